"""Optimizer steps that wait for their own compile run uncaptured (Note [A step waiting
for its compile is not captured]): capture suspended for the step's body, per thread.

Example::

    >>> import torch
    >>> from adaptive_eager.dispatch.lazy import is_suspended
    >>> w, opt = WaitingSteps(), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> w.suspend(opt); is_suspended()
    True
    >>> w.resume(); is_suspended()
    False
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .lazy import _TLS as _LAZY_STATE

# Note [A step waiting for its compile is not captured]
# A candidate's step that runs eagerly because its own compile is not worth it yet
# (Note [A step compiles once it has cost enough]), not ready, or being checked (its
# first compiled call runs on copies beside eager's step) used to be captured at the
# foreach level like any other ops, and its window was worth compiling: the compile
# worker then compiled the same arithmetic twice, first as a region (queued as soon as
# the window recurred), then as the step (queued once the step had cost enough), one
# after the other. Measured: SGD-momentum over 100 tensors, 2 threads, the step's own
# compile waited 25 s behind the region's, the program at 2.2x eager meanwhile; a step
# checked against its disk-loaded compiled call became an 8-op window and then a 61-node
# region of its own (the demo with kept caches compiled it, 6.8 s of the worker, parked
# meanwhile). Such a step now runs as eager runs it (dispatch/optim_compile.py,
# ``StepCompiler.passes_through``): the window before it is flushed, its groups run at
# the foreach level where that is equal (Note [Optimizer steps at the foreach level]),
# and its ops pass through, capture suspended from our pre-hook to our post-hook. After
# a step that raised, capture is back at the next step of any optimizer or at the
# block's exit. The suspensions are counted apart from the weak table of the steps that
# hold one: an optimizer freed after its step raised must not leave capture suspended.


class WaitingSteps:
    """This thread's optimizers whose step runs with capture suspended (see the Note)."""

    def __init__(self) -> None:
        self._tls = threading.local()

    def suspend(self, opt: Any) -> None:
        """Capture suspended until ``opt``'s step ends (:meth:`resume`)."""
        tls = self._tls
        waiting = getattr(tls, "waiting", None)
        if waiting is None:
            waiting = tls.waiting = weakref.WeakKeyDictionary()
        if opt not in waiting:
            waiting[opt] = True
            tls.held = getattr(tls, "held", 0) + 1
            _LAZY_STATE.suspended += 1

    def resume(self, opt: Any = None) -> None:
        """Capture back after ``opt``'s step (None: after every such step of this thread:
        one raised)."""
        tls = self._tls
        held = getattr(tls, "held", 0)
        if not held:
            return
        waiting = tls.waiting
        if opt is not None:
            if waiting.pop(opt, None) is None:
                return
            n = 1
        else:
            waiting.clear()
            n = held
        tls.held = held - n
        _LAZY_STATE.suspended = max(0, _LAZY_STATE.suspended - n)


__all__ = ["WaitingSteps"]
