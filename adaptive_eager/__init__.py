"""adaptive-eager: make eager PyTorch fast without giving up eager.

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager"):
    ...     x = torch.ones(3) * 2
    ...     print(x)
    tensor([2., 2., 2.])
"""

from . import config
from .config import ConfigError
from .dispatch import LazyTensor
from .session import adaptive_eager, sync

__version__ = "0.1.0"

__all__ = ["adaptive_eager", "sync", "config", "ConfigError", "LazyTensor", "__version__"]
