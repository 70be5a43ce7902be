"""Runtime faults (issue 15): what compiled calls must never do to the program.

A first compiled call that is verified must not apply in-place updates twice; a
backend that scribbles on its inputs must not reach the program's data; the sign of a
zero is part of a scalar's value; the runtime leaves the program's thread count alone;
an out-of-range index raises eager's error instead of aborting; a compile that never
returns does not keep the interpreter from exiting.

Each test is differential against plain eager, on cpu and (where it applies) on the
emulated neuron device.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager import session

from test_devices import device  # noqa: F401 - the cpu / emulated neuron fixture


def _opts(backend="eager", **extra) -> dict:
    """The first sighting compiles at once and its first call is checked."""
    return dict(backend=backend, compile_after=1, async_compile=False, min_region_work=0,
                adaptive_passthrough=False, device=extra.pop("device", "cpu"), **extra)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "adaptive_eager" and r.levelno >= logging.WARNING]


# -- item 1: a verified first call must not apply in-place updates twice ----------------

def _sgd_steps(ctx, device: str, steps: int = 4) -> tuple[list[float], int]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256).to(device)
    x = torch.randn(128, 256).to(device)
    out = []
    with ctx:
        for _ in range(steps):
            lin.zero_grad()
            lin(x).pow(2).mean().backward()
            for p in lin.parameters():
                p.data.add_(p.grad, alpha=-0.1)   # written through a view made in the region
            out.append(lin.weight.sum().item())
    return out, lin.weight._version


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("verify", [True, False])
def test_hand_written_sgd_step_is_applied_once(backend, verify, device, caplog):
    import contextlib

    expected = _sgd_steps(contextlib.nullcontext(), device)
    got = _sgd_steps(ae.adaptive_eager(backend=backend, adaptive_passthrough=False,
                                       async_compile=False, compile_after=1, device=device,
                                       verify_compiled=verify), device)
    # Lifted scalars round once more than eager (Note [Scalar lifting]); a step applied
    # twice moves the sum by ~6e-4 relative.
    for e, g in zip(expected[0], got[0]):
        assert math.isclose(e, g, rel_tol=1e-5), (expected, got)
    assert got[1] == expected[1]  # Note [Version counters of written inputs]
    s = ae.stats()
    assert s.regions_compiled >= 1 and s.compiled_calls >= 1, s
    assert s.compile_failures == 0, _warnings(caplog)


def test_region_writing_an_input_through_its_own_view_counts_it_as_mutated():
    from adaptive_eager.fusion.graph import storage_groups
    from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    from adaptive_eager.fusion.partition import partition
    from adaptive_eager.fusion.policy import DefaultCost, OpSupport

    aten = torch.ops.aten
    p, g = torch.zeros(1 << 14), torch.ones(1 << 14)
    s = TensorSpec.of(p)
    w = Window({0: p, 1: g}, (
        OpNode(aten.detach.default, (ValueRef(0),), (), (2,), (), True),
        OpNode(aten.mul.Tensor, (ValueRef(1), 0.5), (), (3,)),
        OpNode(aten.add_.Tensor, (ValueRef(2), ValueRef(3)), (), (2,), (2,)),
    ), {0: s, 1: s, 2: s, 3: s}, frozenset({2}), alias_root={2: 0})
    (region,) = partition(w, storage_groups(w), OpSupport(), DefaultCost(min_work=0, call_us=0)).steps
    assert region.fused, region
    assert region.mutated == (0,), region


@pytest.mark.inductor
def test_hand_written_sgd_step_is_applied_once_inductor(caplog):
    import contextlib

    expected = _sgd_steps(contextlib.nullcontext(), "cpu", steps=3)
    got = _sgd_steps(ae.adaptive_eager(backend="inductor", adaptive_passthrough=False,
                                       async_compile=False, compile_after=1), "cpu", steps=3)
    for e, g in zip(expected[0], got[0]):
        assert math.isclose(e, g, rel_tol=1e-5), (expected, got)
    assert got[1] == expected[1]
    s = ae.stats()
    assert s.compiled_calls >= 1, s
    assert not any("differ" in m for m in _warnings(caplog)), _warnings(caplog)


# -- item 8: a backend that writes into its inputs --------------------------------------

def _scribbler(gm, example_inputs):
    def run(*args):
        outs = gm(*args)
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a.add_(1000.0)                   # a compiler bug: writes every input
        return outs
    return run


@pytest.mark.parametrize("verify", [True, False])
def test_backend_that_writes_its_inputs_never_reaches_the_program(verify, device, caplog):
    torch.manual_seed(0)
    x = torch.randn(64, 64).to(device)
    p = torch.zeros(64, 64).to(device)
    x0, p0 = x.clone(), p.clone()

    def prog(x, p, sync):
        y = ((x * 2 + 1).sin() * x).sum(dim=0)   # a region that reads x only
        sync()
        p.add_(x * 0.5)                          # one that writes p
        sync()
        return y

    expected = [prog(x0, p0, lambda: None) for _ in range(3)]
    with ae.adaptive_eager(**_opts(_scribbler, device=device, verify_compiled=verify)):
        got = [prog(x, p, ae.sync) for _ in range(3)]
    torch.testing.assert_close(x, x0, rtol=0, atol=0)
    torch.testing.assert_close(p, p0, rtol=0, atol=0)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert ae.stats().compile_failures >= 1
    assert any("input" in m for m in _warnings(caplog)), _warnings(caplog)


def test_artifact_that_fails_after_its_checked_first_call_falls_back(device, caplog):
    def flaky(gm, example_inputs):
        calls = []

        def run(*args):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("injected failure on a later call")
            return gm(*args)
        return run

    x = torch.randn(64, 64).to(device)
    expected = [((x * 2 + 1).sin() * x).sum(dim=0) for _ in range(4)]
    with ae.adaptive_eager(**_opts(flaky, device=device)):
        got = []
        for _ in range(4):
            got.append(((x * 2 + 1).sin() * x).sum(dim=0))
            ae.sync()
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    assert ae.stats().compile_failures == 1
    assert any("later call" in m and "stay correct" in m for m in _warnings(caplog))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_in_place_updates_count_versions_as_eager(backend):
    def prog(p, q, x):
        with torch.no_grad():
            p.mul_(0.9).add_(x)          # two bumps of p
            q.data.add_(x * 2)           # none of q's (.data has its own counter)
        return p._version, q._version

    def run(ctx):
        p, q, x = torch.ones(64, 64), torch.ones(64, 64), torch.randn(64, 64)
        out = []
        with ctx:
            for _ in range(3):
                out.append(prog(p, q, x))
                ae.sync()
        return out, p._version, q._version

    import contextlib
    assert run(ae.adaptive_eager(**_opts(backend))) == run(contextlib.nullcontext())
    assert ae.stats().compiled_calls >= 1


# -- item 9: the sign of zero (and NaN payloads) is part of a scalar's value ------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int32)


def _nan(payload: int) -> float:
    import struct

    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


SPECIAL = [1.0, 0.0, -0.0, 0.0, -0.0, math.inf, -math.inf, -0.0]


@pytest.mark.parametrize("where", ["lifted", "baked"])
def test_negative_zero_is_not_zero(where, device):
    torch.manual_seed(0)
    x = torch.rand(64, 64).add_(0.5).to(device)
    m = (torch.rand(64, 64) < 0.5).to(device)

    def prog(s):
        if where == "lifted":
            y = x * s                       # a lifted scalar (Note [Scalar lifting])
        else:
            y = x.masked_fill(m, s)         # a baked one (in the region key)
        return (1.0 / y).mul(2.0)

    expected = [prog(s) for s in SPECIAL]
    with ae.adaptive_eager(**_opts(device=device)):
        got = []
        for s in SPECIAL:
            got.append(prog(s))
            ae.sync()
    for s, e, g in zip(SPECIAL, expected, got):
        same = torch.equal(_bits(g), _bits(e))
        assert same, f"scalar {s!r}: {g.flatten()[:3].tolist()}, eager {e.flatten()[:3].tolist()}"
    assert ae.stats().compiled_calls >= 1


@pytest.mark.parametrize("payload", [None, 1 << 40])
def test_nan_constants_keep_their_bits_and_a_fresh_nan_hits_the_cache(payload, device):
    x = torch.rand(256, 256).to(device)
    m = (torch.rand(256, 256) < 0.5).to(device)

    def nan():  # a new float object each time
        return float("nan") if payload is None else _nan(payload)

    expected = [x.masked_fill(m, nan()).mul(2.0) for _ in range(4)]
    with ae.adaptive_eager(**_opts(device=device)):
        got = []
        for _ in range(4):
            got.append(x.masked_fill(m, nan()).mul(2.0))
            ae.sync()
    for e, g in zip(expected, got):
        same = torch.equal(_bits(g), _bits(e))
        assert same, "NaN bits differ"
    s = ae.stats()
    if payload is None:
        assert s.compiled_calls >= 2, s  # one key for every canonical NaN
    else:  # Note [NaN payloads run eagerly]
        assert s.compiled_calls == 0, s
        assert any("nan_payload" in r for r in s.fallback_reasons.values()), s.fallback_reasons


def test_float_keys_tell_signed_zeros_and_nans_apart():
    from adaptive_eager.fusion.signature import _freeze, _freeze_args

    nan = float("nan")
    assert _freeze_args((0.0,)) != _freeze_args((-0.0,))
    assert _freeze((0.0, [1.0])) != _freeze((-0.0, [1.0]))
    assert _freeze_args((nan,)) == _freeze_args((float("nan"),))
    assert _freeze_args((_nan(1),)) != _freeze_args((_nan(2),))
    assert _freeze_args((complex(0.0, 0.0),)) != _freeze_args((complex(-0.0, 0.0),))
    assert _freeze_args((3 + 0j,)) != _freeze_args((3,))


# -- item 17: a compile that never returns must not keep the interpreter alive ----------

@pytest.mark.parametrize("async_compile", [True, False])
def test_backend_that_never_returns_does_not_block_exit(async_compile):
    code = textwrap.dedent(f"""
        import threading, torch, adaptive_eager as ae

        def never(gm, example_inputs):
            threading.Event().wait()        # a compiler stuck for good

        x = torch.randn(64, 64)
        with ae.adaptive_eager(backend=never, compile_after=1, async_compile={async_compile},
                               compile_timeout_s=0.5, min_region_work=0,
                               adaptive_passthrough=False):
            for _ in range(3):
                y = ((x * 2 + 1).sin() * x).sum().item()
        print("done", y == ((x * 2 + 1).sin() * x).sum().item(), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done True" in proc.stdout


# -- item 10: the runtime leaves the program's thread count alone -----------------------

def test_thread_count_and_losses_stay_the_programs_while_a_compile_is_in_flight(monkeypatch):
    from adaptive_eager.runtime import compile_worker

    release = threading.Event()

    def stuck_in_worker(gm, example_inputs):
        release.wait(60)                 # a compile in flight in the worker process
        raise compile_worker.CompileError("abandoned by the test")

    monkeypatch.setattr(compile_worker, "compile_in_worker", stuck_in_worker)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    n = torch.get_num_threads()
    torch.set_num_threads(2)

    def train(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                    torch.nn.Linear(512, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(256, 256)
        losses, threads = [], []
        with ctx:
            for _ in range(6):
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
                threads.append(torch.get_num_threads())
        return losses, threads

    import contextlib
    try:
        expected = train(contextlib.nullcontext())
        got = train(ae.adaptive_eager(backend="inductor", compile_after=1))
        assert ae.stats().compiles_in_flight >= 1 or ae.stats().compile_failures >= 1
    finally:
        release.set()
        torch.set_num_threads(n)
    assert got[1] == [2] * 6
    assert got[0] == expected[0]         # nothing compiled: bit for bit eager's
