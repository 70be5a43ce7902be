"""When fusion arrives and what waiting for it costs the program (issue 22, items 2-4).

``python -m benchmarks.arrival [--steps N] [--caches DIR] [--model mlp|gpt] [--size S]``
trains the demo's job (``adaptive_eager.demo.build``) eagerly for a few steps, then under
adaptive eager, and prints, per phase of the adaptive run, the program thread's step
time against eager's: while a compile waits (item 4: <= 1.3x eager), the steps at which
a region arrived (compiled or loaded from disk; item 3: <= 50 ms added), and the steps
after. Also the first region's latency from queued to ready (item 2: <= 10 s) and the
CPU of the compile worker, with the load average.

``--caches DIR``: the Inductor and region caches live in ``DIR/inductor`` and
``DIR/regions`` (created empty if missing): run twice with the same ``DIR`` for a fresh
machine and a second run. Without it, both are fresh temporary folders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any


def _set_caches(root: str) -> None:
    for name, var in (("inductor", "TORCHINDUCTOR_CACHE_DIR"), ("regions", "ADAPTIVE_EAGER_CACHE_DIR")):
        path = os.path.join(root, name)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ[var] = path


def _steps(job, n: int, record=None) -> list[tuple[float, float]]:  # noqa: ANN001
    out = []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        job.optimizer.zero_grad(set_to_none=True)
        loss = job.loss(i)
        loss.backward()
        job.optimizer.step()
        if (i + 1) % 10 == 0:
            loss.item()
        out.append((time.perf_counter() - t0, time.thread_time() - c0))
        if record is not None:
            record(i)
    return out


def _ms(xs: list[float]) -> str:
    return f"{1e3 * statistics.median(xs):6.1f}" if xs else "     -"


def _phases(rows: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """The steps after the first two, as (waiting for a compile, a region arriving, after)."""
    waiting, arrival, after = [], [], []
    for k, row in enumerate(rows):
        before = rows[k - 1]["arrived"] if k else 0
        if k < 2:
            continue
        if row["arrived"] > before:
            arrival.append(row)
        elif row["in_flight"]:
            waiting.append(row)
        elif row["arrived"]:
            after.append(row)
    return waiting, arrival, after


def _print_regions(stats: Any, queued: list[float], first: dict | None, kids0: float | None,
                   kids1: float | None) -> None:
    if queued and first is not None:
        print(f"  first region: queued at {queued[0]:.1f} s, ready by step {first['step']} "
              f"at {first['t']:.1f} s ({first['t'] - queued[0]:.1f} s after queued); longest "
              f"compile latency {stats.compile_latency_max_s:.1f} s")
    elif first is not None:
        print(f"  first region ready by step {first['step']} at {first['t']:.1f} s (from disk: "
              f"{stats.regions_from_disk})")
    else:
        print(f"  no region arrived (compiles in flight at the end: {stats.compiles_in_flight})")
    worker = "unknown" if kids0 is None or kids1 is None else f"{kids1 - kids0:.1f} s"
    print(f"  regions compiled {stats.regions_compiled}, from disk {stats.regions_from_disk} "
          f"(load {stats.disk_load_time_s:.2f} s); compile worker CPU {worker}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eager-steps", type=int, default=30)
    ap.add_argument("--caches", default=None, help="a folder for both caches (kept)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--size", default="small")
    ap.add_argument("--json", default=None, help="write per-step records here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's default: 1)")
    args = ap.parse_args(argv)
    root = args.caches or tempfile.mkdtemp(prefix="ae-arrival-")
    _set_caches(root)
    import torch  # noqa: PLC0415 - after the cache variables are set

    from adaptive_eager import demo, session  # noqa: PLC0415

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    load0 = os.getloadavg()[0]
    eager = _steps(demo.build(args.model, args.size), args.eager_steps)[2:]
    eager_wall = statistics.median(w for w, _ in eager)
    eager_cpu = statistics.median(c for _, c in eager)
    session.reset_stats()
    counters = session.counters()
    rows: list[dict] = []
    t_start = time.perf_counter()
    queued: list[float] = []

    def record(i: int) -> None:
        if counters.compiles_in_flight and not queued:
            queued.append(time.perf_counter() - t_start)
        rows.append({"step": i, "t": time.perf_counter() - t_start,
                     "in_flight": counters.compiles_in_flight,
                     # a compiled optimizer step counts from its first compiled run
                     "arrived": counters.regions_compiled + counters.regions_from_disk
                     + (counters.optimizer_steps_compiled > 0)})

    kids0 = demo._children_cpu_s()
    with session.adaptive_eager():
        steps = _steps(demo.build(args.model, args.size), args.steps, record)
        kids1 = demo._children_cpu_s()
    stats = session.stats()
    for row, (w, c) in zip(rows, steps):
        row.update(wall=w, cpu=c)
    waiting, arrival, after = _phases(rows)
    first = next((r for r in rows if r["arrived"]), None)
    print(f"arrival: {args.model}/{args.size}, {args.steps} adaptive steps, caches {root}, "
          f"torch threads {torch.get_num_threads()}, load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"  eager step (median of {len(eager)}): {1e3 * eager_wall:.1f} ms wall, "
          f"{1e3 * eager_cpu:.1f} ms program-thread CPU")
    print("  phase              steps  wall ms  (x eager)  thread CPU ms  max wall ms")
    for name, part in (("waiting", waiting), ("arrival", arrival), ("after", after)):
        walls = [r["wall"] for r in part]
        cpus = [r["cpu"] for r in part]
        ratio = f"{statistics.median(walls) / eager_wall:5.2f}x" if walls else "    -"
        top = f"{1e3 * max(walls):8.1f}" if walls else "       -"
        print(f"  {name:<18} {len(part):5d}  {_ms(walls)}   ({ratio})   {_ms(cpus)}      {top}")
    for r in arrival:
        print(f"    arrival at step {r['step']}: {1e3 * r['wall']:.1f} ms wall "
              f"({1e3 * (r['wall'] - eager_wall):+.1f} over eager), {1e3 * r['cpu']:.1f} ms thread CPU")
    _print_regions(stats, queued, first, kids0, kids1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"eager": eager, "rows": rows}, f)


if __name__ == "__main__":
    sys.exit(main())
