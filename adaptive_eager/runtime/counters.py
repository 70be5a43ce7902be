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
    fast_ops: int = 0             # of ops_captured, those matched against a recurring window's trace
    trace_mismatches: Counter = field(default_factory=Counter)  # "op at line" -> windows that diverged there
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

    def reset(self) -> None:
        fresh = Counters()
        for name in self.__dataclass_fields__:
            if name != "lock":
                setattr(self, name, getattr(fresh, name))


__all__ = ["Counters"]
