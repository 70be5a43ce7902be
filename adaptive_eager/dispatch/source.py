"""The user's source line: the first frame outside adaptive_eager and torch.

Recorded for every flush, so the report can say which line forced a sync.

Example::

    >>> user_source().endswith(">:1") or ":" in user_source()
    True
"""

from __future__ import annotations

import os
import sys

import torch

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP = (_PKG_DIR + os.sep, _TORCH_DIR + os.sep, "<frozen ", os.path.dirname(os.__file__) + os.sep + "contextlib.py")


# Modules of this package that are user programs (the demo trains a model like a user would).
_USER_CODE = (os.path.join(_PKG_DIR, "demo.py"),)


def _is_user(fname: str) -> bool:
    return not fname.startswith(_SKIP) or fname in _USER_CODE


def user_source(depth: int = 1) -> str:
    """``"file:line (function)"`` of the innermost frame that is the user's code."""
    f = sys._getframe(depth)
    while f is not None:
        if _is_user(f.f_code.co_filename):
            return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "<unknown>"


def called_by_user(depth: int = 1) -> bool:
    """Whether the frame ``depth`` levels up is the user's code (not torch's, not ours)."""
    return _is_user(sys._getframe(depth + 1).f_code.co_filename)


__all__ = ["user_source", "called_by_user"]
