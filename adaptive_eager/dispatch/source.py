"""The user's source line: which line of the program made the runtime stop and sync.

Recorded for every flush (and fallback), so the report can say which line forced a
sync, and used to give warnings back the program's line.

Example::

    >>> user_source().endswith(")")
    True
    >>> classify(__file__), classify("<stdin>")
    ('internal', 'program')
"""

from __future__ import annotations

import contextlib
import functools
import os
import site
import sys
import sysconfig
import warnings
from typing import Iterator

import torch

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_INTERNAL = (_PKG_DIR + os.sep, _TORCH_DIR + os.sep, "<frozen ")

# Modules of this package that are user programs (the demo and the benchmark workloads
# run models like a user would).
_USER_CODE = (os.path.join(_PKG_DIR, "demo.py"), os.path.join(_PKG_DIR, "benchmarks", "workloads") + os.sep)


def _library_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(third-party dirs, stdlib dirs). Site-packages may sit inside the stdlib dir (a
    venv's platstdlib holds its site-packages), so third-party is tested first."""
    third: set[str] = set()
    for getter in (site.getsitepackages, lambda: [site.getusersitepackages()]):
        try:
            third.update(getter())
        except Exception:  # noqa: BLE001 - site may be trimmed (embedded interpreters)
            pass
    paths = sysconfig.get_paths()
    third.update(p for p in (paths.get("purelib"), paths.get("platlib")) if p)
    std = {p for p in (paths.get("stdlib"), paths.get("platstdlib"), os.path.dirname(os.__file__)) if p}
    norm = lambda ds: tuple(sorted({os.path.abspath(d) + os.sep for d in ds}))  # noqa: E731
    return norm(third), norm(std)


_THIRD_PARTY, _STDLIB = _library_dirs()
_THIRD_PARTY_MARKS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


# Note [Whose line is it]
# A flush is blamed on the innermost frame of the program's own code: not this
# package, not torch, not the standard library, not an installed library. A training
# loop that reads its batches through numpy.memmap syncs inside numpy's __getitem__
# (it calls the index tensor's __index__), and a DataLoader loop inside
# multiprocessing/queues.py; both are reported at the program's line that made the
# call. A program that is itself installed (``python -m pkg`` from site-packages) has
# no such frame: its innermost library frame outside torch and the stdlib is used.
# Classification is by file name, memoized (a registry that only grows, one entry per
# source file seen at a flush).
@functools.lru_cache(maxsize=4096)
def classify(fname: str) -> str:
    """``"internal"`` (torch, adaptive_eager), ``"stdlib"``, ``"library"`` (installed
    third-party code) or ``"program"`` (everything else: the user's own code)."""
    if fname.startswith(_USER_CODE):
        return "program"
    if fname.startswith(_INTERNAL):
        return "internal"
    if fname.startswith("<"):  # <stdin>, <string>, notebook cells: typed by the user
        return "program"
    if fname.startswith(_THIRD_PARTY) or any(m in fname for m in _THIRD_PARTY_MARKS):
        return "library"
    if fname.startswith(_STDLIB):
        return "stdlib"
    return "program"


def _user_frame(depth: int):
    f = sys._getframe(depth + 1)
    fallback = None
    while f is not None:
        kind = classify(f.f_code.co_filename)
        if kind == "program":
            return f
        if kind == "library" and fallback is None:
            fallback = f
        f = f.f_back
    return fallback


def user_source(depth: int = 1) -> str:
    """``"file:line (function)"`` of the program's innermost frame (Note [Whose line is it])."""
    f = _user_frame(depth)
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


def called_by_user(depth: int = 1) -> bool:
    """Whether the code ``depth`` levels up is the program's (or a library's it called),
    not torch's or ours. Standard-library frames in between are looked through: a read
    in multiprocessing called by torch's DataLoader is torch's."""
    f = sys._getframe(depth + 1)
    while f is not None:
        kind = classify(f.f_code.co_filename)
        if kind != "stdlib":
            return kind != "internal"
        f = f.f_back
    return False


# Note [Warnings keep the program's line]
# A warning names the line that caused it through its stack level, counted from the
# function that warns. Inside the runtime, a read of a tensor reaches torch through
# this package's frames (a read wrapper of observe.py, a handle's method), so torch's
# `.storage()` deprecation (stacklevel: its caller) named dispatch/observe.py. Python
# 3.11 has no way to skip frames from the outside (skip_file_prefixes, 3.12, is for the
# caller of warn), so such reads run under `warnings_at_user_line()`: warnings raised
# inside are caught, those located in this package are issued again at the program's
# line, through the program's filters and once-registry (so "error" still raises and
# "default" still shows once per program line), and the others are shown unchanged.
# Only reads run under it (a few µs, at a flush anyway), not every torch call.
@contextlib.contextmanager
def warnings_at_user_line() -> Iterator[None]:
    """Re-issue warnings located in adaptive_eager at the program's line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", module=r"adaptive_eager\.")
        yield
    if caught:
        _reissue(caught)


def _reissue(caught: list) -> None:
    frame = None
    for w in caught:
        if not w.filename.startswith(_PKG_DIR + os.sep):
            warnings._showwarnmsg(w)  # type: ignore[attr-defined]  # as it would have shown
            continue
        if frame is None:
            frame = _user_frame(0) or sys._getframe(1)
        g = frame.f_globals
        warnings.warn_explicit(w.message, w.category, frame.f_code.co_filename, frame.f_lineno,
                               module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}),
                               module_globals=g, source=w.source)


__all__ = ["user_source", "called_by_user", "classify", "warnings_at_user_line"]
