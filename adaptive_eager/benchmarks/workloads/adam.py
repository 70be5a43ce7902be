"""(b2) torch.optim.Adam over 100 tensors (see _optim_step for the method)."""
from __future__ import annotations

import torch

from . import Context, Workload
from ._optim_step import build_step


def build(ctx: Context) -> Workload:
    return build_step(ctx, torch.optim.Adam, "Adam")
