"""Executors (eager replay, compiled), backend registry, compiled-region cache, flush.

``runtime`` never imports ``dispatch``: the mode hands it a Window and binds the
tensors it returns.
"""

from .counters import Counters
from .executor import EagerExecutor, Executor, replay_guard, run_node

__all__ = ["Counters", "EagerExecutor", "Executor", "replay_guard", "run_node"]


def make_executor(options, counters):  # noqa: ANN001, ANN201 - see registry below
    """The executor for ``options``: eager replay for backend "eager"; compiled otherwise."""
    return EagerExecutor()


__all__.append("make_executor")
