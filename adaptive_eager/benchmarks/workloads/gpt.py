"""(c) GPT-style training step: forward, cross-entropy, backward, AdamW step.

d=256, T=256, B=8, 2 layers, 4 heads, vocab 512. Compile mode compiles the
loss function (model forward + cross-entropy, so backward is compiled by
AOTAutograd) and ``opt.step`` separately, the usual recipe.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Context, Workload
from ._gpt import GPT


def build(ctx: Context) -> Workload:
    if ctx.quick:
        vocab, d, L, H, T, B = 64, 32, 1, 2, 16, 2
    else:
        vocab, d, L, H, T, B = 512, 256, 2, 4, 256, 8
    torch.manual_seed(ctx.seed)
    model = GPT(vocab, d, L, H, T).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(ctx.seed + 1)
    # a fixed pool of batches, cycled
    data = torch.randint(0, vocab, (4, B, T + 1), generator=gen).to(ctx.device)

    def loss_fn(x, y):
        logits = model(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))

    loss_c = ctx.compile(loss_fn)
    opt_step = ctx.compile(opt.step)
    n = [0]

    def step() -> float:
        batch = data[n[0] % data.shape[0]]
        n[0] += 1
        opt.zero_grad(set_to_none=True)
        loss = loss_c(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt_step()
        return loss.item()

    nparams = sum(p.numel() for p in model.parameters())
    return Workload(step=step, size=f"d={d} T={T} B={B} layers={L} heads={H} vocab={vocab}, "
                                   f"{nparams / 1e6:.2f}M params")
