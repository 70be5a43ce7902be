"""Injected faults: exceptions, interrupts, failing/hanging/lying backends, unbounded loops, leaks.

The backend tests use the backend-callable API (``backend=callable(gm, example_inputs)
-> callable``) with ``compile_after=1, async_compile=False, min_region_work=0``, so the
first window compiles and the compiled artifact is called at once.
"""

from __future__ import annotations

import gc
import logging
import os
import time

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor

@pytest.fixture(autouse=True)
def _fresh_sessions():
    # Sessions (and their pass-through policy) are shared per options across tests:
    # start each test with fresh ones so an earlier test's history does not decide
    # whether this one defers.
    session.clear_sessions()
    yield


def _no_modes_left() -> None:
    assert _get_current_dispatch_mode_stack() == []
    assert session.current_mode() is None
    assert not torch._C._is_torch_function_mode_enabled()


def _program(x: torch.Tensor) -> torch.Tensor:
    return ((x * 2 + 1).sin() * x).sum(dim=0)


def _compiled_opts(backend, **extra) -> dict:
    return dict(backend=backend, compile_after=1, async_compile=False, min_region_work=0,
                adaptive_passthrough=False, **extra)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "adaptive_eager" and r.levelno >= logging.WARNING]


# -- exceptions and interrupts ----------------------------------------------------------

def test_exception_inside_context_applies_deferred_work_and_pops_modes():
    p = torch.zeros(3)
    with pytest.raises(ValueError, match="boom"):
        with ae.adaptive_eager(backend="eager"):
            p.add_(1)                    # deferred in-place update of a real tensor
            y = torch.ones(3) * 4        # deferred handle
            raise ValueError("boom")
    _no_modes_left()
    assert p.tolist() == [1.0, 1.0, 1.0]
    assert y.tolist() == [4.0, 4.0, 4.0]
    assert session.counters().flushes["exit"] == 1


def test_keyboard_interrupt_during_flush(monkeypatch):
    opts = dict(backend="eager", window_size=97)  # a session of its own
    executor = session.get_session(session.resolve_options(**opts)).executor
    real_run = executor.run
    calls = {"n": 0}

    def interrupted(window, known):  # Executor.run's one form
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real_run(window, known)

    monkeypatch.setattr(executor, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with ae.adaptive_eager(**opts):
            y = torch.ones(3) + 1
            y.tolist()                   # the flush is interrupted
    _no_modes_left()
    # the window was finished before the interrupt reached the program (Note [A failed
    # flush loses no work]): what the program computed before it is readable
    assert y.tolist() == [2.0, 2.0, 2.0]
    with ae.adaptive_eager(**opts):     # the session still works
        assert (torch.ones(2) * 3).tolist() == [3.0, 3.0]
    _no_modes_left()


def test_keyboard_interrupt_during_compile():
    def interrupting_backend(gm, example_inputs):
        raise KeyboardInterrupt

    xs = [torch.randn(8, 4) for _ in range(3)]
    with pytest.raises(KeyboardInterrupt):
        with ae.adaptive_eager(**_compiled_opts(interrupting_backend)):
            [_program(x) for x in xs][-1].tolist()
    _no_modes_left()
    # the interrupt reached the program as in eager; afterwards the runtime works
    with ae.adaptive_eager(backend="eager"):
        out = _program(xs[0]).clone()
    torch.testing.assert_close(out, _program(xs[0]))
    _no_modes_left()


# -- misbehaving backends: detected, eager fallback, correct values, logged once --------

def _check_fallback(backend, caplog, **extra) -> None:
    xs = [torch.randn(8, 4) for _ in range(3)]
    refs = [_program(x) for x in xs]
    caplog.set_level(logging.WARNING, logger="adaptive_eager")
    with ae.adaptive_eager(**_compiled_opts(backend, **extra)):
        outs = [_program(x) for x in xs]
        outs = [o.clone() for o in outs]
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    s = ae.session.stats()
    assert s.compile_failures >= 1, s
    assert s.ops_fused == 0
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "runs eagerly" in warnings[0]


def test_backend_that_raises(caplog):
    calls = []

    def raising_backend(gm, example_inputs):
        calls.append(gm)
        raise RuntimeError("injected compiler failure")

    _check_fallback(raising_backend, caplog)
    assert calls, "the backend was never asked to compile"
    assert "injected compiler failure" in caplog.text


def test_backend_that_hangs_past_the_timeout(caplog):
    def hanging_backend(gm, example_inputs):
        time.sleep(2.0)
        return gm

    t0 = time.monotonic()
    _check_fallback(hanging_backend, caplog, compile_timeout_s=0.2)
    assert time.monotonic() - t0 < 10
    assert "timed out" in caplog.text


def test_backend_that_returns_wrong_shapes(caplog):
    def lying_backend(gm, example_inputs):
        def run(*args):
            outs = gm(*args)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            return tuple(o.reshape(-1)[:1].clone() if isinstance(o, torch.Tensor) else o
                         for o in outs)
        return run

    _check_fallback(lying_backend, caplog)
    assert "differ" in caplog.text or "got" in caplog.text


def test_backend_that_works_is_used():
    """Control for the three above: the same program does fuse with a sane backend."""
    xs = [torch.randn(8, 4) for _ in range(3)]
    with ae.adaptive_eager(**_compiled_opts(lambda gm, ex: gm)):
        [_program(x) for x in xs]
        ae.sync()                        # compiled here
        [_program(x) for x in xs]
        ae.sync()                        # first compiled call: checked against eager
        outs = [_program(x) for x in xs]
    for o, x in zip(outs, xs):
        torch.testing.assert_close(o, _program(x))
    assert ae.session.stats().ops_fused > 0


# -- bounded windows, released tensors -------------------------------------------------

def test_loop_that_never_syncs_stays_within_window_bound():
    w = 16
    largest = 0
    with ae.adaptive_eager(backend="eager", window_size=w, adaptive_passthrough=False):
        mode = session.current_mode()
        x = torch.zeros(4)
        for _ in range(500):
            x = x + 1
            largest = max(largest, len(mode.recorder))
    assert 0 < largest <= w
    assert session.counters().flushes["window_full"] >= 500 // w - 1
    assert x.tolist() == [500.0] * 4


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc for RSS")
def test_dropped_tensors_are_released_over_1000_iterations():
    w = torch.randn(16, 16, requires_grad=True)

    def step():
        x = torch.randn(8, 16)
        loss = (x @ w).tanh().square().mean()
        loss.backward()
        with torch.no_grad():
            w.sub_(w.grad * 1e-3)
        w.grad = None
        return loss

    with ae.adaptive_eager(backend="eager", window_size=64, adaptive_passthrough=False):
        for _ in range(50):  # warm up caches (meta memo, plans) before measuring
            step()
        ae.sync()
        base_tensors, base_rss = _live_tensors(), _rss_bytes()
        for i in range(1000):
            loss = step()
            if i % 100 == 0:
                loss.item()
        ae.sync()
        end_tensors, end_rss = _live_tensors(), _rss_bytes()
    print(f"\nlive tensors {base_tensors} -> {end_tensors}; RSS {base_rss / 2**20:.1f} -> "
          f"{end_rss / 2**20:.1f} MiB over 1000 iterations")
    assert end_tensors - base_tensors <= 8
    assert end_rss - base_rss < 16 * 2**20
    assert isinstance(loss, LazyTensor)


def test_training_loop_survives_passthrough():
    """Regression: detach of a plain tensor carrying the Python key (fixed in 5806ccd)."""
    w = torch.randn(16, 16, requires_grad=True)
    with ae.adaptive_eager(backend="eager", window_size=64):
        for _ in range(60):
            loss = (torch.randn(8, 16) @ w).tanh().square().mean()
            loss.backward()
            with torch.no_grad():
                w.sub_(w.grad * 1e-3)
            w.grad = None
