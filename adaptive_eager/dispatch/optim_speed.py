"""Compiled optimizer steps timed against their eager steps: one slower goes back.

Example::

    >>> from adaptive_eager.dispatch.optim_speed import STEP_TIMED_CALLS
    >>> STEP_TIMED_CALLS
    5
"""

from __future__ import annotations

import weakref
from typing import Any

from ..reasons import R
from ..runtime.cache import COMPILED
from .optim_threshold import CostThreshold, thread_spent

# Note [A compiled step slower than eager's goes back]
# The cost threshold (Note [A step compiles once it has cost enough]) decides when a
# step is worth a compile, not whether the compiled step is faster: for a tiny model
# it is not. Adam over a Linear(8, 8) (2 tensors, 72 floats), parked, one thread: eager
# 136-177 µs a step, compiled 216-395 µs (the hooks' Python, the known step's check,
# six 0-d scalars made each step, the compiled call's wrappers), and it compiled once
# its eager steps had cost optimizer_step_after_ms (~600 steps): from there the loop
# ran slower for good. So the first STEP_TIMED_CALLS compiled steps are timed like the
# eager ones were (the program thread's CPU from our pre-hook to our post-hook, less
# its flushes); if the fastest is no faster than eager's average step, the entry is
# demoted (eager-only, counted in demotions, the report's reason names both figures)
# and the steps run eagerly as before the compile. A step whose trace came from the
# disk cache has no eager figure and is kept, so a demoted step's artifact is deleted
# from the cache (a later process times its eager steps again); the debugging backends
# (eager, aot_eager: for checking results, not speed) are never demoted, as regions
# are not.
STEP_TIMED_CALLS = 5

# Note [A step found slower than eager stays eager in the next process]
# A demoted step's artifact is deleted (Note [A compiled step slower than eager's goes
# back]), so the next process ran the same program through the same cost threshold,
# traced, compiled the step again in the worker, timed it, and demoted it again: a
# compile and five slow steps in every process, for a verdict that depends on what the
# disk key holds (the step's graph, the environment, the backend, the thread count) and
# on the eager step's cost. So a demotion also records the compiled step's time beside
# its key (``<key> slower than eager``); a later process whose trace lands on that key
# compares it with its own eager steps' average (the threshold timed them before the
# trace) and keeps the step eager, without a compile, while the recorded compiled time
# is no faster; an eager step that has grown dearer (another load, bigger tensors are
# another key) than the recorded compiled time compiles it again, and that compile is
# timed and decided afresh. Debugging backends are never demoted, so never recorded.


class StepSpeed:
    """Per optimizer: where its compiled step started (``thread_mark``), until its end."""

    def __init__(self, threshold: CostThreshold) -> None:
        self._threshold = threshold  # the eager steps' figures
        self._started: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()

    def started(self, opt: Any, mark: tuple) -> None:
        """``opt``'s step ran compiled; it began at ``mark``."""
        self._started[opt] = mark

    def ended(self, opt: Any, known: tuple | None) -> None:
        """``opt``'s step is over (``known``: its (KnownStep, entry, service)): the time of a
        compiled one is booked, and its entry demoted once it shows no faster than eager."""
        mark = self._started.pop(opt, None)
        region = known[1].region if mark is not None and known is not None else None
        if region is None or region.state != COMPILED or len(region.compiled_ns) >= STEP_TIMED_CALLS:
            return
        region.compiled_ns.append(thread_spent(mark))
        eager = self._threshold.eager_step_ns(opt)
        if len(region.compiled_ns) == STEP_TIMED_CALLS and eager is not None \
                and min(region.compiled_ns) >= eager:
            service = known[2]
            service.fail(region, f"{R.DEMOTED}: the compiled step took {min(region.compiled_ns) / 1e3:.0f} µs, "
                                 f"eager's {eager / 1e3:.0f} µs", "demotions")
            store = getattr(service, "store", None)
            if region.disk_key is not None and store is not None:
                store.discard(region.disk_key)  # not loaded, untimed, by a later process
                # Note [A step found slower than eager stays eager in the next process]
                store.note_slow(region.disk_key, min(region.compiled_ns))

    def found_slow(self, opt: Any, region: Any, service: Any) -> bool:
        """Whether an earlier process found ``region``'s compiled step no faster than ``opt``'s
        eager steps cost here; if so, the region is demoted now, with no compile (Note [A
        step found slower than eager stays eager in the next process])."""
        store = getattr(service, "store", None)
        if store is None or region.disk_key is None:
            return False
        slow = store.slow_ns(region.disk_key)
        if slow is None:
            return False
        eager = self._threshold.eager_step_ns(opt)
        if eager is not None and slow < eager:
            return False
        here = f", eager's {eager / 1e3:.0f} µs" if eager is not None else ""
        service.fail(region, f"{R.DEMOTED}: the compiled step took {slow / 1e3:.0f} µs in an earlier "
                             f"process{here}", "demotions")
        return True


__all__ = ["STEP_TIMED_CALLS", "StepSpeed"]
