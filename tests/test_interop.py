"""Interop: torch.compile, other dispatch modes, torch.func, checkpoint, gradcheck."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor

OPTS = dict(backend="eager")

@pytest.fixture(autouse=True)
def _fresh_sessions():
    # Sessions (and their pass-through policy) are shared per options across tests:
    # start each test with fresh ones so an earlier test's history does not decide
    # whether this one defers.
    session.clear_sessions()
    yield


def f(x):
    return (x.sin() * 2 + x.cos()).sum(-1)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_torch_compile_inside_context(fullgraph):
    # Note [torch.compile inside the block]: Dynamo compiles the function (it is not
    # skipped for our mode), its pending input is flushed and released first, and its
    # compiled code runs on real tensors.
    torch._dynamo.reset()
    x = torch.randn(4, 8)
    compiled = torch.compile(f, backend="eager", fullgraph=fullgraph)
    ref = f(x)
    with ae.adaptive_eager(**OPTS):
        y = torch.ones(4, 8) * x        # a deferred input
        out = compiled(y) + 1
        again = compiled(x)
        stats = ae.stats()
    torch.testing.assert_close(out, f(torch.ones(4, 8) * x) + 1)
    torch.testing.assert_close(again, ref)
    assert stats.flushes.get("torch.compile", 0) >= 1
    assert type(y) is torch.Tensor      # released before Dynamo saw it


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _train_compiled(backend: str, steps: int, inside: bool) -> list[float]:
    torch._dynamo.reset()
    model = _mlp()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    losses = []
    ctx = ae.adaptive_eager(**OPTS) if inside else contextlib.nullcontext()
    with ctx:
        for _ in range(steps):
            h = x * 2                                # pending when the runtime is on
            loss = compiled(h).tanh().pow(2).mean()  # eager ops on a compiled output
            loss.backward()                          # compiled backward gets a handle
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("backend, steps, rel", [
    # aot_eager: AOTAutograd's runtime wrappers and compiled backward, cheaply.
    ("aot_eager", 3, 1e-6),
    # Inductor's compiled code writes into buffers it allocates and calls extern kernels
    # (addmm.out) through the dispatcher: deferring those would read stale buffers, so
    # the runtime steps aside for compiled code.
    pytest.param("inductor", 2, 1e-5, marks=pytest.mark.inductor),
])
def test_torch_compiled_module_trains_inside_context(backend, steps, rel):
    ref_losses, ref_params = _train_compiled(backend, steps, inside=False)
    losses, params = _train_compiled(backend, steps, inside=True)
    assert losses == pytest.approx(ref_losses, rel=rel)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q)


def test_dynamo_disabled_function_inside_context_still_defers():
    # Stepping aside is for compiled code only: a program that never called a
    # compiled function keeps deferring inside torch._dynamo.disable'd code.
    @torch._dynamo.disable
    def g(t):
        return t.sin() + 1

    session.clear_sessions()
    with ae.adaptive_eager(**OPTS):
        out = g(torch.ones(3))
        deferred = type(out) is LazyTensor
        value = out.tolist()
    assert deferred
    assert value == pytest.approx((torch.ones(3).sin() + 1).tolist())


class LoggingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_logging_mode_outside_runtime_sees_ops():
    log = LoggingMode()
    x = torch.randn(3)
    with log, ae.adaptive_eager(**OPTS):
        y = (x * 2).sum()
        assert y.item() == pytest.approx(float((x * 2).sum()))
    assert torch.ops.aten.mul.Tensor in log.ops
    assert _get_current_dispatch_mode_stack() == []


def test_logging_mode_inside_runtime_sees_real_tensors():
    log = LoggingMode()
    x = torch.randn(3)
    with ae.adaptive_eager(**OPTS), log:
        y = (x * 2).sum()
        value = y.item()
    assert value == pytest.approx(float((x * 2).sum()))
    assert torch.ops.aten.mul.Tensor in log.ops
    assert _get_current_dispatch_mode_stack() == []


def test_flop_counter_both_orders():
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    expected = 2 * 8 * 16 * 4
    fc = FlopCounterMode(display=False)
    with fc, ae.adaptive_eager(**OPTS):
        out1 = (a @ b).sum().item()
    assert fc.get_total_flops() == expected
    fc2 = FlopCounterMode(display=False)
    with ae.adaptive_eager(**OPTS), fc2:
        out2 = (a @ b).sum().item()
    assert fc2.get_total_flops() == expected
    assert out1 == pytest.approx(out2)


def test_fake_tensor_mode_inside_runtime():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with ae.adaptive_eager(**OPTS), FakeTensorMode():
        y = torch.empty(4, 3) @ torch.empty(3, 2)
        assert y.shape == (4, 2) and isinstance(y, FakeTensor)
    # Deferred work around a fake region keeps eager's values (Note [Fake tensors are not ours]).
    with ae.adaptive_eager(**OPTS):
        a = torch.ones(3) * 2
        with FakeTensorMode():
            z = torch.empty(2, 2).sin()
            assert isinstance(z, FakeTensor)
        b = a + 1
    assert b.tolist() == [3.0, 3.0, 3.0]


def test_fake_tensor_mode_outside_runtime():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fm, ae.adaptive_eager(**OPTS):
        x = fm.from_tensor(torch.randn(4, 3))
        z = (x * 2).sum(0)
        assert z.shape == (3,)
    assert _get_current_dispatch_mode_stack() == []


def test_torch_func_grad_and_vmap():
    x = torch.randn(5)
    g_ref = torch.func.grad(lambda t: f(t.unsqueeze(0)).sum())(x)
    v_ref = torch.func.vmap(f)(torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0)))
    with ae.adaptive_eager(**OPTS):
        g = torch.func.grad(lambda t: f(t.unsqueeze(0)).sum())(x)
        v = torch.func.vmap(f)(torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(v, v_ref)


def test_checkpoint():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def run():
        lin.zero_grad()
        x.grad = None
        out = checkpoint(lambda t: torch.tanh(lin(t)).square(), x, use_reentrant=False).sum()
        out.backward()
        return out.detach().clone(), x.grad.clone(), lin.weight.grad.clone()

    ref = run()
    with ae.adaptive_eager(**OPTS):
        got = run()
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)


def test_gradcheck_float64():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    with ae.adaptive_eager(**OPTS):
        assert torch.autograd.gradcheck(lambda a, b: torch.tanh(a @ b).sin(), (x, w))
