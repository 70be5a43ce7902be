"""(e) Varying shapes: a small transformer forward whose sequence length changes
every step, among 50 distinct values T in range(16, 216, 4).

The metric is the total time of a fixed number of steps from the very first
one (no warmup): a runtime that compiles per shape pays for it here. The step
order is a seeded shuffle that visits every length in the first 50 steps.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from . import Context, Workload
from ._gpt import GPT

LENGTHS = list(range(16, 16 + 50 * 4, 4))


def build(ctx: Context) -> Workload:
    if ctx.quick:
        vocab, d, L, H, B = 64, 32, 1, 2, 2
        lengths = LENGTHS[:4]
    else:
        vocab, d, L, H, B = 512, 128, 2, 4, 4
        lengths = LENGTHS
    torch.manual_seed(ctx.seed)
    model = GPT(vocab, d, L, H, max(lengths)).to(ctx.device).eval()
    rng = random.Random(ctx.seed)
    order = []
    while len(order) < 10_000:
        perm = list(lengths)
        rng.shuffle(perm)
        order += perm
    gen = torch.Generator().manual_seed(ctx.seed + 1)
    data = torch.randint(0, vocab, (B, max(lengths)), generator=gen).to(ctx.device)

    def fwd(idx):
        logits = model(idx)
        return F.log_softmax(logits, dim=-1).mean()

    fwd_c = ctx.compile(fwd)
    n = [0]

    def step() -> float:
        T = order[n[0]]
        n[0] += 1
        with torch.no_grad():
            return fwd_c(data[:, :T]).item()

    return Workload(step=step, metric="total",
                    size=f"d={d} layers={L} heads={H} B={B} vocab={vocab}, forward no_grad, "
                         f"T cycles {len(lengths)} values {lengths[0]}..{lengths[-1]}")
