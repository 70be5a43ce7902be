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
