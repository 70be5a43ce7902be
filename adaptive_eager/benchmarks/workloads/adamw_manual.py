"""(b') Hand-written AdamW: a Python loop of torch ops over the 100 tensors.

Same parameters, grads and lr schedule as ``adamw``; the bias corrections
(Python floats) change every step as well. Compile mode compiles the
per-tensor update (``adamw_one``, ``dynamic=True``: one graph per rank; with
automatic dynamic shapes it recompiles per shape and hits the recompile limit): compiling the whole 100-tensor loop as one graph takes
Inductor many minutes on 2 cores, which does not fit the suite.
"""
from __future__ import annotations

import math

import torch

from . import Context, Workload
from ._params import describe, lr_at, make_params


def adamw_one(p, g, m, v, decay: float, step_size: float, bc2_sqrt: float,
              beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
    p.mul_(decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    # not addcdiv_(..., value=-step_size): a Scalar kwarg makes dynamo specialize on
    # the float (a recompile every step); a float multiplying a tensor does not
    p.sub_(m / denom * step_size)


def adamw_update(one, params, grads, exp_avgs, exp_avg_sqs, lr: float, bc1: float, bc2: float,
                 wd: float = 0.01):
    step_size = lr / bc1
    bc2_sqrt = math.sqrt(bc2)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        one(p, g, m, v, 1 - lr * wd, step_size, bc2_sqrt)


def build(ctx: Context) -> Workload:
    params, grads = make_params(ctx.seed, ctx.quick, ctx.device)
    params = [p.detach() for p in params]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    one = ctx.compile(adamw_one, dynamic=True)
    probe = params[0]
    n = [0]

    def step() -> float:
        n[0] += 1
        t = n[0]
        with torch.no_grad():
            adamw_update(one, params, grads, exp_avgs, exp_avg_sqs, lr_at(t - 1),
                   1 - 0.9 ** t, 1 - 0.999 ** t)
            return probe[0, 0].item()

    return Workload(step=step, size=describe(params) + ", hand-written AdamW loop"
                    + (" (torch.compile of the per-tensor update)" if ctx.mode == "compile" else ""))
