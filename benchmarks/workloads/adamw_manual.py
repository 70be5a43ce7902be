"""(b') Hand-written AdamW: a Python loop of torch ops over the 100 tensors.

Same parameters, grads and lr schedule as ``adamw``; the bias corrections
(Python floats) change every step as well. Compile mode compiles the whole
update function.
"""
from __future__ import annotations

import math

import torch

from . import Context, Workload
from ._params import describe, lr_at, make_params


def adamw_update(params, grads, exp_avgs, exp_avg_sqs, lr: float, bc1: float, bc2: float,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, wd: float = 0.01):
    step_size = lr / bc1
    bc2_sqrt = math.sqrt(bc2)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)


def build(ctx: Context) -> Workload:
    params, grads = make_params(ctx.seed, ctx.quick, ctx.device)
    params = [p.detach() for p in params]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    update = ctx.compile(adamw_update)
    probe = params[0]
    n = [0]

    def step() -> float:
        n[0] += 1
        t = n[0]
        with torch.no_grad():
            update(params, grads, exp_avgs, exp_avg_sqs, lr_at(t - 1),
                   1 - 0.9 ** t, 1 - 0.999 ** t)
            return probe[0, 0].item()

    return Workload(step=step, size=describe(params) + ", hand-written AdamW loop")
