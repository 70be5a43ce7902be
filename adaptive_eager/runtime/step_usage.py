"""What the program's thread spends in page faults between optimizer steps, for the report.

Note [Page faults between optimizer steps]
Eager PyTorch on the CPU allocates each step's large tensors afresh: glibc serves a block
above its mmap threshold (32 MiB at most) with its own mapping and unmaps it when freed, so
the next step faults every page in again, in the kernel, on the program's thread. Measured
on the 2-core machine (``resource.getrusage(RUSAGE_THREAD)`` around each step of the demo's
job, 17.9M parameters, AdamW): ~34,800 minor faults a step, 60-80 ms of system time in a
150-180 ms eager step, up to 230-390 ms while a compile ran beside it; with glibc told to
keep freed memory (``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184``) the same 40
steps took 3.1-3.6 s instead of 6.8-6.9 s (no faults), at 719 MiB peak RSS instead of 656.
That is a cost eager pays too, and no fusion removes it all (the compiled step still took
16,385 faults, 68-83 ms -> 55-63 ms without them), so the runtime does not hide it: at each
optimizer step end (dispatch/parking.py, any phase) it reads its thread's usage, one
``getrusage`` (~1 µs), and the report names the cost and the setting when faults take a
large share of the steps. It changes nothing itself: a process-wide allocator policy that
keeps memory from the OS is the program's choice (its RSS no longer shrinks between steps).

Example::

    >>> from adaptive_eager.runtime.counters import Counters
    >>> c = Counters()
    >>> book(c, (100, 0.10, 1.0), (35100, 0.17, 1.15))
    >>> (c.steps_sampled, c.step_faults, round(c.step_system_s, 2), round(c.step_wall_s, 2))
    (1, 35000, 0.07, 0.15)
"""

from __future__ import annotations

import time
from typing import Any

try:
    import resource
    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux
except ImportError:  # pragma: no cover - Windows has no resource module
    resource = None  # type: ignore[assignment]
    _RUSAGE_THREAD = None

Sample = tuple  # (page faults, system seconds, wall seconds) of the calling thread

# The report's line appears from this many faults a step and this share of its wall time.
FAULTS_PER_STEP = 1000
SYSTEM_SHARE = 0.15
KEEP_MEMORY = "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184"


def sample() -> Sample | None:
    """The calling thread's page faults, system time and the wall clock; None where the
    platform cannot tell one thread's usage."""
    if _RUSAGE_THREAD is None:
        return None
    r = resource.getrusage(_RUSAGE_THREAD)
    return (r.ru_minflt + r.ru_majflt, r.ru_stime, time.perf_counter())


def book(counters: Any, last: Sample, now: Sample, waiting: bool = False) -> None:
    """Count one step's usage (from ``last`` to ``now``) in ``counters``; ``waiting``: it
    ended with a compile in flight."""
    counters.steps_sampled += 1
    counters.step_faults += now[0] - last[0]
    counters.step_system_s += now[1] - last[1]
    counters.step_wall_s += now[2] - last[2]
    if waiting:
        counters.steps_waiting += 1
        counters.step_waiting_wall_s += now[2] - last[2]


def waiting_line(steps: int, wall_s: float, waiting: int, waiting_wall_s: float) -> str | None:
    """The report's line on the steps that ran while a compile was in flight (issue 22:
    the report says what waiting cost), or None when there were none, or no others.

    >>> print(waiting_line(100, 20.0, 30, 9.0))
    30 of 100 steps (optimizer step to the next) ended with a compile in flight: 300 ms a step against 157 ms for the others (1.91x)
    """
    others = steps - waiting
    if waiting <= 0 or others <= 0:
        return None
    during, rest = waiting_wall_s / waiting, (wall_s - waiting_wall_s) / others
    ratio = f" ({during / rest:.2f}x)" if rest > 0 else ""
    return (f"{waiting:,} of {steps:,} steps (optimizer step to the next) ended with a compile "
            f"in flight: {during * 1e3:.0f} ms a step against {rest * 1e3:.0f} ms for the "
            f"others{ratio}")


def report_line(steps: int, faults: int, system_s: float, wall_s: float) -> str | None:
    """The report's line about page faults, or None when they cost little (see the Note).

    >>> print(report_line(100, 3_480_000, 7.0, 16.0))
    34,800 a step, 70 ms of system time a step (44% of the time between optimizer steps): the program's large CPU tensors are given back to the OS when freed and faulted in again each step; on Linux with glibc, MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=17179869184 keeps them (eager pays this too)
    >>> report_line(100, 20_000, 0.1, 16.0) is None
    True
    """
    if steps < 3 or wall_s <= 0:
        return None
    per_step = faults / steps
    share = system_s / wall_s
    if per_step < FAULTS_PER_STEP or share < SYSTEM_SHARE:
        return None
    return (f"{per_step:,.0f} a step, {system_s / steps * 1e3:.0f} ms of system time a step "
            f"({share:.0%} of the time between optimizer steps): the program's large CPU "
            "tensors are given back to the OS when freed and faulted in again each step; on "
            f"Linux with glibc, {KEEP_MEMORY} keeps them (eager pays this too)")


__all__ = ["sample", "book", "report_line", "waiting_line", "FAULTS_PER_STEP", "SYSTEM_SHARE",
           "KEEP_MEMORY"]
