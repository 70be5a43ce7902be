"""(b) torch.optim.AdamW (foreach=True, the default) over 100 tensors.

Gradients are preset (random, fixed); the learning rate changes every step
(warmup + cosine schedule, written into param_groups as a Python float, as a
scheduler does). Compile mode compiles ``opt.step`` and, as the PyTorch
tutorial "Running the compiled optimizer with an LR scheduler" prescribes,
holds lr in a 0-d tensor updated with ``fill_``: with a Python float lr,
dynamo recompiles on every new value (each compile of this 100-tensor step
takes tens of seconds) until it hits its recompile limit.
"""
from __future__ import annotations

import torch

from . import Context, Workload
from ._params import describe, lr_at, make_params


def build(ctx: Context) -> Workload:
    params, grads = make_params(ctx.seed, ctx.quick, ctx.device)
    for p, g in zip(params, grads):
        p.grad = g
    tensor_lr = ctx.mode == "compile"
    lr0 = torch.tensor(lr_at(0)) if tensor_lr else lr_at(0)
    opt = torch.optim.AdamW(params, lr=lr0, weight_decay=0.01)
    opt_step = ctx.compile(opt.step)
    probe = params[0]
    n = [0]

    def step() -> float:
        lr = lr_at(n[0])
        for group in opt.param_groups:
            if tensor_lr:
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        n[0] += 1
        opt_step()
        with torch.no_grad():
            return probe[0, 0].item()

    return Workload(step=step, size=describe(params) + ", foreach AdamW, lr schedule"
                    + (" (lr as 0-d tensor for torch.compile)" if tensor_lr else ""))
