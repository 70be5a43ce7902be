"""Sessions: what a ``with adaptive_eager():`` block turns on, and where it is kept.

A :class:`Session` is everything that should outlive one ``with`` block: options,
the executor (and so the compiled-region cache), the op table and the metadata memo.
Sessions are kept per Options in a process-wide registry, so a training loop that
enters the context every step reuses its caches. Modes are per thread (PyTorch's
mode stacks are thread-local): each thread that enters gets its own mode, with its
own open window, over the shared session.

Example::

    >>> import torch
    >>> from adaptive_eager import adaptive_eager
    >>> with adaptive_eager(backend="eager"):
    ...     (torch.ones(2) * 2).sum().item()
    4.0
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import config
from .config import Options
from .dispatch import AdaptiveEagerMode, MetaMemo, ObserveMode, OpTable
from .runtime import Counters, Executor, make_executor

# Note [Process-wide registries]
# _COUNTERS (what stats() reports) and _SESSIONS (caches per Options) are the
# process-wide state of the public API layer. Both are explicit and resettable
# (reset_stats(), clear_sessions()); nothing below this layer holds global state.
_COUNTERS = Counters()
_SESSIONS: dict[Options, "Session"] = {}
_SESSIONS_LOCK = threading.Lock()
_TLS = threading.local()


@dataclass
class Session:
    options: Options
    executor: Executor
    counters: Counters
    table: OpTable = field(default_factory=OpTable)
    memo: MetaMemo | None = None

    def new_mode(self) -> AdaptiveEagerMode:
        if self.memo is None:
            self.memo = MetaMemo(self.options.meta_cache_size)
        return AdaptiveEagerMode(self.options, self.executor, self.counters, self.table, self.memo)


def get_session(options: Options) -> Session:
    with _SESSIONS_LOCK:
        s = _SESSIONS.get(options)
        if s is None:
            s = _SESSIONS[options] = Session(options, make_executor(options, _COUNTERS), _COUNTERS)
        return s


def clear_sessions() -> None:
    """Drop every session (and its compiled regions). Active modes keep theirs."""
    with _SESSIONS_LOCK:
        _SESSIONS.clear()


def counters() -> Counters:
    return _COUNTERS


def _stack() -> list:
    st = getattr(_TLS, "stack", None)
    if st is None:
        st = _TLS.stack = []
    return st


def current_mode() -> AdaptiveEagerMode | None:
    """The innermost active mode in this thread, if any."""
    st = _stack()
    return st[-1][0] if st else None


class adaptive_eager:
    """Run the enclosed code under adaptive eager; also usable as a decorator.

    Options are keyword arguments (see ``adaptive_eager.config``). Nested blocks with
    the same options share one mode; a nested block with other options flushes the
    outer window first. Leaving the block flushes: every tensor made inside is then an
    ordinary tensor.

    Example::

        >>> import torch
        >>> @adaptive_eager(backend="eager")
        ... def f(x):
        ...     return (x + 1) * 2
        >>> f(torch.zeros(2))
        tensor([2., 2.])
    """

    def __init__(self, **options: Any):
        self._overrides = options
        self.options = config.resolve(**options)  # validates now, at the user's line

    def __enter__(self) -> "adaptive_eager":
        st = _stack()
        if st and st[-1][0].options == self.options:
            st.append((st[-1][0], None))
            return self
        outer = current_mode()
        if outer is not None:
            outer.flush("nested_enter")
        mode = get_session(self.options).new_mode()
        observe = ObserveMode(mode)
        mode.__enter__()
        observe.__enter__()
        st.append((mode, observe))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        mode, observe = _stack().pop()
        try:
            mode.flush("exit")
        finally:
            if observe is not None:
                observe.__exit__(None, None, None)
                mode.__exit__(None, None, None)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with adaptive_eager(**self._overrides):
                return fn(*args, **kwargs)

        return wrapper


def sync() -> None:
    """Flush the current thread's open window now (no-op outside the runtime).

    Example::

        >>> sync()
    """
    mode = current_mode()
    if mode is not None:
        mode.flush("explicit_sync")


__all__ = ["adaptive_eager", "sync", "Session", "get_session", "clear_sessions", "counters", "current_mode"]
