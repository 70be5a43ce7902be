"""(b) torch.optim.AdamW (foreach=True, the default) over 100 tensors.

Gradients are preset (random, fixed); the learning rate changes every step
(warmup + cosine schedule, written into param_groups as a Python float, as a
scheduler does). Compile mode compiles ``opt.step`` (the recipe in the
PyTorch "compiled optimizer" tutorial).
"""
from __future__ import annotations

import torch

from . import Context, Workload
from ._params import describe, lr_at, make_params


def build(ctx: Context) -> Workload:
    params, grads = make_params(ctx.seed, ctx.quick, ctx.device)
    for p, g in zip(params, grads):
        p.grad = g
    opt = torch.optim.AdamW(params, lr=lr_at(0), weight_decay=0.01)
    opt_step = ctx.compile(opt.step)
    probe = params[0]
    n = [0]

    def step() -> float:
        for group in opt.param_groups:
            group["lr"] = lr_at(n[0])
        n[0] += 1
        opt_step()
        with torch.no_grad():
            return probe[0, 0].item()

    return Workload(step=step, size=describe(params) + ", foreach AdamW, lr schedule")
