"""Python entry points into C++ that touches tensor memory directly (Note [Opaque calls]).

Example::

    >>> import torch, adaptive_eager as ae
    >>> from adaptive_eager.dispatch.opaque import OPAQUE_CALLS
    >>> ("torch.nn.parallel", "DistributedDataParallel", "__init__", "call") in OPAQUE_CALLS
    True
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..hooks import HOOKS, Hook, Patch, rng_setters_skipped
from ..reasons import R
from ..runtime.holds import compiles_held
from .exported import export, export_storage
from .lazy import suspended, unwrap_all

# Note [Opaque calls]
# Some C++ code allocates tensors through the dispatcher and then reads or writes
# their memory through raw pointers (accessors, data_ptr), which no mode sees. Under
# the runtime its allocations would be handles without storage, and its dispatched
# writes (copy_ into a buffer it then reads) would still be pending when it reads:
# DistributedDataParallel's constructor does both (_verify_params_across_processes
# fills a metadata tensor through an accessor, broadcasts it, copy_s it back and
# compares through an accessor); moving a storage to shared memory copies it with a
# dispatched copy_ into memory it then swaps in (a tensor shared in the block read as
# zeros). Other C++ takes a tensor and reads its memory directly: ``set_rng_state``
# (a state cloned in the block: "data is not allocated yet"), DLPack export. Copies
# are eager's when made of real tensors (Note [Copies of handles are eager's copies],
# lazy.py): ``torch.save``/``torch.load`` and the rebuild functions unpickling calls
# (whose tensors would be handles, and a parameter of a handle a LazyTensor), and
# ``Parameter.__deepcopy__``. Such
# calls are listed here. While a session is active they are wrapped: everything the
# thread has pending runs first (flush reason "opaque:<name>"), handles among the
# arguments are replaced by their real tensors, and the call runs with capture
# suspended, so it sees and makes plain tensors, exactly as in eager. What exports
# memory is remembered (Note [Exported memory], exported.py). The wrappers are
# installed once, when the first session is made, and only act in threads where the
# runtime is capturing. Methods of C++ types cannot be wrapped (``Generator.set_state``
# called directly: README, Limitations); their Python entry points are.
#
# Entries: (module, owner, attribute, what): owner "" for a module-level function;
# what is "call" (flush, real arguments, suspended), "export" (the same, then the
# first argument's memory is exported for good) or "handoff" (flush only: the
# program hands objects to another thread, Note [Threads see what was synced]).
OPAQUE_CALLS: tuple[tuple[str, str, str, str], ...] = (
    ("torch.nn.parallel", "DistributedDataParallel", "__init__", "call"),
    ("torch", "", "set_rng_state", "call"),
    ("torch.random", "", "set_rng_state", "call"),
    ("torch", "", "to_dlpack", "export"),
    ("torch.utils.dlpack", "", "to_dlpack", "export"),
    ("torch.storage", "UntypedStorage", "_share_fd_cpu_", "export"),
    ("torch.storage", "UntypedStorage", "_share_filename_cpu_", "export"),
    ("torch", "", "save", "call"),
    ("torch.serialization", "", "save", "call"),
    ("torch", "", "load", "call"),
    ("torch.serialization", "", "load", "call"),
    ("torch.nn.parameter", "Parameter", "__deepcopy__", "call"),
    *(("torch._utils", "", name, "call") for name in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_device_tensor_from_cpu_tensor",
        "_rebuild_device_tensor_from_numpy")),
    ("torch._tensor", "", "_rebuild_from_type_v2", "call"),
    ("queue", "Queue", "put", "handoff"),
    ("concurrent.futures.thread", "ThreadPoolExecutor", "submit", "handoff"),
)

# Note [Threads see what was synced]
# Modes are per thread, and so are windows: a write deferred in one thread is not
# seen by another until the writing thread flushes. The rule: what a thread wrote is
# visible to other threads and processes from its next sync on, and the runtime syncs
# at the hand-offs it can see: putting an object on a ``queue.Queue`` (an evaluator
# thread handed the model), submitting to a ``ThreadPoolExecutor``, ``os.fork``
# (multiprocessing's fork start method), pickling for another process, and every read,
# optimizer step end and block exit. Writes to
# shared memory (``share_memory_()``) are never deferred (Note [Exported memory]).
# Hand-offs it cannot see (a shared variable behind a lock, an Event) need
# ``adaptive_eager.sync()`` before them (README, Limitations).

def _flush_this_thread(reason: str) -> bool:
    """Flush every runtime mode of this thread; whether one was capturing."""
    from .mode import AdaptiveEagerMode  # noqa: PLC0415 - mode imports this module's users

    found = False
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, AdaptiveEagerMode):
            mode.flush(reason)
            found = True
    return found


def opaque(fn: Callable[..., Any], name: str, what: str = "call") -> Callable[..., Any]:
    """Wrap ``fn`` so that it runs after a flush, with capture suspended."""
    reason = f"{R.OPAQUE}:{name}"
    # torch's set_rng_state: this one wrapper is also the compile thread's guard
    # (hooks.py: Note [The compile thread's random stream]), so it is wrapped once.
    guarded = name == "set_rng_state"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if guarded and rng_setters_skipped():
            return None
        if _flush_this_thread(reason) and what != "handoff":
            args, kwargs = unwrap_all(args, kwargs, reason)
            with suspended():
                out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        if what == "export":  # in any thread, capturing or not: memory is shared by all
            first = args[0]
            with suspended():
                if isinstance(first, torch.Tensor):
                    export(first)
                else:
                    export_storage(first)
        return out

    return wrapper


def _before_fork() -> None:
    try:
        with compiles_held():  # Note [No compile starts at a fork or at exit] (runtime/holds.py)
            _flush_this_thread("opaque:fork")
    except Exception:  # noqa: BLE001 - never stop a fork; the child sees what was synced
        pass


def _hook_fork() -> bool | None:
    """Flush before a fork (Note [Threads see what was synced]); os has no undo."""
    if not hasattr(os, "register_at_fork"):
        return None
    os.register_at_fork(before=_before_fork)
    return True


def _row(entry: tuple[str, str, str, str]) -> Patch:
    module, owner, attr, what = entry
    name = owner or attr
    return Patch("opaque", f"{module}.{owner}" if owner else module, attr,
                 lambda fn: opaque(fn, name, what), own_only=bool(owner),
                 covers=("rng-guard",) if attr == "set_rng_state" else ())


# The opaque calls' rows of the hooks registry (Note [The hooks registry], hooks.py).
ROWS: tuple[Patch | Hook, ...] = (
    *(_row(entry) for entry in OPAQUE_CALLS),
    Hook("fork", "os.register_at_fork(before=)", lambda: _hook_fork()),
)


def install() -> None:
    """Wrap every call in :data:`OPAQUE_CALLS` and hook fork (idempotent)."""
    HOOKS.install(ROWS)


__all__ = ["OPAQUE_CALLS", "ROWS", "install", "opaque"]
