"""Turning bound handles back into plain tensors, in place (Note [Releasing bound handles]
in mode.py).

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager"):
    ...     y = torch.ones(2) * 3
    >>> type(y).__name__                # released at exit: nothing else holds it
    'Tensor'
"""

from __future__ import annotations

import sys
import weakref

import torch

from .lazy import LazyTensor


def release(h: LazyTensor) -> bool:
    """Swap bound handle ``h`` with its real tensor if nothing else holds either."""
    real = h._ae_real
    if h.requires_grad or real.requires_grad or type(real) is not torch.Tensor:
        return False
    # The program's references to h all see the swap (that is the point); a holder of
    # `real` (besides h.__dict__, the local name and getrefcount's argument) would be
    # left with the empty wrapper, so then nothing is swapped.
    if sys.getrefcount(real) > 3:
        return False
    if h._use_count() != 1 or real._use_count() != 1 or weakref.getweakrefs(h) \
            or weakref.getweakrefs(real):
        return False
    try:
        torch.utils.swap_tensors(h, real)
    except RuntimeError:
        return False
    # `real` is now the (empty) wrapper and carries h's attributes: bind it to h, the
    # plain tensor, so that any stray reference still reads the value.
    real._ae_real = h
    return True


__all__ = ["release"]
