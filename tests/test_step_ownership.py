"""A candidate optimizer's step belongs to the step compiler (dispatch/optim_compile.py):
capture neither measures it (Note [Steps compiled on their own are not measured]), nor
captures it while its compile waits (Note [A step waiting for its compile is not
captured]); a program left with only small windows parks (Note [Small windows count in
part]); a checked step is compiled without Inductor's size asserts and its params are
checked by a guard instead (Note [A checked step skips Inductor's size asserts])."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch.lazy import is_suspended
from adaptive_eager.runtime.verdicts import SMALL_WINDOW_OPS, Tally, Verdict

O = torch.optim


def _sgd(n: int = 6, size: int = 1 << 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.randn(size, generator=gen).requires_grad_() for _ in range(n)]
    opt = O.SGD(ps, lr=0.05, momentum=0.9)
    return ps, opt


def _grads(ps, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)


def _plain(gm, example_inputs):
    """A backend that is not a debugging one (so the session measures before capturing)."""
    return gm


# -- Note [Small windows count in part] ----------------------------------------------------
def test_small_windows_count_in_part_towards_patience():
    t, patience = Tally(), 8
    per_window = 2
    needed = patience * SMALL_WINDOW_OPS // per_window
    stops = [t.weigh(Verdict(per_window), True, patience, 48)[1] for _ in range(needed)]
    assert stops[:-1] == [None] * (needed - 1)
    assert stops[-1] == f"{patience} windows in a row held nothing worth compiling"


def test_small_windows_between_windows_worth_compiling_never_stop_deferral():
    t = Tally()
    for _ in range(200):
        for _ in range(5):
            assert t.weigh(Verdict(3), True, 8, 48) == (False, None)
        assert t.weigh(Verdict(40, worth=True), True, 8, 48) == (True, None)


def test_a_program_of_probe_reads_around_a_compiled_step_parks():
    """The only ops besides the compiled step are a probe read (two selects, an .item()):
    before, every read was a captured two-op window for ever; now the runtime parks, and
    the measure says it left the step out."""
    ps, opt = _sgd()
    ref_ps, ref_opt = _sgd()
    steps = 60
    got, want = [], []
    ae.reset_stats()
    with ae.adaptive_eager(backend=_plain, optimizer_step_after_ms=0, async_compile=False, warmup=True):
        for i in range(steps):
            _grads(ps, i)
            opt.step()
            with torch.no_grad():
                got.append(ps[0][3].item())
    for i in range(steps):
        _grads(ref_ps, i)
        ref_opt.step()
        with torch.no_grad():
            want.append(ref_ps[0][3].item())
    assert got == want
    s = ae.stats()
    assert s.optimizer_steps_compiled >= steps - 5
    assert s.ops_captured < steps, s.ops_captured  # 2 a step had it captured for ever
    whys = [row[-1] for row in s.phases.values()]
    assert any("optimizer steps compiled on their own left out" in w for w in whys), whys
    assert session.counters().phases  # the report tells the story
    assert "parked" in ae.report()


# -- Note [A step waiting for its compile is not captured] ---------------------------------
def test_a_step_waiting_for_its_compile_runs_uncaptured_and_equals_eager():
    gate = threading.Event()
    compiled = []

    def slow(gm, example_inputs):
        compiled.append(len(gm.graph.nodes))
        gate.wait(30)
        return gm

    ps, opt = _sgd()
    ref_ps, ref_opt = _sgd()
    ae.reset_stats()
    try:
        with ae.adaptive_eager(backend=slow, async_compile=True, optimizer_step_after_ms=0,
                               adaptive_passthrough=False):
            for i in range(8):
                _grads(ps, i)
                opt.step()
                assert not is_suspended()
                if i == 0:  # state creation runs eagerly, captured
                    first = ae.stats().ops_captured
            assert session.counters().compiles_in_flight == 1  # the step's own, nothing else
            captured = ae.stats().ops_captured - first
            ps[0].sum().item()
    finally:
        gate.set()
    for i in range(8):
        _grads(ref_ps, i)
        ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ps, ref_ps))
    assert first > 0 and captured == 0, (first, captured)  # before: its foreach ops, 3 a step
    kinds = {k.partition("|")[2]: n for k, n in ae.stats().optimizer_step_kinds.items()}
    assert kinds.get("eager: compile not ready", 0) >= 1, kinds


def test_capture_comes_back_after_a_passed_through_step_that_raised(monkeypatch):
    import torch.optim.sgd as sgd_module

    ps, opt = _sgd()
    fail = []

    def failing(real):
        def run(*args, **kwargs):
            if fail and args[0][0].device.type != "meta":  # not the step compiler's trace
                raise RuntimeError("boom inside the step")
            return real(*args, **kwargs)
        return run

    for name in ("_single_tensor_sgd", "_multi_tensor_sgd"):
        monkeypatch.setattr(sgd_module, name, failing(getattr(sgd_module, name)))
    gate = threading.Event()

    def slow(gm, example_inputs):
        gate.wait(30)
        return gm

    try:
        with ae.adaptive_eager(backend=slow, async_compile=True, optimizer_step_after_ms=0,
                               adaptive_passthrough=False):
            _grads(ps, 0)
            opt.step()                                 # state creation
            _grads(ps, 1)
            fail.append(1)
            with pytest.raises(RuntimeError, match="boom inside the step"):
                opt.step()                             # waits for its compile: passed through
            assert is_suspended()                      # the raise skipped our post-hook
            fail.clear()
            _grads(ps, 2)
            opt.step()                                 # the next step gives it back
            assert not is_suspended()
            _grads(ps, 3)
            fail.append(1)
            with pytest.raises(RuntimeError, match="boom"):
                opt.step()
            assert is_suspended()
        assert not is_suspended()                      # and so does the block's exit
        with ae.adaptive_eager(backend=slow, async_compile=True, optimizer_step_after_ms=0,
                               adaptive_passthrough=False):
            _grads(ps, 4)
            fail.append(1)
            with pytest.raises(RuntimeError, match="boom"):
                opt.step()                             # compiling still (the gate): passes through
            assert is_suspended()
            del opt
            gc.collect()                               # its optimizer is gone...
            qs, other = _sgd(n=2, seed=1)
            _grads(qs, 0)
            fail.clear()
            other.step()                               # ...another optimizer's step gives it back
            assert not is_suspended()
            y = qs[0] * 2
            assert type(y) is not torch.Tensor         # captured again (a handle)
        assert not is_suspended()
    finally:
        gate.set()


# -- Note [A checked step skips Inductor's size asserts] -----------------------------------
def test_a_checked_graph_is_compiled_without_size_asserts():
    from torch._inductor import config as inductor_config
    from torch.fx.experimental.proxy_tensor import make_fx

    from adaptive_eager.runtime.compile_worker import CHECKED_META, checked_config

    gm = make_fx(lambda x: (x + 1,))(torch.ones(2))
    before = inductor_config.size_asserts
    with checked_config(gm):
        assert inductor_config.size_asserts == before
    gm.meta[CHECKED_META] = True
    with checked_config(gm):
        assert inductor_config.size_asserts is False
    assert inductor_config.size_asserts == before


@pytest.mark.parametrize("swap", ["param", "state"])
def test_a_param_or_state_swapped_for_another_shape_is_seen(swap):
    """``p.data = t`` keeps the param's identity: the known step's guard sees the new
    shape (the compiled step no longer checks sizes itself) and the step equals eager."""
    def run(ps, opt, compiled: bool):
        ctx = ae.adaptive_eager(backend="eager", optimizer_step_after_ms=0, async_compile=False) \
            if compiled else None
        if ctx is not None:
            ctx.__enter__()
        try:
            for i in range(8):
                if i == 4:
                    with torch.no_grad():
                        if swap == "param":
                            ps[1].data = torch.linspace(0, 1, 3 * ps[1].numel()).reshape(3, -1)
                            opt.state[ps[1]]["momentum_buffer"] = torch.zeros_like(ps[1])
                        else:
                            buf = opt.state[ps[1]]["momentum_buffer"]
                            buf.data = torch.ones(buf.shape[0] * 2)[::2]  # same shape, strided
                _grads(ps, i)
                opt.step()
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)

    ps, opt = _sgd(n=3, size=64)
    ref_ps, ref_opt = _sgd(n=3, size=64)
    ae.reset_stats()
    run(ps, opt, True)
    assert ae.stats().optimizer_steps_compiled >= 2
    run(ref_ps, ref_opt, False)
    for a, b in zip(ps, ref_ps):
        assert a.shape == b.shape and torch.equal(a, b)
