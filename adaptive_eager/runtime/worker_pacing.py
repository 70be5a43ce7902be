"""The compile worker runs in slices while the program's threads fill the cores.

Example::

    >>> from adaptive_eager.runtime.worker_pacing import WorkerPacer, next_run_s
    >>> next_run_s(program_cores=1.9, cores=2)   # the program fills both cores: a slice
    0.01
    >>> next_run_s(program_cores=0.9, cores=2)   # a core is free: the worker runs on
    0.1
    >>> sent = []
    >>> pacer = WorkerPacer(1234, cores=2, signal=lambda pgid, sig: sent.append(sig))
    >>> with pacer.pacing():
    ...     pass
    >>> sent[-1].name      # a pacing always ends by continuing the worker
    'SIGCONT'
"""
from __future__ import annotations

import contextlib
import os
import signal as _signal
import threading
import time
from typing import Callable, Iterator

# Note [The worker runs in slices while the program fills the cores]
# The compile worker is one more busy process. Where the program's intra-op threads leave
# a core free (the demo: one thread on two cores) it costs the program little, but where
# they take every core (the GPT and AdamW benchmarks: two threads on two cores) the
# program slowed 2.5-5x for the whole compile: OpenMP's threads wait for each other at
# the end of every parallel op, and whichever lost its core to the worker keeps the other
# spinning. The GPT benchmark's train step (its workload in a ``/tmp`` script, eager
# 175-180 ms) ran 431-978 ms for the 31 steps its AdamW compile took (17.6 s).
# Measured beside that program with a busy process started and stopped by signals
# (medians of 15 steps, eager alone 174-178 ms, 2 cores):
#   competitor          its share of a core   the program's step
#   always running      0.72                  534 ms (3.07x)
#   20 ms of every 40   0.29                  244 ms (1.37x)
#   10 ms of every 30   0.18-0.19             212 ms (1.19x)
#   10 ms of every 40   0.15-0.17             207-212 ms (1.19-1.22x)
#   5 ms of every 50    0.07-0.08             185-195 ms (1.06-1.12x)
# At every share the program lost about as much time as the competitor got (0.85-0.95 s
# of its steps per CPU second of the other process): slicing does not make a compile
# cheaper, it spreads its cost, at ~1.2x a step instead of ~3x, over a wait 4-6x longer.
# Lower priorities do not get that: at nice 10 the worker starved (still importing 25 s
# in), and under SCHED_IDLE the GPT program's AdamW compile never landed in 22 s (the
# program's spinning threads leave no idle time). Signals share by the clock, so a
# slice always runs.
#
# So, with option ``pace_compiles``, while a compile is in flight and the program's
# threads fill the cores (its thread count + 1 > the cores it may use), a pacing thread in
# the program stops the worker's process group (the worker and the compiler it runs) with
# SIGSTOP and continues it with SIGCONT: ``RUN_S`` running of every ``RUN_S + PAUSE_S``.
# During each pause it reads the program's own CPU rate (``time.process_time``, every
# thread); where that leaves a core free (the program waits on I/O, or runs Python on one
# thread while the others sleep), the worker runs on for ``FREE_RUN_S`` before it is
# looked at again. A compile the program waits for (``async_compile=False``) is never
# paced: nothing competes.
#
# It is off by default, because it does not meet its aim where it matters most. On the
# GPT train step (same script, fresh caches) it did: the AdamW compile landed 74 s after it
# was queued (the worker got ~0.14 of a core), the steps meanwhile 198-273 ms (most
# ~1.2x), then 168-176 ms. But on the AdamW benchmark (8 ms steps, 2 threads; `python -m
# benchmarks --workloads adamw --modes eager,adaptive`, load ~3) the paced compile had not
# landed after 141 s of steps (at full speed: 46.6 s), and the steps meanwhile were still
# 10-20 ms (1.25-2.5x; a 10 ms slice is longer than the step); at full speed they were 38
# ms on average (4.75x) for 46 s and 1.7 ms after. A program that gains much from its
# compile loses more by the later arrival than it saves per step, since the total cost is
# the same. ``pace_compiles=True`` suits long programs with long steps that want even step
# times; the report's ``worker paused`` line says how long the worker was held.
#
# Compile timeouts count the worker's running time, not its pauses (``paused_s``): a
# paced compile is no nearer its timeout for the time it was held. If the program dies
# while the worker is stopped, the worker's process group is orphaned with a stopped
# member, and the kernel sends it SIGHUP then SIGCONT: the worker ends (it also ends at the
# end of its input). The pacing thread always continues the worker when the compile ends.
RUN_S = 0.010
PAUSE_S = 0.020
FREE_RUN_S = 0.1
FREE_SLACK = 0.25  # cores: a program using at most cores - 1 + this leaves a core free


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def contended(threads: int, cores: int | None = None) -> bool:
    """Whether a program with ``threads`` intra-op threads leaves no core to the worker.

    >>> contended(1, cores=2), contended(2, cores=2), contended(4, cores=8)
    (False, True, False)
    """
    return threads + 1 > (usable_cores() if cores is None else cores)


def next_run_s(program_cores: float, cores: int) -> float:
    """How long the worker runs next, given the program's CPU rate in cores during the
    last pause (Note [The worker runs in slices while the program fills the cores])."""
    return FREE_RUN_S if program_cores <= cores - 1 + FREE_SLACK else RUN_S


class WorkerPacer:
    """Stops and continues one process group while a compile is in flight.

    ``signal(pgid, sig)`` sends the signal (``os.killpg``); ``paused_s`` is the total time
    the group was held stopped, over every pacing of this pacer.
    """

    def __init__(self, pgid: int, cores: int,
                 signal: Callable[[int, _signal.Signals], None] = os.killpg,
                 cpu: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic):
        if pgid <= 0:  # killpg(0) is this process's own group; below 0, not a group
            raise ValueError(f"pgid must be a process group id > 0, got {pgid}")
        self.pgid = pgid
        self.cores = cores
        self.paused_s = 0.0
        self.pauses = 0
        self._signal = signal
        self._cpu = cpu
        self._clock = clock

    @contextlib.contextmanager
    def pacing(self) -> Iterator[None]:
        """Pace the group for the block's length; continued at its end, whatever happens."""
        done = threading.Event()
        thread = threading.Thread(target=self._loop, args=(done,), name="adaptive_eager-pacing",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self._send(_signal.SIGCONT)

    def hold(self, on: bool) -> None:
        """Stop (True) or continue (False) the group now (Note [The worker waits while
        the loader runs], compile_worker.py)."""
        self._send(_signal.SIGSTOP if on else _signal.SIGCONT)

    def _send(self, sig: _signal.Signals) -> bool:
        try:
            self._signal(self.pgid, sig)
            return True
        except OSError:  # the group is gone: nothing to pace
            return False

    def _loop(self, done: threading.Event) -> None:
        run = RUN_S
        while not done.is_set():
            if not self._send(_signal.SIGCONT) or done.wait(run):
                return
            if not self._send(_signal.SIGSTOP):
                return
            t0, c0 = self._clock(), self._cpu()
            done.wait(PAUSE_S)
            t1, c1 = self._clock(), self._cpu()
            self.paused_s += t1 - t0
            self.pauses += 1
            run = next_run_s((c1 - c0) / max(t1 - t0, 1e-6), self.cores)


__all__ = ["WorkerPacer", "contended", "next_run_s", "usable_cores", "RUN_S", "PAUSE_S", "FREE_RUN_S"]
