"""What the window's writers answer besides a value: a leaf module, imported by the mode
before any window exists (Note [The window is built at the first capture], mode.py).

* :data:`MISS`: an emitter's answer when the op is not the node its trace expects
  (dispatch/match.py, trace.py);
* :class:`OutputMismatch`: an in-place or ``out=`` op that would change a tensor's
  metadata, so it must run for real (dispatch/builder.py).

Example::

    >>> MISS
    MISS
    >>> issubclass(OutputMismatch, Exception)
    True
"""

from __future__ import annotations

from typing import Any


class _Miss:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS: Any = _Miss()  # an emitter's answer when the op is not the node it expects


class OutputMismatch(Exception):
    """An in-place/out= op would change a tensor's metadata: must run for real."""


__all__ = ["MISS", "OutputMismatch"]
