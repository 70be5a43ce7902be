"""(d') Small MLP training step, hidden size 32: forward, MSE, backward, SGD.

Many tiny ops (a few hundred floats each), so time is dominated by per-op
overhead, not arithmetic. Compile mode compiles the loss function and the
optimizer step.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import Context, Workload


def build(ctx: Context) -> Workload:
    hidden, batch, depth = 32, 16, (2 if ctx.quick else 4)
    torch.manual_seed(ctx.seed)
    layers = []
    for i in range(depth):
        layers += [nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(hidden, 1)).to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    gen = torch.Generator().manual_seed(ctx.seed + 1)
    xs = torch.randn(8, batch, hidden, generator=gen).to(ctx.device)
    ys = torch.randn(8, batch, 1, generator=gen).to(ctx.device)

    def loss_fn(x, y):
        return F.mse_loss(model(x), y)

    loss_c = ctx.compile(loss_fn)
    opt_step = ctx.compile(opt.step)
    n = [0]

    def step() -> float:
        i = n[0] % xs.shape[0]
        n[0] += 1
        opt.zero_grad(set_to_none=True)
        loss = loss_c(xs[i], ys[i])
        loss.backward()
        opt_step()
        return loss.item()

    nparams = sum(p.numel() for p in model.parameters())
    return Workload(step=step, size=f"hidden={hidden} batch={batch} depth={depth}, {nparams} params, SGD+momentum")
