"""Executors (eager replay, compiled), backend registry, compiled-region cache, flush.

``runtime`` never imports ``dispatch``: the mode hands it a Window and binds the
tensors it returns.

NB: the names below are loaded on first use (PEP 562), so that ``from ..runtime.counters
import Counters`` does not import the compile pipeline (Note [The compiled executor is
built at the first window], runtime/deferred.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> submodule of this package that defines it
_LAZY: dict[str, str] = {
    "BackendUnavailable": "backends", "backend_support": "backends", "get_backend": "backends",
    "register_backend": "backends",
    "RegionCache": "cache", "RegionEntry": "cache",
    "CompiledExecutor": "compiled",
    "Counters": "counters",
    "EagerExecutor": "executor", "Executor": "executor", "FlushResult": "executor",
    "replay_guard": "executor", "run_node": "executor",
    "DeferPolicy": "adapt", "Verdict": "adapt",
}

__all__ = [
    "Counters", "EagerExecutor", "Executor", "replay_guard", "run_node", "CompiledExecutor",
    "RegionCache", "RegionEntry", "DeferPolicy", "Verdict", "FlushResult", "BackendUnavailable", "register_backend",
    "get_backend", "backend_support", "make_executor",
]

if TYPE_CHECKING:  # pragma: no cover
    from .adapt import DeferPolicy, Verdict
    from .backends import BackendUnavailable, backend_support, get_backend, register_backend
    from .cache import RegionCache, RegionEntry
    from .compiled import CompiledExecutor
    from .counters import Counters
    from .executor import EagerExecutor, Executor, FlushResult, replay_guard, run_node


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def make_executor(options, counters):  # noqa: ANN001, ANN201 - Options, Counters -> Executor
    """The executor for ``options``: a :class:`CompiledExecutor` over ``options.backend``,
    built at its first window (:class:`~adaptive_eager.runtime.deferred.DeferredExecutor`).

    Every backend, "eager" included, goes through partitioning and regions ("eager"
    runs each region's GraphModule as is: the pipeline without a compiler).
    """
    from .deferred import DeferredExecutor  # noqa: PLC0415

    return DeferredExecutor(options, counters)
