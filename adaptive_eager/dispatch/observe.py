"""ObserveMode: the torch-function half of the runtime.

It flushes the dispatch mode before Python-level reads of plain tensors (Note
[Observation on CPU]) and asks the pass-through policy whether to park the dispatch
mode; parking itself, its own included, is dispatch/parking.py's (Note [Deep parking]).

Example::

    >>> import torch
    >>> from adaptive_eager import config
    >>> from adaptive_eager.runtime import EagerExecutor, Counters
    >>> mode = AdaptiveEagerMode(config.resolve(backend="eager"), EagerExecutor(), Counters())
    >>> p = torch.zeros(2)
    >>> with mode, ObserveMode(mode):
    ...     _ = p.add_(1)        # a deferred in-place update of a plain tensor
    ...     print(p.tolist())    # ObserveMode flushes before the read
    [1.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .direct import HANDLERS
from .exported import note_export
from .lazy import suspended
from .mode import AdaptiveEagerMode, _tensors
from .parking import end_warmup, park, unpark
from .source import called_by_user, user_source, warnings_at_user_line
from ..reasons import R


# Note [Observation on CPU]
# Reading a plain CPU tensor (print, numpy, tolist, data_ptr) dispatches no ATen op,
# so a deferred in-place update of a real tensor (a parameter after a deferred
# optimizer step) would be read stale. ObserveMode sees those Python-level reads
# and flushes first. Handles need no such help: LazyTensor overrides these methods.
_OBSERVERS = {
    getattr(torch.Tensor, name): name
    for name in (
        "__repr__", "__format__", "numpy", "tolist", "__array__", "data_ptr", "__dlpack__",
        "untyped_storage", "storage", "_typed_storage", "__reduce_ex__", "__deepcopy__",
        "__setstate__", "__getstate__", "share_memory_",
    )
    if hasattr(torch.Tensor, name)
}


# Reads that end the eager warm-up (Note [The first iteration runs eagerly]): the
# observers above, and the syncs that return Python values (these reach the dispatch
# mode as ATen ops when it captures, so the observers above do not list them).
_READS = {**_OBSERVERS, **{
    getattr(torch.Tensor, name): name
    for name in ("item", "__bool__", "__float__", "__int__", "__index__", "cpu")
}}

# Note [A branch on a tensor is a bool read]
# `if t:`, `while t:`, `t and u` call Tensor.__bool__, whose ATen op is the same
# _local_scalar_dense as .item()'s (is_nonzero is a composite op, decomposed before the
# dispatch mode sees it). Only here, at the Python level, are the two told apart: the
# mode is told which read it is while the call runs, and names the sync after it.
_SCALAR_READS = {torch.Tensor.__bool__: R.BOOL}
# Torch functions handled in their own way (Note [Behind the dispatcher], direct.py).
_OBSERVED = {**_OBSERVERS, **{func: "direct" for func in HANDLERS}}
_ROUTES = {**_OBSERVED, **_SCALAR_READS}  # one lookup per torch call for all

_COPYING_OBSERVERS = {"__repr__", "__format__", "tolist", "__reduce_ex__", "__deepcopy__", "__getstate__"}


class ObserveMode(TorchFunctionMode):
    """Flushes ``mode`` before a Python-level read of any tensor's data."""

    def __init__(self, mode: AdaptiveEagerMode):
        super().__init__()
        self.mode = mode
        self.deep = False  # off the torch-function stack (parking.deep_park)
        self._depth = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        mode = self.mode
        if mode._parked:
            # Fast path: parked means nothing is pending in this thread, so no read
            # needs a flush, and ops pass straight through unless the policy probes.
            if not mode._should_defer():
                if mode.policy.warming and func in _READS \
                        and called_by_user(1):
                    # Note [The first iteration runs eagerly]: the program's read ends it
                    # (torch's own, like an optimizer reading its step count, does not).
                    end_warmup(mode, f"{R.OBSERVE}:{_READS[func].strip('_')}", user_source(2))
                name = _OBSERVED.get(func)
                if name is None:
                    return func(*args, **kwargs) if kwargs else func(*args)
                # Nothing is pending, but exports are remembered and handles unwrapped.
                return self._observe(name, func, args, kwargs or {})
            unpark(mode)
        kwargs = kwargs or {}
        if not mode.recorder.nodes and not mode._should_defer():
            park(mode)  # Note [Parking the mode] (parking.py)
        name = _ROUTES.get(func)
        if name is not None:
            read = _SCALAR_READS.get(func)
            if read is not None:
                mode.read_reason = read  # Note [A branch on a tensor is a bool read]
                try:
                    return func(*args, **kwargs)
                finally:
                    mode.read_reason = None
            return self._observe(name, func, args, kwargs)
        return func(*args, **kwargs)

    def _observe(self, name: str, func: Any, args: tuple, kwargs: dict) -> Any:
        if name == "direct":
            return HANDLERS[func](self.mode, func, args, kwargs)
        if len(self.mode.recorder):
            # Copies out (repr, tolist, pickle) need only their tensors' values; what
            # exposes memory (numpy, data_ptr, storage, dlpack) can be written through,
            # so everything pending runs first.
            targets = _tensors(args, kwargs) if name in _COPYING_OBSERVERS else None
            self.mode.flush(f"{R.OBSERVE}:{name.strip('_')}", user_source(3), targets=targets)
        # The read itself runs ops (numpy() and storage() detach, repr formats):
        # on real tensors, for real, or it would read a handle's empty storage.
        # Note [Warnings keep the program's line] (source.py)
        with suspended(), warnings_at_user_line():
            out = func(*args, **kwargs)
            if name not in _COPYING_OBSERVERS:
                note_export(name, args[0], out)  # Note [Exported memory]
        return out


__all__ = ["ObserveMode"]
