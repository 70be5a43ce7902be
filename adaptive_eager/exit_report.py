"""The report at process exit (option ``report`` / ``ADAPTIVE_EAGER_REPORT``).

One ``atexit`` hook for the process: it runs what must happen first (process-wide
enabling flushes the main thread's window: :func:`before_report`), then writes the report
to every destination asked for. It depends on nothing above it: the statistics come from
the snapshot function handed over with the first destination.

Example::

    >>> from adaptive_eager.statistics import Stats
    >>> report_at_exit("", lambda: Stats())   # "" is off: nothing is registered
"""

from __future__ import annotations

import atexit
import threading
from typing import Any, Callable

from ._env import OFF_WORDS
from ._logging import log

# Note [The exit report registry]
# The process's one exit hook and what it writes: documented module state, like atexit's.
_LOCK = threading.Lock()
_DESTINATIONS: list[str] = []
_FIRST: list[Callable[[], None]] = []
_SNAPSHOT: list[Callable[[], Any]] = []
_REGISTERED = [False]


def _register() -> None:
    if not _REGISTERED[0]:
        _REGISTERED[0] = True
        atexit.register(_at_exit)


def report_at_exit(destination: str, snapshot: Callable[[], Any]) -> None:
    """Write the report of ``snapshot()`` to ``destination`` (stderr, stdout, a path; a
    ``.json`` path gets JSON) when the process exits."""
    if destination.strip().lower() in OFF_WORDS:
        return
    with _LOCK:
        if destination not in _DESTINATIONS:
            _DESTINATIONS.append(destination)
        if not _SNAPSHOT:
            _SNAPSHOT.append(snapshot)
        _register()


def before_report(fn: Callable[[], None]) -> None:
    """Run ``fn`` at exit before the report is written (once per function)."""
    with _LOCK:
        if fn not in _FIRST:
            _FIRST.append(fn)
        _register()


def _at_exit() -> None:
    for fn in list(_FIRST):
        try:
            fn()
        except Exception as e:  # at exit, a message is better than a traceback
            log.warning("adaptive_eager: %s at exit failed: %s", getattr(fn, "__name__", fn), e)
    if _DESTINATIONS and _SNAPSHOT:
        from .reporting import emit_report  # noqa: PLC0415 - only when a report is asked for

        snap = _SNAPSHOT[0]()
        for dest in list(_DESTINATIONS):
            emit_report(snap, dest)  # JSON for a .json path


__all__ = ["report_at_exit", "before_report"]
