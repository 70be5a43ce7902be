"""AdaptiveEagerMode: the dispatch mode that defers target-device ops into windows.

``__torch_dispatch__`` is a short router: it classifies the op (OpTable) and
calls one named handler. The mode owns the state (the open window, counters,
executor); LazyTensor handles are thin and point back to it. Closing a window (the
flush, binding its handles) is a :class:`~adaptive_eager.dispatch.flush.Flush` the mode
makes with its collaborators (flush.py), and
turning bound handles into plain tensors is ``BoundHandles``'s (release.py).

Companion: :class:`~adaptive_eager.dispatch.observe.Observer`, which sees Python-level
reads of plain tensors through wrapped methods (Note [Observation on CPU]).

Example::

    >>> import torch
    >>> from adaptive_eager import config
    >>> from adaptive_eager.runtime import EagerExecutor, Counters
    >>> from adaptive_eager.dispatch.observe import Observer
    >>> mode = AdaptiveEagerMode(config.resolve(backend="eager"), EagerExecutor(), Counters())
    >>> with mode, Observer(mode):
    ...     y = torch.ones(3) + 1
    ...     print(y)
    tensor([2., 2., 2.])
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import Options
from ..fusion.policy import fixed_shape_call, without_dropout
from ..reasons import STRICT_FALLBACKS, SYNC_OPS, R, StrictModeError
from ..runtime import Counters, DeferPolicy
from ..runtime.memory import window_budget
from .dynamo import dynamo_aware
from .exported import Exported
from .lazy import _TLS as _LAZY_TLS
from .lazy import LazyTensor, unwrap_all
from .lazy import has_unbound as _has_unbound
from .answers import MISS, OutputMismatch
from .meta import MetaFailure, MetaMemo
from .optable import Kind, OpTable, OpTraits, raise_if_out_of_range
from .release import BoundHandles
from .source import user_source

if TYPE_CHECKING:
    from ..runtime import Executor
    from .trace import TraceBook

_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_infra_mode = torch._C._get_dispatch_mode

log = logging.getLogger("adaptive_eager")
aten = torch.ops.aten
_PLAIN_DISPATCH = torch._C._disabled_torch_dispatch_impl
_RUN_NOW_VIEWS = {aten.lift_fresh.default}
_NATIVE_DROPOUT = aten.native_dropout.default
_TO_COPY = aten._to_copy.default
_COPY_ = aten.copy_.default


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    """Device of the first tensor argument, or the factory's device kwarg."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b.device
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            return a.device
    dev = kwargs.get("device")
    if dev is None:
        return torch.device("cpu") if "device" in kwargs else None
    return torch.device(dev)


@dynamo_aware  # Note [Dynamo's wrapper only while Dynamo runs] (dynamo.py)
class AdaptiveEagerMode(TorchDispatchMode):
    """Defers ops on ``options.device`` into windows; flushes at observation points.

    One instance serves one runtime session; its state is guarded by a lock so a
    handle used from another thread can flush it safely.
    """

    def __init__(self, options: Options, executor: Executor, counters: Counters,
                 policy: DeferPolicy | None = None, table: OpTable | None = None,
                 memo: MetaMemo | None = None,
                 traces: "TraceBook | Callable[[], TraceBook] | None" = None):
        super().__init__()
        self.options = options
        self.executor = executor
        self.counters = counters
        # The session's pass-through policy (runtime.adapt): fed each window's verdict,
        # asked before each new window. None: always defer.
        self.policy = policy if policy is not None else DeferPolicy(enabled=False)
        self.device_type = options.device
        self.window_budget = window_budget(options)  # Note [A byte budget per window]
        self.table = table if table is not None else OpTable()
        self._traits = self.table._traits  # read-only fast path; OpTable fills it
        self._should_defer = self.policy.should_defer  # hot: asked on every torch call
        self._parked = False  # off the dispatch-mode stack (dispatch/parking.py)
        # Set by the read wrappers while a Python-level scalar read runs (Note [A branch on a
        # tensor is a bool read], observe.py): what the sync of its scalar is called.
        self.read_reason: str | None = None
        self._strict = options.strict
        self._dynamo_seen = False  # Note [torch.compile inside the block] (dynamo.py)
        self.bound = BoundHandles(counters)  # Note [Releasing bound handles] (release.py)
        self.memo = memo if memo is not None else MetaMemo(options.meta_cache_size, counters)
        self.lock = threading.RLock()
        # The session's traces of recurring windows (dispatch/trace.py), or what makes
        # them; a mode made on its own keeps its own. None with fast_path off: every
        # window is recorded. Built with the window (Note [The window is built at the
        # first capture]).
        self._traces_from = traces
        self.traces: TraceBook | None = None
        self.recorder: Any = IDLE
        self.flusher: Any = None
        self._handlers = {
            Kind.RECORD: self._on_record,
            Kind.VIEW: self._on_view,
            Kind.METADATA: self._on_metadata,
            Kind.SYNC: self._on_sync,
            Kind.COLLECTIVE: self._on_sync,
            Kind.RANDOM: self._on_random,
        }

    def build_window(self) -> None:
        """Make the window's recorder and flush now (Note [The window is built at the
        first capture]); idempotent."""
        if self.flusher is not None:
            return
        from .flush import Flush  # noqa: PLC0415 - the point of building it here
        from .recorder import Recorder  # noqa: PLC0415
        from .trace import TraceBook  # noqa: PLC0415

        with self.lock:
            if self.flusher is not None:
                return
            options, traces = self.options, self._traces_from
            if callable(traces):
                traces = traces()
            if options.fast_path and traces is None:
                traces = TraceBook(options.window_size)
            self.traces = traces if options.fast_path else None
            recorder = Recorder(torch.device(options.device), self.memo, owner=self,
                                book=self.traces)
            self.flusher = Flush(lock=self.lock, builder=recorder, executor=self.executor,
                                 counters=self.counters, memo=self.memo, traces=self.traces,
                                 table=self.table, bound=self.bound, strict=self._strict)
            self.recorder = recorder

    # -- flushing -------------------------------------------------------------------
    def flush(self, reason: str, source: str | None = None, targets: Any = None) -> None:
        """Run the open window and bind its live handles (:meth:`Flush.flush
        <adaptive_eager.dispatch.flush.Flush.flush>`); its verdict goes to the policy.
        Before the window is built nothing is pending: nothing to do."""
        if self.flusher is None:
            return
        with self.lock:
            verdict = self.flusher.flush(reason, source, targets)
            if verdict is not None:
                self.policy.note(verdict)  # the session's policy decides (runtime.adapt)

    def materialize(self, handle: LazyTensor, reason: str) -> torch.Tensor:
        """Owner protocol: flush so that ``handle`` is bound, and return its tensor."""
        self.flush(reason, targets=(handle,))
        real = handle._ae_real
        if real is None:
            if handle._ae_error is None:
                # Not bound by the flush and no error: its window is gone (a bug, or a
                # handle of another mode's window). Say so rather than ask again forever.
                handle._ae_error = RuntimeError(
                    "adaptive_eager: this tensor's window was flushed without it (internal error)")
            return handle._ae_materialize(reason)  # raises with the recorded error
        return real

    # -- routing --------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        # Note [Recurring windows are matched, not recorded] (trace.py): the op the
        # window's trace expects next, if the router would just record it.
        rec = self.recorder
        nd = rec.next
        if nd is not None and func is nd.func and nd.direct and not _LAZY_TLS.suspended \
                and _get_infra_mode(_FAKE) is None:
            with self.lock:
                out = nd.emit(rec, args, kwargs) if rec.next is nd else MISS
            if out is not MISS:
                if nd.full:
                    self.flush(R.WINDOW_FULL)
                elif not len(rec.nodes) & 15:
                    self._check_bytes()
                return out
        kwargs = kwargs or {}
        if _get_infra_mode(_FAKE) is not None:
            # Note [Fake tensors are not ours]
            # A FakeTensorMode is active (entered inside or outside the runtime): its ops
            # compute metadata only, so there is nothing to defer. Infra modes run below
            # user modes, so calling the op again here reaches it, whichever was entered
            # first. Bound handles unwrap; a fake op on an unbound handle flushes first.
            return self._run_real(func, args, kwargs)
        for t in types:
            # Foreign subclasses decide for themselves; plain tensors that carry the
            # Python key (types lists them as torch.Tensor/Parameter) are ours to handle.
            if t is not LazyTensor and t.__torch_dispatch__ is not _PLAIN_DISPATCH:
                return NotImplemented
        if _LAZY_TLS.suspended:
            return self._run_real(func, args, kwargs)
        if not self.recorder.nodes and not self._should_defer():
            # The policy found nothing worth deferring lately: run straight through
            # (probing again now and then; runtime.adapt). Nothing is pending, so
            # every handle is bound and unwraps itself.
            self.counters.ops_passthrough += 1
            policy = self.policy
            policy.passed += 1  # the policy's own count (Note [Measure before capturing])
            if policy.timing and not policy.fusible(func):
                # Note [Only fusible ops pay for capture] (runtime/measure.py)
                t0 = time.thread_time_ns()
                out = func(*args, **kwargs)
                policy.unfusible_ns += time.thread_time_ns() - t0
                return out
            if policy.seeding:  # Note [Seeding the memo from real runs] (meta.py)
                out = func(*args, **kwargs)
                policy.seeded()
                if self.flusher is None:
                    self.build_window()
                self.recorder.seed(func, self._traits.get(func) or self.table.traits(func),
                                   args, kwargs, out)
                return out
            return func(*args, **kwargs)
        if self.flusher is None:
            self.build_window()  # deferring from here on: Note [The window is built at the first capture]
        first = args[0] if args else None
        traits = self._traits.get(func)
        if traits is None:
            traits = self.table.traits(func)
        if type(first) is not LazyTensor:  # handles are on the target device by construction
            dev = _device_of(args, kwargs)
            if dev is None or dev.type != self.device_type:
                if not _has_unbound((args, tuple(kwargs.values()))):
                    return func(*args, **kwargs)
            elif traits.kind is Kind.RECORD and self._untouched_scalars(args):
                # Note [Host scalars run now]
                # Ops on 0-dim real tensors that no pending op touches (an optimizer's
                # step counters: step += 1, then step.item()) read and write nothing the
                # window holds, so running them now is what eager does, and it spares a
                # flush at the .item() that follows.
                self.counters.ops_passthrough += 1
                return func(*args, **kwargs)
        with self.lock:
            return self._handlers[traits.kind](func, traits, args, kwargs)

    def stop_deferring(self) -> None:
        """From now on this mode defers nothing and never probes (its block was closed
        from another thread); the session's policy, shared with other blocks, is left
        as it is."""
        self.policy = DeferPolicy.never()
        self._should_defer = self.policy.should_defer

    def release_handles(self) -> int:
        """Turn bound, unshared handles into plain tensors; returns how many were released
        (:meth:`BoundHandles.release <adaptive_eager.dispatch.release.BoundHandles.release>`)."""
        return self.bound.release()

    def _untouched_scalars(self, args: tuple) -> bool:
        seen = False
        rec = self.recorder
        for a in args:
            items = a if isinstance(a, (list, tuple)) else (a,)
            for t in items:
                if isinstance(t, torch.Tensor):
                    if type(t) is LazyTensor or t.dim() != 0 or (rec.nodes and rec.vid_of(t) is not None):
                        return False
                    seen = True
        return seen

    # -- handlers -------------------------------------------------------------------
    def _on_record(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        if kwargs and kwargs.get("device") is not None and \
                torch.device(kwargs["device"]).type != self.device_type:
            return self._sync_then_run(func, args, kwargs, R.TRANSFER)
        if func is _TO_COPY or func is _COPY_:
            if self._crosses_devices(func, args, kwargs):
                return self._sync_then_run(func, args, kwargs, R.TRANSFER)
        rec = self.recorder
        if rec.at is not None or (rec.book is not None and not rec.nodes):
            out = rec.replay(func, args, kwargs)  # a trace's node (trace.py)
            if out is not MISS:
                if traits.want_source:
                    self._note_source(func)
                if rec.at.full:
                    self.flush(R.WINDOW_FULL)
                elif not len(rec.nodes) & 15:
                    self._check_bytes()
                return out
        try:
            out = rec.record(func, traits, args, kwargs)
        except MetaFailure as e:
            return self._on_meta_failure(func, args, kwargs, e)
        except OutputMismatch:
            from .lazy import restride_all  # noqa: PLC0415 - only on this rare path

            out = self._sync_then_run(func, args, kwargs, R.RESIZE)
            restride_all((args, kwargs))  # Note [In-place metadata changes]
            return out
        self.counters.ops_captured += 1
        if traits.want_source:
            self._note_source(func)
        n = len(rec.nodes)
        if n >= self.options.window_size:
            self.flush(R.WINDOW_FULL)
        elif not n & 15:
            self._check_bytes()
        return out

    def _check_bytes(self) -> None:
        """Flush when the window holds more bytes the program dropped than the budget
        allows (Note [A byte budget per window], runtime/memory.py); every 16 ops."""
        held = self.recorder.dropped_bytes()
        counters = self.counters
        if held > counters.window_peak_bytes:
            counters.window_peak_bytes = held
        if held > self.window_budget:
            self.flush(R.WINDOW_BYTES)

    def _fallback(self, func: Any, reason: str) -> None:
        source = user_source(3)
        if self._strict:
            raise StrictModeError.at("fallback", reason, source, func.name())
        self.counters.note_fallback(func.name(), reason, source)

    def _note_source(self, func: Any) -> None:
        """An op that fell back in an earlier window: note the program's line that issues it
        (once; the report's fallback rows show it). Costs nothing once noted."""
        source = self.counters.fallback_sites.setdefault(func.name(), user_source(3))
        self.table.want_source(func, False)
        if self._strict:
            name = func.name()
            reasons = [k.reason for k in self.counters.fallback_ops if k.op == name]
            bad = [r for r in reasons if r in STRICT_FALLBACKS]
            if bad:  # its first window ran already: raise where it is issued again
                raise StrictModeError.at("fallback", bad[0], source, func.name())


    def _on_view(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        # Note [Views of real tensors are recorded]
        # A view of a real tensor reads no data and could be taken at once, but then
        # the window would see the base and the view as two aliasing inputs (a weight
        # and its transpose in every linear layer), which a compiler must treat
        # conservatively. Recorded, the view is a node of the window and the window
        # has one input per storage. Only ops that lift fresh constants run at once.
        if func in _RUN_NOW_VIEWS:
            return self._run_real(func, args, kwargs)
        return self._on_record(func, traits, args, kwargs)

    def _on_metadata(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        return self._run_real(func, args, kwargs) if not _has_unbound(args) else \
            func(*_to_meta(args), **_to_meta(kwargs))

    def _on_sync(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        if traits.when_fixed is not None and fixed_shape_call(func, args, _dtype_of):
            # Note [Integer indexing is not data-dependent] (fusion/policy.py)
            raise_if_out_of_range(func, args)
            return self._on_record(func, traits.when_fixed, args, kwargs)
        # Reading a scalar (.item(), bool()) is a sync, not an op that failed to fuse.
        if traits.reason in (R.DATA_DEPENDENT, R.NO_META_KERNEL, R.METADATA_MUTATION) and \
                func._schema.name not in SYNC_OPS:
            self._fallback(func, traits.reason)
        from .lazy import restride_all  # noqa: PLC0415 - only on this rare path

        reason = _sync_reason(func, traits)
        if reason == R.ITEM and self.read_reason is not None:
            reason = self.read_reason
        out = self._sync_then_run(func, args, kwargs, reason)
        if traits.reason == R.METADATA_MUTATION:
            restride_all((args, kwargs))  # Note [In-place metadata changes]
        return out

    def _on_random(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        # Note [RNG]
        # Random ops consume the generator now, in program order, so a seeded program
        # draws exactly eager's numbers. An in-place fill (uniform_, bernoulli_(p), ...)
        # does not read the values it overwrites: it fills a fresh real tensor of the
        # same layout now, and the window records a copy_ into the target, so the
        # surrounding ops (dropout's scale and multiply) stay deferred and fusible.
        if traits.dropout_arg is not None:
            # Note [Attention without dropout is not random]
            # SDPA's kernels are tagged nondeterministic_seeded for their dropout; with
            # dropout_p == 0 (inference, or attention without dropout) they draw
            # nothing, so they are recorded like any op instead of flushing the window
            # (which cut a GPT training step into pieces at every attention layer).
            if without_dropout(traits.dropout_arg, args, kwargs):
                return self._on_record(func, _as_record(traits), args, kwargs)
        rest_unbound = _has_unbound((args[1:], tuple(kwargs.values())))
        if func is _NATIVE_DROPOUT and not rest_unbound and type(args[0]) is LazyTensor:
            return self._native_dropout(*args, **kwargs)
        if traits.random_fill and not rest_unbound and isinstance(args[0], torch.Tensor):
            target = args[0]
            if type(target) is not LazyTensor and len(self.recorder) == 0:
                return func(*args, **kwargs)
            spec = target._ae_spec if type(target) is LazyTensor and target._ae_real is None \
                else None
            base = target if spec is None else None
            if base is not None and type(base) is LazyTensor:
                base = base._ae_real
            if base is not None:
                fresh = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device=base.device)
            else:
                fresh = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=spec.device)
            func(fresh, *unwrap_all(args[1:], {}, R.RANDOM)[0], **unwrap_all((), kwargs, R.RANDOM)[1])
            self._on_record(_COPY_, self.table.traits(_COPY_), (target, fresh), {})
            return target
        touches_window = rest_unbound or _has_unbound(args[:1]) or any(
            isinstance(a, torch.Tensor) and self.recorder.holds(a) for a in args
        )
        if touches_window:
            self.flush(R.RANDOM)
        return self._run_real(func, args, kwargs)

    def _native_dropout(self, x: LazyTensor, p: float, train: bool | None) -> Any:
        # Dropout on accelerators (neuron, cuda) is one native_dropout op whose mask
        # depends only on the shape. The mask is drawn now, by the real kernel on a
        # stand-in of x's layout (so the generator advances exactly as eager's), and
        # the window records eager's arithmetic: x * mask * (1 / (1 - p)).
        if train is False or x.numel() == 0:
            return self._on_record(_NATIVE_DROPOUT, self.table.traits(_NATIVE_DROPOUT), (x, p, train), {})
        s = x._ae_spec
        stand_in = torch.zeros(s.shape, dtype=s.dtype, device=s.device)
        _, mask = _NATIVE_DROPOUT(stand_in, p, train)
        p1m = 1.0 - p
        scale = 0.0 if p1m == 0 else 1.0 / p1m
        out = self._on_record(aten.mul.Tensor, self.table.traits(aten.mul.Tensor), (x, mask), {})
        out = self._on_record(aten.mul_.Scalar, self.table.traits(aten.mul_.Scalar), (out, scale), {})
        return out, mask

    def _on_meta_failure(self, func: Any, args: tuple, kwargs: dict, failure: MetaFailure) -> Any:
        # Meta execution failed: either the call is invalid (eager raises too, and must
        # raise here, at the user's line) or the op lacks a meta kernel. Running it for
        # real tells which; only the second is remembered.
        if isinstance(failure, Exported):  # Note [Exported memory] (exported.py)
            tensors = _tensors(args, kwargs)
            if _has_unbound(tensors) or any(self.recorder.vid_of(t) is not None for t in tensors):
                self.flush(failure.reason, user_source(3))
            return self._run_real(func, args, kwargs)
        if not failure.marks_op:  # valid but not deferrable, or eager raises: run it now
            return self._sync_then_run(func, args, kwargs,
                                       getattr(failure, "sync_reason", R.UNCAPTURABLE))
        self.flush(R.NO_META_KERNEL)
        out = self._run_real(func, args, kwargs)
        log.debug("no meta kernel for %s (%s); it syncs from now on", func, failure)
        self.table.mark_no_meta(func)
        self.flusher.forget_traces()  # a trace would record what now syncs
        self._fallback(func, R.NO_META_KERNEL)
        return out

    # -- running for real -------------------------------------------------------------
    def _crosses_devices(self, func: Any, args: tuple, kwargs: dict) -> bool:
        if func is _TO_COPY:
            dev = kwargs.get("device")
            return dev is not None and torch.device(dev).type != self.device_type
        dst, src = args[0], args[1]
        return dst.device.type != src.device.type

    def _sync_then_run(self, func: Any, args: tuple, kwargs: dict, reason: str) -> Any:
        traits = self._traits.get(func)
        reads_only = traits is not None and not traits.mutated_args
        # The source line is found by the flush, only if it has work to do (a read of a
        # host scalar nothing pending touches has none: no stack walk).
        self.flush(reason, targets=_tensors(args, kwargs) if reads_only else None)
        return self._run_real(func, args, kwargs)

    def _run_real(self, func: Any, args: tuple, kwargs: dict) -> Any:
        args, kwargs = unwrap_all(args, kwargs, R.SYNC)
        return func(*args, **kwargs)


# Note [The window is built at the first capture]
# ``ADAPTIVE_EAGER=1`` enters a mode in every process, and most short scripts never
# capture an op: the policy warms up parked, then measures with ops passing through the
# mode, and parks for good. The window's machinery (the recorder and its trace matching,
# the flush, and through them the fusion signatures and scalar lifting: ~10 ms CPU of the
# ~55 ms that enabling cost, measured with benchmarks.fixed_cost's 20-op script) is needed
# only once an op is deferred or the memo seeded. So a mode starts with IDLE as its
# recorder (an empty window: what everything that asks a mode "is anything pending?"
# reads) and no flush, and builds both at its first deferred op or seeded op
# (``build_window``); the modules are imported earlier, where capture is decided, with
# Dynamo (parking.import_dynamo), so a window rarely pays the import.
class _IdleWindow:
    """The recorder of a mode whose window is not built yet: always empty."""

    __slots__ = ()
    next = None  # no trace node expected
    at = None
    book = None
    nodes: tuple = ()

    def __len__(self) -> int:
        return 0

    def vid_of(self, t: Any) -> None:
        return None

    def holds(self, t: Any) -> bool:
        return False

    def dropped_bytes(self) -> int:
        return 0


IDLE = _IdleWindow()


@functools.lru_cache(maxsize=None)
def _as_record(traits: OpTraits) -> OpTraits:
    return dataclasses.replace(traits, kind=Kind.RECORD, dropout_arg=None)


def _sync_reason(func: Any, traits: OpTraits) -> str:
    return SYNC_OPS.get(func._schema.name, traits.reason or R.SYNC)


def _dtype_of(obj: Any) -> torch.dtype | None:
    return obj.dtype if isinstance(obj, torch.Tensor) else None


def _to_meta(obj: Any) -> Any:
    if isinstance(obj, LazyTensor) and obj._ae_real is None:
        s = obj._ae_spec
        return torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="meta")
    if isinstance(obj, LazyTensor):
        return obj._ae_real
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def _tensors(args: tuple, kwargs: dict) -> list:
    out: list = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(b for b in a if isinstance(b, torch.Tensor))
    return out


__all__ = ["AdaptiveEagerMode", "IDLE"]
