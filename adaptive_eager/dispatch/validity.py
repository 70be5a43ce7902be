"""Errors eager raises at the op, found when the op is recorded.

Meta execution raises the shape errors eager raises, and most dtype errors, at the
user's line. Not all: torch's Python meta kernel for ``mul_`` checks broadcasting only
(``int_tensor.mul_(0.5)`` passes), others miss ``"not implemented for 'Long'"`` and
other dtype checks of the CPU kernels, and some errors depend on values (integer
division by zero). Deferred, such an op would fail at a later flush, outside the
``try`` the program wrapped around it, and the work after it would hang on a window
that failed (issue 15, item 3). Two checks close the gap, both on a metadata-memo
miss only, so steady state pays nothing:

Note [Dtype errors are found at record time]
A pointwise op (``torch.Tag.pointwise``) accepts or rejects its inputs by dtype and
rank alone (broadcasting of any shapes of the same ranks behaves alike on size-1
dims), so running its CPU kernel once on one-element stand-ins of the same dtypes and
ranks, with the same scalars, tells whether eager raises. When it does, the op is not
recorded: the mode runs it for real (after a flush), which raises eager's own error,
message included, at the op's line. Measured: the probe costs ~10-30 µs, on a miss
that costs ~60 µs of meta execution already. The CPU kernels stand in for every
device (the emulated neuron device runs them); a device whose kernels accept what the
CPU's reject only syncs that op, never computes a different value.

Note [Integer division runs now]
Integer ``//``, ``%``, ``fmod`` and ``div(rounding_mode=...)`` by a tensor raise
``ZeroDivisionError`` when a divisor element is 0, which no metadata tells. These run
now, as syncs (flush reason ``integer_division``), so the error is raised at the
op's line; by a Python number, the probe above finds a zero.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import TensorSpec, ValueRef
    >>> specs = {0: TensorSpec.of(torch.ones(3, dtype=torch.long))}
    >>> try:
    ...     check(torch.ops.aten.mul_.Scalar, (ValueRef(0), 0.5), {}, specs)
    ... except WouldRaise as e:
    ...     print(e)
    result type Float can't be cast to the desired output type Long
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..fusion.ir import TensorSpec, ValueRef
from ..runtime.executor import replay_guard
from .meta import Uncapturable
from ..reasons import R

aten = torch.ops.aten

_DIVISIONS = frozenset({
    "aten::floor_divide", "aten::floor_divide_", "aten::remainder", "aten::remainder_",
    "aten::fmod", "aten::fmod_", "aten::div", "aten::div_",
})


class WouldRaise(Uncapturable):
    """Eager raises on this call (found by the probe): run it for real, now."""

    sync_reason = "invalid_call"


class RunsNow(Uncapturable):
    """The call's errors depend on values (integer division): run it for real, now."""

    sync_reason = R.INTEGER_DIVISION


def check(func: Any, args: tuple, kwargs: Mapping[str, Any], specs: Mapping[int, TensorSpec]) -> None:
    """Raise :class:`RunsNow` or :class:`WouldRaise` for calls that cannot be deferred.

    ``args``/``kwargs`` are encoded (ValueRefs for tensors, ``specs`` their metadata).
    Called on a metadata-memo miss, after meta execution passed.
    """
    division = func._schema.name in _DIVISIONS  # elementwise, though not all tagged so
    if division and _integer_division(func, args, kwargs, specs):
        raise RunsNow(RuntimeError(f"{func}: integer division by a tensor"))
    if division or torch.Tag.pointwise in func.tags:
        _probe(func, args, kwargs, specs)


def _integer_division(func: Any, args: tuple, kwargs: Mapping[str, Any],
                      specs: Mapping[int, TensorSpec]) -> bool:
    """Whether ``func`` divides integers by a tensor (whose zeros make eager raise)."""
    if func._schema.name in ("aten::div", "aten::div_") and kwargs.get("rounding_mode") is None:
        return False  # true division: a float result, no error
    operands = [a for a in args[:2]]
    if len(operands) < 2:
        operands.extend(kwargs[k] for k in ("other",) if k in kwargs)
    if len(operands) < 2 or not isinstance(operands[1], ValueRef):
        return False
    for a in operands:
        if isinstance(a, ValueRef):
            dtype = specs[a.id].dtype
            if dtype.is_floating_point or dtype.is_complex:
                return False
        elif isinstance(a, (float, complex)):
            return False
    return True


def _probe(func: Any, args: tuple, kwargs: Mapping[str, Any], specs: Mapping[int, TensorSpec]) -> None:
    try:
        pargs = _stand_ins(args, specs)
        pkwargs = {k: _stand_ins(v, specs) for k, v in kwargs.items()}
    except (RuntimeError, TypeError):  # a dtype ones() cannot make (quantized): no probe
        return
    try:
        with replay_guard():
            func(*pargs, **pkwargs)
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        raise WouldRaise(e) from e


def _stand_ins(obj: Any, specs: Mapping[int, TensorSpec]) -> Any:
    if isinstance(obj, ValueRef):
        spec = specs[obj.id]
        return torch.ones((1,) * len(spec.shape), dtype=spec.dtype)
    if isinstance(obj, tuple):
        return tuple(_stand_ins(o, specs) for o in obj)
    if isinstance(obj, list):
        return [_stand_ins(o, specs) for o in obj]
    if isinstance(obj, torch.device):
        return torch.device("cpu")
    return obj


__all__ = ["check", "WouldRaise", "RunsNow"]
