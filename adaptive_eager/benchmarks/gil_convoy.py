"""Measure the GIL convoy behind Note [GIL convoy] (runtime/compiler.py).

``python -m benchmarks.gil_convoy``: 1000 in-place ops on fp32[1000] alone, next to a
thread running pure Python, and the same with shorter switch intervals.
"""
from __future__ import annotations

import sys
import threading
import time

import torch


def _ops(x: torch.Tensor, n: int = 1000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        x.mul_(1.0001)
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(1000)
    print(f"alone:                       {_ops(x):9.1f} ms")
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(1000))

    th = threading.Thread(target=busy, daemon=True)
    th.start()
    old = sys.getswitchinterval()
    try:
        print(f"next to a busy thread:       {_ops(x):9.1f} ms  (switch interval {old * 1e3:g} ms)")
        for interval in (1e-4, 2e-5):
            sys.setswitchinterval(interval)
            print(f"  switch interval {interval * 1e6:5.0f} us:     {_ops(x):9.1f} ms")
    finally:
        sys.setswitchinterval(old)
        stop.set()
        th.join()


if __name__ == "__main__":
    main()
