"""Training loops under adaptive eager match plain eager: losses every step, final
parameters and optimizer state, and dropout masks bit for bit (random ops consume
the generator in eager order, Note [RNG]). Parameters and optimizer state are real
tensors updated in place by deferred ops; ``.item()`` on the loss each step is the
observation that flushes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor

from helpers import assert_same, mode

STEPS = 5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


class Block(nn.Module):
    """Pre-norm transformer block: attention (SDPA with dropout) + GELU MLP + LayerNorm."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             dropout_p=0.1 if self.training else 0.0)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        x = x + self.drop(self.mlp(self.ln2(x)))
        return self.head(x)


class ManualAttention(nn.Module):
    """Attention written out (softmax, masked_fill, dropout on the weights)."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        w = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        w = F.dropout(w.masked_fill(mask, float("-inf")).softmax(-1), 0.2, self.training)
        return self.out(self.ln(x + w @ v))


def _data(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    if kind == "block":
        return torch.randn(4, 6, 16, generator=g), torch.randint(0, 5, (4, 6), generator=g)
    return torch.randn(3, 5, 16, generator=g), torch.randint(0, 3, (3, 5), generator=g)


MODELS = {"mlp": MLP, "block": Block, "manual_attention": ManualAttention}
OPTIMS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                              weight_decay=1e-3, foreach=False),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
}


def train(model, opt, x, y, *, block_per_step=None, masks=None):
    losses = []
    if masks is not None:
        def hook(mod, inp, out):
            masks.append(out == 0)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.register_forward_hook(hook)
    for step in range(STEPS):
        ctx = block_per_step() if block_per_step else _null()
        with ctx:
            opt.zero_grad(set_to_none=step % 2 == 0)
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
    return losses


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None


def _setup(kind, optim):
    torch.manual_seed(0)
    model = MODELS[kind]()
    return model, copy.deepcopy(model), OPTIMS[optim]


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("optim", list(OPTIMS))
def test_training_matches_eager(kind, optim):
    m_e, m_a, make_opt = _setup(kind, optim)
    x, y = _data(kind)
    opt_e, opt_a = make_opt(m_e.parameters()), make_opt(m_a.parameters())
    masks_e: list = []
    masks_a: list = []

    torch.manual_seed(42)
    losses_e = train(m_e, opt_e, x, y, masks=masks_e)
    torch.manual_seed(42)
    with mode():
        losses_a = train(m_a, opt_a, x, y, masks=masks_a)

    assert session.counters().ops_captured > 0
    assert sum(session.counters().flushes.values()) >= STEPS
    torch.testing.assert_close(losses_a, losses_e)
    assert len(masks_e) == len(masks_a)
    for me, ma in zip(masks_e, masks_a):
        assert torch.equal(me, ma), "dropout masks differ"
    for (n, pe), (_, pa) in zip(m_e.named_parameters(), m_a.named_parameters()):
        assert type(pa) is nn.Parameter, n  # updated in place, never replaced
        torch.testing.assert_close(pa, pe, msg=n)
        torch.testing.assert_close(pa.grad, pe.grad, msg=n)
    se, sa = opt_e.state_dict()["state"], opt_a.state_dict()["state"]
    assert se.keys() == sa.keys()
    for k in se:
        for name in se[k]:
            assert not isinstance(sa[k][name], LazyTensor) or sa[k][name]._ae_real is not None
            torch.testing.assert_close(sa[k][name], se[k][name], msg=f"{k}.{name}")


def test_block_entered_every_step():
    m_e, m_a, make_opt = _setup("block", "adamw")
    x, y = _data("block")
    opt_e, opt_a = make_opt(m_e.parameters()), make_opt(m_a.parameters())
    torch.manual_seed(3)
    losses_e = train(m_e, opt_e, x, y)
    torch.manual_seed(3)
    losses_a = train(m_a, opt_a, x, y, block_per_step=lambda: mode())
    torch.testing.assert_close(losses_a, losses_e)
    for pe, pa in zip(m_e.parameters(), m_a.parameters()):
        torch.testing.assert_close(pa, pe)


def test_parameters_seen_in_place_after_deferred_step(capsys):
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    ref = copy.deepcopy(lin)
    x = torch.ones(4, 3)
    for m, use_mode in ((ref, False), (lin, True)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        ctx = mode() if use_mode else _null()
        with ctx:
            m(x).pow(2).sum().backward()
            opt.step()
            print(m.weight)
            print(m.bias.detach().numpy())
    out = capsys.readouterr().out.split("\n")
    half = len(out) // 2
    assert out[:half] == out[half:2 * half]


def test_foreach_ops():
    def program(ps, gs):
        torch._foreach_mul_(ps, 0.9)
        torch._foreach_add_(ps, gs, alpha=-0.1)
        sq = torch._foreach_mul(gs, gs)
        norms = torch._foreach_norm(sq)
        torch._foreach_addcdiv_(ps, gs, [n + 1 for n in norms], value=0.5)
        torch._foreach_lerp_(ps, gs, 0.25)
        return [p.clone() for p in ps], norms, torch._foreach_sqrt([g.abs() for g in gs])

    def make():
        g = torch.Generator().manual_seed(5)
        return [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)], \
               [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]

    pe, ge = make()
    exp = program(pe, ge)
    pa, ga = make()
    with mode():
        gl = [g * 1 for g in ga]  # lazy gradients, real parameters
        got = program(pa, gl)
    assert_same(exp, got)
    assert_same(pe, pa)


def test_optimizer_steps_end_windows_so_they_recur():
    # Note [Optimizer steps end windows]: a loop that reads nothing per step, with an
    # iteration whose op count is not a multiple of window_size. Without the step's
    # flush its windows start at a different op every step and never recur.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
    ref = copy.deepcopy(model)
    x, y = torch.randn(256, 64), torch.randn(256, 64)  # regions above min_region_work

    def run(m, use_mode):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        losses = []
        # (the step captured with the window, not run as one compiled function: the
        # step's own flush is what this checks; tests/test_optim_compile.py the other)
        with ae.adaptive_eager(backend="eager", window_size=40, adaptive_passthrough=False,
                               optimizer_step=False) \
                if use_mode else _null():
            for _ in range(6):
                loss = F.mse_loss(m(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            stats = ae.stats()
        return torch.stack(losses), stats

    ref_losses, _ = run(ref, False)
    losses, stats = run(model, True)
    torch.testing.assert_close(losses, ref_losses)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert stats.flushes.get("optimizer_step") == 6
    assert stats.cache_hits > 0               # the same windows every step: compiled, reused
