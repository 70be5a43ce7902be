"""Torch functions that reach a tensor's TensorImpl or memory without dispatching an op.

The read wrappers (observe.py) hand these to the handlers below instead of running them
as they come (Note [Behind the dispatcher]); nothing else pays for them.

Example::

    >>> import torch, adaptive_eager as ae
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> with ae.adaptive_eager(backend="eager", adaptive_passthrough=False):
    ...     p.data = p.data.double() * 2      # a deferred value assigned to .data
    ...     p.dtype
    torch.float64
    >>> p.tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..fusion.ir import TensorSpec
from .lazy import LazyTensor, hold_memory, suspended, unwrap
from ..reasons import R

_SET_DATA = torch._C.TensorBase.data.__set__
_SHALLOW_COPY_TYPE = torch._has_compatible_shallow_copy_type  # before observe.py wraps it


# Note [Behind the dispatcher]
# A few torch functions work on a tensor's C++ object itself, not through ops:
# - ``t.data = v`` (``set_data``) copies v's TensorImpl fields (storage, sizes,
#   dtype) into t. With v a handle that is a wrapper without storage: a real
#   parameter given it crashed the process at its next use (``m.weight.data =
#   m.weight.data * 0.9``), and ``Module.double()`` / ``.to(dtype)``, which assign
#   ``.data`` the converted handle, left the parameter's value in float32.
#   Here the window runs first when it touches either side, then t is given v's real
#   tensor; a handle t becomes a wrapper of v's new metadata bound to an alias of v's
#   real tensor (its own TensorImpl sharing v's memory, as eager's t would be).
# - ``torch._has_compatible_shallow_copy_type(t, v)`` (asked by ``Module._apply``
#   before it assigns ``.data``) reads the two C++ key sets, and a wrapper's key set
#   differs from a real tensor's on some devices (the neuron device: Python keys;
#   eager says True there). It is answered for the tensors the handles stand for.
# - ``torch.tensor`` / ``as_tensor`` / ``asarray`` / ``Tensor.new_tensor`` of a
#   (nested) list of tensors copy each element's memory in C++: the elements are
#   brought up to date and handles replaced by their real tensors first. The legacy
#   constructors (``torch.Tensor([t])``, ``torch.FloatTensor``) convert each element
#   with ``float(t)`` / ``t.__index__()`` with Python dispatch excluded: those
#   conversions run on the real tensor, after the flush their dispatched form makes.
def set_data(mode: Any, args: tuple, kwargs: dict) -> None:
    """``target.data = new`` as eager does it (Note [Behind the dispatcher])."""
    target, new = args
    if not isinstance(new, torch.Tensor):
        return _SET_DATA(target, new)  # eager's TypeError
    rec = mode.recorder
    if len(rec) and any(type(t) is LazyTensor or rec.vid_of(t) is not None for t in (target, new)):
        mode.flush(R.SET_DATA)
    real = unwrap(new, R.SET_DATA)
    if type(target) is not LazyTensor:
        return _SET_DATA(target, real)
    with suspended():
        alias = real.detach()
    spec = TensorSpec.of(alias)
    # A wrapper of the new metadata lends its fields to the handle (wrapper to wrapper:
    # the key sets match on every device); the handle stays the program's object.
    _SET_DATA(target, LazyTensor(spec, target._ae_vid, target._ae_owner))
    target._ae_real = alias
    target._ae_spec = spec
    target._ae_error = None
    hold_memory(target)  # Note [Bound handles hold their memory] (lazy.py)
    return None


def _stand_in(t: Any) -> Any:
    if type(t) is not LazyTensor:
        return t
    if t._ae_real is not None:
        return t._ae_real
    with suspended():
        return torch.empty(0, dtype=t.dtype, device=t.device)


def shallow_copy_type(mode: Any, args: tuple, kwargs: dict) -> bool:
    """``torch._has_compatible_shallow_copy_type`` of the tensors the handles stand for."""
    return _SHALLOW_COPY_TYPE(*(_stand_in(a) for a in args),
                              **{k: _stand_in(v) for k, v in kwargs.items()})


# Note [Lists of numbers are scanned in C]
# ``torch.tensor(data)`` is looked through for handles in ``data``; a corpus tokenized
# line by line (word_language_model: ``torch.tensor(ids)`` per line, ~200 ints each)
# had every element checked by a Python call: 0.65 ms of each one-iteration run of the
# patterns benchmark's lstm_lm. A list whose elements are all Python numbers holds no
# tensor, and ``set(map(type, data))`` finds that at C speed; other elements are
# looked into as before.
_NUMBERS = frozenset({int, float, bool, complex})


def _nested_tensors(obj: Any, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)) and not set(map(type, obj)) <= _NUMBERS:
        for o in obj:
            if type(o) not in _NUMBERS:
                _nested_tensors(o, out)
    return out


def _real_nested(obj: Any) -> Any:
    if type(obj) is LazyTensor:
        return obj._ae_materialize(R.TENSOR_FROM_DATA)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_real_nested(o) for o in obj)
    return obj


def _from_data(pos: int) -> Callable[[Any, Callable, tuple, dict], Any]:
    def handler(mode: Any, func: Callable, args: tuple, kwargs: dict) -> Any:
        data = args[pos] if len(args) > pos else kwargs.get("data")
        if not isinstance(data, (list, tuple)):
            return func(*args, **kwargs)
        tensors = _nested_tensors(data, [])
        if not tensors:
            return func(*args, **kwargs)
        if len(mode.recorder):
            mode.flush(R.TENSOR_FROM_DATA, targets=tensors)
        real = _real_nested(data)
        if len(args) > pos:
            args = (*args[:pos], real, *args[pos + 1:])
        else:
            kwargs = {**kwargs, "data": real}
        with suspended():
            return func(*args, **kwargs)

    return handler


def _scalar(mode: Any, func: Callable, args: tuple, kwargs: dict) -> Any:
    # float(t), int(t), t.__index__(): the legacy constructors (torch.Tensor([t])) call
    # these from C++ with Python dispatch excluded, so their item() reads t's memory.
    t = args[0]
    if len(mode.recorder):
        mode.flush(R.ITEM, targets=[t])
    real = unwrap(t, R.ITEM)
    with suspended():
        return func(real, *args[1:], **kwargs)


# func -> handler(mode, func, args, kwargs); observe.py's wrappers run these in their place.
HANDLERS: dict[Any, Callable[[Any, Callable, tuple, dict], Any]] = {
    _SET_DATA: lambda mode, func, args, kwargs: set_data(mode, args, kwargs),
    _SHALLOW_COPY_TYPE:
        lambda mode, func, args, kwargs: shallow_copy_type(mode, args, kwargs),
    torch.tensor: _from_data(0),
    torch.as_tensor: _from_data(0),
    torch.asarray: _from_data(0),
    torch.Tensor.new_tensor: _from_data(1),
    torch.Tensor.__float__: _scalar,
    torch.Tensor.__int__: _scalar,
    torch.Tensor.__index__: _scalar,
    torch.Tensor.__complex__: _scalar,
}


__all__ = ["HANDLERS", "set_data", "shallow_copy_type"]
