"""Parking: when the runtime steps off PyTorch's mode stacks, and when it comes back.

Whether to defer is the policy's decision (``runtime.adapt.DeferPolicy``); this module is
the mechanism that acts on it, in one place:

* :func:`park` / :func:`unpark`: the dispatch mode leaves or rejoins the dispatch-mode
  stack (Note [Parking the mode]);
* :func:`deep_park` / :func:`resume`: the torch-function observer leaves or rejoins its
  stack too (Note [Deep parking]);
* :func:`end_warmup`: the program's first iteration is over (Note [The first iteration
  runs eagerly], runtime/adapt.py);
* :class:`SafePoints`: the points between torch calls where both may happen: the start
  and end of an optimizer step (global ``torch.optim`` hooks) and, while some runtime is
  parked, every module call (a global forward pre-hook).

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager") as ctx:   # a policy that passes through:
    ...     mode = ae.session.current_mode()
    ...     park(mode); parked = mode._parked; unpark(mode)
    >>> parked, mode._parked
    (True, False)
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable

from torch.overrides import _get_current_function_mode as _current_function_mode
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode
from torch.utils._python_dispatch import _pop_mode, _push_mode

import torch

from .._logging import artifact_logger
from .optim import restore as restore_foreach
from .optim import use_foreach
from .source import user_source
from ..reasons import R

_pop_function_mode = torch._C._pop_torch_function_stack
_push_function_mode = torch._C._push_on_torch_function_stack
_function_stack_len = torch._C._len_torch_function_stack
_PARK_LOG = artifact_logger("ae_parking")

# A safe point counts for this many torch calls towards the pass-through policy's probes:
# the end of an optimizer step stands for a step's worth, a module call for a few.
SAFE_POINT_WEIGHT = 100
MODULE_CALL_WEIGHT = 8


# Note [Parking the mode]
# Passing ops through still costs the dispatch mode's Python call (~5-8 µs per op),
# more than a tiny op itself. So while the pass-through policy says nothing pays and
# nothing is pending, the mode leaves the dispatch-mode stack ("parks"); ObserveMode,
# a torch-function mode costing ~1 µs per call, keeps asking the policy and puts the
# mode back when the policy probes again. Parking only happens when the mode is on top
# of the stack, and a block unparks before exiting.
def park(mode: Any) -> None:
    """``mode`` leaves the dispatch-mode stack while ops pass straight through."""
    if mode._parked or _current_dispatch_mode() is not mode:
        return
    _pop_mode()
    mode._parked = True
    if _PARK_LOG.isEnabledFor(logging.DEBUG):
        _PARK_LOG.debug("parked (ops pass straight through): %s",
                        mode.policy.reason or "pass-through policy")
    mode.release_handles()  # Note [Releasing bound handles] (mode.py)
    if SAFE_POINTS is not None:
        SAFE_POINTS.parked_changed(True)


def unpark(mode: Any) -> None:
    """``mode`` is back on the dispatch-mode stack (capturing again)."""
    if not mode._parked:
        return
    _push_mode(mode)
    mode._parked = False
    if _PARK_LOG.isEnabledFor(logging.DEBUG):
        _PARK_LOG.debug("unparked: capturing again (a probe, or compiles finished) at %s",
                        user_source(2))
    if SAFE_POINTS is not None:
        SAFE_POINTS.parked_changed(False)


def end_warmup(mode: Any, why: str, source: str | None) -> None:
    """The program's first iteration ended (Note [The first iteration runs eagerly])."""
    if mode.policy.end_warmup():
        if source is None:
            source = user_source(2)  # e.g. the program's opt.step() line
        mode.counters.warmup_ended = f"{why} at {source}"
        _PARK_LOG.debug("warm-up ended: %s at %s; capturing from now", why, source)


# Note [Deep parking]
# Parked, the mode still costs ObserveMode's Python call on every torch function
# (~1.5 µs; an AdamW step makes 1,700 of them: 15-25% of its eager time). At a safe
# point (SafePoints) a parked runtime takes ObserveMode off the torch-function stack
# too, and ops run with no Python in between. Nothing is pending while parked, so no
# read needs a flush. The next safe point asks the policy (its probes, or the end of a
# compile wait) and puts ObserveMode back, which unparks the mode on the next torch
# call. Only when ObserveMode is the top of the stack (and, to come back, when the stack
# is as it was left) does this happen, so that a mode the program entered meanwhile
# keeps its place.
def deep_park(observe: Any) -> bool:
    """``observe`` leaves the torch-function stack while its mode is parked; True if so."""
    if observe.deep or not observe.mode._parked or _current_function_mode() is not observe:
        return False
    _pop_function_mode()
    observe.deep = True
    observe._depth = _function_stack_len()
    return True


def resume(observe: Any) -> bool:
    """``observe`` is back on the torch-function stack after :func:`deep_park`."""
    if not observe.deep or _function_stack_len() != observe._depth:
        return False
    _push_function_mode(observe)
    observe.deep = False
    return True


def innermost_observe(stack: list) -> Any:
    """The innermost ObserveMode of a thread's runtime stack of (mode, observe) entries."""
    for _, observe in reversed(stack):
        if observe is not None:
            return observe
    return None


def park_or_resume(mode: Any, stack: list, weight: int) -> bool:
    """At a safe point: deep-park a parked runtime, or bring a deep-parked one back when
    the policy wants to capture again. False when the runtime is capturing."""
    observe = innermost_observe(stack)
    if observe is None or observe.mode is not mode:
        return True
    if observe.deep:
        if mode._should_defer(weight):
            resume(observe)
    elif mode._parked:
        if not mode.policy.warming:
            deep_park(observe)
    else:
        return False
    return True


class SafePoints:
    """The process's safe points: global torch.optim step hooks, and a global module
    forward pre-hook while some runtime is parked.

    ``thread_stack()`` returns the calling thread's runtime stack (a list of (mode,
    observe) entries, innermost last) or None; ``counters`` counts the optimizer steps
    switched to the foreach level. Installed once per process (:func:`install`).
    """

    def __init__(self, thread_stack: Callable[[], list | None], counters: Any):
        self.thread_stack = thread_stack
        self.counters = counters
        self._lock = threading.Lock()
        self._parked = 0
        self._module_hook: Any = None
        self._tls = threading.local()  # optimizer -> param groups switched to foreach
        from torch.optim.optimizer import (  # noqa: PLC0415
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        # torch's public API; costs nothing to code that never steps an optimizer
        self._hooks = [register_optimizer_step_pre_hook(self.step_starts),
                       register_optimizer_step_post_hook(self.step_ends)]

    # -- optimizer steps ----------------------------------------------------------------
    def _switched(self) -> "weakref.WeakKeyDictionary":
        switched = getattr(self._tls, "foreach", None)
        if switched is None:
            switched = self._tls.foreach = weakref.WeakKeyDictionary()
        return switched

    def step_starts(self, opt: Any, *_: Any) -> None:
        """The start of an optimizer step: qualifying param groups run at the foreach
        level (Note [Optimizer steps at the foreach level], dispatch/optim.py)."""
        switched = self._switched()
        left = switched.pop(opt, None)
        if left:  # the last step raised before its post hook ran
            restore_foreach(left)
        if self.thread_stack():
            groups = use_foreach(opt)
            if groups:
                switched[opt] = groups
                self.counters.optimizer_steps_foreach += 1

    def restore_foreach(self) -> None:
        """Every group this thread switched and did not restore yet gets foreach=None back."""
        switched = getattr(self._tls, "foreach", None)
        while switched:
            _, groups = switched.popitem()
            restore_foreach(groups)

    def step_ends(self, opt: Any, *_: Any) -> None:
        """The end of an optimizer step."""
        switched = getattr(self._tls, "foreach", None)
        if switched:
            groups = switched.pop(opt, None)
            if groups:
                restore_foreach(groups)
        st = self.thread_stack()
        if not st:
            return
        mode = st[-1][0]
        if mode.policy.warming:
            end_warmup(mode, "optimizer step", None)  # Note [The first iteration runs eagerly]
            return
        if not park_or_resume(mode, st, SAFE_POINT_WEIGHT) and len(mode.recorder):
            # Note [Optimizer steps end windows]
            # A program that reads nothing every step (loss read every N steps) has its
            # windows cut only by window_size, at a different op each iteration (an
            # iteration of 307 ops: 256, then 51 + 205, ...), so no window recurs and
            # nothing compiles. Ending the window at the end of each optimizer step
            # anchors windows to iterations: the same ops each step, so they recur.
            mode.flush(R.OPTIMIZER_STEP, user_source(2))

    # -- module calls ---------------------------------------------------------------------
    # Note [Deep parking at module calls]
    # Optimizer steps are the safe points of training loops; an inference loop (or any
    # loop stepping no torch.optim optimizer) has none, so a parked runtime kept paying
    # ObserveMode's Python call on every torch function (measured: a small GPT forward
    # with a new sequence length each step, 20% over eager once passed through). While
    # some runtime in the process is parked, a global module forward pre-hook is
    # installed, and each module call is a safe point too: it deep-parks the parked
    # runtime of its thread, and while deep-parked counts towards the policy's probes (a
    # module call standing for a few torch calls) and brings ObserveMode back when the
    # policy probes. Module calls happen between torch calls, never inside ObserveMode,
    # like an optimizer step's end. While the warm-up lasts, ObserveMode stays: it is
    # what sees the first read. The hook is removed when no runtime is parked, so
    # programs pay for it only while parked.
    def module_call(self, *_: Any) -> None:
        """Before a module's forward (the global module forward pre-hook, while parked)."""
        st = self.thread_stack()
        if st:
            park_or_resume(st[-1][0], st, MODULE_CALL_WEIGHT)

    def parked_changed(self, parked: bool) -> None:
        with self._lock:
            self._parked += 1 if parked else -1
            if self._parked > 0 and self._module_hook is None:
                from torch.nn.modules.module import register_module_forward_pre_hook  # noqa: PLC0415

                self._module_hook = register_module_forward_pre_hook(self.module_call)
            elif self._parked <= 0 and self._module_hook is not None:
                self._parked = 0
                self._module_hook.remove()
                self._module_hook = None

    @property
    def module_hooked(self) -> bool:
        """Whether the module forward pre-hook is installed now."""
        return self._module_hook is not None


# Note [The safe points registry]
# One SafePoints per process, installed with the first session (it registers global
# torch hooks, which must not be doubled); the documented registry of this module.
SAFE_POINTS: SafePoints | None = None
_INSTALL_LOCK = threading.Lock()


def install(thread_stack: Callable[[], list | None], counters: Any) -> SafePoints:
    """Install the process's safe points once (idempotent); returns them."""
    global SAFE_POINTS
    with _INSTALL_LOCK:
        if SAFE_POINTS is None:
            SAFE_POINTS = SafePoints(thread_stack, counters)
        return SAFE_POINTS


__all__ = ["park", "unpark", "end_warmup", "deep_park", "resume", "innermost_observe",
           "park_or_resume", "SafePoints", "install", "SAFE_POINTS", "SAFE_POINT_WEIGHT",
           "MODULE_CALL_WEIGHT"]
