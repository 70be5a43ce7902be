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
_TLS = threading.local()


def is_suspended() -> bool:
    return getattr(_TLS, "suspended", 0) > 0


class suspended:
    """Context manager: ops run for real in this thread while inside."""

    def __enter__(self) -> None:
        _TLS.suspended = getattr(_TLS, "suspended", 0) + 1

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
    extent = spec.storage_offset + 1
    for size, stride in zip(spec.shape, spec.stride):
        extent += (size - 1) * abs(stride) if size else 0
    aten = torch.ops.aten
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowADInplaceOrView():
        aten.resize_.default(handle, [extent])  # room for the new view in the (empty) wrapper storage
        aten.as_strided_.default(handle, spec.shape, spec.stride, spec.storage_offset)
    handle._ae_spec = spec


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
    _ae_real: torch.Tensor | None
    _ae_spec: TensorSpec
    _ae_error: BaseException | None

    @staticmethod
    def __new__(cls, spec: TensorSpec, vid: int, owner: Owner) -> "LazyTensor":
        t = torch.Tensor._make_wrapper_subclass(
            cls, spec.shape, strides=spec.stride, storage_offset=spec.storage_offset,
            dtype=spec.dtype, device=spec.device, requires_grad=False,
        )
        t._ae_vid = vid
        t._ae_owner = owner
        t._ae_real = None
        t._ae_spec = spec
        t._ae_error = None
        return t

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107 - all done in __new__
        pass

    # -- binding -------------------------------------------------------------------
    def _ae_materialize(self, reason: str = "observe") -> torch.Tensor:
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
        return self._ae_read("torch.compile")

    # -- running ops without the mode (escaped handles) ------------------------------
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        real_args, real_kwargs = unwrap_all(args, kwargs, "escaped")
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
    # runs first, as ObserveMode does for plain tensors.
    def _ae_read(self, reason: str, exposes: bool = False) -> torch.Tensor:
        """The real tensor for a Python-level read of its data (pending writes applied)."""
        owner = self._ae_owner
        if owner is not None:
            if exposes:
                owner.flush(reason)
            elif self._ae_real is not None:
                return owner.materialize(self, reason)
        return self._ae_materialize(reason)

    # -- Python-level reads: always of the real tensor -------------------------------
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        # Note [Printing like eager]
        # torch prints subclasses as "ClassName(...)" and plain tensors as "tensor(...)",
        # with grad_fn/requires_grad read from the object printed. Printing the handle
        # itself (ops on it run for real while suspended) keeps grad_fn; naming the
        # class "tensor" for the duration makes the prefix, and so the indentation of
        # every line, exactly eager's.
        self._ae_read("repr")
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
            return self._ae_read("format").__format__(format_spec)
        return object.__format__(self, format_spec)

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._ae_read("numpy", exposes=True).numpy(*args, **kwargs)

    def tolist(self) -> Any:  # type: ignore[override]
        return self._ae_read("tolist").tolist()

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ae_read("numpy", exposes=True).__array__(*args, **kwargs)

    def data_ptr(self) -> int:  # type: ignore[override]
        return self._ae_read("data_ptr", exposes=True).data_ptr()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._ae_read("dlpack", exposes=True).__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:  # type: ignore[override]
        return self._ae_materialize("dlpack").__dlpack_device__()

    def untyped_storage(self) -> Any:  # type: ignore[override]
        return self._ae_read("storage", exposes=True).untyped_storage()

    def storage(self) -> Any:  # type: ignore[override]
        from .source import warnings_at_user_line  # noqa: PLC0415 - source imports torch's dirs

        with warnings_at_user_line():  # torch's deprecation names its caller: this line
            return self._ae_read("storage", exposes=True).storage()

    def _typed_storage(self) -> Any:
        return self._ae_read("storage", exposes=True)._typed_storage()

    def __reduce_ex__(self, proto: Any) -> Any:
        real = self._ae_read("pickle")
        with suspended():  # under the mode, detach() would return a handle: recursion
            real = real.detach()
        real.requires_grad_(self.requires_grad)
        return real.__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        real = self._ae_read("deepcopy")
        with suspended():
            out = real.detach().clone()
        out.requires_grad_(self.requires_grad and self.is_leaf)
        memo[id(self)] = out
        return out


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


__all__ = ["LazyTensor", "DeferredError", "suspended", "is_suspended", "unwrap", "unwrap_all"]
