"""The capture layer: the dispatch mode, LazyTensor handles, op tables, the window buffer."""

from .lazy import DeferredError, LazyTensor, suspended
from .meta import MetaMemo
from .mode import AdaptiveEagerMode
from .observe import ObserveMode
from .optable import Kind, OpTable, OpTraits

__all__ = [
    "AdaptiveEagerMode", "ObserveMode", "LazyTensor", "DeferredError", "MetaMemo",
    "OpTable", "OpTraits", "Kind", "suspended",
]
