"""A workload's step, eager, adaptive and torch.compile interleaved in one process:
``python -m benchmarks.train_interleave``.

The suite (``python -m benchmarks``) runs each (workload, mode) in a process of its own,
one after the other: on this shared machine the load moves between the rows, and a ratio
near 1 (the GPT train step: 1.09x in one run, 0.92x in the next, each row's spread 3-9%)
says nothing. Here the three variants are built in one process, each over its own model
and data made from the same seed (``build(ctx)`` of the suite's workloads), warmed up, and
then run in rounds of ``--chunk`` steps, the order rotating each round, so each sees the
same load. ``adaptive``: the eager build's step inside ``adaptive_eager()`` with the
default options (``--options`` adds some); its warm-up goes on until no compile has been in
flight for a few steps (at most ``--settle`` s, as the suite settles), so the timed rounds measure the steady state, as the suite's
rows do. ``compile``: the workload's own torch.compile recipe (for gpt-train, the loss
function and ``opt.step``). Per variant: the median and 10th percentile of a step's wall
time, the median of its thread CPU time and the ratio of eager's median to its own.

Example::

    python -m benchmarks.train_interleave --workload gpt-train --rounds 8 --chunk 5
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch

from . import workloads as W
from .worker import SETTLE_QUIET, _kv, _threshold_steps

VARIANTS = ("eager", "adaptive", "compile")


def _build(spec: W.Spec, variant: str, quick: bool) -> W.Workload:
    compile_fn = (lambda fn, **kw: torch.compile(fn, **kw)) if variant == "compile" else (lambda fn, **kw: fn)
    return spec.build(W.Context(quick=quick, mode=variant, compile=compile_fn))


def rotating_rounds(variants: List[str], steps: Dict[str, Callable[[], Any]],
                    contexts: Dict[str, Callable[[], Any]], rounds: int, chunk: int) -> tuple:
    """Each variant's step ``rounds x chunk`` times, in rounds of ``chunk`` steps inside its
    context, the order rotating each round; (wall, thread CPU) times per variant."""
    wall: Dict[str, List[float]] = {v: [] for v in variants}
    cpu: Dict[str, List[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            with contexts[v]():
                for _ in range(chunk):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    steps[v]()
                    cpu[v].append(time.thread_time() - c0)
                    wall[v].append(time.perf_counter() - w0)
    return wall, cpu


def print_variants(wall: Dict[str, List[float]], cpu: Dict[str, List[float]]) -> None:
    """Per variant: median and 10th percentile wall time, median CPU, eager's median over it."""
    base = statistics.median(wall["eager"]) if "eager" in wall else None
    for v, times in wall.items():
        med = statistics.median(times)
        p10 = sorted(times)[len(times) // 10]
        ratio = f"  eager/{v} {base / med:5.2f}x" if base else ""
        print(f"  {v:12s} wall median {med * 1e3:8.3f} ms  p10 {p10 * 1e3:8.3f} ms  "
              f"cpu median {statistics.median(cpu[v]) * 1e3:8.3f} ms{ratio}")


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_interleave")
    p.add_argument("--workload", default="gpt-train", help="one of the suite's workloads (default gpt-train)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, among {','.join(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--chunk", type=int, default=5, help="steps of one variant in a row")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the workload's)")
    p.add_argument("--settle", type=float, default=300.0,
                   help="adaptive: keep warming up (at most this many s) while compiles are in flight")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--options", default="", help="k=v,... for adaptive_eager() (e.g. backend=eager)")
    p.add_argument("--quick", action="store_true", help="small sizes (tests, smoke)")
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        p.error(f"unknown variant {', '.join(bad) or '(none)'}; variants: {', '.join(VARIANTS)}")
    try:
        spec = W.get(a.workload)
    except KeyError:
        p.error(f"unknown workload {a.workload!r}; known: {', '.join(s.name for s in W.SPECS)}")
    options = _kv(a.options)
    torch.set_num_threads(a.threads)
    import adaptive_eager as ae

    steps: Dict[str, Callable[[], float]] = {}
    contexts: Dict[str, Callable[[], Any]] = {}
    for v in variants:
        wl = _build(spec, v, a.quick)
        if wl.metric != "median":
            p.error(f"{a.workload} is measured as a total (metric {wl.metric!r}), not per step")
        steps[v] = wl.step
        contexts[v] = (lambda o=dict(wl.adaptive_defaults, **options): ae.adaptive_eager(**o)) \
            if v == "adaptive" else contextlib.nullcontext
    warm = a.warmup if a.warmup is not None else (spec.quick_warmup if a.quick else spec.warmup)
    load0 = os.getloadavg()[0]
    for v in variants:
        ae.reset_stats()
        t0 = time.perf_counter()
        with contexts[v]():
            for _ in range(max(warm, 1)):
                steps[v]()
            n, quiet = max(warm, 1), 0
            # adaptive: as the suite settles (benchmarks/worker.py's _timed_loop), until
            # SETTLE_QUIET steps in a row had no compile in flight and no optimizer step
            # still waiting for its cost threshold
            last = _threshold_steps(dataclasses.asdict(ae.stats()))
            while v == "adaptive" and quiet < SETTLE_QUIET and time.perf_counter() - t0 < a.settle:
                s = ae.stats()
                now = _threshold_steps(dataclasses.asdict(s))
                quiet = 0 if s.compiles_in_flight or now > last else quiet + 1
                last = now
                steps[v]()
                n += 1
        if v == "adaptive":
            s = ae.stats()
            print(f"adaptive: {n} warm-up steps in {time.perf_counter() - t0:.1f} s, regions compiled "
                  f"{s.regions_compiled} (from disk {s.regions_from_disk}), demoted {s.demotions}, compiles in "
                  f"flight {s.compiles_in_flight}, optimizer steps compiled {s.optimizer_steps_compiled}", file=sys.stderr)
    ae.reset_stats()
    wall, cpu = rotating_rounds(variants, steps, contexts, a.rounds, a.chunk)
    s = ae.stats()
    print(f"{a.workload}: {a.rounds} rounds x {a.chunk} steps, {a.threads} threads, load average "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f}; adaptive's timed steps: compiled calls "
          f"{s.compiled_calls}, optimizer steps compiled {s.optimizer_steps_compiled}, compiles {s.regions_compiled}, "
          f"demotions {s.demotions}")
    print_variants(wall, cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
