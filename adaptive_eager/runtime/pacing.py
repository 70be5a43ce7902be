"""Work on a helper thread, paced so the program's thread keeps the core and the GIL.

Example::

    >>> from adaptive_eager.runtime.pacing import paced
    >>> with paced(ready=lambda: False, share=0.5) as pacer:
    ...     import xml.dom.minidom  # new modules: this thread sleeps as long as it imports
    >>> pacer.paused_s >= 0
    True
    >>> with paced(ready=lambda: False, share=0):
    ...     pass
    Traceback (most recent call last):
    ...
    ValueError: share must be in (0, 1], got 0
"""
from __future__ import annotations

import _imp
import contextlib
import sys
import threading
import time
from typing import Any, Callable, Iterator

from ..hooks import HOOKS, Hook, Patch

# Note [The loader's warm-up is paced while the worker compiles]
# Note [The loader is warmed while the worker compiles] (compile_worker.py) moved the
# first artifact load's imports (~1,500 modules: Inductor's compile_fx, select_algorithm,
# lowering, AOTAutograd's cache; 1-2.3 s of CPU) and ``torch_key()`` (a hash of torch's
# sources, ~0.16 s) off the region's arrival, onto the service thread while it waits for
# the worker. But there they ran at full speed in the program's first seconds: on the
# 2-core machine the worker compiles on one core, and the warm-up's Python and the
# program's thread share the other (and the GIL, held up to the 5 ms switch interval each
# time the program's op returns). The demo's fresh run showed it as its slow steps: 13-22
# at 203-370 ms wall against a 160 ms eager step, with the service thread in
# ``warm_loader`` throughout (py-spy, 100 Hz). Nothing needs the loader before the worker
# replies (a fresh compile: 8-9 s), so the warm-up takes at most ``share`` of the time:
# after each ``SLICE_S`` of its thread's CPU it sleeps (GIL released) long enough that its
# CPU is ``share`` of the wall time, checked at each module it imports (a
# ``sys.meta_path`` finder that finds nothing) and each package ``torch_key`` hashes
# (Inductor's ``build_code_hash``). A pause is at most ``MAX_PAUSE_S`` (the rest is owed
# and paid at the next check): the thread sleeps inside an import, holding that module's
# import lock, which the program's thread may want (but not the global one: Note [A
# paced import pauses without the import lock]). Once ``ready()`` says the reply is
# there, pacing stops and the rest runs at full speed: the region is waiting for it then.
# Both checks are rows of the hooks registry (group ``paced``), installed for the
# warm-up and undone after it; they act only on the thread being paced.
SLICE_S = 0.005
MAX_PAUSE_S = 0.05
SHARE = 0.2

_LOCAL = threading.local()  # .pacer: the calling thread's Pacer, while it is paced


class Pacer:
    """One paced thread's account: CPU spent since its last pause, pauses owed and taken."""

    def __init__(self, ready: Callable[[], bool], share: float,
                 hold: Callable[[bool], None] | None = None):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.ready = ready
        self.pause_per_s = (1.0 - share) / share
        self.mark = time.thread_time()
        self.done = share == 1
        self.paused_s = 0.0
        self._owed = 0.0
        # Note [The worker waits while the loader runs]: hold(True) while this thread
        # runs, hold(False) while it sleeps and once it is done
        self._hold = hold
        self.holding = False
        self._held(not self.done)

    def _held(self, on: bool) -> None:
        if self._hold is not None and on != self.holding:
            self.holding = on
            self._hold(on)

    def release(self) -> None:
        """No hold from now on (the block ends)."""
        self._held(False)

    def due(self) -> bool:
        """Whether :meth:`check` would ask ``ready()`` or pause now."""
        return not self.done and (self._owed > 0 or time.thread_time() - self.mark >= SLICE_S)

    def check(self) -> None:
        """Sleep what this thread owes, unless ``ready()``: then never again."""
        if not self.due():
            return
        now = time.thread_time()
        spent = now - self.mark
        if self.ready():
            self.done = True
            self._held(False)
            return
        self._owed += spent * self.pause_per_s
        self.mark = now
        pause = min(self._owed, MAX_PAUSE_S)
        self._held(False)
        time.sleep(pause)
        self._held(True)
        self._owed -= pause
        self.paused_s += pause


def _check() -> None:
    pacer = getattr(_LOCAL, "pacer", None)
    if pacer is not None:
        pacer.check()


# Note [A paced import pauses without the import lock]
# importlib asks each ``sys.meta_path`` finder for a spec holding the global import lock
# (``_find_spec``'s ``_ImportLockContext``), so a paced thread that slept inside our finder
# held it for its pause, up to MAX_PAUSE_S: every import of a new module in any other
# thread waited. The program's thread imports the runtime's own modules lazily in its
# first captured steps (the fusion pipeline, the step compiler), exactly while the loader
# is paced: a 300-step AdamW run of a tiny model spent 162 ms of its ~460 waiting in
# ``_imp.acquire_lock`` (cProfile); a thread importing 60 new modules beside a paced one
# waited 1,083 ms (``tests/test_first_compile.py``'s test, made from this). So the finder
# gives the lock back while it sleeps and takes it again before it returns (it finds
# nothing, so there is nothing the lock guards in between). Where this thread holds it
# more than once (an import inside a finder of its own), one release does not free it:
# it then does not pause there; what it owes is paid at its next check.
class _Finder:
    """A ``sys.meta_path`` finder that finds nothing: it lets a paced thread pause."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        pacer = getattr(_LOCAL, "pacer", None)
        if pacer is None or not pacer.due():
            return None
        try:
            _imp.release_lock()
        except RuntimeError:  # not ours (a caller outside importlib): pause as it is
            pacer.check()
            return None
        try:
            if not _imp.lock_held():  # held still: by this thread twice, or raced by another
                pacer.check()
        finally:
            _imp.acquire_lock()
        return None


def _add_finder() -> _Finder:
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return finder


def _remove_finder(finder: _Finder) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def _paced_hash(original: Callable[..., Any]) -> Callable[..., Any]:
    def build_code_hash(*args: Any, **kwargs: Any) -> Any:
        _check()
        return original(*args, **kwargs)
    return build_code_hash


IMPORTS_ROW = Hook("paced", "sys.meta_path finder pausing a paced thread", _add_finder, _remove_finder)
# installed once codecache is imported (by the paced imports: locating it must not import it)
HASH_ROW = Patch("paced", "torch._inductor.codecache", "build_code_hash", _paced_hash)


@contextlib.contextmanager
def paced(ready: Callable[[], bool], share: float = SHARE,
          hold: Callable[[bool], None] | None = None) -> Iterator[Pacer]:
    """Pace this thread's imports (and, once ``torch._inductor.codecache`` is imported,
    ``torch_key``'s hashing) inside the block to ``share`` of the wall time until
    ``ready()`` (Note [The loader's warm-up is paced while the worker compiles]); other
    threads are not touched. ``hold(on)``: called with True when this thread starts to
    run and False when it pauses, is done or leaves the block (Note [The worker waits
    while the loader runs], compile_worker.py)."""
    pacer = Pacer(ready, share, hold)
    HOOKS.install([IMPORTS_ROW])
    _LOCAL.pacer = pacer
    try:
        yield pacer
    finally:
        _LOCAL.pacer = None
        pacer.release()
        HOOKS.uninstall("paced")


def pace_hashing() -> None:
    """Inside :func:`paced`, once Inductor's codecache is imported: pace its source
    hashing too."""
    if "torch._inductor.codecache" in sys.modules:
        HOOKS.install([HASH_ROW])


__all__ = ["HASH_ROW", "IMPORTS_ROW", "MAX_PAUSE_S", "Pacer", "SHARE", "SLICE_S", "pace_hashing", "paced"]
