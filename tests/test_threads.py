"""Threads: the runtime is per thread (PyTorch's mode stacks are thread-local)."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor

JOIN_S = 60

@pytest.fixture(autouse=True)
def _fresh_sessions():
    # Sessions (and their pass-through policy) are shared per options across tests:
    # start each test with fresh ones so an earlier test's history does not decide
    # whether this one defers.
    session.clear_sessions()
    yield


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the global generator is shared by threads: build in one
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(model: torch.nn.Module, seed: int, steps: int = 5) -> tuple[list[float], list[torch.Tensor]]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def _run_threads(targets) -> list:
    results: list = [None] * len(targets)
    errors: queue.Queue = queue.Queue()

    def wrap(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.put(e)

    threads = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "thread did not finish (deadlock?)"
    if not errors.empty():
        raise errors.get()
    return results


def test_context_is_per_thread_loader_thread_unaffected():
    seen: dict = {}
    go = threading.Event()
    done = threading.Event()

    def loader():
        go.wait(JOIN_S)
        x = torch.randn(16, 4) * 2 + 1       # CPU work outside any context
        seen["type"] = type(x)
        seen["mode"] = session.current_mode()
        seen["stack"] = len(torch.utils._python_dispatch._get_current_dispatch_mode_stack())
        seen["value"] = (x.sum() * 0).item()
        done.set()

    t = threading.Thread(target=loader)
    t.start()
    session.counters().reset()
    with ae.adaptive_eager(backend="eager"):
        y = torch.ones(3) * 2
        assert isinstance(y, LazyTensor)
        go.set()
        assert done.wait(JOIN_S)
        captured = session.counters().ops_captured
    t.join(JOIN_S)
    assert seen["type"] is torch.Tensor and seen["mode"] is None and seen["stack"] == 0
    assert seen["value"] == 0.0
    assert captured == 2  # only this thread's ones() and mul: none of the loader's ops


def test_two_threads_train_two_models_like_eager():
    ref = [_train(_model(1), 1), _train(_model(2), 2)]
    models = {1: _model(1), 2: _model(2)}

    def under_runtime(seed):
        def run():
            with ae.adaptive_eager(backend="eager"):
                out = _train(models[seed], seed)
                assert session.current_mode() is not None
            return out
        return run

    got = _run_threads([under_runtime(1), under_runtime(2)])
    for (losses, params), (ref_losses, ref_params) in zip(got, ref):
        assert losses == pytest.approx(ref_losses, rel=1.3e-6, abs=1e-5)
        for p, r in zip(params, ref_params):
            torch.testing.assert_close(p, r, rtol=1.3e-6, atol=1e-5)
    assert session.counters().ops_captured > 0


def test_handle_read_from_another_thread_flushes_its_owner():
    out: dict = {}
    with ae.adaptive_eager(backend="eager"):
        y = torch.arange(4.0) * 3
        t = threading.Thread(target=lambda: out.setdefault("v", y.tolist()))
        t.start()
        t.join(JOIN_S)
    assert out["v"] == [0.0, 3.0, 6.0, 9.0]


def test_thread_started_after_enable_runs_under_runtime():
    enable = getattr(ae, "enable", None) or getattr(session, "enable", None)
    disable = getattr(ae, "disable", None) or getattr(session, "disable", None)
    if enable is None or disable is None:
        pytest.skip("adaptive_eager.enable() does not exist yet")
    seen: dict = {}

    def worker():
        y = torch.ones(2) * 5
        seen["lazy"] = isinstance(y, LazyTensor)
        seen["value"] = y.tolist()

    enable(backend="eager")
    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join(JOIN_S)
    finally:
        disable()
    assert seen == {"lazy": True, "value": [5.0, 5.0]}


# -- the runtime's own threads end when idle (Note [An idle thread ends]) -----------------
def _wait_until(cond, timeout: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_an_idle_runtime_thread_ends_and_the_next_call_starts_another():
    from adaptive_eager.runtime.compiler import DaemonThread

    t = DaemonThread("ae-test-idle", idle_s=0.05)
    first = t.submit(threading.current_thread)
    ran_on = first.result(timeout=JOIN_S)
    assert ran_on is not threading.current_thread() and ran_on.name == "ae-test-idle"
    assert _wait_until(lambda: not ran_on.is_alive()), "the idle thread did not end"
    again = t.submit(threading.current_thread).result(timeout=JOIN_S)
    assert again is not ran_on and again.is_alive()


def test_calls_submitted_as_the_thread_goes_idle_all_run():
    """The start and the idle exit take one lock: a call put while the thread decides
    to end is never left without a thread to run it."""
    import time

    from adaptive_eager.runtime.compiler import DaemonThread

    t = DaemonThread("ae-test-race", idle_s=0.002)
    done = []
    for i in range(300):
        fut = t.submit(done.append, i)
        if i % 3 == 0:
            time.sleep(0.002 + (i % 7) * 0.0005)  # around the idle timeout
        elif i % 3 == 1:
            fut.result(timeout=JOIN_S)
    t.submit(lambda: None).result(timeout=JOIN_S)
    assert done == list(range(300))


def test_dropped_sessions_leave_no_compile_thread_behind(monkeypatch):
    """Before: each session dropped (clear_sessions, eviction) left its compile thread
    blocked on an empty queue for the life of the process (~260 in the test suite)."""
    from adaptive_eager.runtime import compiler

    from helpers import OPTIONS

    monkeypatch.setattr(compiler, "IDLE_EXIT_S", 0.05)

    def compile_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "adaptive_eager-compile"]

    before = set(compile_threads())
    x = torch.randn(1 << 16)
    for i in range(4):  # four sessions (options differ), each compiling a region
        with ae.adaptive_eager(**OPTIONS, compile_after=1, window_size=64 + i):
            for _ in range(3):
                y = torch.sigmoid((x * 2.0 + 1.0).relu()) * x
                y.sum().item()
        session.clear_sessions()
    assert ae.stats().regions_compiled >= 4, ae.stats()
    assert _wait_until(lambda: not (set(compile_threads()) - before)), compile_threads()


# -- two threads at their first optimizer step import the step compiler at once -----------
def test_a_step_compiler_still_importing_elsewhere_is_not_read():
    """parking._steps: a module in sys.modules without STEPS is another thread's import
    in progress; it holds no optimizer yet, so the step's start finds none to give back."""
    import sys
    import types

    from adaptive_eager.dispatch import parking

    name = "adaptive_eager.dispatch.optim_compile"
    partial = types.ModuleType(name)  # what a thread sees while another imports it
    saved = sys.modules.get(name)
    sys.modules[name] = partial
    try:
        assert parking._steps(load=False) is None
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def test_two_threads_reaching_their_first_step_together_in_a_fresh_process():
    """Two threads training under the runtime in a fresh interpreter: the first step of
    each imports the step compiler; one thread read it half imported ("partially
    initialized module ... has no attribute 'STEPS'") in 3 runs of 6 before the fix."""
    import subprocess
    import sys
    import textwrap

    body = textwrap.dedent("""
        import threading, torch
        import adaptive_eager as ae
        barrier = threading.Barrier(2)
        errors = []
        def train(seed):
            try:
                torch.manual_seed(seed)
                m = torch.nn.Linear(8, 1)
                opt = torch.optim.Adam(m.parameters(), lr=1e-2)
                with ae.adaptive_eager(backend="eager"):
                    loss = m(torch.ones(4, 8)).square().mean()
                    loss.backward()
                    barrier.wait(timeout=60)
                    opt.step()
                    opt.step()
            except BaseException as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=train, args=(i,)) for i in range(2)]
        for t in ts: t.start()
        for t in ts: t.join()
        print("errors", errors, flush=True)
    """)
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "errors []" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def test_a_restarted_runtime_thread_runs_its_set_up_again():
    """Note [An idle thread ends]: per-thread state (the checker's one OpenMP thread) is
    set by ``on_start`` in every thread the DaemonThread starts, not by a first job."""
    from adaptive_eager.runtime.compiler import DaemonThread

    local = threading.local()
    t = DaemonThread("ae-test-setup", idle_s=0.05, on_start=lambda: setattr(local, "ready", True))
    first = t.submit(lambda: (threading.current_thread(), getattr(local, "ready", False))).result(timeout=JOIN_S)
    assert first[1] is True
    assert _wait_until(lambda: not first[0].is_alive())
    again = t.submit(lambda: (threading.current_thread(), getattr(local, "ready", False))).result(timeout=JOIN_S)
    assert again[0] is not first[0] and again[1] is True
