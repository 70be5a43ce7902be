"""Process-wide enabling: this thread now, and every thread started afterwards.

:func:`enable` / :func:`disable` (re-exported by ``adaptive_eager.session`` and the
package) turn the runtime on for the whole process (Note [Process-wide enable]);
``ADAPTIVE_EAGER=1`` calls :func:`enable` when ``import torch`` completes
(``adaptive_eager.autoload``).

Example::

    >>> from adaptive_eager import process
    >>> process.is_enabled()
    False
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Callable

import torch

from ._logging import log, warn_once
from .config import Options
from .exit_report import before_report
from .hooks import HOOKS, Patch
from .session import _TLS, _stack, adaptive_eager, resolve_options


# Note [Process-wide enable]
# PyTorch's mode stacks are thread-local, so "the whole process" means: the calling
# thread now, and every thread started later. enable() enters a mode in the calling
# thread and patches threading.Thread.start so that each thread started afterwards
# runs its run() inside `with adaptive_eager(...)` (the instance's run is wrapped,
# so Thread subclasses that override run() are covered too). Not covered, by design
# or by necessity:
# - threads already running when enable() is called: another thread's mode stack
#   cannot be changed from outside; they stay plain eager (they may call enable() or
#   use `with adaptive_eager()` themselves);
# - threads started by torch or by adaptive_eager itself (compile workers, pin-memory
#   threads): the runtime must never capture its own machinery; a thread can also
#   opt out with `thread.adaptive_eager_exempt = True` before start();
# - threads started with _thread.start_new_thread, below the threading module.
# disable() undoes the patch and leaves the mode in the calling thread; threads
# started while enabled keep the runtime until their run() returns.
class _Enabled:
    """The registry of process-wide enabling: the options new threads start under (the
    patch of Thread.start is a row of the hooks registry, hooks.py)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.options: Options | None = None


_ENABLED = _Enabled()
_EXEMPT_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)
_THREADING_DIRS = (
    os.path.abspath(threading.__file__),
    os.path.join(os.path.dirname(os.path.abspath(threading.__file__)), "concurrent") + os.sep,
)


def _started_by_library(depth: int) -> bool:
    """Whether the code that started a thread is torch's or ours (skipping threading)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_THREADING_DIRS):
        f = f.f_back
    return f is not None and f.f_code.co_filename.startswith(_EXEMPT_DIRS)


def _run_under(options: Options, run: Callable[[], None]) -> Callable[[], None]:
    @functools.wraps(run)
    def run_under_runtime() -> None:
        ctx = adaptive_eager._from_options(options)
        try:
            ctx.__enter__()
        except Exception as e:  # noqa: BLE001 - the thread's own work must still run
            warn_once(f"thread-enter:{type(e).__name__}",
                      "adaptive_eager: a thread runs plain eager, entering the runtime failed: "
                      "%s: %s", type(e).__name__, e)
            run()
            return
        try:
            run()
        except BaseException:
            ctx.__exit__(*sys.exc_info())
            raise
        ctx.__exit__(None, None, None)

    return run_under_runtime


def _start_under_runtime(original_start: Callable) -> Callable:
    def start(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
        options = _ENABLED.options
        if options is not None and not getattr(self, "adaptive_eager_exempt", False) \
                and not _started_by_library(2):
            self.run = _run_under(options, self.run)  # type: ignore[method-assign]
        return original_start(self, *args, **kwargs)

    return functools.wraps(original_start)(start)


# The row of the hooks registry (Note [The hooks registry], hooks.py): installed by
# enable(), undone by disable().
THREAD_START = Patch("thread-start", "threading.Thread", "start", _start_under_runtime)


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect (new threads start under the runtime)."""
    return _ENABLED.options is not None


def enable(**options: Any) -> None:
    """Run the rest of the program under adaptive eager: this thread and new threads.

    Options are those of :class:`adaptive_eager`. The calling thread enters the runtime
    at once; threads started afterwards run under it too. Threads already running are
    not affected (Note [Process-wide enable]). Calling it again with other options
    switches to them; with the same options it only enters the calling thread.
    The runtime is left (the window flushed) by :func:`disable` or at process exit.

    Example::

        >>> import torch, adaptive_eager as ae
        >>> ae.enable(backend="eager")
        >>> (torch.ones(2) * 3).tolist()
        [3.0, 3.0]
        >>> ae.disable()
    """
    resolved = resolve_options(**options)
    if getattr(_TLS, "enabled_ctx", None) is None and _stack():
        raise RuntimeError(
            "adaptive_eager.enable() was called inside a `with adaptive_eager()` block; "
            "call it outside (before) the block"
        )
    with _ENABLED.lock:
        if _ENABLED.options is not None and _ENABLED.options != resolved:
            disable()
        if getattr(_TLS, "enabled_ctx", None) is None:
            # Entered before threads are patched: if entering fails, nothing has changed
            # (a thread started later must not inherit a runtime that cannot start).
            ctx = adaptive_eager._from_options(resolved)
            ctx.__enter__()
            _TLS.enabled_ctx = ctx
            _TLS.enabled_depth = len(_stack())
        _ENABLED.options = resolved
        HOOKS.install([THREAD_START])
        before_report(_leave_at_exit)  # flush before the exit report (exit_report.py)
    log.debug("enabled process-wide: %s", resolved)


def disable() -> None:
    """Undo :func:`enable`: flush and leave the runtime in this thread; new threads run eager.

    Must not be called inside a ``with adaptive_eager()`` block of the same thread.
    A no-op when not enabled.

    Example::

        >>> import adaptive_eager as ae
        >>> ae.disable()
    """
    with _ENABLED.lock:
        _ENABLED.options = None
        HOOKS.uninstall(THREAD_START)
    ctx = getattr(_TLS, "enabled_ctx", None)
    if ctx is None:
        return
    if len(_stack()) != _TLS.enabled_depth:
        raise RuntimeError(
            "adaptive_eager.disable() was called inside a `with adaptive_eager()` block; "
            "leave the block first"
        )
    _TLS.enabled_ctx = None
    ctx.__exit__(None, None, None)


def _leave_at_exit() -> None:
    """At exit, before the report: flush and leave the main thread's runtime."""
    if getattr(_TLS, "enabled_ctx", None) is not None:
        disable()


__all__ = ["enable", "disable", "is_enabled"]
