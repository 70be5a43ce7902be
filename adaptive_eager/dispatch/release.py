"""Turning bound handles back into plain tensors, in place (Note [Releasing bound handles]).

:class:`BoundHandles` is the mode's list of the handles its flushes bound;
:func:`release` swaps one of them with its real tensor.

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

from ..runtime import Counters
from .lazy import LazyTensor, hold_memory

# Note [Releasing bound handles]
# State a program creates while ops are deferred (optimizer moments, momentum
# buffers, caches) is made of handles, and stays so after its window has run: every
# later op on it pays the handle's Python __torch_dispatch__ (~10 µs), which is what
# a pass-through phase exists to avoid (measured: a tiny-MLP SGD step at 2.5x eager
# once parked, from its momentum buffers alone). So when the mode parks or its
# context exits, each bound handle that nothing but the program references becomes
# the plain tensor it stands for, in place: torch.utils.swap_tensors swaps the
# Python objects' class, __dict__ and TensorImpl, keeping the program's object
# identity. Handles with autograd history (requires_grad, saved for backward, held
# by C++ such as ``.grad``) or any other reference (use counts above one, weakrefs)
# stay handles: they keep working, only at the handle's cost.


class BoundHandles:
    """Weak references to the handles a mode's flushes bound, until it releases them
    (Note [Releasing bound handles]). Guarded by the mode's lock."""

    def __init__(self, counters: Counters):
        self.counters = counters
        self._refs: list[weakref.ref] = []
        self._prune_at = 1024

    def remember(self, live: list) -> None:
        """Note the handles a flush of a whole window just bound."""
        refs = self._refs
        for h in live:
            refs.append(weakref.ref(h))  # those that stay handles get memory (lazy.py)
        if len(refs) > self._prune_at:
            self._refs = [r for r in refs if r() is not None]
            self._prune_at = max(1024, 2 * len(self._refs))

    def release(self) -> int:
        """Turn bound, unshared handles into plain tensors; returns how many were released.

        Nothing may be pending for them to be bound, so only the handles of flushed
        windows are considered.
        """
        refs, self._refs = self._refs, []
        released = 0
        while refs:
            h = refs.pop()()
            if h is None or type(h) is not LazyTensor or h._ae_real is None:
                continue
            if release(h):
                released += 1
            else:
                hold_memory(h)  # Note [Bound handles hold their memory] (lazy.py)
            del h
        self.counters.handles_released += released
        return released


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


__all__ = ["BoundHandles", "release"]
