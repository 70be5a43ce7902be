"""Python entry points into C++ that touches tensor memory directly (Note [Opaque calls]).

Example::

    >>> import torch, adaptive_eager as ae
    >>> from adaptive_eager.dispatch.opaque import OPAQUE_CALLS
    >>> ("torch.nn.parallel", "DistributedDataParallel", "__init__") in OPAQUE_CALLS
    True
"""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any, Callable

from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .lazy import suspended

# Note [Opaque calls]
# Some C++ code allocates tensors through the dispatcher and then reads or writes
# their memory through raw pointers (accessors, data_ptr), which no mode sees. Under
# the runtime its allocations would be handles without storage, and its dispatched
# writes (copy_ into a buffer it then reads) would still be pending when it reads:
# DistributedDataParallel's constructor does both (_verify_params_across_processes
# fills a metadata tensor through an accessor, broadcasts it, copy_s it back and
# compares through an accessor). Such calls are listed here. While a session is
# active they are wrapped: everything the thread has pending runs first (flush reason
# "opaque:<name>"), then the call runs with capture suspended, so it sees and makes
# plain tensors, exactly as in eager. The wrappers are installed once, when the first
# session is made, and only act in threads where the runtime is capturing.
OPAQUE_CALLS: tuple[tuple[str, str, str], ...] = (
    ("torch.nn.parallel", "DistributedDataParallel", "__init__"),
)

_INSTALLED: set[tuple[str, str, str]] = set()
_LOCK = threading.Lock()


def _flush_this_thread(reason: str) -> None:
    from .mode import AdaptiveEagerMode  # noqa: PLC0415 - mode imports this module's users

    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, AdaptiveEagerMode):
            mode.flush(reason)


def opaque(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Wrap ``fn`` so that it runs after a flush, with capture suspended."""
    reason = f"opaque:{name}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _flush_this_thread(reason)
        with suspended():
            return fn(*args, **kwargs)

    wrapper._ae_opaque = fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Wrap every call in :data:`OPAQUE_CALLS` (idempotent)."""
    with _LOCK:
        for entry in OPAQUE_CALLS:
            if entry in _INSTALLED:
                continue
            module, owner, attr = entry
            try:
                obj = getattr(importlib.import_module(module), owner)
            except (ImportError, AttributeError):
                continue  # not in this torch build (distributed off): nothing to wrap
            fn = obj.__dict__.get(attr) if isinstance(obj, type) else getattr(obj, attr)
            if fn is None or hasattr(fn, "_ae_opaque"):
                continue
            setattr(obj, attr, opaque(fn, owner))
            _INSTALLED.add(entry)


__all__ = ["OPAQUE_CALLS", "install", "opaque"]
