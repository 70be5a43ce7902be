"""(b) torch.optim.AdamW over 100 tensors (see _optim_step for the method)."""
from __future__ import annotations

import torch

from . import Context, Workload
from ._optim_step import build_step


def build(ctx: Context) -> Workload:
    return build_step(ctx, torch.optim.AdamW, "AdamW (weight_decay 0.01)", weight_decay=0.01)
