"""Real-program patterns, eager against adaptive eager in one process: ``python -m benchmarks.patterns``.

Each pattern (``workloads/patterns.py``: an LSTM and a Transformer LM like
word_language_model, its generate loop, nanoGPT train and sample, LBFGS with a closure, a
regression with a manual update, a GAN, a loop printing its loss) is a whole program, run
as the program would run: eagerly, then inside one ``adaptive_eager()`` block with default
options (a fresh session each time, so the warm-up, the capture and the decision to pass
through are in every timed run), alternating, ``--reps`` times. Times are CPU time of this
thread (``time.thread_time``: other processes on a shared machine do not inflate it, nor do
the intra-op threads' spin-waits) next to wall time; ratios are adaptive / eager of the
medians, so below 1 is faster. ``first`` is the same ratio for a one-step run of the
program (set-up and its first iteration). Results must be equal to eager's (``same``).

Example::

    python -m benchmarks.patterns                      # every pattern, 3 reps, 1 thread
    python -m benchmarks.patterns --only gan,lstm_lm --reps 5
    python -m benchmarks.patterns --json /tmp/patterns.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    r = fn()
    return r, time.thread_time() - c0, time.perf_counter() - w0


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def run_pattern(name: str, steps: int, reps: int, options: Dict[str, Any]) -> Dict[str, Any]:
    """Time pattern ``name`` eagerly and under the runtime, alternating; a result row."""
    import adaptive_eager as ae
    from adaptive_eager import session
    from .workloads.patterns import PATTERNS

    fn = PATTERNS[name]

    def adaptive(n: int) -> tuple[Any, float, float, Any]:
        session.clear_sessions()
        ae.reset_stats()
        with ae.adaptive_eager(**options):
            r, c, w = _timed(lambda: fn(n))
        return r, c, w, ae.stats()

    fn(steps)  # warm: first-call costs of torch itself are no one's
    eager_c, eager_w, ada_c, ada_w, same = [], [], [], [], True
    st = None
    for _ in range(reps):
        re_, c, w = _timed(lambda: fn(steps))
        eager_c.append(c)
        eager_w.append(w)
        ra, c, w, st = adaptive(steps)
        ada_c.append(c)
        ada_w.append(w)
        same = same and _same(re_, ra)
    first_e = statistics.median(_timed(lambda: fn(1))[1] for _ in range(reps))
    first_a = statistics.median(adaptive(1)[1] for _ in range(reps))
    e, a = statistics.median(eager_c), statistics.median(ada_c)
    captured = st.ops_captured
    return {
        "pattern": name, "steps": steps, "reps": reps,
        "eager_cpu_s": e, "adaptive_cpu_s": a, "ratio": a / e,
        "eager_wall_s": statistics.median(eager_w), "adaptive_wall_s": statistics.median(ada_w),
        "first_ratio": first_a / first_e, "same": same,
        "ops_captured": captured, "ops_passthrough": st.ops_passthrough,
        "ops_fused": st.ops_fused, "windows": st.windows, "regions_compiled": st.regions_compiled,
        "stats": st.to_json() if hasattr(st, "to_json") else None,
    }


def main(argv: List[str] | None = None) -> int:
    from .workloads.patterns import BENCH_STEPS, PATTERNS

    p = argparse.ArgumentParser(prog="python -m benchmarks.patterns")
    p.add_argument("--only", default="", help="comma-separated patterns (default: all)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="override every pattern's step count")
    p.add_argument("-o", "--option", action="append", default=[],
                   help="adaptive_eager option k=v (value parsed as JSON when it parses)")
    p.add_argument("--json", default="", help="write the rows here")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    options: Dict[str, Any] = {}
    for kv in a.option:
        k, _, v = kv.partition("=")
        try:
            options[k] = json.loads(v)
        except ValueError:
            options[k] = v
    names = [n for n in a.only.split(",") if n] or list(PATTERNS)
    print(f"load average {os.getloadavg()[0]:.2f}, {a.threads} thread(s), options {options or 'default'}")
    print(f"{'pattern':15s} {'eager cpu':>10s} {'adaptive':>10s} {'ratio':>6s} {'first':>6s} "
          f"{'wall e/a':>15s} {'captured':>8s} {'fused':>6s} {'windows':>7s} same")
    rows = []
    for name in names:
        row = run_pattern(name, a.steps or BENCH_STEPS[name], a.reps, options)
        rows.append(row)
        print(f"{name:15s} {row['eager_cpu_s'] * 1e3:8.1f}ms {row['adaptive_cpu_s'] * 1e3:8.1f}ms "
              f"{row['ratio']:5.2f}x {row['first_ratio']:5.2f}x "
              f"{row['eager_wall_s'] * 1e3:6.0f}/{row['adaptive_wall_s'] * 1e3:6.0f}ms "
              f"{row['ops_captured']:8d} {row['ops_fused']:6d} {row['windows']:7d} {row['same']}",
              flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
