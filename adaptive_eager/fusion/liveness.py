"""Liveness of a window's values: which values a run may drop after each node.

# Note [Replay frees at last use]
Eager frees an intermediate the moment the program's last reference to it goes, usually
right after the op that reads it last. A window replayed with every value kept in one env
until the window ends held a window's whole history: a pointwise loop over 4 MiB tensors
peaked at +435 MiB under capture with 100-op windows against eager's +43, and a GPT
training step at 2.3x eager's peak (``python -m benchmarks.memory``). So a run drops each
value right after its last use *in the order it runs the nodes* (a plan may run nodes out
of window order), unless the program can still see it (``Window.outputs``: its handle is
alive) — the rule ``torch.fx.Interpreter`` applies to its env. A value no node reads
after it is made is dropped after the node that made it. Dropping a reference never
changes a value: a view keeps its base's storage alive, and an in-place update of a
dropped value's storage through a live view still lands. What a failed run needs to
finish (Note [A failed flush loses no work], runtime/recovery.py) is never dropped:
every node not yet run reads only values whose last use is still ahead.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, ValueRef
    >>> aten = torch.ops.aten
    >>> nodes = (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),   # %1 = %0 * 2
    ...          OpNode(aten.add.Tensor, (ValueRef(1), 1.0), (), (2,)),   # %2 = %1 + 1
    ...          OpNode(aten.neg.default, (ValueRef(2),), (), (3,)))      # %3 = -%2
    >>> release_after(nodes, (0, 1, 2), keep=frozenset({3}))
    {0: (0,), 1: (1,), 2: (2,)}
    >>> peak_bytes(nodes, (0, 1, 2), frozenset({3}), lambda v: 4, fresh=lambda i, v: True)
    8
"""

from __future__ import annotations

from math import prod
from typing import AbstractSet, Callable, Iterable, Sequence

from .ir import OpNode, TensorSpec, Window


def last_uses(nodes: Sequence[OpNode], order: Iterable[int]) -> dict[int, int]:
    """Value id -> the node (index into ``nodes``) that uses it last when run in ``order``.

    A use is a read (an argument), an in-place update, or, for a value nothing reads
    after it, its making.
    """
    last: dict[int, int] = {}
    for i in order:
        node = nodes[i]
        for v in node.inputs():
            last[v] = i
        for v in node.mutates:
            last[v] = i
        for v in node.outputs:
            if v is not None and v not in last:
                last[v] = i
    return last


def release_after(nodes: Sequence[OpNode], order: Sequence[int],
                  keep: AbstractSet[int]) -> dict[int, tuple[int, ...]]:
    """Node index -> the value ids a run in ``order`` drops right after it (Note [Replay
    frees at last use]); ``keep``: ids the program can still see (never dropped)."""
    by_node: dict[int, list[int]] = {}
    for v, i in last_uses(nodes, order).items():
        if v not in keep:
            by_node.setdefault(i, []).append(v)
    return {i: tuple(vs) for i, vs in by_node.items()}


def peak_bytes(nodes: Sequence[OpNode], order: Sequence[int], keep: AbstractSet[int],
               nbytes: Callable[[int], int], fresh: Callable[[int, int], bool]) -> int:
    """The most bytes a run in ``order`` that frees at last use holds at once, counting
    the values it allocates (``fresh(node index, value id)``: the node's output is new
    memory, not a view or an in-place result) at ``nbytes(value id)`` each."""
    release = release_after(nodes, order, keep)
    held = peak = 0
    alive: set[int] = set()
    for i in order:
        for v in nodes[i].outputs:
            if v is not None and v not in alive and fresh(i, v):
                alive.add(v)
                held += nbytes(v)
        peak = max(peak, held)
        for v in release.get(i, ()):
            if v in alive:
                alive.discard(v)
                held -= nbytes(v)
    return peak


def spec_bytes(spec: TensorSpec) -> int:
    """The bytes of a dense tensor of ``spec``'s shape and dtype."""
    return prod(spec.shape) * spec.dtype.itemsize


def replay_peak(window: Window, order: Sequence[int]) -> int:
    """:func:`peak_bytes` of ``window`` run in ``order``, sized from its specs (a view or an
    in-place result allocates nothing)."""
    specs = window.specs
    nodes = window.nodes

    def nbytes(v: int) -> int:
        spec = specs.get(v)
        return 0 if spec is None else spec_bytes(spec)

    def fresh(i: int, v: int) -> bool:
        node = nodes[i]
        return not node.is_view and v not in node.mutates

    return peak_bytes(nodes, order, window.outputs, nbytes, fresh)


__all__ = ["last_uses", "release_after", "peak_bytes", "replay_peak", "spec_bytes"]
