"""A fused optimizer step under a learning-rate schedule: its window recurs and compiles.

``torch.optim.AdamW(fused=True)`` (the Hugging Face Trainer's default) is one op whose
``lr`` is a Python float a schedule changes every step; keyed by value, the window holding
it never recurred (Note [A fused optimizer's learning rate is lifted, and the op runs
eagerly], fusion/scalars.py). Issue 27: the Trainer's step.
"""

from __future__ import annotations

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.fusion.ir import OpNode
from adaptive_eager.fusion.policy import OpSupport
from adaptive_eager.fusion.signature import window_key
from adaptive_eager.runtime import register_backend
from helpers import decomposing

aten = torch.ops.aten
STEPS = 8
# never demoted for speed: the assertions must not depend on the machine's load
register_backend("test_step_float", decomposing, OpSupport(factories=False), debugging=True)
OPTS = dict(backend="test_step_float", async_compile=False, adaptive_passthrough=False,
            warmup=False)


def _train(fused: bool) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / (2 * STEPS))
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def _fresh_sessions():
    session.clear_sessions()
    yield
    session.clear_sessions()


def test_a_scheduled_fused_adamw_step_recurs_compiles_and_equals_eager():
    ref_losses, ref_params = _train(fused=True)
    session.counters().reset()
    with ae.adaptive_eager(**OPTS):
        losses, params = _train(fused=True)
    s = ae.stats()
    # compiled regions round as Inductor's decompositions do (README Limitations: ~1e-5)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params, ref_params, rtol=1e-5, atol=1e-6)
    assert s.fallback_reasons.get("aten::_fused_adamw_") == ("step_float",)
    # the step's window recurs although lr changed every step: its regions compiled
    # (before: a new window every step, nothing compiled)
    assert s.compiled_calls >= STEPS - 4, s.compiled_calls
    assert s.compile_failures == 0
    assert s.fused_share > 0.4, s.fused_share


def test_the_learning_rate_is_out_of_the_key_and_runs_eagerly():
    def node(lr: float) -> OpNode:
        return OpNode(aten._fused_adamw_.default, ((), (), (), (), (), ()),
                      (("lr", lr), ("beta1", 0.9), ("beta2", 0.999), ("weight_decay", 0.0),
                       ("eps", 1e-8), ("amsgrad", False), ("maximize", False)), ())

    from adaptive_eager.fusion.ir import Window
    from adaptive_eager.fusion.scalars import runs_eagerly

    def key(lr: float):
        return window_key(Window({}, (node(lr),), {}, frozenset()), {})

    (k1, f1), (k2, f2) = key(1e-3), key(5e-4)
    assert k1 == k2 and (f1, f2) == ([1e-3], [5e-4])
    assert runs_eagerly(node(1e-3), {})
    # other floats stay in the key: a new beta is a new window
    other = OpNode(aten._fused_adamw_.default, node(1e-3).args,
                   (("lr", 1e-3), ("beta1", 0.8)) + node(1e-3).kwargs[2:], ())
    assert window_key(Window({}, (other,), {}, frozenset()), {})[0] != k1
