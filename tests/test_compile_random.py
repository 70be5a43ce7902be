"""Differential: random programs through the real mode, compiled regions vs plain eager."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import adaptive_eager as ae
from adaptive_eager import session

UNARY = [torch.relu, torch.sigmoid, torch.tanh, torch.exp, lambda t: t * 0.5, lambda t: t + 1.25,
         lambda t: t.abs().sqrt(), lambda t: t.clamp(min=-0.5)]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum, lambda a, b: a @ b.t(),
          lambda a, b: torch.addcmul(a, a, b, value=0.3)]
INPLACE = [lambda t, f: t.mul_(f), lambda t, f: t.add_(f), lambda t, f: t.lerp_(t.flip(0), 0.25)]

op = st.one_of(
    st.tuples(st.just("u"), st.integers(0, len(UNARY) - 1), st.integers(0, 9)),
    st.tuples(st.just("b"), st.integers(0, len(BINARY) - 1), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("i"), st.integers(0, len(INPLACE) - 1), st.integers(0, 9),
              st.floats(0.5, 1.5)),
    st.tuples(st.just("r"), st.integers(0, 9)),  # reduction to a row vector, broadcast back
    st.tuples(st.just("s"), st.integers(0, 9)),  # a sync in the middle
)


def _program(ops, inputs):
    vals = list(inputs)
    for o in ops:
        pick = lambda k: vals[k % len(vals)]  # noqa: E731
        if o[0] == "u":
            vals.append(UNARY[o[1]](pick(o[2])))
        elif o[0] == "b":
            vals.append(BINARY[o[1]](pick(o[2]), pick(o[3])))
        elif o[0] == "i":
            INPLACE[o[1]](pick(o[2]), o[3])
        elif o[0] == "r":
            t = pick(o[1])
            vals.append(t - t.mean(dim=0, keepdim=True))
        else:
            float(pick(o[1]).sum())
    return vals[len(inputs):] + list(inputs)


@pytest.mark.parametrize("backend", ["aot_eager"])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_random_programs_match_eager(backend, ops, seed):
    session.clear_sessions()
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(64, 64, generator=g) * 0.5 for _ in range(3)]
    want = _program(ops, [b.clone() for b in base])
    for _ in range(2):  # second run: the regions are compiled (compile_after=1)
        real = [b.clone() for b in base]
        with ae.adaptive_eager(backend=backend, compile_after=1, async_compile=False,
                               min_region_work=0):
            got = _program(ops, real)
        for w, r in zip(want, got):
            torch.testing.assert_close(r, w, rtol=1e-4, atol=1e-4, equal_nan=True)
    session.clear_sessions()


# -- Note [Compiles never rewind the program's random stream] (runtime/compiler.py) ------
def test_an_async_compile_does_not_rewind_the_programs_random_stream():
    """aot_eager's compile (AOTAutograd) saves the global generator's state when it starts
    and sets it back when it ends; it runs beside the program, which draws batches all the
    while. The program's numbers must be eager's."""
    import time

    import adaptive_eager as ae

    torch.manual_seed(0)
    w = torch.randn(64, 64)
    got = []
    ae.reset_stats()
    with ae.adaptive_eager(backend="aot_eager", adaptive_passthrough=False, warmup=False,
                           async_compile=True, min_region_work=0):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ae.stats().compiled_calls < 3:
            x = torch.randn(512, 512)  # drawn while the compile runs
            got.append(((x * w[0, 0] + 1).sin() * x + w[1, 0]).exp().sum().item())
    assert ae.stats().compiled_calls >= 3
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    ref = []
    for _ in got:
        x = torch.randn(512, 512)
        ref.append(((x * w[0, 0] + 1).sin() * x + w[1, 0]).exp().sum().item())
    assert got == ref


def test_rng_setters_do_nothing_on_the_compile_thread_only():
    import threading

    from adaptive_eager import hooks
    from adaptive_eager.runtime import compiler

    compiler.guard_rng_setters()
    compiler.guard_rng_setters()  # idempotent
    assert hasattr(torch.random.set_rng_state, "__ae_wrapped__")
    before = torch.random.get_rng_state()
    torch.randn(3)
    moved = torch.random.get_rng_state()

    def on_compile_thread():
        hooks.skip_rng_setters_in_this_thread()
        torch.random.set_rng_state(before)  # what preserve_rng_state does at its end

    t = threading.Thread(target=on_compile_thread)
    t.start()
    t.join()
    assert torch.equal(torch.random.get_rng_state(), moved)
    torch.random.set_rng_state(before)  # any other thread: as torch does
    assert torch.equal(torch.random.get_rng_state(), before)
