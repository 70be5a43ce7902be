"""LazyTensor: the handle a deferred op returns.

A wrapper subclass with the right shape, stride, dtype, device and (set by
autograd) requires_grad, and no data. It is a thin handle: the window that owns it
lives in the mode; the handle holds its value id, its owner, and once its window has
been flushed, the real tensor it stands for (``_ae_real``).

After its window is flushed a handle behaves like the real tensor it is bound to,
with or without the mode: ops unwrap it, and Python-level reads (repr, numpy,
tolist, data_ptr, storage, pickling) read the real tensor.

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager"):
    ...     y = torch.ones(2) * 3       # y is a LazyTensor, nothing computed yet
    ...     type(y).__name__
    'LazyTensor'
    >>> y                               # bound at exit; prints like any tensor
    tensor([3., 3.])
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

import torch

from ..fusion.ir import TensorSpec
from .exported import export_array, note_export
from ..reasons import R


class Owner(Protocol):
    """What a handle needs from the mode that made it."""

    def materialize(self, handle: "LazyTensor", reason: str) -> torch.Tensor:
        ...

    def flush(self, reason: str) -> None:
        ...


# Note [Suspending capture]
# Formatting a tensor (repr) runs ops on it. Those must run for real, not be
# captured into the window they are trying to display. `suspended()` makes every
# AdaptiveEagerMode in this thread pass ops through (unwrapping handles) until it
# exits. Thread-local and documented: the one piece of state outside a mode.
# Its attribute has a class default, so that every thread reads it without a miss (a
# missing thread-local attribute read through getattr raises and catches AttributeError
# inside: ~0.6 µs on every captured op, issue 13).
class _ThreadState(threading.local):
    suspended = 0


_TLS = _ThreadState()


def is_suspended() -> bool:
    return _TLS.suspended > 0


class suspended:
    """Context manager: ops run for real in this thread while inside."""

    def __enter__(self) -> None:
        _TLS.suspended += 1

    def __exit__(self, *exc: Any) -> None:
        _TLS.suspended -= 1


_REPR_LOCK = threading.RLock()


class DeferredError(RuntimeError):
    """A handle whose deferred computation failed when its window was flushed."""


# Note [In-place metadata changes]
# squeeze_, resize_, set_, as_strided_ ... change a tensor's shape or strides, not
# only its values. They run for real on a handle's real tensor (after a flush), and
# the handle, which the program holds and eager would have changed in place, is then
# given the real tensor's new metadata by restriding the wrapper itself.
def restride(handle: "LazyTensor") -> None:
    """Give a bound handle its real tensor's shape, stride and offset."""
    real = handle._ae_real
    if real is None:
        return
    spec = TensorSpec.of(real)
    if spec == handle._ae_spec:
        return
    extent = spec.extent
    aten = torch.ops.aten
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowADInplaceOrView():
        aten.resize_.default(handle, [extent])  # room for the new view in the (empty) wrapper storage
        aten.as_strided_.default(handle, spec.shape, spec.stride, spec.storage_offset)
    handle._ae_spec = spec


# Note [Bound handles hold their memory]
# C++ that takes a tensor and reads its memory without dispatching an op
# (``Generator.set_state``, ``t.data = h``'s shallow copy, the legacy constructors,
# DLPack export) sees a handle's own TensorImpl, which a wrapper made without storage:
# "data is not allocated yet", or, once ``p.data = h`` copied that empty storage into a
# real parameter, a crash at its next use. So binding a handle also gives its wrapper the
# real tensor's storage, sizes and strides (the C++ shallow copy behind ``.data =``, which
# keeps the wrapper's Python keys and its own autograd metadata and version counter):
# ~0.4 µs per bound handle. The shallow copy takes the handle's autograd-metadata lock,
# which autograd may hold while it runs the op whose flush binds the handle (a view's
# grad_fn regenerated after an in-place change runs ``t()`` under that lock: the suite
# hung there), so handles with autograd metadata (requires_grad, views) get their memory
# later, when the runtime parks or its block exits and they are not released
# (:func:`hold_memory`). Where the device's key sets do not allow it (the emulated
# neuron device: a wrapper's keys differ from a real tensor's), handles stay without
# storage; unbound handles have no memory to give, and the calls that can reach C++ with
# them flush first (direct.py, opaque.py).
_SET_DATA = torch._C.TensorBase.data.__set__
_SHARES: dict[str, bool] = {}


def hold_memory(handle: "LazyTensor") -> None:
    """Give bound ``handle``'s wrapper its value's storage (Note [Bound handles hold their
    memory]). Not while autograd may hold the handle's lock (inside a flush), unless the
    handle has no autograd metadata."""
    real = handle._ae_real
    kind = real.device.type
    shares = _SHARES.get(kind)
    if shares is None:
        with torch._C._DisableTorchDispatch():  # the C++ answer, not a mode's
            shares = _SHARES[kind] = torch._has_compatible_shallow_copy_type(handle, real)
    if shares and real.layout == torch.strided and real.dtype == handle.dtype:
        with torch._C.DisableTorchFunction():  # not observe.py's `.data =` wrapper (direct.py)
            _SET_DATA(handle, real)


def bind(handle: "LazyTensor", real: torch.Tensor) -> torch.Tensor:
    """Bind ``handle`` to its value ``real`` (Note [Bound handles hold their memory])."""
    handle._ae_real = real
    if not handle.requires_grad and not handle._is_view():
        hold_memory(handle)
    return real


def restride_all(obj: Any) -> None:
    """:func:`restride` every handle in a (nested) args structure."""
    if isinstance(obj, LazyTensor):
        restride(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            restride_all(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            restride_all(o)


class LazyTensor(torch.Tensor):
    """A deferred tensor. See the module docstring."""

    _ae_vid: int
    _ae_owner: Owner | None
    _ae_spec: TensorSpec
    # Unbound and without error until a flush says otherwise: class defaults, so that a
    # new handle sets three attributes, not five (Note [Making a handle]).
    _ae_real: torch.Tensor | None = None
    _ae_error: BaseException | None = None

    @staticmethod
    def __new__(cls, spec: TensorSpec, vid: int, owner: Owner) -> "LazyTensor":
        return new_handle(spec, vid, owner)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107 - all done in __new__
        pass

    # -- binding -------------------------------------------------------------------
    def _ae_materialize(self, reason: str = R.OBSERVE) -> torch.Tensor:
        """The real tensor, flushing the owning window first if needed."""
        real = self._ae_real
        if real is not None:
            return real
        if self._ae_error is not None:
            raise DeferredError(
                f"this tensor's deferred computation failed when its window was flushed: "
                f"{self._ae_error!r}"
            ) from self._ae_error
        owner = self._ae_owner
        if owner is None:
            raise DeferredError("lazy tensor has no owner and no value (internal error)")
        return owner.materialize(self, reason)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: Any,
                                            expected_type: Any = None) -> torch.Tensor | None:
        """A torch.compile'd backward got this handle as a gradient: hand it the real one.

        AOTAutograd asks subclasses it did not trace with to become the plain tensor
        its compiled backward expects (Note [torch.compile inside the block], dynamo.py).
        """
        if expected_type is not None and expected_type is not torch.Tensor:
            return None
        return self._ae_read(R.TORCH_COMPILE)

    # -- running ops without the mode (escaped handles) ------------------------------
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        real_args, real_kwargs = unwrap_all(args, kwargs, R.ESCAPED)
        out = func(*real_args, **real_kwargs)
        if func._schema.is_mutable:
            restride_all((args, kwargs))  # Note [In-place metadata changes]
        return out

    # Note [Reading a bound handle]
    # A bound handle's real tensor can still be written by the open window (``h.add_(1)``
    # after ``h`` was bound records an in-place update of the real tensor). A Python-level
    # read of its data (numpy, storage, data_ptr, repr ...) must see that update, as
    # eager would, so it asks the owner to flush what touches the tensor first. What
    # exposes memory (numpy, storage, data_ptr, dlpack) can be written or freed through
    # (FSDP frees storage with ``untyped_storage().resize_(0)``): everything pending
    # runs first, as observe.py's read wrappers do for plain tensors.
    def _ae_read(self, reason: str, exposes: bool = False) -> torch.Tensor:
        """The real tensor for a Python-level read of its data (pending writes applied)."""
        owner = self._ae_owner
        if owner is not None:
            if exposes:
                owner.flush(reason)
            elif self._ae_real is not None:
                return owner.materialize(self, reason)
        return self._ae_materialize(reason)

    def _ae_expose(self, reason: str, name: str, *args: Any, **kwargs: Any) -> Any:
        real = self._ae_read(reason, exposes=True)
        out = getattr(real, name)(*args, **kwargs)
        with suspended():
            note_export(name, real, out)
        return out

    # -- Python-level reads: always of the real tensor -------------------------------
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        # Note [Printing like eager]
        # torch prints subclasses as "ClassName(...)" and plain tensors as "tensor(...)",
        # with grad_fn/requires_grad read from the object printed. Printing the handle
        # itself (ops on it run for real while suspended) keeps grad_fn; naming the
        # class "tensor" for the duration makes the prefix, and so the indentation of
        # every line, exactly eager's.
        self._ae_read(R.REPR)
        with _REPR_LOCK, suspended():
            cls = type(self)
            saved = cls.__name__
            cls.__name__ = "tensor"
            try:
                return torch.Tensor.__repr__(self, tensor_contents=tensor_contents)
            finally:
                cls.__name__ = saved

    def __format__(self, format_spec: str) -> str:
        # Tensor.__format__ formats a 0-dim plain tensor as its item (f"{loss:.3f}"); for
        # a subclass it falls back to object.__format__, which rejects any format spec.
        if self.dim() == 0:
            return self._ae_read(R.FORMAT).__format__(format_spec)
        return object.__format__(self, format_spec)

    # What these expose is remembered (Note [Exported memory], exported.py).
    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return export_array(self._ae_read(R.NUMPY, exposes=True).numpy(*args, **kwargs))

    def tolist(self) -> Any:  # type: ignore[override]
        return self._ae_read(R.TOLIST).tolist()

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return export_array(self._ae_read(R.NUMPY, exposes=True).__array__(*args, **kwargs))

    def data_ptr(self) -> int:  # type: ignore[override]
        return self._ae_expose("data_ptr", "data_ptr")

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._ae_expose("dlpack", "__dlpack__", *args, **kwargs)

    def __dlpack_device__(self) -> Any:  # type: ignore[override]
        return self._ae_materialize(R.DLPACK).__dlpack_device__()

    def untyped_storage(self) -> Any:  # type: ignore[override]
        return self._ae_expose("storage", "untyped_storage")

    def storage(self) -> Any:  # type: ignore[override]
        from .source import warnings_at_user_line  # noqa: PLC0415 - source imports torch's dirs

        with warnings_at_user_line():  # torch's deprecation names its caller: this line
            return self._ae_expose("storage", "storage")

    def _typed_storage(self) -> Any:
        return self._ae_expose("storage", "_typed_storage")

    # Note [Copies of handles are eager's copies]
    # copy.deepcopy, pickle, torch.save and copy.copy of a handle give what they give for
    # the tensor eager would hold: a plain tensor sharing the handle's memory, or a
    # Parameter for a parameter made in the block (``_is_param``), with the handle's
    # requires_grad, leafness, grad and Python attributes. Torch's own __deepcopy__ and
    # __reduce_ex__ then run on it (capture suspended, so the copies are real), which
    # keeps eager's answers: Parameters stay Parameters, storage shared within one
    # deepcopy memo stays shared, non-leaves refuse deepcopy with eager's error.
    def _ae_eager_object(self, reason: str) -> torch.Tensor:
        real = self._ae_read(reason)
        grad = self.grad if self.is_leaf else None  # a non-leaf's .grad warns
        with suspended():
            stand = real.detach()
            if getattr(self, "_is_param", False):
                stand = torch.nn.Parameter(stand, requires_grad=self.requires_grad)
            elif self.requires_grad:
                stand.requires_grad_(True)
                if not self.is_leaf:
                    stand = stand.view_as(stand)  # a non-leaf, like the handle
            if grad is not None and stand.is_leaf:
                stand.grad = unwrap(grad, reason)
        for k, v in self.__dict__.items():
            if not k.startswith("_ae_") and k != "_is_param":
                stand.__dict__[k] = v
        return stand

    def __reduce_ex__(self, proto: Any) -> Any:
        stand = self._ae_eager_object("pickle")
        with suspended():
            return stand.__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        if id(self) in memo:
            return memo[id(self)]
        stand = self._ae_eager_object("deepcopy")
        # torch memoizes by id(stand): keep stand alive for the memo's life (as copy does),
        # or the next stand-in could reuse its id and be given this copy.
        memo.setdefault(id(memo), []).append(stand)
        with suspended():
            out = stand.__deepcopy__(memo)
        memo[id(self)] = out
        return out


# Note [Making a handle]
# A handle is made per captured op output, on the hot path. ``LazyTensor(spec, vid,
# owner)`` ran a Python ``__new__`` and ``__init__`` and passed six keyword arguments to
# ``_make_wrapper_subclass`` (measured: 1.7 µs for the wrapper with six, 1.0 with the two
# it needs, and ~2.5 µs for the Python frames around it). :func:`new_handle` calls it
# directly, with strides only where they are not the contiguous ones and an offset only
# when it is not 0 (dtype and device always: their defaults are settable globals), and
# sets the three attributes a handle does not share with every other (_ae_real and
# _ae_error are class defaults until a flush binds or fails it).
_make = torch.Tensor._make_wrapper_subclass


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides ``_make_wrapper_subclass`` gives ``shape`` when none are passed."""
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def new_handle(spec: TensorSpec, vid: int, owner: Owner | None) -> LazyTensor:
    """A fresh, unbound handle for value ``vid`` of ``owner``'s window, with ``spec``'s
    metadata (Note [Making a handle]).

    Example::

        >>> import torch
        >>> h = new_handle(TensorSpec.of(torch.ones(2, 3).t()), 7, None)
        >>> h.shape, h.stride(), h._ae_vid, h._ae_real is None
        (torch.Size([3, 2]), (1, 3), 7, True)
    """
    if spec.storage_offset:
        h = _make(LazyTensor, spec.shape, strides=spec.stride, storage_offset=spec.storage_offset,
                  dtype=spec.dtype, device=spec.device)
    elif spec.stride != contiguous_strides(spec.shape):
        h = _make(LazyTensor, spec.shape, strides=spec.stride, dtype=spec.dtype, device=spec.device)
    else:
        h = _make(LazyTensor, spec.shape, dtype=spec.dtype, device=spec.device)
    h._ae_vid = vid
    h._ae_owner = owner
    h._ae_spec = spec
    return h


def has_unbound(obj: Any) -> bool:
    """Whether ``obj`` (a handle, or nested lists/tuples) holds a handle still pending."""
    if type(obj) is LazyTensor:
        return obj._ae_real is None
    if isinstance(obj, (list, tuple)):
        return any(has_unbound(o) for o in obj)
    return False


def unwrap(x: Any, reason: str) -> Any:
    """A handle's real tensor (flushing if needed); anything else unchanged."""
    if isinstance(x, LazyTensor):
        return x._ae_materialize(reason)
    return x


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, (list, tuple)):
        out = [_map(o, fn) for o in obj]
        return out if isinstance(obj, list) else tuple(out)
    return fn(obj)


def unwrap_all(args: tuple, kwargs: dict, reason: str) -> tuple[tuple, dict]:
    """Replace every handle in args/kwargs by its real tensor."""
    fn = lambda x: unwrap(x, reason)  # noqa: E731
    return _map(args, fn), {k: _map(v, fn) for k, v in kwargs.items()}


__all__ = ["LazyTensor", "DeferredError", "suspended", "is_suspended", "has_unbound", "unwrap",
           "unwrap_all", "new_handle", "contiguous_strides"]
