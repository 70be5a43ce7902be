"""The compiled-region cache: region signature -> :class:`RegionEntry`, bounded (LRU).

An entry is the runtime's record of one region signature: how often it was seen, its
compile state, the compiled artifact, timings. Evicting an entry drops its artifact; it
is compiled again if it becomes hot again. Hits, misses and evictions go to Counters.

Example::

    >>> from adaptive_eager.runtime.counters import Counters
    >>> c = Counters(); cache = RegionCache(1, c)
    >>> cache.entry("a").seen, cache.entry("b").seen, c.cache_evictions
    (0, 0, 1)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import cachetools

from .counters import Counters

COLD, COMPILING, COMPILED, EAGER_ONLY = "cold", "compiling", "compiled", "eager_only"


@dataclass(eq=False)
class RegionEntry:
    """Mutable runtime state of one region signature (see the module docstring)."""

    key: Hashable
    state: str = COLD
    seen: int = 0
    fn: Callable[..., Any] | None = None
    reason: str = ""                 # why eager-only
    submitted_at: float = 0.0
    submitted_paused: float = 0.0    # the compile service's paused() then (its timeout's clock)
    checked: bool = False            # first compiled call verified
    eager_ns: list[int] = field(default_factory=list)
    compiled_ns: list[int] = field(default_factory=list)
    scalars: dict = field(default_factory=dict)  # slot -> (value, 0-dim tensor)
    is_region: bool = True           # False: a compiled optimizer step (counted on its own)
    compiled_for: tuple = ()  # the specs of the example inputs it was compiled with
    disk_key: str | None = None      # its key in the disk cache (runtime/region_store.py)
    disk_tried: bool = False         # the disk cache was asked for it
    from_disk: bool = False          # its artifact was loaded from the disk cache


class _LRU(cachetools.LRUCache):
    def __init__(self, maxsize: int, counters: Counters):
        super().__init__(maxsize)
        self._counters = counters

    def popitem(self):  # noqa: ANN201 - cachetools signature
        item = super().popitem()
        self._counters.cache_evictions += 1
        item[1].fn = None
        return item


class RegionCache:
    """Bounded map from region signature to entry; thread-safe."""

    def __init__(self, maxsize: int, counters: Counters):
        self._lru = _LRU(maxsize, counters)
        self._lock = threading.Lock()

    def entry(self, key: Hashable) -> RegionEntry:
        """The entry for ``key``, created (cold) if absent."""
        with self._lock:
            e = self._lru.get(key)
            if e is None:
                e = self._lru[key] = RegionEntry(key)
            return e

    def __len__(self) -> int:
        return len(self._lru)

    def values(self) -> list[RegionEntry]:
        with self._lock:
            return list(self._lru.values())


__all__ = ["RegionEntry", "RegionCache", "COLD", "COMPILING", "COMPILED", "EAGER_ONLY"]
