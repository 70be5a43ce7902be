"""The demo: train a small GPT on synthetic data, eager and then adaptive eager.

Random init, random token data (no downloads), a fixed number of AdamW steps, the
same seed for both runs. Prints both runs' progress, how far the loss curves are
apart, the speedup and the report. ``adaptive-eager demo --help`` for the flags.

Example::

    >>> from adaptive_eager.demo import run_demo
    >>> result = run_demo(steps=2, backend="eager", size="tiny", out=None)  # doctest: +SKIP
    >>> result.max_abs_diff < 1e-3  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, TextIO

import torch
import torch.nn as nn
import torch.nn.functional as F

# name -> (vocab, d_model, layers, heads, seq_len, batch)
SIZES = {
    "tiny": (64, 32, 1, 2, 16, 2),
    "small": (256, 128, 2, 4, 64, 8),
    "medium": (512, 256, 4, 4, 128, 8),
}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP.

    Attention is written out (matmul, mask, softmax) rather than calling
    scaled_dot_product_attention: a chain of small ops, the kind fusion pays off on.
    """

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """A GPT-style language model: token + position embeddings, blocks, LM head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1))
        self.register_buffer("positions", torch.arange(seq_len))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(self.positions[:t])
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


@dataclass(frozen=True)
class RunResult:
    losses: tuple[float, ...]
    step_times: tuple[float, ...]

    @property
    def total_s(self) -> float:
        return sum(self.step_times)

    def steady_s(self, skip: int) -> float:
        """Median step time after the first ``skip`` steps (compiles happen early)."""
        tail = sorted(self.step_times[skip:] or self.step_times)
        return tail[len(tail) // 2]


@dataclass(frozen=True)
class DemoResult:
    eager: RunResult
    adaptive: RunResult
    max_abs_diff: float
    report: str


class Progress:
    """A plain-text progress bar (carriage returns on a terminal, lines otherwise)."""

    def __init__(self, label: str, total: int, out: TextIO | None, width: int = 30):
        self.label, self.total, self.out, self.width = label, total, out, width
        self.tty = bool(out is not None and getattr(out, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.last_line = 0.0

    def update(self, done: int, loss: float | None) -> None:
        if self.out is None:
            return
        now = time.perf_counter()
        final = done == self.total
        if not self.tty and not final and now - self.last_line < 5.0:
            return
        self.last_line = now
        filled = self.width * done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        loss_text = "" if loss is None else f" loss {loss:.4f}"
        text = f"{self.label:<14} [{bar}] {done:>4}/{self.total}{loss_text} {now - self.start:6.1f}s"
        self.out.write(("\r" + text) if self.tty else text + "\n")
        if self.tty and final:
            self.out.write("\n")
        self.out.flush()


def train(steps: int, size: str, context: Callable[[], ContextManager], label: str,
          out: TextIO | None, seed: int = 0, log_every: int = 10) -> RunResult:
    """Train from a fixed seed for ``steps`` AdamW steps inside ``context()``.

    The loss stays a tensor in the loop and is read (``.item()``) only every
    ``log_every`` steps and at the end, as the report's advice recommends.
    """
    vocab, d, layers, heads, seq_len, batch = SIZES[size]
    torch.manual_seed(seed)
    model = TinyGPT(vocab, d, layers, heads, seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(0, vocab, (8, batch, seq_len + 1), generator=gen)
    progress = Progress(label, steps, out)
    losses: list[torch.Tensor] = []
    times: list[float] = []
    shown: float | None = None
    with context():
        for i in range(steps):
            t0 = time.perf_counter()
            x = data[i % data.shape[0]]
            opt.zero_grad(set_to_none=True)
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if (i + 1) % log_every == 0 or i + 1 == steps:
                shown = loss.item()
            times.append(time.perf_counter() - t0)
            progress.update(i + 1, shown)
        values = torch.stack(losses).tolist()
    return RunResult(tuple(values), tuple(times))


def run_demo(steps: int = 40, backend: str = "inductor", size: str = "small",
             out: TextIO | None = sys.stdout, seed: int = 0, **options: object) -> DemoResult:
    """Train eager, then under adaptive eager; compare and report (see module docstring)."""
    from . import session

    ctx_options = {"backend": backend, **options}
    session.resolve_options(**ctx_options)  # bad options fail before any training
    vocab, d, layers, heads, seq_len, batch = SIZES[size]
    say = (lambda s: (out.write(s + "\n"), out.flush())) if out is not None else (lambda s: None)
    say(f"adaptive-eager demo: GPT-style model (vocab {vocab}, d_model {d}, {layers} layers, "
        f"{heads} heads, seq {seq_len}, batch {batch}), {steps} AdamW steps on random tokens, "
        f"torch threads: {torch.get_num_threads()}")
    say(f"adaptive eager options: {ctx_options}")
    eager = train(steps, size, contextlib.nullcontext, "eager", out, seed)
    session.reset_stats()
    adaptive = train(steps, size, lambda: session.adaptive_eager(**ctx_options),
                     "adaptive eager", out, seed)
    report = session.report()
    diff = max((abs(a - b) for a, b in zip(eager.losses, adaptive.losses)), default=0.0)
    return DemoResult(eager, adaptive, diff, report)


def summarize(result: DemoResult) -> str:
    e, a = result.eager, result.adaptive
    skip = max(1, len(e.step_times) // 2)
    lines = [
        "",
        "loss curves (every few steps)",
        "  step      eager   adaptive",
    ]
    n = len(e.losses)
    picks = sorted({0, n - 1, *range(0, n, max(1, n // 8))})
    lines += [f"  {i + 1:>4}  {e.losses[i]:9.5f}  {a.losses[i]:9.5f}" for i in picks]
    agree = "agree" if result.max_abs_diff < 1e-3 else "DIFFER"
    lines += [
        f"max |loss diff|  {result.max_abs_diff:.3g}  ({agree}; rounding differs between "
        "compiled and eager kernels)",
        f"total time       eager {e.total_s:6.2f} s   adaptive {a.total_s:6.2f} s   "
        f"speedup {e.total_s / a.total_s:4.2f}x  (includes compiling)",
        f"steady step      eager {1e3 * e.steady_s(skip):6.1f} ms  adaptive "
        f"{1e3 * a.steady_s(skip):6.1f} ms  speedup {e.steady_s(skip) / a.steady_s(skip):4.2f}x  "
        f"(median of the last {n - skip} steps)",
        "",
    ]
    return "\n".join(lines)


__all__ = ["TinyGPT", "train", "run_demo", "summarize", "DemoResult", "RunResult", "SIZES"]
