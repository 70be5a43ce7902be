"""Counters: what the runtime did, kept in one place the statistics API grows from.

A :class:`Counters` object is owned by one runtime session (a mode and its
executor); it is mutable on purpose (cheap increments on the hot path) and
snapshotted into the frozen ``adaptive_eager.stats()`` dataclass.

Example::

    >>> c = Counters()
    >>> c.note_flush("item", "train.py:12")
    >>> c.flushes["item"], c.sync_sites["train.py:12"]
    (1, 1)
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    ops_captured: int = 0          # ops recorded into windows
    ops_passthrough: int = 0       # target-device ops run straight through (not deferred)
    ops_executed: int = 0          # recorded ops run by an executor (eager or compiled)
    ops_fused: int = 0             # of those, ops run inside compiled regions
    ops_eager: int = 0             # of those, ops replayed eagerly
    windows: int = 0               # windows flushed
    flushes: Counter = field(default_factory=Counter)       # reason -> count
    sync_sites: Counter = field(default_factory=Counter)    # user source line -> count
    sync_site_reasons: Counter = field(default_factory=Counter)  # (line, reason) -> count
    fallback_ops: Counter = field(default_factory=Counter)  # "op: reason" -> count
    fallback_sites: dict = field(default_factory=dict)     # op -> the user's line first seen
    sources_wanted: dict = field(default_factory=dict)     # op target -> op, for the mode
    regions_compiled: int = 0
    compiled_calls: int = 0
    compile_failures: int = 0
    demotions: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    compile_time_s: float = 0.0
    compiles_in_flight: int = 0
    meta_hits: int = 0
    meta_misses: int = 0
    optimizer_steps_foreach: int = 0  # torch.optim steps run at the foreach level (dispatch/optim.py)
    handles_released: int = 0     # bound handles turned into plain tensors (mode.release_handles)
    warmup_ended: str = ""        # why and where capture started (Note [The first iteration runs eagerly])
    # Where the time went (Note [What the time breakdown measures]): wall ns, summed over
    # flushed windows; one perf_counter_ns pair per flush and per region, none per op.
    capture_ns: int = 0           # first recorded op to flush: recording + the program's Python between
    flush_ns: int = 0             # the executors' runs of those windows, of which:
    eager_replay_ns: int = 0      #   ops replayed eagerly
    compiled_region_ns: int = 0   #   calls of compiled regions
    # windows that ran compiled regions: how many, their eager runs (as measured when they
    # last ran all eagerly) and their runs now; the difference is the estimated saving
    compared_windows: int = 0
    compared_eager_ns: int = 0
    compared_run_ns: int = 0
    compile_latency_s: float = 0.0      # queued -> ready, summed over finished compiles
    compile_latency_max_s: float = 0.0  # the longest of them
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note_flush(self, reason: str, site: str | None) -> None:
        self.flushes[reason] += 1
        if site is not None:
            self.sync_sites[site] += 1
            self.sync_site_reasons[(site, reason)] += 1

    def note_fallback(self, op: str, reason: str, site: str | None = None,
                      target: object = None) -> None:
        """Count a fallback of ``op``; ``site``: the program's line, if known here. Without
        one, ``target`` (the op) asks the mode for the line of its next recording."""
        self.fallback_ops[f"{op}: {reason}"] += 1
        if op not in self.fallback_sites:
            if site is not None:
                self.fallback_sites[op] = site
            elif target is not None:
                self.sources_wanted[target] = op

    def note_run(self, opened_ns: int, start_ns: int, end_ns: int,
                 eager_ns: int | None = None) -> None:
        """Time one executor run of a window (Note [What the time breakdown measures]):
        it ran from ``start_ns`` to ``end_ns``, its first op was recorded at ``opened_ns``
        (0: unknown); ``eager_ns``: the window's measured eager run, when compiled regions
        ran in it this time (the saving estimate)."""
        ran = end_ns - start_ns
        self.flush_ns += ran
        if opened_ns:
            self.capture_ns += start_ns - opened_ns
        if eager_ns is not None:
            self.compared_windows += 1
            self.compared_eager_ns += eager_ns
            self.compared_run_ns += ran

    def reset(self) -> None:
        fresh = Counters()
        for name in self.__dataclass_fields__:
            if name != "lock":
                setattr(self, name, getattr(fresh, name))


__all__ = ["Counters"]
