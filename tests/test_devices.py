"""The capture core and the fusion pipeline on every target device: cpu, the emulated
neuron device (PrivateUse1 renamed "neuron", data in CPU memory) and cuda where a GPU
is present (the cuda cases are collected everywhere and skipped without one;
scripts/gpu-check runs them on a GPU machine).

Each test runs a program eagerly and under adaptive eager on the same device and
compares values, gradients and random streams; structural tests check that neuron
ops (and only they) are deferred and that a fused region is one simulated launch.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_eager as ae
from adaptive_eager import neuron_sim, session
from adaptive_eager.dispatch import LazyTensor

from test_training import MODELS, OPTIMS, _data, train

DEVICES = ["cpu", "neuron", "cuda"]
_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(params=[pytest.param(d, marks=_NO_CUDA) if d == "cuda" else d for d in DEVICES])
def device(request):
    if request.param == "neuron":
        neuron_sim.enable()
    return request.param


def opts(device, **kw):
    return {"device": device, "backend": "eager", "adaptive_passthrough": False, **kw}


def to(obj, device):
    return obj.to(device) if isinstance(obj, (torch.Tensor, nn.Module)) else obj


@pytest.mark.parametrize("kind", ["mlp", "block"])  # manual_attention builds a CPU mask
@pytest.mark.parametrize("optim", ["adamw", "adamw_foreach", "sgd_momentum"])
def test_training_matches_eager_on_device(device, kind, optim):
    torch.manual_seed(0)
    m_e = MODELS[kind]().to(device)
    m_a = copy.deepcopy(m_e)
    x, y = (t.to(device) for t in _data(kind))
    opt_e, opt_a = OPTIMS[optim](m_e.parameters()), OPTIMS[optim](m_a.parameters())
    masks_e: list = []
    masks_a: list = []
    torch.manual_seed(42)
    losses_e = train(m_e, opt_e, x, y, masks=masks_e)
    torch.manual_seed(42)
    with ae.adaptive_eager(**opts(device)):
        losses_a = train(m_a, opt_a, x, y, masks=masks_a)
    assert session.counters().ops_captured > 0
    torch.testing.assert_close(losses_a, losses_e)
    for me, ma in zip(masks_e, masks_a):
        assert torch.equal(me.cpu(), ma.cpu()), "dropout masks differ"
    for pe, pa in zip(m_e.parameters(), m_a.parameters()):
        assert pa.device.type == device
        torch.testing.assert_close(pa.cpu(), pe.cpu())
        torch.testing.assert_close(pa.grad.cpu(), pe.grad.cpu())


_UNARY = [torch.sin, torch.exp, torch.tanh, F.gelu, F.silu, torch.sigmoid, lambda t: t * 1.5,
          lambda t: t.relu(), lambda t: t.t(), lambda t: t.sum(0, keepdim=True).expand_as(t),
          lambda t: t.softmax(-1), lambda t: t[1:].sum() + t]
_BINARY = [torch.add, torch.mul, torch.sub, torch.maximum, lambda a, b: a @ b,
           lambda a, b: torch.where(a > b, a, b)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(st.tuples(st.booleans(), st.integers(0, 11), st.integers(0, 5),
                                  st.integers(0, 3), st.integers(0, 3)), min_size=2, max_size=10),
       inplace=st.booleans())
def test_random_programs_match_eager_on_device(device, program, inplace):
    def run(xs):
        env = list(xs)
        for unary, u, b, i, j in program:
            a = env[i % len(env)]
            out = _UNARY[u](a) if unary else _BINARY[b](a, env[j % len(env)])
            env.append(out)
        acc = torch.zeros_like(env[0]).detach()
        if inplace:
            acc.add_(env[-1].detach()).mul_(0.5)
        return torch.stack([e.sum() for e in env]).sum(), acc

    torch.manual_seed(0)
    base = [torch.randn(4, 4) for _ in range(2)]
    xe = [b.clone().to(device).requires_grad_(k == 1) for k, b in enumerate(base)]
    xa = [b.clone().to(device).requires_grad_(k == 1) for k, b in enumerate(base)]
    xe[0] = xe[0].detach()
    xa[0] = xa[0].detach()
    out_e, first_e = run(xe)
    out_e.backward()
    with ae.adaptive_eager(**opts(device)):
        out_a, first_a = run(xa)
        out_a.backward()
    torch.testing.assert_close(out_a.cpu(), out_e.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(first_a.cpu(), first_e.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xa[1].grad.cpu(), xe[1].grad.cpu(), rtol=1e-4, atol=1e-4)


def test_views_inplace_and_rng_on_device(device):
    def program():
        x = torch.zeros(3, 4, device=device)
        v = x[1]
        v.add_(1)                      # through a view: changes x
        r = torch.rand(3, 4, device=device)
        x.mul_(r)
        d = F.dropout(torch.ones(64, device=device), 0.5)
        return x, r, d

    torch.manual_seed(7)
    expected = program()
    torch.manual_seed(7)
    with ae.adaptive_eager(**opts(device)):
        got = program()
        assert isinstance(got[0], LazyTensor) or got[0].device.type == device
    for e, a in zip(expected, got):
        assert torch.equal(a.cpu(), e.cpu())


def test_only_target_device_ops_are_deferred(device):
    other = "meta" if device == "cpu" else "cpu"
    with ae.adaptive_eager(**opts(device)):
        a = torch.ones(3, device=other) * 2          # other device: runs for real
        b = torch.ones(3, device=device) * 2          # target device: deferred
        assert not isinstance(a, LazyTensor)
        assert isinstance(b, LazyTensor) and b._ae_real is None
        assert b.device.type == device


def test_host_device_copies_are_syncs_on_neuron():
    neuron_sim.enable()
    with ae.adaptive_eager(**opts("neuron")):
        x = torch.arange(4.0).to("neuron")            # host -> device: runs for real
        y = (x * 2).cpu()                              # device -> host: flushes first
        assert not isinstance(y, LazyTensor)
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert session.counters().flushes["transfer"] >= 1


def test_mixing_devices_raises_like_eager_on_neuron():
    neuron_sim.enable()
    a = torch.ones(3, device="neuron")
    b = torch.ones(3)
    with pytest.raises(RuntimeError) as eager_err:
        a + b
    with ae.adaptive_eager(**opts("neuron")):
        with pytest.raises(RuntimeError) as ae_err:
            (a * 1) + b
    assert "same device" in str(ae_err.value) and "same device" in str(eager_err.value)


def test_fused_region_is_one_simulated_launch():
    neuron_sim.enable()
    x = torch.randn(64, 64, device="neuron")

    def f(t):
        for _ in range(3):
            t = F.gelu(t * 1.5 + 0.25) * torch.sigmoid(t)
        return t

    expected = f(x)
    neuron_sim.reset_launch_count()
    f(x)
    eager_launches = neuron_sim.launch_count()
    options = opts("neuron", backend="aot_eager", compile_after=1, async_compile=False,
                   min_region_work=0)
    for _ in range(3):  # see, compile and verify, then run compiled
        with ae.adaptive_eager(**options):
            kept = f(x)  # kept alive: the same live outputs as below, so the same window
    del kept
    neuron_sim.reset_launch_count()
    with ae.adaptive_eager(**options):
        got = f(x)
    assert neuron_sim.launch_count() == 1 < eager_launches
    torch.testing.assert_close(got.cpu(), expected.cpu())
    assert ae.stats().ops_fused > 0


def test_device_auto_picks_the_accelerator():
    # Note [device="auto"]: the suite sets ADAPTIVE_EAGER_DEVICE=cpu (conftest); without
    # it, "auto" is the accelerator torch.accelerator reports -- here the emulated neuron
    # device, which pytest_configure registered.
    neuron_sim.enable()
    options = ae.config.resolve(environ={})
    assert options.device_auto and options.device == torch.accelerator.current_accelerator().type
    assert options.device == "neuron"
    assert not ae.config.resolve(environ={}, device="cpu").device_auto
    assert options.replace(window_size=8).device_auto
    x = torch.ones(8, device="neuron")
    with ae.adaptive_eager(device="auto", backend="eager", adaptive_passthrough=False):
        y = x * 2
        assert isinstance(y, LazyTensor)           # neuron ops are deferred
        z = torch.ones(8) * 2
        assert not isinstance(z, LazyTensor)       # cpu ops run eagerly
    assert torch.equal(y.cpu(), z)
    assert "neuron (device=auto" in ae.report()
    with ae.adaptive_eager(backend="eager", adaptive_passthrough=False):
        assert isinstance(torch.ones(8) * 2, LazyTensor)  # the suite's cpu default
    assert "cpu (set by the device option)" in ae.report()


def test_device_auto_is_cpu_without_an_accelerator():
    # A fresh interpreter without the emulator: "auto" is what it was before, the CPU
    # (cuda on a GPU machine).
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if (not k.startswith("ADAPTIVE_EAGER") or k == "ADAPTIVE_EAGER_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", "from adaptive_eager import config; o = config.resolve(); "
                               "print(o.device, o.device_auto)"],
        env=env, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["cuda" if torch.cuda.is_available() else "cpu", "True"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the whole CUDA leg on a GPU machine")
def test_gpu_check_without_a_gpu_says_it_needs_cuda_and_skips():
    """It says it needs CUDA, checks that the cuda cases are collected (they skip here),
    and exits 0 (skipped), or 3 when told a GPU is required."""
    import os
    import re
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"
    assert os.access(script, os.X_OK), f"{script} is not executable"
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIPPED: it needs a CUDA device" in r.stdout, r.stdout
    collected = re.search(r"(\d+) cuda test cases collected", r.stdout)
    assert collected and int(collected.group(1)) >= 9, r.stdout
    assert "passed" not in r.stdout  # no test ran
    r = subprocess.run([str(script), "--require-gpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
