"""When an optimizer's step is first traced (Note [A step compiles once it has cost
enough]), and which steps an earlier process saved compiled (Note [A saved step skips the
cost threshold]): an index in the persistent cache from a step's signature to its
artifact's disk key, read before the step is traced.

Example::

    >>> import tempfile, torch
    >>> from adaptive_eager.runtime.disk_cache import DiskCache
    >>> from adaptive_eager.runtime.backends import artifact_codec
    >>> from adaptive_eager.runtime.region_store import RegionStore
    >>> from adaptive_eager.runtime.optim_graph import gather
    >>> folder = tempfile.TemporaryDirectory()  # removed with the object
    >>> store = RegionStore(DiskCache(folder.name), "a backend", "cpu",
    ...                     artifact_codec("inductor", "cpu"))
    >>> p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)
    >>> opt = torch.optim.SGD([p], lr=0.1, momentum=0.9); opt.step()
    >>> got = gather(opt, (torch.Tensor, torch.nn.Parameter))
    >>> saved_before(store, got)           # nothing noted yet
    False
    >>> note_trace(store, got, "0" * 64)   # the trace's artifact key (not saved yet)
    True
    >>> saved_before(store, got)           # noted, but no artifact under that key
    False
    >>> store.cache.put("0" * 64, b"an artifact"); saved_before(store, got)
    True
    True
"""
from __future__ import annotations

import os
import sys
import time
import weakref
from typing import Any, Callable

import torch

from ..runtime.optim_graph import Gathered, gather
from ..runtime.region_store import RegionStore
from .optim_inputs import kernel_threads

# Note [A saved step skips the cost threshold]
# Note [A step compiles once it has cost enough] keeps a short program from paying for a
# compile it never earns back. A step an earlier process compiled and saved costs a load
# instead, and a load is cheap only where the backend's loader is already in the
# process: loading the tiny MLP's AdamW step from disk in a fresh process took 3.5 s of
# CPU (13.5 s wall, load average 8.6), of which ~1.05 s is Inductor's own import (~1,500
# modules; ``import torch._inductor.standalone_compile`` alone: 1.03-1.06 s CPU), against
# 0.16 s of CPU for that program's whole 300-step eager run; the load landed after 8.3 s
# (step 1,358 of a 3,000-step run), never within 300 steps. With Inductor's entry module
# imported first the first load still cost 0.72-0.96 s of CPU (another ~260-680 modules),
# a second load in the process 8-10 ms (load average 4.1). So the threshold is skipped
# only when an Inductor artifact was loaded in the process already (its module is in
# Inductor's code cache: a program whose regions or another step ran compiled), never to pay
# the first load; then an optimizer
# still under the threshold looks its signature up once, on its second step (the first
# with state), and on a hit its step is traced now and its artifact loaded. A signature
# the session compiled already (another optimizer's, with the same specs) skips it too.
# The region's disk key holds the traced graph's code (Note [Compiled steps in the
# persistent cache]), so it is known only after a trace (~17 ms for Adam over 4
# tensors); to find the artifact before tracing, each trace also writes an index entry
# to the persistent cache, keyed by the step's signature (class, options, tensor specs,
# state layout, the kernel's thread count, and the store's environment, backend and
# device), holding the disk key of the trace's artifact: a hit is an index entry whose
# artifact is on disk (a trace whose code differs from the saved one, e.g. after an
# edit of torch.optim, finds no artifact and compiles as usual).
_INDEX_FORMAT = "adaptive_eager optimizer step index 1"


def _index_key(store: RegionStore, got: Gathered) -> str | None:
    cls = got.key[0]
    threads = kernel_threads(got.inputs) or torch.get_num_threads()
    return store.key((_INDEX_FORMAT, f"{cls.__module__}.{cls.__qualname__}", got.key[1:]), threads)


def _loads_cheaply(store: RegionStore) -> bool:
    """Whether loading one of ``store``'s artifacts costs only the artifact: not Inductor's
    import (Note [A saved step skips the cost threshold])."""
    if store.backend != "inductor":
        return True
    # a compiled artifact's module in Inductor's code cache: its loader ran in this
    # process. ``PyCodeCache.load_by_key_path`` records every module it loads in the
    # program's process (``in_toplevel_process``), the same loads that put a
    # ``compile_tasks.<key>`` module in sys.modules, which an earlier version scanned too
    # (~2,000 names, 0.8 ms: 3% of the GAN pattern's run, at each optimizer's second step)
    codecache = sys.modules.get("torch._inductor.codecache")
    return codecache is not None and bool(getattr(getattr(codecache, "PyCodeCache", None), "modules", None))


def saved_before(store: Any, got: Gathered) -> bool:
    """Whether an earlier trace of ``got``'s signature has its artifact on disk, and
    loading it costs no more than the artifact."""
    if store is None or not store.usable or not _loads_cheaply(store):
        return False
    key = _index_key(store, got)
    if key is None:
        return False
    data = store.cache.get(key)
    if not data:
        return False
    disk_key = data.decode("ascii", "replace")
    return len(disk_key) == 64 and os.path.exists(store.cache.entry_path(disk_key))


def note_trace(store: Any, got: Gathered, disk_key: str | None) -> bool:
    """Note that ``got``'s signature traced to the artifact ``disk_key``; whether noted."""
    if store is None or not store.usable or not disk_key:
        return False
    key = _index_key(store, got)
    if key is None:
        return False
    if store.cache.get(key) == disk_key.encode("ascii"):
        return True
    return store.cache.put(key, disk_key.encode("ascii"))


# Note [A step compiles once it has cost enough]
# Compiling a step has a price the program pays whether or not the compile ever lands:
# the trace on the program's thread (~17 ms a signature, Adam over 4 tensors), the
# first compiled call checked against eager, and Inductor loaded into the process on a
# service thread (~1 s of CPU, holding the GIL against the program: right after a
# session, a 60-step GAN ran its eager steps at 119-210 ms against 42 ms for the ~5 s
# it took). A short program, or one whose step is cheap, never earns that back: the
# patterns benchmark measured gan 1.83x eager CPU with compiled steps against 1.18x
# without, nanogpt_train 1.26x against 1.03x, loss_print 1.6x against 1.07x (none of
# them got a compiled step in before it ended). So, as in ski rental, an optimizer's
# steps run eagerly (timed on the program's thread, pre-hook to post-hook) until they
# have cost ``optimizer_step_after_ms`` (100 ms by default, about what compiling costs
# the program), and only then is its step traced: a step that never costs that much
# never pays for a compile; one that does (the demo's AdamW: ~60 ms a step, so from
# its third step; AdamW over 120 tensors: ~6 ms, from its ~17th) pays at most twice.
# A flush inside the span (a full window, a read of a step counter) runs the program's
# earlier work too (the backward the window held, a region's synchronous compile), so
# the thread's time in flushes is left out (Flush.thread_ns): a captured step costs its
# capture and torch.optim's Python, wherever the window boundaries fall. Issue 27: HF
# Llama's step (2 windows of 256 ops a step, the second full inside the step) was
# charged 20, 9, 59, 12, 14 ms for its first steps (of which flushes 0, 6, 57, 9, 3),
# was traced at its 5th step, and the windows around it changed and warmed up again
# (8 steps, Inductor: 41% fused instead of ~60%).
def thread_mark(mode: Any) -> tuple:
    """Where a step starts, to :func:`thread_spent`: the program thread's CPU time and its
    mode's flushes' so far."""
    flusher = getattr(mode, "flusher", None)
    return time.thread_time_ns(), flusher, flusher.thread_ns() if flusher is not None else 0


def thread_spent(mark: tuple) -> int:
    """The program thread's CPU time since :func:`thread_mark`, less its flushes' (they run
    the program's earlier work, not the step's)."""
    t0, flusher, f0 = mark
    flushes = flusher.thread_ns() - f0 if flusher is not None else 0
    return max(0, time.thread_time_ns() - t0 - flushes)


class CostThreshold:
    """Per optimizer: its eager steps' cost so far, and whether its signature was looked
    up in the index (see the Notes above)."""

    def __init__(self, plain: tuple) -> None:
        self.plain = plain  # the tensor types a step may hold (optim_graph.gather)
        self._spent: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # ns
        self._started: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        self._looked_up: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
        self._steps: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # timed

    def cheap(self, opt: Any, mode: Any, service: Any, compiled_here: Callable[[Gathered], bool],
              mark: tuple) -> bool:
        """Whether ``opt``'s steps have cost less than the threshold so far (this step is
        then timed from ``mark``, :func:`thread_mark`'s, to :meth:`charge`); a step compiled in this
        session already (``compiled_here``) or saved before skips it (looked up once there
        is a compile ``service``: Note [A cheap step does not build the compile pipeline],
        optim_compile.py)."""
        after_ns = mode.options.optimizer_step_after_ms * 1e6
        if self._spent.get(opt, 0) >= after_ns:
            return False
        if opt.state and service is not None and opt not in self._looked_up:  # once, from its first step with state
            self._looked_up[opt] = True
            got = gather(opt, self.plain)
            if not isinstance(got, str) and (compiled_here(got) or saved_before(getattr(service, "store", None), got)):
                self._spent[opt] = int(after_ns)
                with mode.counters.lock:
                    mode.counters.optimizer_step_kinds[f"{type(opt).__name__}|saved before: no threshold"] += 1
                return False
        self._started[opt] = mark
        return True

    def charge(self, opt: Any) -> None:
        """The step :meth:`cheap` timed is over: add its cost, less its flushes'."""
        started = self._started.pop(opt, None)
        if started is not None:
            self._spent[opt] = self._spent.get(opt, 0) + thread_spent(started)
            self._steps[opt] = self._steps.get(opt, 0) + 1

    def eager_step_ns(self, opt: Any) -> float | None:
        """What ``opt``'s eager steps cost on average while they were timed (None: none
        was: its trace came from the disk cache, Note [A saved step skips the cost
        threshold]); Note [A compiled step slower than eager's goes back]."""
        steps = self._steps.get(opt, 0)
        return self._spent.get(opt, 0) / steps if steps else None


__all__ = ["CostThreshold", "saved_before", "note_trace", "thread_mark", "thread_spent"]
