"""(a) Pointwise-heavy block: RMSNorm, rotary embedding, GELU, SiLU gating, residual.

Forward only, under no_grad, on activations large enough (B*T x d = 8192 x 512
float32, 16 MiB per tensor) that eager is memory-bound: every op reads and
writes whole tensors, a fused kernel reads the input once.
"""
from __future__ import annotations

import torch

from . import Context, Workload


def rms_norm(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, cos, sin):
    # x: [B, T, d]; rotate the two halves (GPT-NeoX style)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def block(x, w1, w2, scale, bias, cos, sin):
    h = rms_norm(x, w1)
    h = rotary(h, cos, sin)
    a = torch.nn.functional.gelu(h)
    g = torch.nn.functional.silu(h * scale) * (a + bias)
    y = x + 0.5 * g
    return rms_norm(y, w2)


def build(ctx: Context) -> Workload:
    B, T, d = (2, 256, 256) if ctx.quick else (16, 512, 512)
    dev = ctx.device
    gen = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(B, T, d, generator=gen).to(dev)
    w1 = (1 + 0.1 * torch.randn(d, generator=gen)).to(dev)
    w2 = (1 + 0.1 * torch.randn(d, generator=gen)).to(dev)
    scale = torch.randn(d, generator=gen).to(dev)
    bias = torch.randn(d, generator=gen).to(dev)
    pos = torch.arange(T, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d // 2, dtype=torch.float32) / (d // 2)))
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)

    fn = ctx.compile(block)

    def step() -> float:
        with torch.no_grad():
            y = fn(x, w1, w2, scale, bias, cos, sin)
            return y[0, 0, 0].item()

    return Workload(step=step, size=f"x[{B},{T},{d}] fp32 (B*T={B * T}, d={d}), forward, no_grad")
