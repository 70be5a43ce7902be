"""Slicing a window: the nodes an observed value needs, and whether running them early is safe.

Note [Partial flush]
Observing one value (``step.item()`` inside an optimizer loop, a loss printed every
step) needs only the nodes that value depends on. Running just those nodes and
keeping the rest of the window open keeps fusion windows long: AdamW on CPU calls
``step_t.item()`` once per parameter, which would otherwise cut the optimizer step
into one window per parameter.

Only small slices for 0-dim values are taken (the recorder's policy): every other
observation flushes the whole window. Windows then start at the same place in every
iteration of a training loop (its loss.item() or print resets them), so the cuts that
a full window forces fall at the same ops each iteration and compiled regions recur;
slicing the loss's ancestors out would shift every later cut.

A node is needed when it produces, or writes the storage of, a needed value; its
inputs then become needed too (walking the window backwards). Running the slice
early reorders it before the excluded nodes that precede it; that is safe unless an
excluded earlier node touches (reads or writes) storage that a slice node writes.
Storage is identified by alias root (views and aliasing real inputs share one).

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, ValueRef
    >>> add_ = torch.ops.aten.add_.Tensor
    >>> mul = torch.ops.aten.mul.Tensor
    >>> nodes = [OpNode(mul, (ValueRef(0), ValueRef(0)), (), (2,)),      # big work on %0
    ...          OpNode(add_, (ValueRef(1), 1), (), (1,), (1,))]         # step += 1
    >>> needed_nodes(nodes, {1}, {}.get)
    [1]
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .ir import OpNode


def _roots(vids: Iterable[int | None], root: Callable[[int], int]) -> set[int]:
    return {root(v) for v in vids if v is not None}


def needed_nodes(
    nodes: Sequence[OpNode], targets: Iterable[int], root_of: Callable[[int, int], int]
) -> list[int] | None:
    """Indices (ascending) of the nodes ``targets`` depend on, or None if running them
    ahead of the others would break program order. ``root_of(vid, default)`` gives a
    value's alias root (dict.get-like)."""
    root = lambda v: root_of(v, v)  # noqa: E731
    needed = _roots(targets, root)
    include: list[int] = []
    written: set[int] = set()
    for i in range(len(nodes) - 1, -1, -1):
        n = nodes[i]
        touched = _roots(n.outputs, root) | _roots(n.mutates, root)
        if touched & needed:
            include.append(i)
            needed |= touched
            needed |= _roots(n.inputs(), root)
            written |= _roots(n.mutates, root)
        elif written and (touched | _roots(n.inputs(), root)) & written:
            return None
    include.reverse()
    return include


__all__ = ["needed_nodes"]
