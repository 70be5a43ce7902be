"""Shared parameter set for the optimizer workloads: 100 tensors of mixed sizes."""
from __future__ import annotations

import math

import torch


def make_params(seed: int, quick: bool, device: str):
    """~2.7M parameters in 100 tensors (weights, biases, norms), grads preset."""
    gen = torch.Generator().manual_seed(seed)
    shapes = []
    if quick:
        for i in range(20):
            shapes += [(64, 32), (32,)]
    else:
        # 20 "layers" x 5 tensors: two weight matrices, two biases, one norm scale
        for i in range(20):
            d = (256, 320, 384, 448)[i % 4]
            shapes += [(d, 192), (192, d), (d,), (192,), (192,)]
    params, grads = [], []
    for s in shapes:
        fan_in = s[-1]
        p = (torch.randn(*s, generator=gen) / math.sqrt(fan_in)).to(device)
        p.requires_grad_(True)
        params.append(p)
        grads.append((torch.randn(*s, generator=gen) * 1e-2).to(device))
    return params, grads


def lr_at(step: int, base: float = 1e-3, warmup: int = 10, total: int = 1000) -> float:
    """Linear warmup then cosine decay: a different float every step."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def describe(params) -> str:
    n = sum(p.numel() for p in params)
    return f"{len(params)} tensors, {n / 1e6:.2f}M params fp32"
