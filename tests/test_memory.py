"""Memory (issue 20): never more than eager holds.

Replay frees each value at its last use (Note [Replay frees at last use],
fusion/liveness.py); a window is flushed once the real tensors it keeps alive that the
program dropped exceed ``window_bytes`` (Note [A byte budget per window],
runtime/memory.py); large regions' first compiled calls are checked without copying what
they only read (Note [The first compiled call runs on copies], runtime/compiled.py); the
emulated neuron device counts its memory as CUDA does, so these tests read device bytes.
"""

from __future__ import annotations

import contextlib
import logging
import weakref

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import config
from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
from adaptive_eager.fusion.liveness import release_after
from adaptive_eager.runtime import Counters
from adaptive_eager.runtime.compiled import CompiledCodeWroteInput, CompiledExecutor
from adaptive_eager.runtime.executor import EagerExecutor

aten = torch.ops.aten
FORCED = dict(adaptive_passthrough=False, warmup=False)


# -- replay frees at last use ----------------------------------------------------------

def _probe_window(owned: bool):
    """%1 = %0 * 2; %2 = keep(%1) (remembers %1 weakly); %3 = dead(%2) (is %1 gone?)."""
    seen = {}

    def keep(t):
        seen["ref"] = weakref.ref(t)
        return t + 1

    def dead(t):
        seen["gone"] = seen["ref"]() is None
        return t * 3

    x = torch.ones(1024)
    s = TensorSpec.of(x)
    nodes = (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),
             OpNode(keep, (ValueRef(1),), (), (2,)),
             OpNode(dead, (ValueRef(2),), (), (3,)))
    w = Window({0: x}, nodes, {0: s, 1: s, 2: s, 3: s}, frozenset({3}), owned=owned)
    return w, seen


def test_eager_replay_drops_an_intermediate_before_the_window_ends():
    w, seen = _probe_window(owned=False)
    out = EagerExecutor().run(w).values
    assert seen["gone"] is True
    assert torch.equal(out[3], torch.full((1024,), 9.0))


def test_an_owned_windows_run_drops_its_inputs_at_their_last_use():
    x = torch.ones(1024)
    ref = weakref.ref(x)
    seen = {}

    def check(t):
        seen["gone"] = ref() is None
        return t + 1

    s = TensorSpec.of(x)
    w = Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),
                        OpNode(check, (ValueRef(1),), (), (2,))),
               {0: s, 1: s, 2: s}, frozenset({2}), owned=True)
    del x
    out = EagerExecutor().run(w).values
    assert seen["gone"] is True, "the window's run kept its dead input alive"
    assert torch.equal(out[2], torch.full((1024,), 3.0))


def test_release_after_follows_the_order_the_nodes_run_in():
    nodes = (OpNode(aten.neg.default, (ValueRef(0),), (), (1,)),
             OpNode(aten.neg.default, (ValueRef(0),), (), (2,)),
             OpNode(aten.add.Tensor, (ValueRef(1), ValueRef(2)), (), (3,)))
    assert release_after(nodes, (0, 1, 2), frozenset({3})) == {1: (0,), 2: (1, 2)}
    # run 1 before 0: %0's last use is node 0
    assert release_after(nodes, (1, 0, 2), frozenset({3})) == {0: (0,), 2: (2, 1)}
    # a value nothing reads is dropped after the node that made it, unless it is live
    assert release_after(nodes[:2], (0, 1), frozenset()) == {0: (1,), 1: (0, 2)}
    assert release_after(nodes[:2], (0, 1), frozenset({1})) == {1: (0, 2)}


def test_planned_windows_free_intermediates_with_every_backend_path():
    """Planned, generated and compiled (eager backend) runs of a recurring window all
    drop its intermediates: device memory stays near eager's."""
    def loop(x):
        for _ in range(40):
            x = x * 1.0001 + 0.0001
        return x

    torch.manual_seed(0)
    x0 = torch.rand(1 << 18, device="neuron")          # 1 MiB
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    want = [loop(x0).sum().item() for _ in range(3)]
    eager_peak = torch.neuron.max_memory_allocated() - base
    for backend in ("eager", "aot_eager"):
        torch.neuron.reset_peak_memory_stats()
        with ae.adaptive_eager(device="neuron", backend=backend, compile_after=1,
                               async_compile=False, **FORCED):
            got = [loop(x0).sum().item() for _ in range(6)]
        peak = torch.neuron.max_memory_allocated() - base
        assert got[:3] == want, backend
        # 40 windows' worth of intermediates (40 MiB) were held before; a first call's
        # copies and checks may add a few MiB once.
        assert peak <= eager_peak + (4 << 20), (backend, peak / 2**20, eager_peak / 2**20)
    assert ae.stats().ops_fused > 0


def test_stats_report_the_replay_peak():
    with ae.adaptive_eager(backend="eager", **FORCED):
        x = torch.ones(1 << 16)
        for _ in range(3):
            y = (x * 2 + 1).sum()
            y.item()
    s = ae.stats()
    assert 0 < s.replay_peak_bytes <= 3 * (1 << 18), s.replay_peak_bytes
    assert "replay_peak_bytes" in s.to_json()


# -- the byte budget ----------------------------------------------------------------------

def test_a_window_holding_dropped_inputs_past_the_budget_is_flushed():
    torch.manual_seed(0)
    chunks = [torch.randn(1 << 16) for _ in range(40)]       # 256 KiB each
    want = sum(c.sum() for c in chunks)
    with ae.adaptive_eager(backend="eager", window_bytes="1MiB", **FORCED):
        acc = torch.zeros(())
        while chunks:
            c = chunks.pop()
            acc = acc + c.sum()                              # the program drops c
        del c
        got = acc.item()
    s = ae.stats()
    assert s.flushes.get("window_bytes", 0) >= 4, s.flushes
    assert s.window_peak_bytes > (1 << 20)
    assert s.window_peak_bytes <= (1 << 20) + 17 * (1 << 18), s.window_peak_bytes  # 16 ops a check
    assert got == pytest.approx(float(want), rel=1e-5)
    text = ae.report()
    assert "the program had dropped" in text and "flushed at window_bytes" in text, text


def test_inputs_the_program_still_holds_do_not_count():
    params = [torch.randn(1 << 16) for _ in range(40)]       # held by the program
    with ae.adaptive_eager(backend="eager", window_bytes="1MiB", **FORCED):
        acc = torch.zeros(())
        for p in params:
            acc = acc + p.sum()
        acc.item()
    s = ae.stats()
    assert "window_bytes" not in s.flushes, s.flushes
    assert s.window_peak_bytes == 0


def test_window_bytes_option_is_validated_and_read_from_the_environment(monkeypatch):
    assert config.resolve(window_bytes="2G").window_bytes == 2 << 30
    assert config.resolve(window_bytes="auto").window_bytes == 0
    with pytest.raises(config.ConfigError, match="window_bytes"):
        config.resolve(window_bytes="lots")
    monkeypatch.setenv("ADAPTIVE_EAGER_WINDOW_BYTES", "512KiB")
    assert config.resolve().window_bytes == 512 << 10


# -- the lean first call of a large region --------------------------------------------------

def _executor(backend, **opts):
    return CompiledExecutor(config.resolve(backend=backend, compile_after=1, async_compile=False,
                                           min_region_work=0, window_bytes="64KiB", **opts),
                            Counters())


def _window(x, p):
    s, sp = TensorSpec.of(x), TensorSpec.of(p)
    nodes = (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (2,)),
             OpNode(aten.sin.default, (ValueRef(2),), (), (3,)),
             OpNode(aten.add_.Tensor, (ValueRef(1), ValueRef(3)), (), (1,), (1,)))
    return Window({0: x, 1: p}, nodes, {0: s, 1: sp, 2: s, 3: s}, frozenset({3}))


def test_a_large_regions_first_call_is_checked_lean_and_then_trusted():
    x, p = torch.randn(1 << 14), torch.zeros(1 << 14)        # 64 KiB each: over 16 KiB
    ex = _executor("eager")
    for _ in range(3):
        out = ex.run(_window(x, p)).values
    torch.testing.assert_close(out[3], (x * 2).sin())
    torch.testing.assert_close(p, 3 * (x * 2).sin())
    assert ex.counters.compiled_calls == 2 and ex.counters.compile_failures == 0


def test_a_large_region_whose_compiled_values_differ_runs_eagerly(caplog):
    def wrong(gm, example):
        def run(*args):
            outs = gm(*args)
            return [o + 1 for o in outs]
        return run

    x, p = torch.randn(1 << 14), torch.zeros(1 << 14)
    ex = _executor(wrong)
    with caplog.at_level(logging.WARNING, logger="adaptive_eager"):
        for _ in range(3):
            out = ex.run(_window(x, p)).values
    torch.testing.assert_close(out[3], (x * 2).sin())
    torch.testing.assert_close(p, 3 * (x * 2).sin())
    assert ex.counters.compile_failures == 1 and ex.counters.compiled_calls == 0
    assert any("differ" in r.getMessage() for r in caplog.records)


def _scribbler(gm, example):
    """A compile function whose code also writes its first input."""
    def run(*args):
        outs = gm(*args)
        args[0].add_(1000.0)
        return outs
    return run


def test_a_large_region_that_writes_an_input_it_only_reads_raises():
    x, p = torch.randn(1 << 14), torch.zeros(1 << 14)
    ex = _executor(_scribbler)
    with pytest.raises(CompiledCodeWroteInput, match="only reads"):
        ex.run(_window(x, p))
    assert ex.counters.compile_failures == 1


def _read_only_window(x):
    s = TensorSpec.of(x)
    nodes = (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),
             OpNode(aten.sin.default, (ValueRef(1),), (), (2,)))
    return Window({0: x}, nodes, {0: s, 1: s, 2: s}, frozenset({2}))


def test_a_large_regions_checked_results_are_kept_when_values_are_not_verified():
    # Note [A large region's checked results are kept] (first_call.py): no eager run at the
    # first call of a region that writes nothing; with verify_compiled, eager runs as before.
    x = torch.randn(1 << 14)
    for verify, calls in ((False, 3), (True, 2)):
        ex = _executor("eager", verify_compiled=verify)
        for _ in range(3):
            out = ex.run(_read_only_window(x)).values
        torch.testing.assert_close(out[2], (x * 2).sin(), rtol=0, atol=0)
        assert ex.counters.compiled_calls == calls and ex.counters.compile_failures == 0


def test_a_large_region_that_writes_what_it_reads_raises_unverified_too():
    x = torch.randn(1 << 14)
    ex = _executor(_scribbler, verify_compiled=False)
    with pytest.raises(CompiledCodeWroteInput, match="only reads"):
        ex.run(_read_only_window(x))
    assert ex.counters.compile_failures == 1 and ex.counters.compiled_calls == 0


def test_summaries_of_finite_tensors_equal_the_masked_formula():
    # Note [Summaries of finite tensors take two passes] (checks.py)
    from adaptive_eager.runtime.checks import summary

    def masked(t):
        finite = torch.isfinite(t)
        x = torch.where(finite, t, 0).to(torch.float64)
        return (tuple(t.shape), t.dtype, float(x.sum()), float(x.abs().sum()),
                int(torch.isnan(t).sum()), int(torch.isposinf(t).sum()), int(torch.isneginf(t).sum()))

    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(1000, generator=g), torch.randn(37, 5, generator=g).to(torch.bfloat16),
             torch.tensor([1.0, float("nan"), -float("inf"), 2.0]), torch.zeros(0),
             torch.tensor([3e38, 3e38, -1.0]), torch.tensor(2.5),
             torch.randn(3000, 700, generator=g).t(),           # not contiguous, several chunks
             torch.randn(1, 3 << 20, generator=g) * 1e3 + 7.0]  # one row wider than a chunk
    for t in cases:
        got, want = summary(t), masked(t)
        assert got[:2] == want[:2] and got[4:] == want[4:]
        # summed in float32 chunks: within 1e-6 of the 1-norm (the comparison's rtol is 1e-3)
        scale = want[3] + 1e-30
        assert abs(got[2] - want[2]) <= 1e-6 * scale and abs(got[3] - want[3]) <= 1e-6 * scale, (got, want)
    t64 = torch.randn(5000, dtype=torch.float64, generator=g)  # float64 sums in float64
    assert summary(t64)[2:4] == pytest.approx(masked(t64)[2:4], rel=1e-12, abs=1e-12)
    # infinities that changed sign are not eager's (they were counted together)
    from adaptive_eager.runtime.checks import summaries_close
    pos, neg = torch.tensor([1.0, float("inf")]), torch.tensor([1.0, -float("inf")])
    assert not summaries_close(summary(pos), summary(neg))
    assert summaries_close(summary(pos), summary(pos.clone()))


def test_close_agrees_with_allclose_nan_and_infinity_included():
    # Note [Closeness in four passes] (checks.py): the fast path only ever says True
    from adaptive_eager.runtime.checks import _FAST_CLOSE_NUMEL, _TOL, close

    g = torch.Generator().manual_seed(1)
    n = _FAST_CLOSE_NUMEL + 3
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        rtol, atol = _TOL.get(dtype, (1e-4, 1e-5))
        a = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
        edge = (atol + rtol * a.abs()).to(dtype)   # right at the tolerance, both sides
        pairs = [(a, b) for b in (a.clone(), a + edge * 0.5, a + edge * 2, a + edge)]
        for special in (float("nan"), float("inf"), -float("inf")):
            for x, y in list(pairs[:2]):
                x, y = x.clone(), y.clone()
                y[7] = special
                pairs.append((x.clone(), y.clone()))  # on one side (x is written next)
                x[7] = special
                pairs.append((x, y))                  # the same on both sides
        for x, y in pairs:
            assert close(x, y) == torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("at", ["first", "last", "boundary"])
def test_close_in_chunks_agrees_with_allclose(monkeypatch, at):
    """Note [Close within atol in chunks]: pairs longer than a chunk (a small one here) are
    compared through one buffer; a difference, a NaN or an infinity in the first chunk, the
    last (partial) one or at a chunk boundary decides as torch.allclose does; non-contiguous
    pairs take the whole-tensor path."""
    from adaptive_eager.runtime import checks

    monkeypatch.setattr(checks, "CLOSE_CHUNK", 1000)
    monkeypatch.setattr(checks, "_FAST_CLOSE_NUMEL", 100)
    chunked = []
    real_sub = torch.sub
    monkeypatch.setattr(torch, "sub", lambda *a, **k: chunked.append("out" in k) or real_sub(*a, **k))
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3 * 1000 + 17, generator=g)
    i = {"first": 3, "last": a.numel() - 2, "boundary": 2000}[at]
    rtol, atol = checks._TOL[torch.float32]
    for value in (1e-7, 1e-3, float("nan"), float("inf")):
        b = a + 1e-9
        b[i] = a[i] + value if value < 1 else value
        for x, y in ((a, b), (a.view(-1, 1).expand(-1, 2).t(), b.view(-1, 1).expand(-1, 2).t())):
            want = torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
            assert checks.close(x, y) == want, (value, x.is_contiguous())
    assert checks.close(a, a + 1e-9)
    assert any(chunked) and not all(chunked)  # both paths taken


# -- the emulated device: a training loop's device memory ---------------------------------

def _train(ctx, steps=6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(128, 64).to("neuron"), torch.randn(128, 64).to("neuron"))
               for _ in range(2)]
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    losses = []
    with ctx:
        for i in range(steps):
            x, y = batches[i % 2]
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return losses, torch.neuron.max_memory_allocated() - base


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_training_loop_holds_no_more_device_memory_than_eager(backend):
    import contextlib

    want, eager_peak = _train(contextlib.nullcontext())
    got, peak = _train(ae.adaptive_eager(device="neuron", backend=backend, compile_after=1,
                                         async_compile=False, **FORCED))
    assert ae.stats().compiled_calls > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # first compiled calls are checked on host copies (Note [The first compiled call runs
    # on copies]), replays free at last use: never above eager's device peak
    assert peak <= 1.1 * eager_peak, (peak / 2**20, eager_peak / 2**20)


def _train_between_steps(ctx, steps=6):
    """Device bytes held after each step of a small AdamW loop (grads set to None)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 64).to("neuron"), torch.randn(128, 64).to("neuron")
    held, losses = [], []
    with ctx:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            held.append(torch.neuron.memory_allocated())
    return losses, held


def test_a_steps_compile_in_flight_keeps_no_gradient_alive():
    # Note [A step's compile holds no gradient] (dispatch/optim_compile.py): the compile
    # of AdamW's step is held in flight for the whole loop; what it keeps as examples
    # must not be the grads the program drops at zero_grad.
    import contextlib
    import threading

    from adaptive_eager.runtime.backends import register_backend, unregister_backend

    release, seen = threading.Event(), []

    def blocked(gm, example):
        seen.append(len(example))
        release.wait(30)
        return gm

    register_backend("blocked_eager", blocked, debugging=True)
    try:
        want, eager_held = _train_between_steps(contextlib.nullcontext())
        got, held = _train_between_steps(ae.adaptive_eager(
            device="neuron", backend="blocked_eager", optimizer_step_after_ms=0, **FORCED))
        in_flight = ae.stats().optimizer_steps_compiled == 0 and seen
    finally:
        release.set()
        unregister_backend("blocked_eager")
    assert in_flight, "the step's compile was not in flight during the loop"
    assert got == want
    # bytes held between steps are eager's, the step's compile in flight or not
    assert held == eager_held, ([h / 2**10 for h in held], [h / 2**10 for h in eager_held])


_TRACED_WHILE_CAPTURING = """
import torch, adaptive_eager as ae
from adaptive_eager.runtime.backends import register_backend
examples = []
register_backend("recording_eager", lambda gm, ex: (examples.append([type(x).__name__ for x in ex]), gm)[1], debugging=True)
torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
with ae.adaptive_eager(backend="recording_eager", optimizer_step_after_ms=0, async_compile=False,
                       adaptive_passthrough=False, warmup=False):
    for _ in range(4):
        loss = model(torch.randn(4, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
assert examples and ae.stats().optimizer_steps_compiled > 0
print("NOT FOR THE WORKER", [i for i, x in enumerate(examples[0]) if x == "LazyTensor"])
"""


def test_a_step_traced_while_capturing_can_be_compiled_in_the_worker():
    # AdamW makes ``torch.tensor(1.0)`` for its CPU step counters; traced under a capturing
    # mode it became a handle among the step's constants, which the compile worker cannot
    # take: the step compiled in-process and loaded Inductor's compiler into the program
    # (python -m benchmarks.memory gpt). A fresh process, as a program runs; types are
    # taken at the compile (a handle, once bound, becomes a plain tensor).
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _TRACED_WHILE_CAPTURING], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NOT FOR THE WORKER []" in r.stdout, r.stdout


def _step_with_backend(backend, steps=4):
    """AdamW over three params, with grads made outside the block; the params after."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
    grads = [torch.randn(64) for _ in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    ctx = ae.adaptive_eager(backend=backend, optimizer_step_after_ms=0, async_compile=False) \
        if backend else contextlib.nullcontext()
    with ctx:
        for _ in range(steps):
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
    return params, grads


def test_a_steps_first_call_copies_what_it_writes_not_the_grads():
    # Note [A step's first call copies what it writes] (dispatch/optim_compile.py)
    from adaptive_eager.runtime.backends import register_backend, unregister_backend

    calls = []

    def pointers(gm, example):
        def call(*args):
            calls.append([a.data_ptr() for a in args if isinstance(a, torch.Tensor)])
            return gm(*args)
        return call

    register_backend("pointers", pointers, debugging=True)
    try:
        params, grads = _step_with_backend("pointers")
    finally:
        unregister_backend("pointers")
    want, _ = _step_with_backend(None)
    assert ae.stats().optimizer_steps_compiled > 0 and calls
    first = set(calls[0])
    assert {g.data_ptr() for g in grads} <= first          # grads: the program's own
    assert not {p.data_ptr() for p in params} & first      # params: copies
    for a, b in zip(params, want):
        assert torch.equal(a.detach(), b.detach())


def test_a_steps_first_call_that_writes_the_grads_raises():
    from adaptive_eager.runtime.backends import register_backend, unregister_backend
    from adaptive_eager.runtime.first_call import CompiledCodeWroteInput

    def scribbler(gm, example):
        def call(*args):
            out = gm(*args)
            for a in args:
                if isinstance(a, torch.Tensor) and a.dim() == 1 and not isinstance(a, torch.nn.Parameter):
                    a.add_(1.0)  # grads and moments; the moments are copies
            return out
        return call

    register_backend("scribbler", scribbler, debugging=True)
    try:
        with pytest.raises(CompiledCodeWroteInput, match="wrote grads"):
            _step_with_backend("scribbler")
    finally:
        unregister_backend("scribbler")
