"""adaptive-eager: make eager PyTorch fast without giving up eager.

Ways in (pick one):

- a block or a function: ``with adaptive_eager(): ...`` / ``@adaptive_eager()``;
- the whole process from code: ``enable()`` ... ``disable()``;
- the whole process with no code change: ``ADAPTIVE_EAGER=1 python train.py``
  (through PyTorch's device-backend autoload, see ``adaptive_eager.autoload``);
- the command line: ``adaptive-eager run train.py``.

Then ``stats()`` (a frozen snapshot) and ``report()`` (a readable table with advice)
say what the runtime did and which lines of the program forced it to sync.

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager"):
    ...     x = torch.ones(3) * 2
    ...     print(x)
    tensor([2., 2., 2.])

NB: this module imports nothing heavy. PyTorch imports ``adaptive_eager.autoload``
on every ``import torch`` (it is a ``torch.backends`` entry point), so the public
names below are loaded on first use (PEP 562), not here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (submodule, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "adaptive_eager": ("session", "adaptive_eager"),
    "enable": ("process", "enable"),
    "disable": ("process", "disable"),
    "is_enabled": ("process", "is_enabled"),
    "sync": ("session", "sync"),
    "stats": ("session", "stats"),
    "reset_stats": ("session", "reset_stats"),
    "report": ("session", "report"),
    "Stats": ("statistics", "Stats"),
    "config": ("config", None),
    "ConfigError": ("config", "ConfigError"),
    "LazyTensor": ("dispatch", "LazyTensor"),
    "StrictModeError": ("reasons", "StrictModeError"),
}

__all__ = [
    "adaptive_eager", "enable", "disable", "is_enabled", "sync", "stats", "reset_stats",
    "report", "Stats", "config", "ConfigError", "LazyTensor", "StrictModeError", "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from . import config
    from .config import ConfigError
    from .dispatch import LazyTensor
    from .reasons import StrictModeError
    from .process import disable, enable, is_enabled
    from .session import adaptive_eager, report, reset_stats, stats, sync
    from .statistics import Stats


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _import_whole(f".{target[0]}")
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value


# Note [Lazy imports finish before a Ctrl-C]
# The public names import the runtime on first use (networkx until 2026-12-02, torch's
# decompositions: 0.5-2 s on a loaded machine). A SIGINT landing in that import left
# half-initialized modules in sys.modules, and every later import of the package failed ("Algorithm
# already exists in dispatch namespace" from networkx) though the program caught the
# KeyboardInterrupt, as a loop stopped by Ctrl-C does (tests/test_faults_flush.py's
# SIGINT trials, first trial, on a loaded machine). So in the main thread the import runs
# with SIGINT noted, not raised, and the program's handler runs once it is done.
def _import_whole(name: str) -> Any:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return importlib.import_module(name, __name__)
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        return importlib.import_module(name, __name__)
    if not callable(previous):  # SIG_IGN / SIG_DFL: nothing raises in Python
        return importlib.import_module(name, __name__)
    caught: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        return importlib.import_module(name, __name__)
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(*caught[0])


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _configure_logging() -> None:
    from ._logging import configure_from_env

    configure_from_env()


_configure_logging()
