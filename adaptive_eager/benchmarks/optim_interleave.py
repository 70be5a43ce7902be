"""An optimizer workload's step, eager, adaptive and torch.compile(opt.step) interleaved in one
process: ``python -m benchmarks.optim_interleave``.

The suite (``python -m benchmarks``) runs each (workload, mode) in its own process, one after
the other: on a shared machine the load changes between the rows and the ratios with it.
Here the variants run in one process over parameter sets of their own (the same values),
in rounds of ``--chunk`` steps, the order rotating each round, so each sees the same load.
Per variant it prints the median and 10th percentile of a step's wall time and the median
of its thread CPU time, and the load average before and after. The step is the workload's
(``_optim_step``: a new lr written every step, the probe's value read after it); the
adaptive variants compile the step before timing (``optimizer_step_after_ms=0``,
``async_compile=False``). ``adaptive-1t``: the same with the kernel compiled for one thread
(Note [A small step's kernel runs on one thread]).

Example::

    python -m benchmarks.optim_interleave --workload sgd-momentum --rounds 10 --chunk 20
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Callable, Dict, List

import torch

from .workloads import Context
from .train_interleave import print_variants, rotating_rounds
from .workloads._optim_step import build_step

_CLASSES: Dict[str, tuple] = {
    "sgd-momentum": (torch.optim.SGD, dict(momentum=0.9), 1e-2),
    "adamw": (torch.optim.AdamW, {}, 1e-3),
    "adam": (torch.optim.Adam, {}, 1e-3),
}
VARIANTS = ("eager", "adaptive", "adaptive-1t", "compile")


def _step_fn(name: str, tensor_lr: bool, step_wrap: Callable | None = None) -> Callable[[], float]:
    """The workload's step (benchmarks/workloads/_optim_step.py) over a parameter set of its
    own; ``tensor_lr``: lr as a 0-d tensor, the step wrapped by ``step_wrap`` (compile)."""
    cls, kw, base = _CLASSES[name]
    ctx = Context(mode="compile" if tensor_lr else "eager",
                  compile=(lambda fn, **k: step_wrap(fn)) if step_wrap is not None else (lambda fn, **k: fn))
    return build_step(ctx, cls, name, base_lr=base, **kw).step


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.optim_interleave")
    p.add_argument("--workload", default="sgd-momentum", choices=sorted(_CLASSES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--chunk", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backend", default="inductor")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    import adaptive_eager as ae
    from adaptive_eager.dispatch import optim_compile

    variants = [v for v in a.variants.split(",") if v]
    steps: Dict[str, Callable[[], float]] = {}
    contexts: Dict[str, Callable[[], Any]] = {}
    for v in variants:
        if v == "eager":
            steps[v], contexts[v] = _step_fn(a.workload, False), None
        elif v == "compile":
            steps[v], contexts[v] = _step_fn(a.workload, True, torch.compile), None
        else:
            # another session for each (its own compiled step): options differ by the timeout
            opts = dict(backend=a.backend, async_compile=False, optimizer_step_after_ms=0,
                        compile_timeout_s=600.0 + len(contexts))
            steps[v] = _step_fn(a.workload, False)
            contexts[v] = (lambda o=opts: ae.adaptive_eager(**o))
    load0 = os.getloadavg()[0]
    for v in variants:  # warm up: compile
        ctx = contexts[v]
        saved = optim_compile.kernel_threads
        if v == "adaptive-1t":
            optim_compile.kernel_threads = lambda inputs: 1
        try:
            ae.reset_stats()
            with (ctx() if ctx is not None else contextlib.nullcontext()):
                for _ in range(8):
                    steps[v]()
            if ctx is not None:
                print(f"{v}: warm-up steps compiled {ae.stats().optimizer_steps_compiled}", file=sys.stderr)
        finally:
            optim_compile.kernel_threads = saved
    ae.reset_stats()
    contexts = {v: (c if c is not None else contextlib.nullcontext) for v, c in contexts.items()}
    wall, cpu = rotating_rounds(variants, steps, contexts, a.rounds, a.chunk)
    load1 = os.getloadavg()[0]
    print(f"{a.workload}: {a.rounds} rounds x {a.chunk} steps, {a.threads} threads, load average "
          f"{load0:.2f} -> {load1:.2f}; compiled steps in the timed rounds {ae.stats().optimizer_steps_compiled}")
    print_variants(wall, cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
