"""Measure the program's step next to a CPU-bound process, behind Note [The program's
threads are its own] (runtime/compiled.py).

``python -m benchmarks.threads_share``: an MLP training step (forward, backward, SGD)
with all cores' intra-op threads, alone; next to one busy process (a stand-in for the
compile worker) at nice 0, 10 and 19; and with one intra-op thread fewer next to it.
Medians of interleaved rounds, in ms; a second column says how far the busy process got
(its loop count per second, relative to it alone at nice 0): what a lower priority
would cost the compile.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

_BUSY = ("import os, sys, time\nos.nice(int(sys.argv[1]))\nn = 0\nt = time.perf_counter()\n"
         "while True:\n    n += 1\n    if n % 200000 == 0:\n"
         "        print(n / (time.perf_counter() - t), flush=True)\n")


def _step_ms(model: torch.nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer, n: int = 10) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _with_busy(nice: int | None, threads: int, model, x, opt) -> tuple[float, float]:
    if nice is None:
        torch.set_num_threads(threads)
        return _step_ms(model, x, opt), 0.0
    proc = subprocess.Popen([sys.executable, "-c", _BUSY, str(nice)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        torch.set_num_threads(threads)
        ms = _step_ms(model, x, opt)
    finally:
        proc.kill()
        out = proc.communicate()[0].split()
    return ms, float(out[-1]) if out else 0.0


def main() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 512)
    cases = [("alone", None, cores), ("busy nice 0", 0, cores), ("busy nice 10", 10, cores),
             ("busy nice 19", 19, cores), (f"busy nice 0, {cores - 1} thread(s)", 0, max(cores - 1, 1))]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
    _step_ms(model, x, opt, 5)
    for _ in range(3):
        for name, nice, threads in cases:
            results[name].append(_with_busy(nice, threads, model, x, opt))
    torch.set_num_threads(cores)
    base = statistics.median(r[1] for r in results["busy nice 0"]) or 1.0
    print(f"{cores} cores, {cores} intra-op threads unless said; median step (ms), busy process's progress")
    for name, _, _ in cases:
        ms = statistics.median(r[0] for r in results[name])
        rate = statistics.median(r[1] for r in results[name]) / base
        print(f"  {name:28s} {ms:8.1f} ms   {rate:5.2f}" if name != "alone" else f"  {name:28s} {ms:8.1f} ms")


if __name__ == "__main__":
    main()
