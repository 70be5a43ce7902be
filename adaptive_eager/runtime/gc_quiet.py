"""The runtime's import bursts do not make the program collect its whole heap.

Example::

    >>> import gc
    >>> from adaptive_eager.runtime.gc_quiet import HeapQuiet
    >>> quiet = HeapQuiet(min_modules=0)
    >>> quiet.block_entered()                   # a block is open (session.py says so)
    >>> before = gc.get_threshold()
    >>> with quiet.burst():
    ...     gc.get_threshold()[2] > before[2]   # no full collection while it runs
    True
    >>> gc.get_threshold() == before, quiet.frozen
    (True, True)
    >>> quiet.block_left(); quiet.frozen, gc.get_freeze_count()
    (False, 0)
"""
from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
from typing import Iterator

log = logging.getLogger("adaptive_eager")

# Note [The runtime's imports freeze the heap they grew]
# CPython collects its oldest generation (every tracked object: torch's modules, the
# program's model, the runtime's) when the objects promoted into it since the last full
# collection exceed a quarter of those it held then. The artifact loader imports 1,424 of
# Inductor's modules (Note [The loader is warmed while the worker compiles],
# compile_worker.py): a process with torch imported grows from 166,000 tracked objects to
# 369,000, and full collections follow, each scanning the whole heap with the GIL held. The demo's kept run (two regions loaded from
# disk; gc.callbacks timing every full collection, with its thread) had one in its
# adaptive run: 289 ms on the compile thread in the load, and its step 6 took 644 ms
# against eager's 291 (the other five of the process were at its start, in its own
# imports of torch). The fresh run's loader warm-up does the same (one of 222 ms on the
# service thread, 2026-12-03).
# So each burst of the runtime's own imports (the loader's warm-up, an artifact load)
# runs with full collections put off (the young generations are still collected, so the
# program's short-lived cycles go as before), and when the outermost burst ends having
# imported ``min_modules`` or more, every tracked object is frozen (``gc.freeze()``: moved
# out of the generations, never scanned again) and the thresholds are restored: the next
# full collections scan only what is made after, and none scans torch's and Inductor's
# modules again. The cost: an object alive at the freeze that later dies in a reference
# cycle (not by its reference count, which frees as always) is not collected until the
# heap is thawed, which any thread's outermost block's exit does (session.py): then the
# next full collection, after the block, scans everything once; a burst with no block
# open (a compile landing after the block) freezes nothing. Nothing is done where the program
# manages its collector itself: collection disabled, a threshold of 0, or objects already
# frozen by someone else. Measured after (the same demo runs, one each): no full
# collection in either adaptive run; the kept run's slowest loading step 359 ms (the
# load's share of the GIL: Note [GIL convoy], compiler.py).
MIN_MODULES = 100  # an artifact load that imports nothing new freezes nothing
_OFF = 1 << 30     # the oldest generation's threshold while a burst runs


class HeapQuiet:
    """The process's one account of the runtime's import bursts (``QUIET``): nests, and
    is safe to use from several threads (the collector is the process's)."""

    def __init__(self, min_modules: int = MIN_MODULES) -> None:
        self.min_modules = min_modules
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: tuple[int, int, int] | None = None  # the thresholds the burst put off
        self._modules = 0
        self._ours = 0  # gc.get_freeze_count() after our freeze; 0: nothing of ours frozen
        self._blocks = 0  # outermost blocks open in the process's threads
        self._owed = False  # a block's exit came while a burst ran: its end thaws

    @property
    def frozen(self) -> bool:
        """Whether a freeze of ours is in place."""
        return self._ours > 0

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        """Run the block with full collections put off; freeze what it grew (see the Note)."""
        with self._lock:
            if self._depth == 0:
                self._saved = None
                thresholds = gc.get_threshold()
                theirs = gc.get_freeze_count() > 0 and not self._ours
                if gc.isenabled() and thresholds[0] > 0 and not theirs:
                    self._saved = thresholds
                    self._modules = len(sys.modules)
                    gc.set_threshold(thresholds[0], thresholds[1], _OFF)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._saved is not None:
                    self._end(self._saved)

    def _end(self, saved: tuple[int, int, int]) -> None:
        now = gc.get_threshold()
        if now[2] == _OFF:  # unless the program set its own meanwhile
            gc.set_threshold(now[0], now[1], saved[2])
        if self._owed and self._ours:
            gc.unfreeze()
            self._ours = 0
        self._owed = False
        grew = len(sys.modules) - self._modules
        # no block open (a compile that lands after the program's block ended): no one
        # would thaw it, so nothing is frozen
        if grew >= self.min_modules and gc.isenabled() and self._blocks > 0:
            gc.freeze()
            self._ours = max(gc.get_freeze_count(), 1)
            log.debug("adaptive_eager: %d modules imported by the runtime; %d objects frozen "
                      "(Note [The runtime's imports freeze the heap they grew])", grew, self._ours)

    def block_entered(self) -> None:
        """A thread entered its outermost block (session.py)."""
        with self._lock:
            self._blocks += 1

    def block_left(self) -> None:
        """A thread left its outermost block: it thaws (:meth:`thaw`), whatever other
        threads still run (a block abandoned in a thread that ended is never left, so the
        count cannot say when the last one is: a freeze must not outlive the block)."""
        with self._lock:
            self._blocks = max(0, self._blocks - 1)
        self.thaw()

    def thaw(self) -> None:
        """Undo our freeze (while a burst runs, at its end); the next full collection
        scans everything once. NB: a freeze the program adds after ours is undone with it
        (the collector keeps one frozen set)."""
        with self._lock:
            if self._ours and self._depth > 0:
                self._owed = True
            elif self._ours:
                gc.unfreeze()
                self._ours = 0


#: the process's account (the collector is the process's: one owner for it)
QUIET = HeapQuiet()

__all__ = ["HeapQuiet", "QUIET", "MIN_MODULES"]
