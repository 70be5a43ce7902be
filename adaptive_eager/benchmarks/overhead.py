"""Capture overhead per op: ``python -m benchmarks.overhead``.

Times a chain of tiny pointwise ops (fp32[32]) in one thread, as
  * plain eager,
  * under adaptive eager with capture forced on (``adaptive_passthrough=False``,
    backend "eager": every op is recorded, then replayed at the window's flush),
  * under adaptive eager with the default policy (which stops deferring when windows
    of tiny ops cannot pay for their capture, Note [Capture must cost less than the work]),
and prints microseconds per op and the ratio to eager. Medians of repeated runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _chain(x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
    a = x
    for _ in range(n):
        a = a * 1.0001 + y
    return a


def _time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead")
    p.add_argument("--ops", type=int, default=200, help="ops per step (2 per chain link)")
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import adaptive_eager as ae

    x, y = torch.randn(32), torch.randn(32)
    n = a.ops // 2

    def step() -> float:
        return _chain(x, y, n).sum().item()

    for _ in range(5):
        step()
    eager = _time(step, a.reps)
    rows = [("eager", eager)]
    for label, opts in (("capture (forced)", {"backend": "eager", "adaptive_passthrough": False}),
                        ("adaptive (default policy)", {})):
        with ae.adaptive_eager(window_size=4 * a.ops, **opts):
            for _ in range(20):
                step()
            rows.append((label, _time(step, a.reps)))
    ops = 2 * n + 2
    print(f"{'mode':28s} {'us/op':>8s} {'ratio vs eager':>15s}")
    for label, t in rows:
        print(f"{label:28s} {t / ops * 1e6:8.2f} {eager / t:15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
