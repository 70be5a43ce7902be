"""Interop: torch.compile, other dispatch modes, torch.func, checkpoint, gradcheck."""

from __future__ import annotations

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


@pytest.mark.xfail(strict=True, raises=Exception, reason=(
    "BUG: torch.compile inside the runtime: Dynamo inlines AdaptiveEagerMode."
    "__torch_dispatch__ (the mode opts out of the torch._disable_dynamo wrapper, "
    "_should_skip_dynamo() -> False) and fails with torch._dynamo.exc.Unsupported: "
    "Dynamo does not know how to trace method `split` of class `str` (optable."
    "derive_traits); restoring the wrapper still fails with fullgraph=True"))
def test_torch_compile_inside_context():
    x = torch.randn(4, 8)
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    ref = f(x)
    with ae.adaptive_eager(**OPTS):
        y = torch.ones(4, 8) * x        # a deferred input
        out = compiled(y) + 1
        again = compiled(x)
    torch.testing.assert_close(out, f(torch.ones(4, 8) * x) + 1)
    torch.testing.assert_close(again, ref)


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
