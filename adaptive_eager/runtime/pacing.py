"""Imports on a helper thread, paced so the program's thread keeps the core and the GIL.

Example::

    >>> import threading
    >>> from adaptive_eager.runtime.pacing import paced_imports
    >>> with paced_imports(ready=lambda: False, share=0.5) as pacer:
    ...     import xml.dom.minidom  # new modules: this thread sleeps as long as it imports
    >>> pacer.paused_s >= 0
    True
    >>> with paced_imports(ready=lambda: False, share=0):
    ...     pass
    Traceback (most recent call last):
    ...
    ValueError: share must be in (0, 1], got 0
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

# Note [The loader's warm-up is paced while the worker compiles]
# Note [The loader is warmed while the worker compiles] (compile_worker.py) moved the
# first artifact load's imports (~1,500 modules: Inductor's compile_fx, select_algorithm,
# lowering, AOTAutograd's cache; 1-2.3 s of CPU) off the region's arrival, onto the
# service thread while it waits for the worker. But there they ran at full speed in the
# program's first seconds: on the 2-core machine the worker compiles on one core, and
# the warm-up's Python and the program's thread share the other (and the GIL, held up
# to the 5 ms switch interval each time the program's op returns). The demo's fresh run
# showed it as its slow steps: 13-22 at 203-370 ms wall against a 160 ms eager step,
# with the service thread in ``warm_loader`` throughout (py-spy, 100 Hz). Nothing needs
# the loader before the worker replies (a fresh compile: 8-9 s), so the warm-up takes at
# most ``share`` of the time: after each ``SLICE_S`` of its thread's CPU it sleeps long
# enough (GIL released) that its CPU is ``share`` of the wall time since it began its
# slice, checked at each module it imports. A pause is at most ``MAX_PAUSE_S`` (the
# rest is owed and paid at the next modules): the thread sleeps inside an import, holding
# that module's import lock, which the program's thread may want. Once ``ready()`` says
# the reply is there, pacing stops and the rest runs at full speed: the region is waiting
# for it then.
SLICE_S = 0.005
MAX_PAUSE_S = 0.05
SHARE = 0.2


class _Pacer:
    """A ``sys.meta_path`` finder that finds nothing: it pauses the pacing thread."""

    def __init__(self, ready: Callable[[], bool], share: float):
        self.ready = ready
        self.pause_per_s = (1.0 - share) / share
        self.thread = threading.get_ident()
        self.mark = time.thread_time()
        self.done = False
        self.paused_s = 0.0
        self._owed = 0.0

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if self.done or threading.get_ident() != self.thread:
            return None
        now = time.thread_time()
        spent = now - self.mark
        if spent < SLICE_S and self._owed <= 0:
            return None
        if self.ready():
            self.done = True
            return None
        self._owed += spent * self.pause_per_s
        self.mark = now
        pause = min(self._owed, MAX_PAUSE_S)
        time.sleep(pause)
        self._owed -= pause
        self.paused_s += pause
        return None

    def find_module(self, name: str, path: object = None) -> None:  # pragma: no cover - old API
        return None


@contextlib.contextmanager
def paced_imports(ready: Callable[[], bool], share: float = SHARE) -> Iterator[_Pacer]:
    """Pace the imports this thread makes inside the block to ``share`` of the wall time
    until ``ready()`` (Note [The loader's warm-up is paced while the worker compiles]);
    other threads' imports are not touched."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    pacer = _Pacer(ready, share)
    if share == 1:
        pacer.done = True
    sys.meta_path.insert(0, pacer)
    try:
        yield pacer
    finally:
        try:
            sys.meta_path.remove(pacer)
        except ValueError:
            pass


__all__ = ["MAX_PAUSE_S", "SHARE", "SLICE_S", "paced_imports"]
