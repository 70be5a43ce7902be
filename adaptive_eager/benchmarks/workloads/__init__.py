"""Benchmark workloads.

Each workload is a small module with a ``build(ctx)`` function. ``build`` makes
all state from ``ctx.seed`` (random init, no downloads) and returns a
:class:`Workload` whose ``step()`` runs one iteration and returns a Python
float read from the result (``loss.item()`` or similar), so every iteration
ends with a value observed by Python, in every mode.

``ctx.compile(fn)`` is ``torch.compile(fn)`` in ``compile`` mode and the
identity otherwise: a workload wraps exactly the functions that the idiomatic
torch.compile version of the program would wrap.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Tuple


class Unavailable(Exception):
    """Raised by ``build`` when a workload cannot run here (reported as skipped)."""


@dataclasses.dataclass
class Context:
    seed: int = 0
    quick: bool = False
    mode: str = "eager"                      # eager | adaptive | compile
    device: str = "cpu"
    compile: Callable[..., Callable] = lambda fn, **kw: fn   # (fn, **torch.compile kwargs)
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Workload:
    step: Callable[[], float]
    size: str                                # human-readable sizes, shown in the JSON/README
    # "median": steady-state median time per iteration after warmup.
    # "total": total time of all steps from the first one (no warmup), e.g.
    #          varying shapes where first-seen-shape costs are the point.
    metric: str = "median"
    # Optional hooks (neuron simulation): called around the timed loop.
    extra: Callable[[], Dict[str, Any]] = None  # returns extra per-run fields for the JSON
    on_timed_start: Callable[[], None] = None
    teardown: Callable[[], None] = None
    # Options the adaptive mode needs for this workload (e.g. the device it runs on);
    # --adaptive-options override them.
    adaptive_defaults: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    module: str
    title: str
    iters: int                               # timed iterations (or total steps for metric=total)
    warmup: int
    quick_iters: int
    quick_warmup: int
    modes: Tuple[str, ...] = ("eager", "adaptive", "compile")
    default: bool = True                     # part of the default suite

    def build(self, ctx: Context) -> Workload:
        mod = importlib.import_module(f"{__name__}.{self.module}")
        return mod.build(ctx)


SPECS: List[Spec] = [
    Spec("pointwise", "pointwise", "pointwise block (GELU/SiLU gate/RMSNorm/RoPE/residual)",
         iters=20, warmup=5, quick_iters=3, quick_warmup=1),
    # The optimizer rows measure a long run's steady state: their warm-up covers the steps
    # that run eagerly before the step is compiled (optimizer_step_after_ms, 100 ms of
    # eager steps: Note [A step compiles once it has cost enough]).
    Spec("adamw", "adamw", "torch.optim.AdamW over 100 tensors, lr changes every step",
         iters=30, warmup=30, quick_iters=3, quick_warmup=1),
    Spec("adam", "adam", "torch.optim.Adam over 100 tensors, lr changes every step",
         iters=30, warmup=35, quick_iters=3, quick_warmup=1),
    Spec("sgd-momentum", "sgd_momentum", "torch.optim.SGD(momentum=0.9) over 100 tensors, lr changes",
         iters=30, warmup=100, quick_iters=3, quick_warmup=1),
    Spec("adamw-manual", "adamw_manual", "hand-written AdamW loop of torch ops over 100 tensors",
         iters=30, warmup=5, quick_iters=3, quick_warmup=1),
    Spec("gpt-train", "gpt", "GPT training step (fwd, cross-entropy, bwd, AdamW)",
         iters=15, warmup=10, quick_iters=2, quick_warmup=1),
    Spec("tiny-ops", "tiny_ops", "200 tiny pointwise ops on 32-element tensors",
         iters=200, warmup=20, quick_iters=10, quick_warmup=2),
    Spec("tiny-mlp", "tiny_mlp", "MLP training step, hidden size 32 (fwd, bwd, SGD)",
         iters=200, warmup=20, quick_iters=10, quick_warmup=2),
    Spec("varying-shape", "varying", "transformer forward, T changes every step (50 values)",
         iters=100, warmup=0, quick_iters=8, quick_warmup=0),
    Spec("neuron-sim", "neuron_sim", "MLP on simulated neuron device (20 us launch latency) [simulated]",
         iters=50, warmup=10, quick_iters=3, quick_warmup=1, modes=("eager", "adaptive")),
]

BY_NAME: Dict[str, Spec] = {s.name: s for s in SPECS}


def get(name: str) -> Spec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(BY_NAME)}") from None
