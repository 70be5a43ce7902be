"""SIGINT waits for the flush (or one-time set-up) in progress (Note [Interrupts wait for the flush]).

Note [Interrupts wait for the flush]
Python runs a signal handler in the main thread between two bytecodes, and checks
for one right after a C call returns: inside a flush, mostly right after a kernel
returned, before the runner has recorded that the node ran. A KeyboardInterrupt there
leaves the window half-applied with no way to tell which in-place updates landed
(running the node again applies it twice; not running the rest loses the program's
work, as a running total read after Ctrl-C did in 3 of 3 trials). So while a runtime
block is open in the main thread, SIGINT goes through :func:`_on_signal`: during a
flush in the main thread it only notes the signal, and the outermost flush delivers
it (calls the program's handler, normally raising KeyboardInterrupt) once every
handle of its window is bound. A second SIGINT during the same flush is delivered at
once, for a user who insists (a long synchronous compile); the flush then finishes
its window eagerly (Note [A failed flush loses no work], runtime/recovery.py). The
one-time import of torch._dynamo before capture (Note [Import Dynamo before capture],
parking.py) is guarded the same way:
interrupted half-way, it left a broken module behind, every meta kernel then failed
and ops were marked as having none (measured: aten::add_ synced for the rest of the
process after a Ctrl-C during the first block's entry).

The handler is installed when the main thread enters its first block, wrapping the
handler in force (only a Python callable: SIG_IGN and SIG_DFL are left alone), and
put back when the main thread leaves its last block, unless the program replaced it
meanwhile (then the program's handler stays, and interrupts are not deferred).
Other threads receive no signals, so their flushes need none of this.

Example::

    >>> with critical():      # what AdaptiveEagerMode.flush does around a window
    ...     pass
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ..hooks import HOOKS, Hook

_get_ident = threading.get_ident


class _State:
    """This module's registry: the wrapped handler and the main thread's flush depth."""

    def __init__(self) -> None:
        self.previous: Any = None    # the program's handler, called to deliver
        self.holds = 0               # open blocks of the main thread
        self.depth = 0               # flushes running in the main thread
        self.pending: tuple[int, Any] | None = None  # a SIGINT noted during a flush


_STATE = _State()


def _main_ident() -> int | None:
    return threading.main_thread().ident


def _on_signal(signum: int, frame: Any) -> None:
    st = _STATE
    if st.depth and st.pending is None:
        st.pending = (signum, frame)
        return
    st.pending = None
    _deliver(signum, frame)


def _deliver(signum: int, frame: Any) -> None:
    previous = _STATE.previous
    if callable(previous):
        previous(signum, frame)
    else:  # pragma: no cover - only callables are ever wrapped
        raise KeyboardInterrupt


def _install_handler() -> Any:
    """Wrap the program's SIGINT handler (a Python callable only); the token is it."""
    current = signal.getsignal(signal.SIGINT)
    if current is _on_signal or not callable(current):
        return None
    try:
        signal.signal(signal.SIGINT, _on_signal)
    except (ValueError, OSError):  # not the main interpreter: leave signals alone
        return None
    _STATE.previous = current
    return current


def _restore_handler(previous: Any) -> None:
    """Put the program's handler back, unless the program replaced ours meanwhile."""
    if signal.getsignal(signal.SIGINT) is _on_signal:
        signal.signal(signal.SIGINT, previous)


# The row of the hooks registry (Note [The hooks registry], hooks.py): added at the
# main thread's first block, removed at its last.
SIGINT_HANDLER = Hook("sigint", "signal.signal(SIGINT)", _install_handler, _restore_handler)


def hold() -> None:
    """A block opens in this thread: in the main thread, defer SIGINT during flushes."""
    if _get_ident() != _main_ident():
        return
    st = _STATE
    st.holds += 1
    if st.holds == 1:
        HOOKS.install([SIGINT_HANDLER])


def release() -> None:
    """A block of this thread closes: the last one of the main thread puts the handler back."""
    if _get_ident() != _main_ident():
        return
    st = _STATE
    st.holds = max(0, st.holds - 1)
    if st.holds == 0:
        HOOKS.uninstall(SIGINT_HANDLER)


class _Critical:
    """Context manager around a flush: a SIGINT in the main thread waits for its end."""

    __slots__ = ()

    def __enter__(self) -> None:
        if _get_ident() == _main_ident():
            _STATE.depth += 1

    def __exit__(self, *exc: Any) -> None:
        if _get_ident() != _main_ident():
            return
        st = _STATE
        st.depth -= 1
        if st.depth == 0 and st.pending is not None:
            signum, frame = st.pending
            st.pending = None
            _deliver(signum, frame)


_CRITICAL = _Critical()


def critical() -> _Critical:
    """A section a SIGINT waits for (one shared instance: it holds no state)."""
    return _CRITICAL


__all__ = ["hold", "release", "critical"]
