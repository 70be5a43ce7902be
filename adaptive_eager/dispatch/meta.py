"""Output metadata by meta execution, memoized.

Running an op on meta tensors (~60 µs) tells the output shapes, strides and dtypes
and raises the shape/dtype errors eager would raise, at the user's line. The result
depends only on the op, the input specs and the non-tensor arguments, so it is
memoized on exactly that key in a bounded LRU: in steady state no meta work runs.

Note [Scalars in the meta key]
Python floats and Scalars passed next to tensors (``mul(x, lr)``, ``add(x, y,
alpha=-lr)``) never change output metadata, only their type can (int vs float vs
bool in type promotion). They are keyed by type, so a learning-rate schedule does
not miss this cache every step. Ints are keyed by value: they are sizes and dims.
Factories (no tensor argument) key everything by value (``arange(0.0, n)``).

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import TensorSpec
    >>> from adaptive_eager.fusion.ir import ValueRef
    >>> specs = {0: TensorSpec.of(torch.ones(2, 3))}
    >>> out = meta_execute(torch.ops.aten.mul.Tensor, (ValueRef(0), 0.5), {}, specs,
    ...                    torch.device("cpu"))
    >>> out.specs[0].shape
    (2, 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import threading

import cachetools
import torch

from ..fusion.ir import TensorSpec, ValueRef
from ..runtime.counters import Counters


@dataclass(frozen=True, slots=True)
class MetaResult:
    """Flattened output specs of one op and how to rebuild its return structure.

    ``structure``: "tensor" (one tensor), "tuple", "list" or "none".
    """

    specs: tuple[TensorSpec | None, ...]
    structure: str
    sids: tuple[int | None, ...] = ()


class MetaFailure(Exception):
    """Meta execution raised; ``error`` is what it raised."""

    # Whether the op is then marked as lacking a meta kernel (synced from now on).
    marks_op = True

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Uncapturable(MetaFailure):
    """The call is valid but its result cannot be a handle: a sparse layout, or a
    conjugate/negative view bit (``fft.ifft`` of a real input) that a wrapper's spec
    does not carry. It runs for real this time; the op is not marked."""

    marks_op = False


def _meta_tensor(spec: TensorSpec, device: Any = "meta") -> torch.Tensor:
    extent = spec.extent  # room for the view
    if device == "meta":
        base = torch.empty((max(extent, 0),), dtype=spec.dtype, device="meta")
    else:
        base = torch.zeros((max(extent, 0),), dtype=spec.dtype, device=device)
    return base.as_strided(spec.shape, spec.stride, spec.storage_offset)


def to_meta_args(obj: Any, specs: Mapping[int, TensorSpec], cache: dict[int, torch.Tensor],
                 real: bool = False) -> Any:
    """ValueRefs become meta tensors built from ``specs`` (one per value id, so a value
    passed twice aliases itself as in eager); with ``real``, zero-filled real tensors of
    the same layout on the specs' devices (Note [Layouts only the kernel knows])."""
    if isinstance(obj, ValueRef):
        t = cache.get(obj.id)
        if t is None:
            spec = specs[obj.id]
            t = cache[obj.id] = _meta_tensor(spec, spec.device if real else "meta")
        return t
    if isinstance(obj, tuple):
        return tuple(to_meta_args(o, specs, cache, real) for o in obj)
    if isinstance(obj, list):
        return [to_meta_args(o, specs, cache, real) for o in obj]
    if isinstance(obj, torch.device) and not real:
        return torch.device("meta")
    return obj


# Note [Layouts only the kernel knows]
# A meta kernel sees no device, and some output layouts depend on the device's kernel:
# convolution's meta kernel reports contiguous strides while the CPU kernel (and the
# emulated neuron device, which runs it) returns channels_last for a channels_last input
# or weight (torch's meta_conv says so; FakeTensor asks the conv backend instead). A
# handle reporting contiguous strides made ``x.is_contiguous()`` answer differently
# before the flush, and a later ``view`` (Flatten) was accepted at record time and
# failed when the window ran ("view size is not compatible"). For such ops the output
# specs come from running the real kernel once per memo key on zero-filled stand-ins of
# the inputs' layouts (on their devices; the memo makes it once per shape): the strides
# the real kernel will produce. The set starts with the convolutions, and it learns:
# when a flush finds a handle whose real strides or shape differ from its spec (Note
# [Meta disagrees with the kernel] in flush.py), its op joins the set and the memo
# forgets that op's entries, so from the next capture on its handles are right before
# the flush too. A stand-in run that raises (a kernel rejecting zeros) keeps meta's
# answer. Measured (torch 2.13, CPU; meta vs kernel over OpInfo's first samples and
# common vision ops in channels_last/channels_last_3d): the convolutions, pixel_shuffle
# (strides of size-1 dims), _fft_r2c, _linalg_svd, linalg_eig, native_batch_norm's
# saved statistics (shape, in eval); a size-1 dim's stride of elementwise ops (mul of
# (1, 3, 2) shapes) differs too, which no layout question depends on and is not learned.
_aten = torch.ops.aten
KERNEL_LAYOUT_OPS = {
    _aten.convolution.default, _aten._convolution.default, _aten._convolution.deprecated,
    _aten.convolution_backward.default, _aten.pixel_shuffle.default,
    _aten.pixel_unshuffle.default, _aten._fft_r2c.default, _aten._linalg_svd.default,
    _aten.linalg_eig.default, _aten.native_batch_norm.default,
    _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit_no_training.default,
}


def _kernel_layout(func: Any, args: tuple, kwargs: dict, specs: Mapping[int, TensorSpec],
                   meta: "MetaResult") -> "MetaResult":
    cache: dict[int, torch.Tensor] = {}
    try:
        with torch.no_grad():
            out = func(*to_meta_args(args, specs, cache, True),
                       **{k: to_meta_args(v, specs, cache, True) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - keep meta's answer
        return meta
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out or ())
    if len(outs) != len(meta.specs):
        return meta
    fixed = []
    for t, m in zip(outs, meta.specs):
        if m is None or not isinstance(t, torch.Tensor) or t.dtype != m.dtype:
            fixed.append(m)
        else:
            fixed.append(TensorSpec(tuple(t.shape), tuple(t.stride()), t.storage_offset(), m.dtype,
                                    m.device))
    return MetaResult(tuple(fixed), meta.structure)


def _spec_out(t: Any, device: torch.device) -> TensorSpec | None:
    if t is None:
        return None
    return TensorSpec(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, device)


def meta_execute(
    func: Any, args: tuple, kwargs: dict, specs: Mapping[int, TensorSpec], device: torch.device
) -> MetaResult:
    """Run ``func`` on meta stand-ins of the ValueRefs in ``args``; raise MetaFailure on error."""
    cache: dict[int, torch.Tensor] = {}
    margs = to_meta_args(args, specs, cache)
    mkwargs = {k: to_meta_args(v, specs, cache) for k, v in kwargs.items()}
    if not cache and "device" not in mkwargs and _has_device_kwarg(func):
        mkwargs["device"] = torch.device("meta")
    try:
        out = func(*margs, **mkwargs)
    except Exception as e:  # noqa: BLE001 - reported by the caller
        raise MetaFailure(e) from e
    for t in (out,) if isinstance(out, torch.Tensor) else (out or ()):
        if isinstance(t, torch.Tensor) and (t.layout != torch.strided or t.is_conj() or t.is_neg()
                                            or t._is_zerotensor()):
            raise Uncapturable(RuntimeError(f"{func} returns a {t.layout} tensor (conj={t.is_conj()}, "
                                            f"neg={t.is_neg()}, zero={t._is_zerotensor()})"))
    if out is None:
        return MetaResult((), "none")
    if isinstance(out, torch.Tensor):
        result = MetaResult((_spec_out(out, device),), "tensor")
    else:
        structure = "list" if isinstance(out, list) else "tuple"
        result = MetaResult(tuple(_spec_out(t, device) for t in out), structure)
    if func in KERNEL_LAYOUT_OPS:
        result = _kernel_layout(func, args, kwargs, specs, result)
    return result


def _has_device_kwarg(func: Any) -> bool:
    return any(a.name == "device" for a in func._schema.arguments)


class MetaMemo:
    """A bounded LRU of ``key -> MetaResult``, plus the spec interner its keys use.

    Note [Fast memo hits]
    Keys are hashed on every captured op. To keep that cheap, tensor specs inside
    keys are small ints from :meth:`intern` (a TensorSpec's hash walks its fields),
    and hits are served from a plain dict that mirrors the cachetools LRU. The LRU
    decides what to evict (recency is refreshed on insertion, not on every hit);
    evictions drop the mirror entry too, so the memo stays bounded.
    """

    def __init__(self, maxsize: int, counters: Counters | None = None):
        # Hits and misses go to the session's Counters (stats().meta_hits/meta_misses).
        self.counters = counters if counters is not None else Counters()
        # cachetools caches are not thread-safe; one memo may serve modes in several threads.
        self._lock = threading.Lock()
        self._fast: dict[Any, MetaResult] = {}
        fast = self._fast

        class _LRU(cachetools.LRUCache):
            def popitem(self) -> tuple[Any, Any]:
                key, value = super().popitem()
                fast.pop(key, None)
                return key, value

        self._cache = _LRU(maxsize=maxsize)
        self._sids: dict[TensorSpec, int] = {}
        self._next_sid = 0
        self.seeded: dict[Any, MetaResult] = {}  # Note [Seeding the memo from real runs]
        self.max_seeded = maxsize
        # Note [Bounded spec interning]: at most this many specs are interned at once.
        self.max_specs = max(1024, 4 * maxsize)

    def get(self, key: Any) -> MetaResult | None:
        r = self._fast.get(key)
        if r is not None:
            self.counters.meta_hits += 1
        return r

    def put(self, key: Any, result: MetaResult) -> None:
        self.counters.meta_misses += 1
        with self._lock:
            self._cache[key] = result
            self._fast[key] = result

    # Note [Bounded spec interning]
    # A program that takes views at ever new offsets (90,000 distinct slices) made the
    # interner grow without bound (RSS +18 MiB, issue 15 item 18) although the memo is an
    # LRU. Evicting one spec would mean finding every key that holds its id, so the
    # interner is bounded by generations instead: when it holds ``max_specs`` specs, it
    # and the memo are emptied together. Ids are never reused (a counter, not the size),
    # so an id still held by an open window's values, or by a key built from them,
    # stands for its spec alone and can only miss, never match another spec's entry.
    # Steady-state programs intern a few hundred specs and never reach the bound.
    def intern(self, spec: TensorSpec) -> int:
        """A small int standing for ``spec`` in memo keys (never reused for another spec)."""
        sid = self._sids.get(spec)
        if sid is None:
            with self._lock:
                sid = self._sids.get(spec)
                if sid is None:
                    if len(self._sids) >= self.max_specs:
                        self._clear_locked()
                    sid = self._sids[spec] = self._next_sid
                    self._next_sid += 1
        return sid

    def learn_layout(self, func: Any) -> None:
        """``func``'s meta kernel disagreed with its real one: ask the kernel from now on
        (Note [Layouts only the kernel knows]) and forget what meta said."""
        if func in KERNEL_LAYOUT_OPS or not isinstance(func, torch._ops.OpOverload):
            return
        KERNEL_LAYOUT_OPS.add(func)
        with self._lock:
            for key in [k for k in self._fast if k[0] is func]:
                self._fast.pop(key, None)
                self._cache.pop(key, None)

    def clear(self) -> None:
        """Forget every memoized result and interned spec (ids are not reused)."""
        with self._lock:
            self._clear_locked()

    def _clear_locked(self) -> None:
        self._fast.clear()
        self._cache.clear()
        self.seeded.clear()
        self._sids = {}

    # Note [Seeding the memo from real runs]
    # A window's first capture pays each op's meta kernel once per key, and torch's meta
    # kernels for common ops are Python decompositions (measured, torch 2.13, CPU, meta
    # tensors: addmm of fp32[128, 256] 389 µs, gelu 378 µs, gelu_backward 1.0 ms, mul
    # 100 µs), so a first sighting cost ~250-300 µs per op against ~15 µs for a recurring
    # one, and a probe that found capture could not pay had spent 15-35 ms on three cold
    # windows (the loss_print and lstm_lm patterns). Once a measure decides to capture
    # (Note [Measure before capturing], runtime/adapt.py), one more span passes through
    # (not before: a program that parks, most on a CPU, would pay ~8 µs an op for seeds
    # it never uses, at every probe): its ops run for real, so their output specs are
    # known. The recorder keys them exactly as a capture would (the interned specs of
    # their inputs, the same scalars and options) and keeps the real outputs' specs here; a capture's memo miss takes a seeded result instead of
    # running meta, and every check a miss makes still runs (devices, validity). Only ops
    # whose output metadata is a function of the key are seeded: recorded ops (no views,
    # random, sync or data-dependent ops, by name, tags or call), with strided, plain
    # outputs. The real kernel's layout is the layout the flush will produce (Note
    # [Layouts only the kernel knows]). Bounded like the memo; emptied with it.
    def seed(self, key: Any, result: MetaResult) -> None:
        """Keep ``result`` (a real run's output specs) for ``key``'s first miss."""
        seeded = self.seeded
        if key not in self._fast and key not in seeded:
            with self._lock:  # one memo may serve modes in several threads
                if len(seeded) >= self.max_seeded and seeded:
                    seeded.pop(next(iter(seeded)), None)
                seeded[key] = result

    def __len__(self) -> int:
        return len(self._fast)


__all__ = ["MetaResult", "MetaFailure", "MetaMemo", "meta_execute", "to_meta_args", "KERNEL_LAYOUT_OPS"]
