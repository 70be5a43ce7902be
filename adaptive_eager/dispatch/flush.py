"""Closing a window: the flush, from sealing the window to binding its handles.

A :class:`Flush` runs the open window (the executor, or its recovery when that fails),
binds the window's live handles to their values, learns the layouts only the kernel
knows, and makes a trace of a window that recurs (Note [Recurring windows are matched,
not recorded], trace.py). Its collaborators are passed in (the mode makes it): the
mode's lock, window builder, executor, counters, meta memo, traces, op table, bound
handles and strictness. It returns the executor's verdict on the window; the mode
feeds it to the session's policy (runtime.adapt), which is the mode's to own.

Example::

    >>> import torch
    >>> from adaptive_eager import config
    >>> from adaptive_eager.reasons import R
    >>> from adaptive_eager.runtime import EagerExecutor, Counters
    >>> from adaptive_eager.dispatch.mode import AdaptiveEagerMode
    >>> mode = AdaptiveEagerMode(config.resolve(backend="eager"), EagerExecutor(), Counters())
    >>> with mode:
    ...     y = torch.ones(3) * 2
    ...     pending = len(mode.recorder)
    ...     verdict = mode.flusher.flush(R.EXPLICIT_SYNC)
    ...     after = len(mode.recorder)
    >>> pending, after, mode.counters.windows, verdict.ops
    (2, 0, 1, 2)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from .._logging import artifact_logger, warn_once
from ..fusion.graph import storage_groups
from ..reasons import ROUTINE_REASONS, StrictModeError
from ..runtime import Counters, Executor
from ..runtime.executor import FlushResult, Known, Verdict
from ..runtime.recovery import finish
from .builder import Sealed, WindowBuilder
from .interrupts import critical
from .lazy import LazyTensor, bind
from .meta import KERNEL_LAYOUT_OPS, MetaMemo
from .optable import OpTable
from .release import BoundHandles
from .source import user_source
from .trace import TNode, TraceBook, verify_key

log = logging.getLogger("adaptive_eager")
_FLUSH_LOG = artifact_logger("ae_flushes")


class Flush:
    """Closes one mode's windows (see the module docstring); made by the mode with its
    collaborators."""

    def __init__(self, *, lock: threading.RLock, builder: WindowBuilder, executor: Executor,
                 counters: Counters, memo: MetaMemo, traces: TraceBook | None, table: OpTable,
                 bound: BoundHandles, strict: bool):
        self.lock = lock
        self.builder = builder
        self.executor = executor
        self.counters = counters
        self.memo = memo
        self.traces = traces
        self.table = table
        self.bound = bound
        self.strict = strict
        self._tls = threading.local()  # thread_ns: this thread's CPU time in flushes

    def thread_ns(self) -> int:
        """The calling thread's CPU time (ns) spent running this mode's windows so far, so
        that a span timed on the program's thread can leave out the earlier work a flush
        inside it ran (Note [A step compiles once it has cost enough],
        dispatch/optim_compile.py)."""
        return getattr(self._tls, "ns", 0)

    def flush(self, reason: str, source: str | None = None, targets: Any = None) -> Verdict | None:
        """Run the open window and bind its live handles; the executor's verdict on it
        (None: nothing ran, or it failed and ran eagerly). No-op when empty.

        ``targets``: tensors the caller is about to read (and not write). When they
        are scalars needing a few nodes, only those run (Note [Partial flush]); plain
        tensors that no pending op touches need nothing. Handles always flush the
        whole window, so windows start where the program syncs.
        """
        with self.lock:
            rec = self.builder
            if len(rec) == 0:
                return None
            vids = None
            if targets is not None:
                vids = [v for v in (rec.vid_of(t) for t in targets) if v is not None]
                if not vids and not any(type(t) is LazyTensor for t in targets):
                    return None  # plain tensors no pending op touches: their values are current
            if source is None:
                source = user_source(2)
            # Torch functions off: a flush's own tensor calls (reading requires_grad, the
            # profiler range, a read) must not reach the read wrappers (observe.py), which,
            # the window being sealed, would see nothing pending and park the mode mid-flush.
            # Entered only with work to do (the contexts cost ~3 µs).
            t0 = time.thread_time_ns()
            try:
                with torch._C.DisableTorchFunction(), critical():
                    return self._flush_window(reason, source, vids)
            finally:
                self._tls.ns = self.thread_ns() + time.thread_time_ns() - t0

    def _flush_window(self, reason: str, source: str, vids: list | None) -> Verdict | None:
        """The flush's work, under the lock with torch functions off and interrupts held:
        seal the window (or the slice ``vids`` need), run it, bind its handles."""
        if self.strict and reason not in ROUTINE_REASONS:
            raise StrictModeError.at("sync", reason, source)  # nothing run: like eager's line
        sealed, sliced = self._seal(reason, source, vids)
        window, live, at = sealed.window, sealed.live, sealed.at
        known = self._known(at, window, sealed.floats) if at is not None else None
        error = None
        try:
            self.counters.note_flush(reason, source)
            self.counters.windows += 1
            _FLUSH_LOG.debug("flush %s: %d ops at %s%s", reason, len(window), source,
                             " (partial)" if sliced else "")
            if sealed.failed:
                raise _EarlierFailure
            result = self._run(window, known, reason)
            values, errors = result.values, _NO_ERRORS
        except BaseException as e:  # noqa: BLE001 - Note [A failed flush loses no work]
            values, errors, error = self._finish(window, live, e, sealed.failed)
            result = None
        self.counters.ops_executed += len(window)
        if self.counters.sources_wanted:
            self._want_sources()
        if not sliced:
            self.bound.remember(live)  # Note [Releasing bound handles] (release.py)
        if self._bind(window, live, values, errors, error):
            self.forget_traces()  # they hold what meta said
        elif result is not None and not sliced and known is None:
            self._offer(sealed, result)
        if sliced:
            self.builder.adopt(values, errors)
        if error is not None:
            raise error
        return result.verdict if result is not None else None

    def _seal(self, reason: str, source: str, vids: list | None) -> tuple[Sealed, bool]:
        """Close the window, or only the slice ``vids`` need (Note [Partial flush]);
        whether it is a slice."""
        rec = self.builder
        at = rec.at  # the trace node the window was matched to (trace.py), if any
        if at is not None and not at.ends:
            # Flushed where no recorded window ended: a divergence (it recurs? it
            # becomes an ending of its own).
            self.counters.trace_mismatches[f"flush ({reason}) at {source}"] += 1
        if vids:
            targets_key = tuple(vids)
            if at is None or targets_key not in at.no_slice:
                sliced = rec.take_slice(vids, reason, source)
                if sliced is not None:
                    return sliced, True
                if at is not None:
                    at.no_slice.add(targets_key)  # the same window: the same answer
        return rec.seal(reason, source), False

    def _run(self, window: Any, known: Known | None, reason: str) -> FlushResult:
        if torch.autograd.profiler._is_profiler_enabled:
            # The range's own ops only while profiling: they reach this mode.
            with torch.profiler.record_function(f"adaptive_eager.flush[{reason}]"):
                return self.executor.run(window, known)
        return self.executor.run(window, known)

    def _bind(self, window: Any, live: list, values: Any, errors: Any,
              error: BaseException | None) -> bool:
        """Bind each live handle to its value (or its error); whether a layout was learned
        that traces may hold otherwise (Note [Layouts only the kernel knows], meta.py)."""
        learned = False
        for h in live:
            vid = h._ae_vid
            real = values.get(vid)
            if real is None:
                h._ae_error = errors.get(vid, error) or _lost(vid)
                continue
            bind(h, real)  # Note [Bound handles hold their memory] (lazy.py)
            spec = h._ae_spec
            if real.stride() != spec.stride or real.shape != spec.shape or real.dtype != spec.dtype:
                _disagrees(h, real)
                if real.shape != spec.shape or any(
                        n > 1 and a != b for n, a, b in zip(spec.shape, real.stride(), spec.stride)):
                    # Note [Layouts only the kernel knows] (meta.py): ask its kernel next time.
                    op = next((n.target for n in window.nodes if vid in n.outputs), None)
                    learned = learned or op not in KERNEL_LAYOUT_OPS
                    self.memo.learn_layout(op)
        return learned

    def _offer(self, sealed: Sealed, result: FlushResult) -> None:
        """A window that ran whole and recurred is offered to the traces (Note [Recurring
        windows are matched, not recorded]: offered from its second sighting, a trace from
        its third)."""
        seen = result.sighting  # None: the executor does not key windows
        if seen is None or not seen.recurred or self.traces is None:
            return
        made = sealed.made
        if sealed.at is not None:
            made = [nd.made for nd in sealed.at.path()]
        if made is not None:
            self.traces.add(sealed.window, made, sealed.sids, seen.key, seen.groups)

    def _known(self, at: TNode, window: Any, floats: list) -> Known | None:
        """What the trace ending at ``at`` knows of ``window``: its key, if its storage
        groups and live outputs are a recorded ending's (invariant 6)."""
        if not at.ends:
            return None
        groups = storage_groups(window)
        outputs = window.outputs
        for end in at.ends:
            if end.outputs == outputs and end.groups == groups:
                if self.traces is not None and self.traces.verify:
                    verify_key(window, groups, end.key, floats)
                return Known(end.key, floats, groups)
        return None

    def forget_traces(self) -> None:
        """What traces recorded may no longer be what capture gives: forget them all (the
        window being matched, if any, continues the slow way)."""
        if self.traces is not None:
            self.builder.leave()
            self.traces.clear()

    def _finish(self, window: Any, live: list, error: BaseException,
                failed: dict) -> tuple[Any, Any, BaseException | None]:
        """Running ``window`` raised ``error``: finish it eagerly (runtime.recovery).

        Returns the values computed, the values that failed and the error to raise.
        """
        cause = None if isinstance(error, _EarlierFailure) else error
        try:
            done = finish(window, cause, failed)
        except BaseException as again:  # interrupted again while finishing: nothing more runs
            for h in live:
                if h._ae_real is None and h._ae_error is None:
                    h._ae_error = again
            raise
        if done.error is None and cause is not None:
            warn_once(f"flush-failed:{type(cause).__name__}",
                      "adaptive_eager: running a window failed (%s: %s); it ran eagerly instead",
                      type(cause).__name__, cause)
        return done.values, done.errors, done.error

    def _want_sources(self) -> None:
        wanted = self.counters.sources_wanted
        while wanted:
            try:
                func, _ = wanted.popitem()
            except KeyError:  # another thread's mode took the last one
                break
            if hasattr(func, "_schema"):
                self.table.want_source(func)
                self.forget_traces()  # their nodes of func would not note it

_NO_ERRORS: dict = {}


class _EarlierFailure(Exception):
    """The window reads values of an earlier window that could not be computed."""


def _lost(vid: int) -> BaseException:
    return RuntimeError(f"adaptive_eager internal error: value %{vid} of a flushed window was "
                        "neither computed nor failed")


def _disagrees(h: LazyTensor, real: torch.Tensor) -> None:
    # Note [Meta disagrees with the kernel]: a few meta kernels promise other strides
    # (linalg.eig, fft.rfftn, svd_lowrank) or shapes (native_batch_norm's saved stats in
    # eval) than the CPU kernel returns; the handle shows the real tensor's. A dtype
    # cannot be changed in place, and the program may have read the promised one: the
    # handle fails with an error that says so, rather than hold another dtype's values.
    if real.dtype != h._ae_spec.dtype:
        h._ae_real = None
        h._ae_error = RuntimeError(
            f"adaptive_eager: the kernel returned {real.dtype} where capture promised "
            f"{h._ae_spec.dtype} (a global setting changed through a path the runtime does "
            "not see? Note [Global state that kernels read])")
        log.warning("adaptive_eager: %s", h._ae_error)
        return
    from .lazy import restride  # noqa: PLC0415 - rare path

    restride(h)

__all__ = ["Flush"]
