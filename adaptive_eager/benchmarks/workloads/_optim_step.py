"""A torch.optim step over the shared 100-tensor parameter set, the lr changing every step.

Gradients are preset (random, fixed); the learning rate follows a warmup + cosine schedule
written into ``param_groups`` as a Python float, as a scheduler does. The optimizer is
built as a program would, with ``foreach`` left unset: on CPU torch then runs its
single-tensor implementation; under adaptive eager the step runs at the foreach level
where that is bitwise equal (Note [Optimizer steps at the foreach level]). Compile mode
compiles ``opt.step`` and, as the PyTorch tutorial "Running the compiled optimizer with an
LR scheduler" prescribes, holds lr in a 0-d tensor updated with ``fill_``: with a Python
float lr, dynamo recompiles on every new value until it hits its recompile limit.
"""
from __future__ import annotations

from typing import Any

import torch

from . import Context, Workload
from ._params import describe, lr_at, make_params


def build_step(ctx: Context, cls: type, label: str, base_lr: float = 1e-3,
               **kwargs: Any) -> Workload:
    params, grads = make_params(ctx.seed, ctx.quick, ctx.device)
    for p, g in zip(params, grads):
        p.grad = g
    tensor_lr = ctx.mode == "compile"
    lr0 = torch.tensor(lr_at(0, base_lr)) if tensor_lr else lr_at(0, base_lr)
    opt = cls(params, lr=lr0, **kwargs)
    opt_step = ctx.compile(opt.step)
    probe = params[0]
    n = [0]

    def step() -> float:
        lr = lr_at(n[0], base_lr)
        for group in opt.param_groups:
            if tensor_lr:
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        n[0] += 1
        opt_step()
        with torch.no_grad():
            return probe[0, 0].item()

    return Workload(step=step, size=describe(params) + f", {label}, lr schedule"
                    + (" (lr as 0-d tensor for torch.compile)" if tensor_lr else ""))
