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
from .optim_records import Why

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


class _Spent:
    """One optimizer's eager steps so far: their cost (ns), how many were timed, where the
    one timed now began (a :func:`thread_mark`), whether its signature was looked up, and
    its report key for a cheap step (Note [A parked cheap step costs a clock])."""

    __slots__ = ("ns", "steps", "started", "looked_up", "cheap_key", "__weakref__")

    def __init__(self, cls: str) -> None:
        self.ns, self.steps, self.started, self.looked_up = 0, 0, None, False
        self.cheap_key = f"{cls}|eager: {Why.CHEAP}"


def _after_ns(mode: Any) -> int:
    """The threshold (optimizer_step_after_ms) in ns."""
    return int(mode.options.optimizer_step_after_ms * 1e6)


def _spent_enough(rec: _Spent, mode: Any) -> bool:
    """Whether ``rec``'s eager steps have cost the threshold."""
    return rec.ns >= _after_ns(mode)


def _lookup_due(rec: _Spent, opt: Any, has_service: bool) -> bool:
    """Whether ``opt``'s signature is to be looked up in the index now: once, from its
    first step with state, where there is a compile service."""
    return bool(opt.state) and has_service and not rec.looked_up


class CostThreshold:
    """Per optimizer: its eager steps' cost so far, and whether its signature was looked
    up in the index (see the Notes above); one record an optimizer (:class:`_Spent`).

    Example::

        >>> import types, torch
        >>> mode = types.SimpleNamespace(options=types.SimpleNamespace(optimizer_step_after_ms=1e6),
        ...                              executor=types.SimpleNamespace(built=False))
        >>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.ones(2)
        >>> opt = torch.optim.SGD([p], lr=0.1)
        >>> t = CostThreshold((torch.Tensor, torch.nn.Parameter))
        >>> t.parked(opt, mode) is None         # never timed by the general path
        True
        >>> t.cheap(opt, mode, None, lambda g: False, thread_mark(mode)); t.charge(opt)
        True
        >>> t.parked(opt, mode).cheap_key       # now the parked fast path times it
        'SGD|eager: cheaper so far than a compile (optimizer_step_after_ms)'
        >>> t.charge(opt)
        >>> t.eager_step_ns(opt) > 0
        True
    """

    def __init__(self, plain: tuple) -> None:
        self.plain = plain  # the tensor types a step may hold (optim_graph.gather)
        self._records: "weakref.WeakKeyDictionary[Any, _Spent]" = weakref.WeakKeyDictionary()

    def _record(self, opt: Any) -> _Spent:
        rec = self._records.get(opt)
        if rec is None:
            rec = self._records[opt] = _Spent(type(opt).__name__)
        return rec

    def cheap(self, opt: Any, mode: Any, service: Any, compiled_here: Callable[[Gathered], bool],
              mark: tuple) -> bool:
        """Whether ``opt``'s steps have cost less than the threshold so far (this step is
        then timed from ``mark``, :func:`thread_mark`'s, to :meth:`charge`); a step compiled in this
        session already (``compiled_here``) or saved before skips it (looked up once there
        is a compile ``service``: Note [A cheap step does not build the compile pipeline],
        optim_compile.py)."""
        rec = self._record(opt)
        if _spent_enough(rec, mode):
            return False
        if _lookup_due(rec, opt, service is not None):  # once, from its first step with state
            rec.looked_up = True
            got = gather(opt, self.plain)
            if not isinstance(got, str) and (compiled_here(got) or saved_before(getattr(service, "store", None), got)):
                rec.ns = _after_ns(mode)
                with mode.counters.lock:
                    mode.counters.optimizer_step_kinds[f"{type(opt).__name__}|saved before: no threshold"] += 1
                return False
        rec.started = mark
        return True

    # Note [A parked cheap step costs a clock]
    # A parked program's optimizer steps run as eager's, and while they have cost less than
    # the threshold all there is to do is time them: through the general path
    # (before_step's decision, after_step's checks of what a compiled or waiting step may
    # have left) an Adam step over Linear(4, 4) cost 236 µs against 167 µs eagerly, parked
    # (1 thread), ~12 weak-dictionary look-ups and two clock reads on each side; the
    # patterns benchmark's GAN, two such optimizers a step, ran 1.15-1.24x eager CPU
    # parked from its fourth iteration. So, once the general path has timed one of its
    # steps (the record exists: its hooks are attached, its first step's state made), a
    # parked step that is still under the threshold with no look-up due is timed here
    # alone: :meth:`parked` at our pre-hook, :meth:`charge` at our post-hook (the step
    # compiler's thread-local ``parked`` says which); anything else takes the general path.
    def parked(self, opt: Any, mode: Any) -> _Spent | None:
        """The parked fast path's pre-hook half: ``opt``'s record if its step (``mode``
        parked) is still under the threshold with no look-up due (then it is timed from
        now; the caller counts it under the record's ``cheap_key``); None: the general
        path decides."""
        rec = self._records.get(opt)
        if rec is None or _spent_enough(rec, mode):
            return None
        # its one look-up is due where the executor (the compile service's owner) is built
        # (Note [A cheap step does not build the compile pipeline], optim_compile.py)
        if _lookup_due(rec, opt, getattr(mode.executor, "built", True)):
            return None
        rec.started = (time.thread_time_ns(), None, 0)  # a parked step runs no flush
        return rec

    def charge(self, opt: Any) -> None:
        """The step :meth:`cheap` timed is over: add its cost, less its flushes'."""
        rec = self._records.get(opt)
        if rec is not None and rec.started is not None:
            rec.ns += thread_spent(rec.started)
            rec.steps += 1
            rec.started = None

    def eager_step_ns(self, opt: Any) -> float | None:
        """What ``opt``'s eager steps cost on average while they were timed (None: none
        was: its trace came from the disk cache, Note [A saved step skips the cost
        threshold]); Note [A compiled step slower than eager's goes back]."""
        rec = self._records.get(opt)
        return rec.ns / rec.steps if rec is not None and rec.steps else None


__all__ = ["CostThreshold", "saved_before", "note_trace", "thread_mark", "thread_spent"]
