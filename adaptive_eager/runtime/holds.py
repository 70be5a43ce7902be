"""Holds on starting compiles: a leaf module (stdlib only), so that the dispatch layer's
fork hook can hold them without importing the compile service.

Example::

    >>> from adaptive_eager.runtime.holds import compiles_held, compiles_are_held
    >>> with compiles_held():
    ...     compiles_are_held()
    True
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

# Note [No compile starts at a fork or at exit]
# A flush at a fork (dispatch/opaque.py's before-fork hook) or at exit (the program's
# last window, process.disable) ran the window's executor as any flush does, and with a
# synchronous service (async_compile=False) a region that had recurred compiled right
# there: at exit, a compile for a program that is ending ("compile failed: RuntimeError:
# can't register atexit after shutdown", logged as a region that runs eagerly from now
# on); at a fork, the compile's first imports (filelock registers its own fork hooks)
# ran inside the fork's before-hooks, and filelock's after-hook raised KeyError in the
# parent. Neither can pay. So while a thread is inside compiles_held(), or once the
# interpreter exits, no compile or disk load starts: the window runs as it would
# uncompiled, the region stays cold (the optimizer step keeps its trace), and a later
# sighting compiles it.
_HELD = threading.local()


@contextlib.contextmanager
def compiles_held() -> Iterator[None]:
    """No compile or disk load starts in the calling thread meanwhile.

    Example::

        >>> with compiles_held():
        ...     compiles_are_held()
        True
        >>> compiles_are_held()
        False
    """
    before = getattr(_HELD, "on", False)
    _HELD.on = True
    try:
        yield
    finally:
        _HELD.on = before


def compiles_are_held() -> bool:
    """Whether the calling thread is inside :func:`compiles_held`."""
    return getattr(_HELD, "on", False)


__all__ = ["compiles_held", "compiles_are_held"]
