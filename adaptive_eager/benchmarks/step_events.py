"""Which runtime work lands in which step of the demo's job (issue 22, items 1-4).

``python -m benchmarks.step_events [--steps N] [--eager-steps N]`` trains the demo's job
(``adaptive_eager.demo.build``) a few steps eagerly, then under adaptive eager with the
Inductor backend, and prints each adaptive step's wall time, the program thread's CPU and
the runtime work that overlapped it: the optimizer step's trace, compiled run and check
(``opt.trace``, ``opt.run``, ``opt.after``), the compile service's compiles and disk loads
and the loader's warm-up (``svc.*``, on the service thread), flushes and first compiled
calls of regions. Each is timed by wrapping the runtime's method for this process only
(times in ms; ``(cpuN)``: the work's own thread CPU, when it ran within the step). A step
above 1.3x eager's median is marked SLOW. The caches are the environment's
(``TORCHINDUCTOR_CACHE_DIR``, ``ADAPTIVE_EAGER_CACHE_DIR``): fresh folders for a fresh
machine, the same again for a second run. On a loaded machine wall times measure the
scheduler; the program thread's CPU is what to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import threading
import time
from typing import Any, Callable

_WRAPPED = (  # (module, class or None, method, label)
    # optim_compile calls its own name for the trace (imported from optim_trace)
    ("adaptive_eager.dispatch.optim_compile", None, "trace_signature", "opt.trace"),
    ("adaptive_eager.dispatch.optim_compile", "StepCompiler", "_run", "opt.run"),
    ("adaptive_eager.dispatch.optim_compile", "StepCompiler", "after_step", "opt.after"),
    ("adaptive_eager.runtime.compiler", "CompileService", "_load", "svc.load"),
    ("adaptive_eager.runtime.compiler", "CompileService", "_compile", "svc.compile"),
    ("adaptive_eager.runtime.compiled", "CompiledExecutor", "_first_call", "first_call"),
    ("adaptive_eager.runtime.compiled", "CompiledExecutor", "run", "flush"),
    ("adaptive_eager.runtime.compile_worker", None, "warm_loader", "warm_loader"),
)
_SHOWN_ALWAYS = ("svc.load", "svc.compile", "opt.trace", "warm_loader")


def _wrap(owner: Any, name: str, label: str, events: list) -> None:
    f: Callable = getattr(owner, name)

    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            events.append((label, threading.current_thread().name[:12], t0, time.perf_counter(),
                           time.thread_time() - c0))

    setattr(owner, name, timed)


def _steps(job: Any, n: int, ctx: Callable[[], Any]) -> list[tuple[float, float, float]]:
    """(start, end, program-thread CPU) of each of ``n`` steps of ``job`` inside ``ctx()``
    (benchmarks.arrival's training loop)."""
    from .arrival import _steps as train  # noqa: PLC0415

    ends: list[float] = []
    with ctx():
        timed = train(job, n, lambda i: ends.append(time.perf_counter()))
    return [(end - wall, end, cpu) for end, (wall, cpu) in zip(ends, timed)]


def _overlaps(events: list, t0: float, t1: float) -> str:
    out = []
    for label, thread, s0, s1, cpu in events:
        ms = 1e3 * (min(t1, s1) - max(t0, s0))
        if ms > 5 or (t0 <= s0 < t1 and label in _SHOWN_ALWAYS):
            inside = f"(cpu{1e3 * cpu:.0f})" if t0 <= s0 and s1 <= t1 else ""
            out.append(f"{label}@{thread}:{ms:.0f}{inside}")
    return " ".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eager-steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's default: 1)")
    args = ap.parse_args(argv)
    import importlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from adaptive_eager import demo, session  # noqa: PLC0415

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    events: list = []
    for module, cls, name, label in _WRAPPED:
        mod = importlib.import_module(module)
        _wrap(getattr(mod, cls) if cls else mod, name, label, events)
    eager = _steps(demo.build("mlp", "small"), args.eager_steps, contextlib.nullcontext)[2:]
    walls = sorted(t1 - t0 for t0, t1, _ in eager)
    cpus = sorted(c for _, _, c in eager)
    ew, ec = walls[len(walls) // 2], cpus[len(cpus) // 2]
    print(f"step_events: load average {os.getloadavg()[0]:.1f}; eager step median {1e3 * ew:.0f} ms "
          f"wall, {1e3 * ec:.0f} ms program-thread CPU")
    session.reset_stats()
    start = time.perf_counter()
    rows = _steps(demo.build("mlp", "small"), args.steps,
                  lambda: session.adaptive_eager(backend="inductor"))
    stats = session.stats()
    print("  step      t  wall ms (x eager)  CPU ms  overlapping work")
    for i, (t0, t1, cpu) in enumerate(rows):
        slow = "SLOW" if i >= 2 and t1 - t0 > 1.3 * ew else "    "
        print(f"{slow} {i + 1:4d} {t0 - start:6.2f} {1e3 * (t1 - t0):7.0f} ({(t1 - t0) / ew:4.2f}x) "
              f"{1e3 * cpu:6.0f}  {_overlaps(events, t0, t1)}")
    for label, thread, s0, s1, cpu in events:
        if label in _SHOWN_ALWAYS:
            print(f"  {label:12s} {thread:12s} {s0 - start:7.2f} -> {s1 - start:7.2f} s  "
                  f"({s1 - s0:.2f} s, thread CPU {cpu:.2f} s)")
    print(f"  regions from disk {stats.regions_from_disk}, compiled {stats.regions_compiled}, "
          f"longest compile latency {stats.compile_latency_max_s:.1f} s, optimizer steps compiled "
          f"{stats.optimizer_steps_compiled}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
