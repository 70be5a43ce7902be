"""Capture overhead per op: ``python -m benchmarks.overhead``.

Times a chain of tiny pointwise ops (fp32[32], ``--ops`` of them, then ``.sum()`` and the
``.item()`` that flushes) in one thread, as
  * plain eager,
  * under adaptive eager with capture forced on (``adaptive_passthrough=False``, backend
    "eager": every op is captured, then replayed at the window's flush), with the
    recurring-window fast path (the default, Note [Recurring windows are matched, not
    recorded]) and without it (``fast_path=False``: every op recorded),
  * under adaptive eager with the default policy (which stops deferring when windows
    of tiny ops cannot pay for their capture, Note [Capture must cost less than the work]),
and prints microseconds per captured op, split into the record part (the chain's ops,
captured) and the flush part (``.sum().item()``: the flush runs the window), in CPU time
of this thread (``time.thread_time``: on a shared machine wall time mostly measures being
descheduled) and wall time, with the ratio to eager, the GC collections per 100 steps
and the load average. Variants run round-robin in one process (interleaved A/B), each
step in its own block; medians over rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import torch


def _chain(x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
    a = x
    for _ in range(n):
        a = a * 1.0001 + y
    return a


class _GcCount:
    """Counts generation-0 collections (gc.callbacks) for the variant running now."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.counts: dict[str, int] = {}
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start" and self.current is not None:
            self.counts[self.current] = self.counts.get(self.current, 0) + 1

    def close(self) -> None:
        gc.callbacks.remove(self)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead")
    p.add_argument("--ops", type=int, default=200, help="captured ops of the chain (2 per link)")
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds (one step per variant)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import adaptive_eager as ae

    x, y = torch.randn(32), torch.randn(32)
    n = a.ops // 2
    ops = 2 * n + 1  # the chain and its sum; the .item() is the flush
    forced = {"backend": "eager", "adaptive_passthrough": False, "warmup": False,
              "window_size": 4 * a.ops}
    blocks = {
        "capture, fast path": ae.adaptive_eager(**forced),
        "capture, fast_path=False": ae.adaptive_eager(fast_path=False, **forced),
        "adaptive (default policy)": ae.adaptive_eager(window_size=4 * a.ops),
    }
    cpu: dict[str, tuple[list, list]] = {}
    wall: dict[str, tuple[list, list]] = {}

    def timed(label: str, ctx) -> None:
        with ctx if ctx is not None else _null():
            c1, w1 = time.thread_time(), time.perf_counter()
            r = _chain(x, y, n)
            c2, w2 = time.thread_time(), time.perf_counter()
            r.sum().item()
            c3, w3 = time.thread_time(), time.perf_counter()
        rc, fc = cpu.setdefault(label, ([], []))
        rw, fw = wall.setdefault(label, ([], []))
        rc.append(c2 - c1)
        fc.append(c3 - c2)
        rw.append(w2 - w1)
        fw.append(w3 - w2)

    variants = {"eager": None, **blocks}
    for _ in range(20):  # warm: first sightings, plans, traces, the policy's decisions
        for label, ctx in variants.items():
            timed(label, ctx)
    cpu.clear()
    wall.clear()
    gcs = _GcCount()
    load0 = os.getloadavg()
    try:
        for r in range(a.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for label, ctx in order:
                gcs.current = label
                timed(label, ctx)
                gcs.current = None
    finally:
        gcs.close()
    load1 = os.getloadavg()

    def per_op(samples: list) -> float:
        return statistics.median(samples) / ops * 1e6

    base = per_op(cpu["eager"][0]) + per_op(cpu["eager"][1])
    print(f"chain of {ops} captured ops (fp32[32]) + its flush, {a.rounds} interleaved rounds, "
          f"medians; load average {load0[0]:.2f} -> {load1[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'mode':28s} {'CPU us/op: record':>17s} {'flush':>7s} {'total':>7s} {'vs eager':>9s}"
          f" {'wall us/op':>11s} {'gc0/100 steps':>14s}")
    for label in variants:
        rec, fl = per_op(cpu[label][0]), per_op(cpu[label][1])
        w = per_op(wall[label][0]) + per_op(wall[label][1])
        collections = 100 * gcs.counts.get(label, 0) / a.rounds
        print(f"{label:28s} {rec:17.2f} {fl:7.2f} {rec + fl:7.2f} {base / (rec + fl):9.2f}"
              f" {w:11.2f} {collections:14.1f}")
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
