"""An executor that is built at its first window, so that enabling costs no runtime import.

# Note [The compiled executor is built at the first window]
``ADAPTIVE_EAGER=1`` enables the runtime in every process, and most short scripts never
capture a window (the policy parks them). Building the :class:`CompiledExecutor` at
``enable()`` imported the whole compile pipeline (``runtime.compiled``: the partitioner,
the fx lowering, the compile service, the region store; ~70 ms CPU of the ~115 ms that
importing the package cost, measured on this 2-core machine) for nothing. So the session
holds a :class:`DeferredExecutor`: it builds the real one on the first ``run`` (or the
first attribute asked of it), and the import happens where capture is decided
(``CompiledExecutor`` is imported with Dynamo, ``dispatch/parking.import_dynamo``), not
inside a measured window. ``close()`` of one never built builds nothing.

Example::

    >>> from adaptive_eager import config
    >>> from adaptive_eager.runtime.counters import Counters
    >>> ex = DeferredExecutor(config.resolve(backend="eager"), Counters())
    >>> ex.built
    False
    >>> type(ex.cache).__name__, ex.built  # any attribute of the real executor builds it
    ('RegionCache', True)
    >>> ex.close()
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .counters import Counters

if TYPE_CHECKING:
    from .executor import FlushResult, Known
    from ..fusion.ir import Window


class DeferredExecutor:
    """Stands for a ``CompiledExecutor(options, counters)`` until it is first used."""

    def __init__(self, options: Any, counters: Counters):
        self._options = options
        self._counters = counters
        self._real: Any = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the real executor exists yet."""
        return self._real is not None

    def real(self) -> Any:
        """The ``CompiledExecutor``, built now if it is not yet."""
        real = self._real
        if real is None:
            with self._lock:
                if self._real is None:
                    from .compiled import CompiledExecutor  # noqa: PLC0415 - the point of this class

                    self._real = CompiledExecutor(self._options, self._counters)
                real = self._real
        return real

    def run(self, window: Window, known: Known | None = None) -> FlushResult:
        return self.real().run(window, known)

    def close(self) -> None:
        if self._real is not None:
            self._real.close()

    def __getattr__(self, name: str) -> Any:  # only for names not defined above
        if name.startswith("__") or name in ("_options", "_counters", "_real", "_lock"):
            raise AttributeError(name)
        return getattr(self.real(), name)


def import_compiled() -> None:
    """Import the compile pipeline now, where capture is decided (see the Note)."""
    from . import compiled  # noqa: F401, PLC0415


__all__ = ["DeferredExecutor", "import_compiled"]
