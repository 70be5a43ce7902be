"""The capture layer: the dispatch mode, LazyTensor handles, op tables, the window buffer."""

from .lazy import DeferredError, LazyTensor, suspended
from .meta import MetaMemo
from .mode import AdaptiveEagerMode
from .observe import Observer
from .optable import Kind, OpTable, OpTraits

__all__ = [
    "AdaptiveEagerMode", "Observer", "LazyTensor", "DeferredError", "MetaMemo",
    "OpTable", "OpTraits", "Kind", "suspended",
]
