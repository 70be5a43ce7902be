"""From a Window to a dependency DAG: data edges plus storage-ordering edges.

Node ``i`` of the DAG is ``window.nodes[i]``. An edge ``i -> j`` means ``j`` must run
after ``i``: either ``j`` reads a value ``i`` produced, or both touch the same storage
and at least one of them writes it (read-after-write, write-after-read,
write-after-write). Any schedule that is a topological order of this DAG computes what
the program-ordered window computes.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> aten = torch.ops.aten
    >>> p = torch.zeros(3); s = TensorSpec.of(p)
    >>> w = Window({0: p}, (
    ...     OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),    # reads p
    ...     OpNode(aten.add_.Tensor, (ValueRef(0), 1.0), (), (0,), (0,)),  # writes p
    ... ), {0: s, 1: s}, frozenset({1}))
    >>> sorted(build_dag(w, storage_groups(w)).edges)
    [(0, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from .ir import Window


def storage_groups(window: Window) -> dict[int, int]:
    """Map each real input id to a canonical id shared by inputs with the same storage.

    Real inputs can alias each other (``p`` and ``p.data``, two views of one buffer):
    the recorder gives them distinct ids with distinct alias roots, so the storage they
    share is found here, from ``untyped_storage().data_ptr()``.
    """
    first: dict[tuple[int, torch.device], int] = {}
    out: dict[int, int] = {}
    with torch._C.DisableTorchFunction():
        for vid, t in window.inputs.items():
            try:
                key = (t.untyped_storage().data_ptr(), t.device)
            except (RuntimeError, NotImplementedError):  # no storage (e.g. a wrapper)
                key = (-1 - vid, t.device)
            if key[0] == 0:  # empty tensors own no memory: never alias anything
                key = (-1 - vid, t.device)
            out[vid] = first.setdefault(key, vid)
    return out


@dataclass(frozen=True)
class StorageRoots:
    """``root(vid)``: the canonical id of the storage a value lives in."""

    alias_root: Mapping[int, int]
    groups: Mapping[int, int]

    def root(self, vid: int) -> int:
        r = self.alias_root.get(vid, vid)
        return self.groups.get(r, r)


# Note [A DAG of lists, not networkx]
# The partitioner needs a node's predecessors and the edge list, nothing else. networkx did
# that until 2026-12-02, and importing it cost ~180-280 ms CPU in every process run with
# ADAPTIVE_EAGER=1 (it imports every algorithm it has), the largest part of the fixed cost
# (issue 22, item 5). Imported lazily instead, at the first partition, it landed inside a
# measured window and made it look too dear to compile. Two tuples of tuples need no import.
@dataclass(frozen=True)
class Dag:
    """A DAG over nodes ``0..n-1`` whose ids are a topological order (program order).

    ``preds[i]``: the nodes ``i`` depends on, ascending.

    Example::

        >>> d = Dag(((), (0,), (0, 1)))
        >>> sorted(d.edges), d.has_edge(1, 2), list(d.predecessors(2))
        ([(0, 1), (0, 2), (1, 2)], True, [0, 1])
    """

    preds: tuple[tuple[int, ...], ...]

    def number_of_nodes(self) -> int:
        return len(self.preds)

    def predecessors(self, i: int) -> tuple[int, ...]:
        return self.preds[i]

    def has_edge(self, a: int, b: int) -> bool:
        return a in self.preds[b]

    @property
    def edges(self) -> Iterator[tuple[int, int]]:
        return ((p, i) for i, ps in enumerate(self.preds) for p in ps)


def build_dag(window: Window, groups: Mapping[int, int]) -> Dag:
    """The dependency DAG of ``window`` (see module docstring).

    ``groups`` comes from :func:`storage_groups` (or an equivalent, structural map).
    """
    roots = StorageRoots(window.alias_root, groups)
    preds: list[tuple[int, ...]] = []
    creator: dict[int, int] = {}
    last_write: dict[int, int] = {}
    reads_since: dict[int, list[int]] = {}
    for i, node in enumerate(window.nodes):
        deps: set[int] = set()
        read_roots = set()
        for vid in node.inputs():
            c = creator.get(vid)
            if c is not None:
                deps.add(c)
            read_roots.add(roots.root(vid))
        write_roots = {roots.root(v) for v in node.mutates}
        for r in read_roots:
            w = last_write.get(r)
            if w is not None:
                deps.add(w)
        for r in write_roots:
            w = last_write.get(r)
            if w is not None:
                deps.add(w)
            deps.update(reads_since.get(r, ()))
        deps.discard(i)
        preds.append(tuple(sorted(deps)))
        for r in read_roots - write_roots:
            reads_since.setdefault(r, []).append(i)
        for r in write_roots:
            last_write[r] = i
            reads_since[r] = []
        mutated = set(node.mutates)
        for vid in node.outputs:
            if vid is not None and vid not in mutated:
                creator[vid] = i
                if window.alias_root.get(vid, vid) == vid:
                    # A fresh (non-view) result is a new storage, written by this node.
                    last_write[vid] = i
    return Dag(tuple(preds))


def ancestor_masks(g: Dag) -> list[int]:
    """``masks[i]``: bitset of every node from which ``i`` is reachable (program order)."""
    masks = [0] * g.number_of_nodes()
    for i in range(len(masks)):  # node ids are a topological order (program order)
        m = 0
        for p in g.predecessors(i):
            m |= masks[p] | (1 << p)
        masks[i] = m
    return masks


__all__ = ["storage_groups", "StorageRoots", "Dag", "build_dag", "ancestor_masks"]
