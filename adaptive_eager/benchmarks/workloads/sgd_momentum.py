"""(b3) torch.optim.SGD with momentum over 100 tensors (see _optim_step for the method)."""
from __future__ import annotations

import torch

from . import Context, Workload
from ._optim_step import build_step


def build(ctx: Context) -> Workload:
    return build_step(ctx, torch.optim.SGD, "SGD (momentum 0.9)", base_lr=1e-2, momentum=0.9)
