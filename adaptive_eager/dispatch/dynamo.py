"""AdaptiveEagerMode next to Dynamo: torch.compile'd code called inside the block.

:func:`dynamo_aware` gives the mode class its ``__torch_dispatch__`` wrapper (Note [Dynamo's wrapper
only while Dynamo runs]) and its answers to Dynamo (Note [torch.compile inside the
block]); mode.py decorates the class with it (no import of mode.py here: no cycle).

Example::

    >>> import torch, adaptive_eager as ae
    >>> double = torch.compile(lambda t: t * 2, backend="eager", fullgraph=True)
    >>> with ae.adaptive_eager(backend="eager"):
    ...     double(torch.ones(2) + 1).tolist()
    [4.0, 4.0]
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch._C._dynamo.eval_frame import (
    _FrameAction,
    _FrameExecStrategy,
    get_eval_frame_callback,
    set_code_exec_strategy,
)
from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

from .lazy import LazyTensor, has_unbound
from .source import user_source
from ..reasons import R

_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_infra_mode = torch._C._get_dispatch_mode
_PLAIN_DISPATCH = torch._C._disabled_torch_dispatch_impl
_DYNAMO_ASKS = any_torch_dispatch_mode_on_stack.__code__


# Note [torch.compile inside the block]
# A torch.compile'd function called inside the block runs as it does outside: Dynamo
# compiles it and its compiled code runs on real tensors, the mode stepping aside.
# Dynamo skips frames while a dispatch mode that does not "ignore compile internals"
# is on the stack (the function would run eagerly, and fullgraph=True would fail),
# so this mode says it ignores them, and makes that true:
# - Dynamo asks (ignore_compile_internals) before it converts a frame. The frame's
#   inputs must be tensors Dynamo can trace, not handles: everything pending runs,
#   and bound handles that nothing else holds become plain tensors (release_handles).
#   A handle with autograd history stays one; Dynamo cannot trace it (a graph break,
#   or an error under fullgraph=True).
# - While Dynamo's eval-frame callback is installed (the compiled function's eager
#   parts, Dynamo's own tracing), and when the op comes from compiled code (run under
#   Dynamo's disable wrapper, or AOTAutograd's runtime wrappers for the forward and
#   the backward: _in_compiled_code), the op flushes what it needs and runs for real
#   (step_aside). Inductor's code writes buffers through data pointers and calls
#   extern kernels (addmm.out) on them: deferring those would read stale memory.
#   Finding compiled code walks the Python stack (a few µs per op), so only a mode
#   that Dynamo has asked does it.
# - A compiled backward handed a handle as a gradient gets its real tensor
#   (LazyTensor.__coerce_same_metadata_as_tangent__).
# Ops on fake tensors (Dynamo's tracing) run through untouched, as anywhere.
def ignore_compile_internals(mode: Any) -> bool:
    """Dynamo asks this before converting a frame: make its inputs plain tensors."""
    # TorchDispatchMode.__enter__ asks too: only Dynamo's question acts.
    if not mode._parked and sys._getframe(1).f_code is _DYNAMO_ASKS:
        mode._dynamo_seen = True
        with mode.lock:
            if len(mode.recorder):
                mode.flush(R.TORCH_COMPILE, user_source(3))
            mode.release_handles()
    return True


def step_aside(mode: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
    """An op inside a torch.compile'd function: run it now, on real tensors."""
    kwargs = kwargs or {}
    if _get_infra_mode(_FAKE) is not None:
        return mode._run_real(func, args, kwargs)  # Note [Fake tensors are not ours]
    for t in types:
        if t is not LazyTensor and t.__torch_dispatch__ is not _PLAIN_DISPATCH:
            return NotImplemented
    with mode.lock:
        if len(mode.recorder) or has_unbound((args, tuple(kwargs.values()))):
            return mode._sync_then_run(func, args, kwargs, R.TORCH_COMPILE)
        return mode._run_real(func, args, kwargs)


def _in_compiled_code() -> bool:
    """Whether a Dynamo-compiled graph called us (Note [torch.compile inside the block]).

    Compiled graphs run under Dynamo's disable wrapper (``_fn``), and AOTAutograd's
    forward and backward run through its runtime wrappers (the backward from the
    autograd engine, with no disable wrapper above it).
    """
    if not _COMPILED_MARKS:
        import torch._dynamo  # noqa: PLC0415 - imported: Dynamo has converted a frame
        from torch._functorch._aot_autograd import runtime_wrappers  # noqa: PLC0415

        _COMPILED_MARKS.add(torch._dynamo.disable(lambda: None).__code__)
        _COMPILED_FILES.add(runtime_wrappers.__file__)
    f = sys._getframe(2)
    for _ in range(_COMPILED_CODE_DEPTH):
        if f is None:
            return False
        code = f.f_code
        if code in _COMPILED_MARKS or code.co_filename in _COMPILED_FILES:
            return True
        f = f.f_back
    return False


_COMPILED_MARKS: set = set()
_COMPILED_FILES: set = set()
_COMPILED_CODE_DEPTH = 64


# Note [Dynamo's wrapper only while Dynamo runs]
# TorchDispatchMode wraps every subclass's __torch_dispatch__ in torch._disable_dynamo,
# so that a torch.compile'd frame never traces into a mode. That wrapper imports
# torch._dynamo on its first call (measured 2.5-3 s: most of this runtime's first
# iteration) and then costs a set_eval_frame round trip per op. Dynamo can only be
# running when its eval-frame callback is installed, so the mode calls its own
# implementation directly while there is none (unless compiled code called it). While
# there is one, the op belongs to a torch.compile'd function (Note [torch.compile inside
# the block]) and the mode steps aside, under Dynamo's disable wrapper. The wrapper's
# own frame is marked for Dynamo to skip, or Dynamo would trace it.
def _dispatch_unless_dynamo(raw: Any) -> Any:
    disabled: list = []

    @functools.wraps(raw)
    def __torch_dispatch__(self: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if get_eval_frame_callback() is None:
            if not self._dynamo_seen or not _in_compiled_code():
                return raw(self, func, types, args, kwargs)
            return step_aside(self, func, types, args, kwargs)
        if not disabled:
            import torch._dynamo  # noqa: PLC0415 - already imported: Dynamo is running

            disabled.append(torch._dynamo.disable(step_aside, recursive=True, wrapping=False))
        return disabled[0](self, func, types, args, kwargs)

    set_code_exec_strategy(__torch_dispatch__.__code__,
                           _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    __torch_dispatch__._torchdynamo_disable = True  # type: ignore[attr-defined]
    __torch_dispatch__._torchdynamo_orig_callable = raw  # type: ignore[attr-defined]
    return __torch_dispatch__


def dynamo_aware(cls: type) -> type:
    """Class decorator: the mode class's Dynamo-aware ``__torch_dispatch__`` and its
    answers to Dynamo (it runs after TorchDispatchMode's ``__init_subclass__``, whose
    wrapper it replaces)."""
    raw = cls.__dict__["__torch_dispatch__"]
    cls.__torch_dispatch__ = _dispatch_unless_dynamo(getattr(raw, "__wrapped__", raw))
    cls.ignore_compile_internals = ignore_compile_internals
    return cls


__all__ = ["dynamo_aware", "ignore_compile_internals", "step_aside"]
