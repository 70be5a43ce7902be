"""(d) Small tensors: a loop of 200 tiny pointwise ops on 32-element tensors.

Pure per-op overhead: eager pays dispatch + kernel launch per op, a fused
region pays it once.
"""
from __future__ import annotations

import torch

from . import Context, Workload

N_OPS = 200


def chain(x, a, b, n_ops: int = N_OPS):
    # 8 ops per round, cycling through common pointwise ops
    for _ in range(n_ops // 8):
        x = x * a
        x = x + b
        x = torch.tanh(x)
        x = x - 0.1
        x = torch.sigmoid(x)
        x = x * 1.5
        x = torch.relu(x - 0.25)
        x = x + a * 0.01
    return x


def build(ctx: Context) -> Workload:
    n = 32
    n_ops = 40 if ctx.quick else N_OPS
    gen = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(n, generator=gen).to(ctx.device)
    a = torch.rand(n, generator=gen).add_(0.5).to(ctx.device)
    b = torch.randn(n, generator=gen).mul_(0.1).to(ctx.device)
    fn = ctx.compile(chain)

    def step() -> float:
        with torch.no_grad():
            y = fn(x, a, b, n_ops)
            return y[0].item()

    return Workload(step=step, size=f"{n_ops} pointwise ops on fp32[{n}], no_grad")
