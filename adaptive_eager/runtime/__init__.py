"""Executors (eager replay, compiled), backend registry, compiled-region cache, flush.

``runtime`` never imports ``dispatch``: the mode hands it a Window and binds the
tensors it returns.
"""

from .backends import BackendUnavailable, backend_support, get_backend, register_backend
from .cache import RegionCache, RegionEntry
from .compiled import CompiledExecutor
from .counters import Counters
from .executor import EagerExecutor, Executor, FlushResult, replay_guard, run_node
from .adapt import DeferPolicy, Verdict

__all__ = [
    "Counters", "EagerExecutor", "Executor", "replay_guard", "run_node", "CompiledExecutor",
    "RegionCache", "RegionEntry", "DeferPolicy", "Verdict", "FlushResult", "BackendUnavailable", "register_backend",
    "get_backend", "backend_support", "make_executor",
]


def make_executor(options, counters):  # noqa: ANN001, ANN201 - Options, Counters -> Executor
    """The executor for ``options``: a :class:`CompiledExecutor` over ``options.backend``.

    Every backend, "eager" included, goes through partitioning and regions ("eager"
    runs each region's GraphModule as is: the pipeline without a compiler).
    """
    return CompiledExecutor(options, counters)
