"""Tests for the emulated `neuron` device (adaptive_eager.neuron_sim).

Enabling the emulator renames PrivateUse1 for the whole process and cannot be undone,
so nothing here enables it in the pytest process (other test files must not see a
`neuron` device). Instead:

- the device tests (`@device_test`) run together in ONE child pytest process with
  `_NEURON_SIM_CHILD=1`, started once per session; each of them has a twin in this
  process that reports the child's outcome for that test, so failures stay granular;
- tests about enabling itself (env var, refusals) each need a fresh process and run
  a short script in their own child.

Values and gradients are compared bit for bit with CPU eager (`torch.equal`): the
neuron kernels are the CPU kernels.
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
CHILD = os.environ.get("_NEURON_SIM_CHILD") == "1"
N = "neuron"

_DEVICE_TESTS: dict[str, Callable[[], None]] = {}


def device_test(fn: Callable[[], None]) -> Callable[[], None]:
    """Register a test that needs the emulator enabled (runs in the child process)."""
    _DEVICE_TESTS[fn.__name__] = fn
    return fn


def _child_env(extra_path: str = "", **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in (str(REPO_ROOT), extra_path, env.get("PYTHONPATH", "")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("ADAPTIVE_EAGER_NEURON_SIM", None)
    env.update(extra)
    return env


# ---- device tests (run in the child) ----------------------------------------------


@device_test
def test_factories_make_neuron_tensors():
    torch.manual_seed(0)
    made = {
        "zeros": (torch.zeros(2, 3, device=N), torch.zeros(2, 3)),
        "ones_int": (torch.ones(4, dtype=torch.int64, device=N), torch.ones(4, dtype=torch.int64)),
        "full": (torch.full((2,), 7.5, device=N), torch.full((2,), 7.5)),
        "arange": (torch.arange(5, device=N), torch.arange(5)),
        "eye": (torch.eye(3, device=N), torch.eye(3)),
        "tensor": (torch.tensor([[1, 2], [3, 4]], device=N), torch.tensor([[1, 2], [3, 4]])),
    }
    for name, (n, c) in made.items():
        assert n.device == torch.device("neuron", 0), name
        assert n.is_neuron and not n.is_cpu, name
        assert torch.equal(n.cpu(), c), name
    assert torch.empty(2, 2, device="neuron:0").shape == (2, 2)
    torch.manual_seed(3)
    r = torch.randn(5, device=N)
    torch.manual_seed(3)
    assert torch.equal(r.cpu(), torch.randn(5)), "neuron RNG draws from the CPU generator"


@device_test
def test_to_and_cpu_round_trip():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool):
        c = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
        n = c.to(N)
        assert n.device.type == N and n.dtype == dtype
        assert torch.equal(n.cpu(), c)
    c = torch.randn(4, 6).t()  # non-contiguous
    assert torch.equal(c.to(N).cpu(), c)
    assert torch.equal(c.to(N).to(torch.float64).cpu(), c.double())
    assert torch.equal(c.neuron().cpu(), c)


@device_test
def test_module_to_neuron_and_back():
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    ref = copy.deepcopy(m)
    m.to(N)
    assert all(p.device.type == N for p in m.parameters())
    m.cpu()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert p.device.type == "cpu" and torch.equal(p, q)


@device_test
def test_printing_shows_neuron_device():
    text = repr(torch.tensor([1.5, 2.0], device=N, requires_grad=True))
    assert "device='neuron:0'" in text and "1.5000" in text and "requires_grad=True" in text
    assert "device='neuron:0'" in repr(torch.ones(0, device=N))
    assert "[0.5, 0.5]" in str(torch.full((2,), 0.5, device=N).tolist())
    assert torch.ones((), device=N).item() == 1.0


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.emb(idx)))
        h = F.dropout(self.norm(h), p=0.2, training=self.training)
        logits = self.fc2(h) @ torch.eye(5, device=h.device)
        aux = logits.softmax(dim=-1).pow(2).mean()
        return F.cross_entropy(logits, target) + aux


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 11, (6,), generator=g), torch.randint(0, 5, (6,), generator=g)


@device_test
def test_autograd_grads_equal_cpu_eager():
    torch.manual_seed(0)
    cpu_net = _Net()
    neuron_net = copy.deepcopy(cpu_net).to(N)
    idx, target = _data()
    torch.manual_seed(5)
    cpu_loss = cpu_net(idx, target)
    cpu_loss.backward()
    torch.manual_seed(5)
    neuron_loss = neuron_net(idx.to(N), target.to(N))
    neuron_loss.backward()
    assert neuron_loss.device.type == N
    assert torch.equal(neuron_loss.cpu(), cpu_loss.detach())
    for (name, p), q in zip(cpu_net.named_parameters(), neuron_net.parameters()):
        assert q.grad is not None and q.grad.device.type == N, name
        assert torch.equal(q.grad.cpu(), p.grad), name


@device_test
def test_dropout_masks_equal_cpu():
    x = torch.randn(1000)
    torch.manual_seed(7)
    cpu = F.dropout(x, 0.3)
    torch.manual_seed(7)
    neuron = F.dropout(x.to(N), 0.3)
    assert torch.equal(neuron.cpu(), cpu)


def _make_optimizer(name: str, params: object) -> torch.optim.Optimizer:
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    if name == "adamw_foreach":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=True)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=False)


def _check_optimizer_steps_equal_cpu(name: str) -> None:
    torch.manual_seed(0)
    cpu_net = _Net()
    neuron_net = copy.deepcopy(cpu_net).to(N)
    cpu_opt = _make_optimizer(name, cpu_net.parameters())
    neuron_opt = _make_optimizer(name, neuron_net.parameters())
    idx, target = _data()
    for step in range(3):
        for net, opt, device in ((cpu_net, cpu_opt, "cpu"), (neuron_net, neuron_opt, N)):
            torch.manual_seed(step)
            opt.zero_grad()
            net(idx.to(device), target.to(device)).backward()
            opt.step()
    for (pname, p), q in zip(cpu_net.named_parameters(), neuron_net.parameters()):
        assert q.device.type == N
        assert torch.equal(q.detach().cpu(), p.detach()), f"{name}: {pname}"


@device_test
def test_sgd_momentum_step_equals_cpu():
    _check_optimizer_steps_equal_cpu("sgd_momentum")


@device_test
def test_adamw_foreach_step_equals_cpu():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(2, device=N)]
    assert _default_to_fused_or_foreach(params, False, False) == (False, True)
    _check_optimizer_steps_equal_cpu("adamw_foreach")


@device_test
def test_adamw_for_loop_step_equals_cpu():
    _check_optimizer_steps_equal_cpu("adamw_for_loop")


@device_test
def test_views_and_inplace_alias():
    x = torch.zeros(2, 3, device=N)
    a = x[0]
    a.add_(1)
    assert torch.equal(x.cpu(), torch.tensor([[1.0, 1, 1], [0, 0, 0]]))
    x.t()[2].mul_(5)  # a strided view of a view
    assert torch.equal(x.cpu(), torch.tensor([[1.0, 1, 5], [0, 0, 0]]))
    x.view(6)[4] = 7.0  # __setitem__ on a view
    assert x[1, 1].item() == 7.0
    assert a._base is x and a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert x.view(torch.int32).device.type == N  # dtype view
    version = x._version
    a.zero_()
    assert x._version > version, "views share the version counter"
    w = torch.ones(3, device=N, requires_grad=True)
    y = w * 2
    saved = y.sin()  # sin saves its input
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


@device_test
def test_out_variant_resizes_out():
    x = torch.arange(6.0, device=N).reshape(2, 3)
    out = torch.empty(0, device=N)
    result = torch.add(x, x, out=out)
    assert result is out and out.shape == (2, 3)
    assert torch.equal(out.cpu(), torch.arange(6.0).reshape(2, 3) * 2)
    grown = torch.ones(2, device=N).resize_(5)
    assert grown.shape == (5,) and grown[:2].cpu().tolist() == [1.0, 1.0]


@device_test
def test_mixed_devices_raise_like_eager():
    n = torch.ones(2, 3, device=N)
    c = torch.ones(2, 3)
    for fn in (lambda: n + c, lambda: c + n, lambda: n @ c.t(), lambda: n.add_(c),
               lambda: torch.add(n, n, out=torch.empty(2, 3))):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fn()
    assert torch.equal((n * torch.tensor(3.0)).cpu(), c * 3)  # 0-dim CPU scalars are fine
    n.copy_(c * 4)  # copies across devices are fine
    assert torch.equal(n.cpu(), c * 4)
    assert torch.equal(n[torch.tensor([1, 0])].cpu(), (c * 4)[[1, 0]])  # CPU index tensor


@device_test
def test_device_queries():
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device(N)
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.ones(2).to("neuron:1")


@device_test
def test_launch_counting():
    import adaptive_eager.neuron_sim as ns

    x = torch.ones(4, device=N)  # empty (free) + fill_ (1)
    ns.reset_launch_count()
    y = x * 2 + 1  # mul, add
    assert ns.launch_count() == 2
    ns.reset_launch_count()
    _ = (x[0], x.view(2, 2), x.t(), torch.empty(3, device=N))  # views, allocation
    assert ns.launch_count() == 0
    ns.reset_launch_count()
    with ns.single_launch():
        z = (y * 3).relu().sum()
        with ns.single_launch():
            z = z + 1
    assert ns.launch_count() == 1
    y.cpu()  # a device-to-host copy is a launch
    assert ns.launch_count() == 2
    assert ns.reset_launch_count() == 2 and ns.launch_count() == 0


@device_test
def test_launch_latency_is_paid_per_launch(monkeypatch):
    import adaptive_eager.neuron_sim as ns
    from adaptive_eager.neuron_sim import _launch

    waits: list[int] = []
    monkeypatch.setattr(_launch, "_busy_wait", waits.append)
    x = torch.ones(4, device=N)
    # Synchronous launches: each busy-waits its latency on the host.
    ns.enable(launch_latency_us=25, async_launch=False)  # idempotent; sets the launch model
    try:
        assert ns.launch_latency_us() == 25.0 and not ns.async_launch()
        x = x + 1
        x = x * 2
        with ns.single_launch():
            x = x.exp().neg()
        assert waits == [25_000, 25_000, 25_000]
        assert ns.queue_depth() == 0
    finally:
        ns.set_launch_latency_us(0)
        ns.set_async_launch(True)
    with pytest.raises(ValueError):
        ns.set_launch_latency_us(-1)


def _enqueue_adds(x: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
    import time

    start = time.perf_counter()
    for _ in range(n):
        x = x + 1
    return x, time.perf_counter() - start


def _run_ahead(latency_us: float, n: int) -> dict:
    """Enqueue ``n`` adds at ``latency_us`` asynchronous launches, then synchronize():
    the enqueue's wall and CPU time, the queue depth after it, the total, the device time."""
    import time

    import adaptive_eager.neuron_sim as ns

    x = torch.zeros(8, device=N)
    _enqueue_adds(x, 20)  # the add's first-call set-up, off the clock
    ns.enable(launch_latency_us=latency_us)
    try:
        torch.neuron.synchronize()
        start, cpu_start = time.perf_counter(), time.thread_time()
        y, enqueue_s = _enqueue_adds(x, n)
        enqueue_cpu_s = time.thread_time() - cpu_start
        depth = ns.queue_depth()
        torch.neuron.synchronize()
        total_s = time.perf_counter() - start
        assert ns.queue_depth() == 0
    finally:
        ns.set_launch_latency_us(0)
    assert torch.equal(y.cpu(), torch.full((8,), float(n)))  # values as eager's
    return {"enqueue_s": enqueue_s, "enqueue_cpu_s": enqueue_cpu_s, "depth": depth,
            "total_s": total_s, "device_s": n * latency_us / 1e6}


@device_test
def test_async_launches_run_ahead_and_synchronize_waits():
    import adaptive_eager.neuron_sim as ns

    assert ns.async_launch(), "asynchronous launches are the default"
    # 1 ms launches: far above the emulator's own host cost
    r = _run_ahead(1000.0, 200)
    # The host enqueued 200 launches in well under their device time and returned
    # with launches still queued; synchronize() waited for the rest.
    assert r["enqueue_s"] < 0.5 * r["device_s"], r
    assert r["depth"] > 0
    assert r["total_s"] >= r["device_s"], r


@device_test
def test_200_tiny_ops_enqueue_under_their_device_time():
    """Issue 25: 200 tiny ops at launches a few times the emulator's own host cost enqueue
    in well under their device time, and synchronize() waits for the rest. The host's
    time is its thread's CPU time (the emulator's Python fallback: 30-40 µs an op on the
    2-core box at load 5, 50-60 µs on a slower VM, 88 µs once in a full suite run there,
    which failed a bound set at 100 µs launches: 17.7 ms against 15). So the launches
    are 250 µs (device 50 ms, bound 37.5 ms): the claim (the host runs ahead of the
    device) does not depend on the machine's speed; what launches of a given latency cost
    a program is the benchmark's (``python -m benchmarks --workloads neuron-sim
    --launch-latency-us 100``), not a test's."""
    r = _run_ahead(250.0, 200)
    assert r["enqueue_cpu_s"] < 0.75 * r["device_s"], r
    if r["enqueue_s"] < 0.9 * r["device_s"]:  # the host ran ahead: launches were still queued
        assert r["depth"] > 0, r
    assert r["total_s"] >= r["device_s"], r  # synchronize() waited for the rest


@device_test
def test_host_reads_wait_for_the_device():
    import time

    import adaptive_eager.neuron_sim as ns

    latency_us, n = 1000.0, 100
    x = torch.zeros(4, device=N)
    reads = {
        "item": lambda t: t.sum().item(),
        "cpu": lambda t: t.cpu(),
        "tolist": lambda t: t.tolist(),
        "print": lambda t: repr(t),
        "nonzero": lambda t: t.nonzero(),
        "synchronize": lambda t: torch.neuron.synchronize(),
    }
    ns.enable(launch_latency_us=latency_us)
    try:
        for name, read in reads.items():
            torch.neuron.synchronize()
            start = time.perf_counter()
            y, _ = _enqueue_adds(x, n)
            value = read(y)
            elapsed = time.perf_counter() - start
            assert ns.queue_depth() == 0, name
            assert elapsed >= n * latency_us / 1e6, (name, elapsed)
    finally:
        ns.set_launch_latency_us(0)
    assert value is None and torch.equal(y.cpu(), torch.full((4,), float(n)))
    # A copy to the device does not wait for the device.
    ns.enable(launch_latency_us=latency_us)
    try:
        torch.neuron.synchronize()
        y, _ = _enqueue_adds(x, 20)
        _ = torch.ones(4).to(N)
        assert ns.queue_depth() > 0
        torch.neuron.synchronize()
    finally:
        ns.set_launch_latency_us(0)


@device_test
def test_async_queue_is_bounded():
    import adaptive_eager.neuron_sim as ns
    from adaptive_eager.neuron_sim import _launch

    ns.enable(launch_latency_us=50)
    try:
        for _ in range(_launch.MAX_QUEUE_DEPTH + 50):
            _launch.record_launch()
        assert ns.queue_depth() <= _launch.MAX_QUEUE_DEPTH
        ns.wait_for_device()
        assert ns.queue_depth() == 0
    finally:
        ns.set_launch_latency_us(0)
    with pytest.raises(TypeError):
        ns.set_async_launch("yes")


@device_test
def test_cpu_view_and_from_cpu_share_memory():
    import adaptive_eager.neuron_sim as ns

    n = torch.zeros(2, 3, device=N)
    view = ns.to_cpu_view(n.t())
    assert view.device.type == "cpu" and view.shape == (3, 2) and view.stride() == (1, 3)
    view[0, 1] = 5.0
    assert n[1, 0].item() == 5.0
    c = torch.arange(4.0)
    m = ns.from_cpu(c)
    assert m.device.type == N and m.data_ptr() == c.data_ptr()
    m.add_(1)
    assert c.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError):
        ns.to_cpu_view(c)
    with pytest.raises(ValueError):
        ns.from_cpu(n)


@device_test
def test_deepcopy_save_load_and_storages():
    net = nn.Linear(3, 2).to(N)
    clone = copy.deepcopy(net)
    assert clone.weight.device.type == N and torch.equal(clone.weight.cpu(), net.weight.cpu())
    assert clone.weight.data_ptr() != net.weight.data_ptr()
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["weight"].device.type == N
    assert torch.equal(loaded["weight"].cpu(), net.weight.detach().cpu())
    buffer.seek(0)
    assert torch.load(buffer, map_location="cpu")["bias"].device.type == "cpu"
    assert torch.UntypedStorage(8, device=N).device.type == N  # no null-allocator crash
    assert torch.ones(2).untyped_storage().neuron().device.type == N


@device_test
def test_conjugate_and_negative_views():
    c = torch.tensor([1 + 2j, 3 - 1j])
    n = c.to(N)
    assert torch.equal(n.conj().cpu(), c.conj().resolve_conj())
    assert torch.equal(n.conj().clone().cpu(), c.conj().clone().resolve_conj())
    assert torch.equal((n.conj() + 1).cpu(), c.conj() + 1)
    assert torch.equal((n.conj()[None] @ n[:, None]).cpu(), c.conj()[None] @ c[:, None])
    assert torch.equal(torch._neg_view(n).cpu(), -c)


@device_test
def test_copies_to_cpu():
    n = torch.arange(6.0, device=N).reshape(2, 3)
    assert torch.equal(n.to("cpu", non_blocking=True), torch.arange(6.0).reshape(2, 3))
    assert n.t().cpu().stride() == (1, 3)  # preserve_format keeps the layout
    assert n.to(N) is n and n.to(torch.int32).dtype == torch.int32


@device_test
def test_conv2d_forward_backward_equal_cpu():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(2, 2, 5, 5)
    conv(x).square().sum().backward()
    neuron_conv = copy.deepcopy(conv).to(N)
    neuron_conv.zero_grad()
    out = neuron_conv(x.to(N))
    out.square().sum().backward()
    assert torch.equal(out.cpu(), conv(x).detach())
    assert torch.equal(neuron_conv.weight.grad.cpu(), conv.weight.grad)


# ---- enabling: each needs a fresh process --------------------------------------------

_FAKE_TORCH_NEURONX = "raise ImportError('fake torch_neuronx: never imported')\n"

_ENABLE_SCRIPTS: dict[str, str] = {
    "import_and_env_var": """
        import os, torch
        import adaptive_eager.neuron_sim as ns
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        assert not hasattr(torch, "neuron") and not ns.is_enabled()
        assert ns.maybe_enable_from_env() is False          # variable unset
        os.environ[ns.ENV_VAR] = "0"
        assert ns.maybe_enable_from_env() is False
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        os.environ[ns.ENV_VAR] = "1"
        assert ns.maybe_enable_from_env() is True
        assert ns.is_enabled() and torch.neuron.is_available()
        ns.enable(); ns.enable()                             # idempotent
        assert torch.ones(2, device="neuron").device.type == "neuron"
        assert ns.launch_latency_us() == 0.0 and ns.async_launch()
        os.environ[ns.LATENCY_ENV_VAR] = "50"
        os.environ[ns.ASYNC_ENV_VAR] = "0"
        assert ns.maybe_enable_from_env() is True
        assert ns.launch_latency_us() == 50.0 and not ns.async_launch()
        os.environ[ns.LATENCY_ENV_VAR] = "-3"                # logged and ignored
        os.environ[ns.ASYNC_ENV_VAR] = "1"
        assert ns.maybe_enable_from_env() is True
        assert ns.launch_latency_us() == 50.0 and ns.async_launch()
        from adaptive_eager import config
        config.env_overrides()  # the emulator's variables are switches, not unknown options
        print("OK")
    """,
    # Both refusals in one process (each torch import costs seconds): first with a
    # fake torch_neuronx importable, then without it but with PrivateUse1 taken.
    "refusals": """
        import importlib, os, sys, torch
        import adaptive_eager.neuron_sim as ns
        try:
            ns.enable()
        except RuntimeError as e:
            assert "torch_neuronx" in str(e), e
        else:
            raise AssertionError("enable() did not refuse with torch_neuronx installed")
        os.environ[ns.ENV_VAR] = "1"
        assert ns.maybe_enable_from_env() is False           # logs, never raises
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        sys.path[:] = [p for p in sys.path if "fake_site" not in p]
        importlib.invalidate_caches()
        assert importlib.util.find_spec("torch_neuronx") is None
        torch.utils.rename_privateuse1_backend("otherdev")
        try:
            ns.enable()
        except RuntimeError as e:
            assert "otherdev" in str(e), e
        else:
            raise AssertionError("enable() did not refuse with PrivateUse1 taken")
        assert not ns.is_enabled()
        print("OK")
    """,
}


@pytest.fixture(scope="session")
def children(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.Popen[str]]:
    """Start every child process at once (the device tests' pytest and the scripts).

    They run concurrently; each test waits only for its own child.
    """
    tmp = tmp_path_factory.mktemp("neuron_sim")
    fake_site = tmp / "fake_site"
    (fake_site / "torch_neuronx").mkdir(parents=True)
    (fake_site / "torch_neuronx" / "__init__.py").write_text(_FAKE_TORCH_NEURONX)
    report = tmp / "child.xml"
    procs = {
        "device_tests": subprocess.Popen(
            [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", "--rootdir", str(REPO_ROOT)],
            env=_child_env(_NEURON_SIM_CHILD="1"),
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    }
    for name, script in _ENABLE_SCRIPTS.items():
        extra_path = str(fake_site) if name == "refusals" else ""
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)],
            env=_child_env(extra_path),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    procs["device_tests"].report = report  # type: ignore[attr-defined]
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _script_output(children: dict[str, subprocess.Popen[str]], name: str) -> str:
    output, _ = children[name].communicate(timeout=240)
    assert children[name].returncode == 0 and "OK" in output, output
    return output


@pytest.fixture(scope="session")
def child_results(children: dict[str, subprocess.Popen[str]]) -> dict[str, str | None]:
    """Outcomes of the device tests in the child: test name -> failure text or None."""
    proc = children["device_tests"]
    output, _ = proc.communicate(timeout=240)
    report: Path = proc.report  # type: ignore[attr-defined]
    if not report.exists():
        pytest.fail(f"child pytest produced no report:\n{output}")
    results: dict[str, str | None] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [el for el in case if el.tag in ("failure", "error", "skipped")]
        results[case.get("name", "")] = (
            "\n".join(f"{el.tag}: {el.get('message')}\n{el.text or ''}" for el in problems)
            if problems else None
        )
    return results


def _make_twin(name: str) -> Callable[[dict[str, str | None]], None]:
    def twin(child_results: dict[str, str | None]) -> None:
        assert name in child_results, f"{name} did not run in the child process"
        failure = child_results[name]
        if failure is not None:
            pytest.fail(f"{name} failed in the neuron child process:\n{failure}", pytrace=False)

    twin.__name__ = name
    return twin


if CHILD:
    import adaptive_eager.neuron_sim as _neuron_sim

    _neuron_sim.enable()
    globals().update(_DEVICE_TESTS)
else:
    globals().update({name: _make_twin(name) for name in _DEVICE_TESTS})

    def test_import_has_no_side_effects_and_env_var_enables(children):
        _script_output(children, "import_and_env_var")

    def test_refuses_when_torch_neuronx_is_installed_or_privateuse1_is_taken(children):
        _script_output(children, "refusals")
