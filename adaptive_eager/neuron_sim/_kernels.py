"""Kernels of the emulated `neuron` device: one boxed fallback for every ATen op.

The fallback is registered for the PrivateUse1 dispatch key, i.e. below autograd,
autocast and ADInplaceOrView, exactly where a real backend's kernels sit. Autograd,
view tracking and version counters are therefore torch's own, not ours.

Routing (`neuron_fallback`):

| op kind                                   | handled by                               |
|-------------------------------------------|------------------------------------------|
| allocation (`empty.memory_format`, ...)   | allocate on CPU, retarget to neuron      |
| view (schema returns a non-write alias)   | the CPU kernel, run on the neuron tensor |
| `set_`, `resize_`                         | the CPU kernel / a storage swap          |
| `_copy_from`, `_copy_from_and_resize`     | copy between CPU views (mixed allowed)   |
| everything else (compute)                 | the CPU kernel on CPU views of the args  |

# Note [Views run the CPU kernel on neuron tensors]
CPU view kernels (`as_strided`, `view`, `_reshape_alias`, `unfold`, ...) only build
a new TensorImpl over `self`'s storage; they never touch the data or check the
device. Redispatching them to the CPU key with the neuron tensor itself yields a
neuron view that shares the *same* storage object, so `x[0].add_(1)` changes `x`,
`_base`/version counters come from autograd as in eager, and
`untyped_storage().data_ptr()` agrees across views.

# Note [Compute runs on CPU views]
For compute, each neuron tensor argument is retargeted to a CPU tensor over the
same bytes (`_dlpack.retarget`), the op runs with the CPU kernel, and results are
mapped back: a result that *is* one of the CPU views (in-place and out= ops return
their argument) becomes the original neuron argument; any other result is
retargeted to neuron without a copy. Random ops with `generator=None` draw from
the CPU default generator, so `torch.manual_seed` makes neuron and CPU programs
produce identical random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import _dlpack, _memory
from ._device import check_device_index
from ._launch import record_launch, wait_for_device
from ._names import DEVICE_TYPE

__all__ = ["neuron_fallback", "to_cpu_view", "from_cpu", "DEVICE_TYPE"]

_aten = torch.ops.aten
_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")


def to_cpu_view(t: torch.Tensor) -> torch.Tensor:
    """CPU tensor over the same bytes as neuron tensor `t` (no copy, no autograd).

    The conjugate and negative bits are kept (DLPack drops them, so they are set
    again on the CPU view): CPU kernels that handle them natively (mm, copy_, ...)
    then see what eager would.
    """
    cpu = _dlpack.retarget(t, _dlpack.KDL_CPU)
    if t.is_conj():
        cpu = cpu.conj()
    if t.is_neg():
        cpu = torch._neg_view(cpu)
    return cpu


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """Neuron tensor over the same bytes as CPU tensor `t` (no copy, no autograd).

    A CPU tensor with the conjugate or negative bit set is materialized first (a
    copy), as DLPack cannot carry the bits.
    """
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return _memory.track(_dlpack.retarget(t, _dlpack.KDL_EXT_DEV))


def _is_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == DEVICE_TYPE


def _iter_tensors(values: Any) -> Any:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _check_same_device(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    """Raise eager's mixed-device RuntimeError (0-dim CPU tensors are allowed, as on CUDA)."""
    # NB: `is_cpu` and `dim()` are cheap C properties; `t.device` builds an object.
    for t in _iter_tensors(args):
        if t.is_cpu and t.dim() != 0:
            _raise_mixed_device(op, t)
    if kwargs:
        for t in _iter_tensors(kwargs.values()):
            if t.is_cpu and t.dim() != 0:
                _raise_mixed_device(op, t)


def _raise_mixed_device(op: torch._ops.OpOverload, t: torch.Tensor) -> None:
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two "
        f"devices, {DEVICE_TYPE}:0 and {t.device}! "
        f"(when checking arguments for {op._schema.name})"
    )


def _to_cpu_arg(x: Any, views: dict[int, torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        if x.is_cpu or x.device.type != DEVICE_TYPE:
            return x
        cpu = to_cpu_view(x)
        views[id(cpu)] = x
        return cpu
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_to_cpu_arg(v, views) for v in x)
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return _CPU
    return x


def _from_cpu_result(x: Any, views: dict[int, torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        original = views.get(id(x))
        if original is not None:
            return original
        return from_cpu(x) if x.is_cpu else x
    if isinstance(x, (list, tuple)):
        return type(x)(_from_cpu_result(v, views) for v in x)
    return x


def _call_on_cpu(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    views: dict[int, torch.Tensor] = {}
    cpu_args = tuple(_to_cpu_arg(a, views) for a in args)
    cpu_kwargs = {k: _to_cpu_arg(v, views) for k, v in kwargs.items()}
    try:
        result = op(*cpu_args, **cpu_kwargs)
    except RuntimeError as e:
        if "not resizable" not in str(e) or not _has_out_args(op):
            raise
        return _call_out_op_with_resize(op, args, kwargs)
    return _from_cpu_result(result, views)


def _has_out_args(op: torch._ops.OpOverload) -> bool:
    return any(a.is_out for a in op._schema.arguments)


def _call_out_op_with_resize(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    # An out= op whose out tensor has the wrong size resizes it; a retargeted CPU
    # view cannot be resized (its storage has no allocator). Compute into fresh CPU
    # out tensors instead, then resize the neuron outs (see `resize_`) and copy.
    outs = {a.name: kwargs[a.name] for a in op._schema.arguments if a.is_out}
    views: dict[int, torch.Tensor] = {}
    cpu_args = tuple(_to_cpu_arg(a, views) for a in args)
    cpu_kwargs = {k: _to_cpu_arg(v, views) for k, v in kwargs.items() if k not in outs}
    fresh = {k: torch.empty(0, dtype=v.dtype) for k, v in outs.items()}
    op(*cpu_args, **cpu_kwargs, **fresh)
    for name, out in outs.items():
        resize_(_aten.resize_.default, out, fresh[name].shape)
        to_cpu_view(out).copy_(fresh[name])
    results = tuple(outs.values())
    return results[0] if len(results) == 1 else results


# ---- special kernels ------------------------------------------------------------


def _empty(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> torch.Tensor:
    device = kwargs.get("device")
    if device is not None:
        check_device_index(device.index)
    kwargs["device"] = _CPU
    kwargs.pop("pin_memory", None)
    return from_cpu(op(*args, **kwargs))


def resize_(
    op: torch._ops.OpOverload,
    self: torch.Tensor,
    size: Any,
    memory_format: torch.memory_format | None = None,
) -> torch.Tensor:
    """`resize_` for neuron tensors: grow by swapping in a larger storage.

    A retargeted storage has no allocator, so it cannot grow in place. When the new
    size needs more bytes, a new storage is allocated, the old bytes copied to its
    front (as `resize_` keeps the data prefix) and `self` is `set_` onto it. Other
    tensors sharing the old storage keep the old one (eager would move them too).
    """
    needed = (self.storage_offset() + math.prod(size)) * self.element_size()
    storage = self.untyped_storage()
    if needed > storage.nbytes():
        grown = torch.zeros(needed, dtype=torch.uint8)
        old = to_cpu_view(_uint8_alias(self))
        grown[: old.numel()].copy_(old)
        new_storage = from_cpu(grown).untyped_storage()
        _aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYSET, self, new_storage, self.storage_offset(), self.shape, self.stride())
    if memory_format is None:
        return op.redispatch(_CPU_KEYSET, self, size)
    return op.redispatch(_CPU_KEYSET, self, size, memory_format=memory_format)


def _uint8_alias(t: torch.Tensor) -> torch.Tensor:
    # A byte view of `t`'s whole storage, sharing the storage object.
    flat = torch.empty(0, dtype=torch.uint8, device=t.device)
    return _aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYSET, flat, t.untyped_storage(), 0, (t.untyped_storage().nbytes(),), (1,))


def _copy_from(
    op: torch._ops.OpOverload, src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False
) -> torch.Tensor:
    record_launch()
    dst_is_neuron = _is_neuron(dst)
    src_cpu = to_cpu_view(src) if _is_neuron(src) else src
    dst_cpu = to_cpu_view(dst) if dst_is_neuron else dst
    dst_cpu.copy_(src_cpu)
    if not dst_is_neuron:  # the host reads device data: Note [Asynchronous launches]
        wait_for_device()
    return dst


def _copy_from_and_resize(
    op: torch._ops.OpOverload, src: torch.Tensor, dst: torch.Tensor
) -> torch.Tensor:
    if dst.shape != src.shape:
        if _is_neuron(dst):
            resize_(_aten.resize_.default, dst, src.shape)
        else:
            dst.resize_(src.shape)
    return _copy_from(_aten._copy_from.default, src, dst)


def _to_copy(
    op: torch._ops.OpOverload,
    self: torch.Tensor,
    *,
    device: torch.device | None = None,
    non_blocking: bool = False,
    pin_memory: bool | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    # `.cpu()`, `.to(dtype)`, `.to("cpu", non_blocking=True)` of a neuron tensor, as
    # one launch. The composite `_to_copy` would pin the CPU result of a non_blocking
    # copy, and pinned memory needs an allocator Python cannot provide.
    target = self.device if device is None else device
    if target.type == DEVICE_TYPE:
        check_device_index(target.index)
    record_launch()
    result = op(to_cpu_view(self), device=_CPU, **kwargs)
    if target.type == DEVICE_TYPE:
        return from_cpu(result)
    wait_for_device()  # the host reads device data: Note [Asynchronous launches]
    return result if target.type == "cpu" else result.to(target)


def _redispatch_to_cpu_kernel(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    return op.redispatch(_CPU_KEYSET, *args, **kwargs)


def _compute(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    _check_same_device(op, args, kwargs)
    record_launch()
    return _call_on_cpu(op, args, kwargs)


def _compute_then_wait(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    # The host needs the result (`.item()`) or its size (`nonzero`): it waits for the
    # device, as CUDA does (Note [Asynchronous launches]).
    result = _compute(op, *args, **kwargs)
    wait_for_device()
    return result


def _compute_mixed_devices_ok(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    record_launch()
    return _call_on_cpu(op, args, kwargs)


_SPECIAL: dict[str, Callable[..., Any]] = {
    "aten::empty.memory_format": _empty,
    "aten::empty_strided": _empty,
    "aten::resize_": resize_,
    "aten::_to_copy": _to_copy,
    "aten::_copy_from": _copy_from,
    "aten::_copy_from_and_resize": _copy_from_and_resize,
    "aten::set_.source_Storage": _redispatch_to_cpu_kernel,
    "aten::set_.source_Storage_storage_offset": _redispatch_to_cpu_kernel,
    "aten::set_.source_Tensor": _redispatch_to_cpu_kernel,
    "aten::set_": _redispatch_to_cpu_kernel,
}

# Ops that accept non-scalar CPU tensors next to device tensors in eager CUDA:
# CPU index tensors in advanced indexing (copies are in _SPECIAL).
_MIXED_DEVICES_OK = frozenset(
    {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
)

# Ops after which the host waits for the device: a value read on the host, or an
# output whose size depends on the data.
_HOST_WAITS = frozenset({
    "aten::_local_scalar_dense", "aten::equal", "aten::nonzero", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
})

# Cache: op -> kernel, filled on first use by `_route` (a pure function of the op).
_ROUTES: dict[torch._ops.OpOverload, Callable[..., Any]] = {}


def _route(op: torch._ops.OpOverload) -> Callable[..., Any]:
    schema = op._schema
    overload = schema.overload_name
    special = _SPECIAL.get(f"{schema.name}.{overload}" if overload else schema.name)
    if special is not None:
        return special
    returns = schema.returns
    if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
        return _redispatch_to_cpu_kernel  # a view: Note [Views run the CPU kernel on neuron tensors]
    if schema.name in _MIXED_DEVICES_OK:
        return _compute_mixed_devices_ok
    if schema.name in _HOST_WAITS:
        return _compute_then_wait
    return _compute


def neuron_fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Boxed PrivateUse1 fallback: run any ATen op on the emulated neuron device.

    Example (after `adaptive_eager.neuron_sim.enable()`)::

        >>> x = torch.ones(2, device="neuron")
        >>> (x + x).cpu()          # add.Tensor -> neuron_fallback -> CPU kernel
        tensor([2., 2.])
    """
    kernel = _ROUTES.get(op)
    if kernel is None:
        kernel = _ROUTES[op] = _route(op)
    return kernel(op, *args, **kwargs)
