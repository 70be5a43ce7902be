"""Observers: the Python-level reads of plain tensors, seen without a TorchFunctionMode.

A Python-level read of a plain tensor (print, numpy, tolist, data_ptr, storage, pickle,
dlpack) dispatches no ATen op, so the dispatch mode cannot see it (Note [Observation on
CPU]). The methods and functions that do such reads are wrapped, once per process
(:func:`install`), and each wrapper asks the calling thread's :class:`Observer` (one per
block, entered with its mode) to flush first. A wrapper costs a thread-local lookup on the
read it wraps and nothing on any other torch call (Note [Reads are seen where they
happen]). The same wrappers are the runtime's safe points between ops: they end the
eager warm-up at the program's first read, and park or unpark the mode after the read
(dispatch/parking.py).

Example::

    >>> import torch
    >>> from adaptive_eager import config
    >>> from adaptive_eager.runtime import EagerExecutor, Counters
    >>> mode = AdaptiveEagerMode(config.resolve(backend="eager"), EagerExecutor(), Counters())
    >>> p = torch.zeros(2)
    >>> with mode, Observer(mode):
    ...     _ = p.add_(1)        # a deferred in-place update of a plain tensor
    ...     print(p.tolist())    # the tolist wrapper flushes before the read
    [1.0, 1.0]
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

from .direct import HANDLERS, _SET_DATA
from .exported import before_export, export_array, export_result, note_export
from .lazy import _TLS as _LAZY_TLS
from .lazy import LazyTensor, suspended
from .mode import AdaptiveEagerMode, _tensors
from ..runtime.phases import AT_READ
from .parking import At, end_warmup, parked_call, parked_read, safe_point, seen
from .source import called_by_user, user_source, warnings_at_user_line
from ..hooks import HOOKS, MARK, Patch
from ..reasons import R



# Note [Observation on CPU]
# Reading a plain CPU tensor (print, numpy, tolist, data_ptr) dispatches no ATen op,
# so a deferred in-place update of a real tensor (a parameter after a deferred
# optimizer step) would be read stale. The wrappers below see those Python-level reads
# and flush first. Handles need no such help: LazyTensor overrides these methods.
#
# Note [Reads are seen where they happen]
# These reads used to be seen by a TorchFunctionMode on the stack beside the dispatch
# mode: it saw every torch call (~3 µs each, measured: issue 13) to find the few that
# read, and a parked runtime had to take it off the stack at safe points (optimizer
# steps, module calls) to run at eager speed. Now the reading methods of torch.Tensor
# and the functions that copy tensors' memory in C++ are wrapped, once per process (with
# the first session): a wrapper costs ~0.6 µs on the read it wraps (a Python call and
# a thread-local lookup; measured on bool() and item() of a 0-dim tensor) and no other
# torch call pays anything. What each read does (flush everything, flush its tensors,
# run a handler of dispatch/direct.py) is as before. Reads made by the runtime itself
# (capture suspended, or torch functions disabled inside a flush) pass straight through,
# as they did past the mode. Under Dynamo (torch.compile tracing a function that calls
# one), a wrapper is the function it wraps. Limitation: a reference taken before the
# first session (``from torch import tensor``) calls the unwrapped function.
EXPOSING = ("numpy", "__array__", "data_ptr", "__dlpack__", "untyped_storage", "storage",
            "_typed_storage", "share_memory_", "__setstate__")
COPYING = ("__repr__", "__format__", "tolist", "__reduce_ex__", "__deepcopy__", "__getstate__")
# Reads that end the eager warm-up (Note [The first iteration runs eagerly]) besides the
# two above: scalar reads, whose sync the dispatch mode sees as an ATen op when it captures.
SCALARS = ("item", "__bool__", "cpu")
# Scalar conversions, reads handled by dispatch/direct.py (Note [Behind the dispatcher]);
# and calls handled there that are not reads (no safe point, not counted), methods and
# functions.
CONVERSIONS = ("__float__", "__int__", "__index__", "__complex__")
_DIRECT_METHODS = ("new_tensor",)
# Not reads, but safe points between the program's torch calls (dispatch/parking.py): a
# backward pass is thousands of ops with no other safe point inside.
_SAFE_POINT_METHODS = ("backward",)
_DIRECT_FUNCTIONS = ("tensor", "as_tensor", "asarray", "_has_compatible_shallow_copy_type")

# Note [A branch on a tensor is a bool read]
# `if t:`, `while t:`, `t and u` call Tensor.__bool__, whose ATen op is the same
# _local_scalar_dense as .item()'s (is_nonzero is a composite op, decomposed before the
# dispatch mode sees it). Only here, at the Python level, are the two told apart: the
# mode is told which read it is while the call runs, and names the sync after it.
_READ_REASONS = {"__bool__": R.BOOL}

class _Observers(threading.local):
    """This thread's Observers, innermost last (a class default: read without a miss)."""

    observers: "list | None" = None


_TLS = _Observers()
_all_disabled = torch._C._is_torch_function_all_disabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_is_compiling = torch.compiler.is_compiling


class Observer:
    """While entered (with its mode), Python-level reads in this thread flush ``mode``
    first. Entering one installs the process's read wrappers if needed."""

    def __init__(self, mode: AdaptiveEagerMode):
        self.mode = mode

    def __enter__(self) -> "Observer":
        install()
        stack = getattr(_TLS, "observers", None)
        if stack is None:
            stack = _TLS.observers = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _TLS.observers
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:
            stack.remove(self)


def _mode_here() -> AdaptiveEagerMode | None:
    """The mode that observes reads in this thread now, or None (no runtime here, or
    the read is the runtime's own: capture suspended, torch functions disabled)."""
    stack = getattr(_TLS, "observers", None)
    if not stack or getattr(_LAZY_TLS, "suspended", 0) or _all_disabled():
        return None
    return stack[-1].mode


def _read(mode: AdaptiveEagerMode, name: str, kind: str, func: Callable, args: tuple,
          kwargs: dict) -> Any:
    """A read in a thread with a runtime: flush what it needs, run it, then a safe point."""
    seen(mode, True)  # Note [Counting while passing through]
    if mode._parked:
        if mode.policy.warming and called_by_user(2):
            # Note [The first iteration runs eagerly]: the program's read ends it
            # (torch's own, like an optimizer reading its step count, does not).
            source = user_source(2)  # Note [The first iteration ends where a boundary recurs]
            end_warmup(mode, f"{R.OBSERVE}:{name.strip('_')}", source, ("read", source))
        if type(args[0]) is not LazyTensor and kind == "convert":
            # Parked: nothing is pending and no mode of ours is on a stack, so a plain
            # tensor converts as it is (the other reads below find nothing to flush).
            out = func(*args, **kwargs)
            safe_point(mode, AT_READ)
            return out
    if kind == "scalar":
        t = args[0]
        if type(t) is not LazyTensor and (not mode.recorder.nodes or mode.recorder.vid_of(t) is None):
            # Note [Reads of untouched host scalars]
            # A plain tensor no pending op touches holds its current value: its read needs
            # no flush, and runs as it is, not through the mode (which would find that out
            # in ~10 µs). torch.optim's foreach steps read every parameter's step counter
            # (``_get_value(step)``, 200 reads an AdamW step over 100 tensors): 2.6 ms a
            # step of a 1.9 ms compiled region, through the mode.
            with suspended():
                out = func(*args, **kwargs)
            safe_point(mode, AT_READ)
            return out
        reason = _READ_REASONS.get(name)
        if reason is None:
            out = func(*args, **kwargs)
        else:
            mode.read_reason = reason  # Note [A branch on a tensor is a bool read]
            try:
                out = func(*args, **kwargs)
            finally:
                mode.read_reason = None
    elif kind == "convert":
        out = HANDLERS[func](mode, func, args, kwargs)
    else:
        if len(mode.recorder):
            # Copies out (repr, tolist, pickle) need only their tensors' values; what
            # exposes memory (numpy, data_ptr, storage, dlpack) can be written through,
            # so everything pending runs first.
            targets = _tensors(args, kwargs) if kind == "copying" else None
            mode.flush(f"{R.OBSERVE}:{name.strip('_')}", user_source(2), targets=targets)
        # The read itself runs ops (numpy() and storage() detach, repr formats):
        # on real tensors, for real, or it would read a handle's empty storage.
        if kind == "exposing":
            # Note [Warnings keep the program's line] (source.py): storage() warns
            with suspended(), warnings_at_user_line():
                if name in _ARRAYS:
                    before_export(args[0])  # Note [Memory exported before the runtime]
                out = func(*args, **kwargs)
                note_export(name, args[0], out)  # Note [Exported memory]
        else:
            with suspended():
                out = func(*args, **kwargs)
    safe_point(mode, AT_READ)  # between torch calls: park or unpark (parking.py)
    return out


# Note [Arrays made outside blocks]
# A numpy array of a tensor made between blocks (or in a thread with no block) aliases
# its memory as one made inside does, so the wrappers note it too, from the moment they
# are installed: its export then ends when the array dies, where an export no wrapper
# saw lasts until the storage is freed (Note [Memory exported before the runtime],
# exported.py). Only the arrays: a data_ptr() outside blocks is what compiled code
# (Inductor's wrappers) takes of every tensor it runs on, and noting those would make
# every parameter exported for good.
_ARRAYS = ("numpy", "__array__")


def _programs_read() -> bool:
    """Whether a read in a thread with no block is the program's (not the runtime's own:
    capture suspended, torch functions disabled)."""
    return not getattr(_LAZY_TLS, "suspended", 0) and not _all_disabled() and not _is_compiling()


def _array_outside(func: Callable, args: tuple, kwargs: dict) -> Any:
    """``numpy()``/``__array__`` of a thread with no block (Note [Arrays made outside blocks])."""
    before_export(args[0])
    return export_array(func(*args, **kwargs))


# Constructors whose tensor aliases memory the program holds (a numpy array, a buffer):
# exported until freed, in any thread (Note [Memory exported before the runtime]).
_ALIASING_FUNCTIONS = ("from_numpy", "frombuffer")


def _aliasing(func: Callable) -> Callable:
    @functools.wraps(func)
    def aliasing(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return func(*args, **kwargs)
        return export_result(func(*args, **kwargs))

    return aliasing


def _method(name: str, func: Callable, kind: str) -> Callable:
    if kind == "direct":  # not a read: a handler of direct.py, no safe point
        return _function(name, func)

    # scalar reads and conversions only: an exposing read notes its export (Note [Exported
    # memory]), a copying one (repr) runs its own reads suspended, uncounted
    fast = kind == "scalar" or kind == "convert"

    @functools.wraps(func)
    def read(*args: Any, **kwargs: Any) -> Any:
        stack = _TLS.observers
        # Note [A parked read costs a counter] (parking.py): one block in this thread,
        # parked, no mode at all on its dispatch-mode stack (an abandoned block's mode
        # parks at a read: Note [A block is left in the thread that entered it],
        # session.py), the program's read of a plain tensor
        if fast and args and stack is not None and len(stack) == 1 and stack[0].mode._parked \
                and not _dispatch_modes() and not _LAZY_TLS.suspended and not _all_disabled() \
                and type(args[0]) is not LazyTensor and parked_read(stack[0].mode):
            return func(*args, **kwargs)
        mode = _mode_here()
        if mode is None:
            if name in _ARRAYS and _programs_read():
                return _array_outside(func, args, kwargs)
            return func(*args, **kwargs)
        return _read(mode, name, kind, func, args, kwargs)

    return read


def _safe_point(name: str, func: Callable) -> Callable:
    @functools.wraps(func)
    def around(*args: Any, **kwargs: Any) -> Any:
        mode = _mode_here()
        if mode is None:
            return func(*args, **kwargs)
        if not parked_call(mode):  # Note [A parked read costs a counter]
            safe_point(mode, At.CALL)
        out = func(*args, **kwargs)
        if not parked_call(mode):
            safe_point(mode, At.CALL)
        return out

    return around


def _function(name: str, func: Callable) -> Callable:
    @functools.wraps(func)
    def direct(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # Dynamo traces the function it wraps, in its graph
            return func(*args, **kwargs)
        mode = _mode_here()
        if mode is None:
            return func(*args, **kwargs)
        return HANDLERS[func](mode, func, args, kwargs)

    return direct


def _set_data(self: torch.Tensor, value: Any) -> None:
    mode = _mode_here()
    if mode is None:
        return _SET_DATA(self, value)
    return HANDLERS[_SET_DATA](mode, _SET_DATA, (self, value), {})


def _data_property(data: Any) -> property:
    return property(data.__get__, _set_data, doc=data.__doc__)


def _direct_or_convert(name: str, kind: str) -> Callable[[Callable], Callable | None]:
    """A direct/convert read is wrapped only if dispatch/direct.py handles it."""
    return lambda func: _method(name, func, kind) if func in HANDLERS else None


def _rows() -> tuple[Patch, ...]:
    """The reads' rows of the hooks registry (Note [The hooks registry], hooks.py)."""
    kinds = {**{n: "exposing" for n in EXPOSING}, **{n: "copying" for n in COPYING},
             **{n: "scalar" for n in SCALARS}, **{n: "convert" for n in CONVERSIONS},
             **{n: "direct" for n in _DIRECT_METHODS}}
    rows = [Patch("reads", "torch.Tensor", name,
                  _direct_or_convert(name, kind) if kind in ("direct", "convert")
                  else functools.partial(_bind_method, name, kind))
            for name, kind in kinds.items()]
    rows += [Patch("reads", "torch.Tensor", n, functools.partial(_safe_point, n))
             for n in _SAFE_POINT_METHODS]
    rows += [Patch("reads", "torch", n, functools.partial(_function, n)) for n in _DIRECT_FUNCTIONS]
    rows += [Patch("reads", "torch", n, _aliasing) for n in _ALIASING_FUNCTIONS]
    rows.append(Patch("reads", "torch.Tensor", "data", _data_property))
    return tuple(rows)


def _bind_method(name: str, kind: str, func: Callable) -> Callable:
    return _method(name, func, kind)


ROWS = _rows()


def install() -> None:
    """Wrap the reading methods of ``torch.Tensor`` and the functions of ``torch`` that
    copy tensors' memory (once per process; Note [Reads are seen where they happen]),
    through the hooks registry (Note [The hooks registry])."""
    if not HOOKS.installed(ROWS[-1]):
        HOOKS.install(ROWS)


def original(func: Any) -> Any:
    """The function a read wrapper wraps (``func`` itself if it is none)."""
    return getattr(func, MARK, func)


def observed_names() -> tuple[str, ...]:
    """The reads that flush and are named after themselves (``observe:<name>``)."""
    return tuple(n for n in EXPOSING + COPYING if hasattr(torch.Tensor, n))


__all__ = ["Observer", "install", "original", "observed_names", "ROWS", "EXPOSING", "COPYING",
           "SCALARS", "CONVERSIONS"]
