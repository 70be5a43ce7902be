"""The partitioner: a window's DAG cut into convex regions, fused or eager, in a valid order.

Input: a Window, its storage groups, a support policy and a cost model (the partitioner
never names a backend). Output: a :class:`Partition`, a sequence of :class:`Region` steps;
running them in order computes what the window computes.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> from adaptive_eager.fusion.policy import OpSupport, DefaultCost
    >>> aten = torch.ops.aten
    >>> x = torch.ones(1 << 16); s = TensorSpec.of(x)
    >>> w = Window({0: x}, (
    ...     OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),
    ...     OpNode(aten.nonzero.default, (ValueRef(1),), (), (2,)),
    ...     OpNode(aten.add.Tensor, (ValueRef(1), 1.0), (), (3,)),
    ...     OpNode(aten.relu.default, (ValueRef(3),), (), (4,)),
    ... ), {0: s, 1: s, 2: s, 3: s, 4: s}, frozenset({2, 4}))
    >>> p = partition(w, {0: 0}, OpSupport(), DefaultCost())
    >>> [(r.nodes, r.fused) for r in p.steps]
    [((0,), False), ((1,), False), ((2, 3), True)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping

from .graph import Dag, StorageRoots, ancestor_masks, build_dag
from .aliasing import rebase
from .indices import IndexUse, entry_value, index_uses
from .ir import OpNode, Window
from .offsets import OFFSET_VIEWS, is_offset_view
from .policy import CostModel, SupportPolicy, summarize
from .scalars import runs_eagerly
from .signature import region_key
from ..reasons import R


@dataclass(frozen=True)
class Region:
    """A convex group of window nodes run as one step.

    ``inputs``: ids read (or written in place) whose value comes from outside the region,
    in first-use order. ``outputs``: ids made here that the program or a later step still
    needs (dead values are never outputs). ``mutated``: inputs updated in place.
    ``fused`` regions go to the compile pipeline; others replay op by op, ``reason`` says
    why. ``key`` is the region signature (fused regions only). ``index_checks``: (input,
    lo, hi, allowed) for each input whose elements index something in the region; every
    element must lie in ``[lo, hi)`` or equal ``allowed`` before the region is called
    compiled (Note [Compiled code never sees an index eager would reject]). ``derived``:
    view ops a fused region runs first, on its inputs, to rebuild values it reads that
    share storage with an input it writes (Note [Aliased inputs are rebuilt as views]);
    their outputs are not inputs.
    """

    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    mutated: tuple[int, ...]
    fused: bool
    reason: str = ""
    key: Hashable = None
    index_checks: tuple[tuple[int, int, int, int | None], ...] = ()
    derived: tuple[OpNode, ...] = ()


@dataclass(frozen=True)
class Partition:
    """The steps of one window, in execution order."""

    steps: tuple[Region, ...]

    @property
    def fused(self) -> tuple[Region, ...]:
        return tuple(r for r in self.steps if r.fused)


# Note [One open region, eager ops hoisted]
# Nodes are visited in program order with one open region. A supported node joins it.
# An eager node U that depends on nothing in the open region (no data or storage edge
# from it, see graph.build_dag) is hoisted: it runs before the open region, which stays
# open, so supported nodes on either side of U still fuse. Otherwise the open region is
# closed (emitted) first. A region only ever runs after every eager node hoisted past it,
# none of which depend on it, so no path leaves a region and re-enters it (convexity),
# and every read/write of one storage keeps its program order.
def partition(window: Window, groups: Mapping[int, int], support: SupportPolicy,
              cost: CostModel) -> Partition:
    """Cut ``window`` into regions (see Note [One open region, eager ops hoisted])."""
    dag = build_dag(window, groups)
    anc = ancestor_masks(dag)
    roots = StorageRoots(window.alias_root, groups)
    readers = _readers(window)
    steps: list[Region] = []
    producer: dict[int, int] = {}  # value id -> index of the node that made it
    region = _Open(window, roots, producer)
    for i, node in enumerate(window.nodes):
        if node.target in OFFSET_VIEWS and is_offset_view(node, window.inputs):
            reason: str | None = R.OFFSET_VIEW  # Note [View offsets are inputs]
        elif runs_eagerly(node, window.specs):
            # Note [A fused optimizer's learning rate is lifted, and the op runs eagerly]
            reason = R.STEP_FLOAT
        else:
            reason = support.unsupported(node, window.specs)
        uses = index_uses(node, window.specs) if reason is None else ()
        if uses is None:
            reason = R.UNCHECKED_INDEX  # Note [Compiled code never sees an index eager would reject]
        if reason is None:
            checks = region.checks_for(uses)
            if checks is None:  # an index computed in the open region: close it first
                steps.append(region.close(readers, cost))
                region = _Open(window, roots, producer)
                checks = region.checks_for(uses)
            region.add(i, checks)
        else:
            if anc[i] & region.mask:
                steps.append(region.close(readers, cost))
                region = _Open(window, roots, producer)
            steps.append(_eager(window, [i], readers, roots, reason))
        for vid in node.outputs:
            if vid is not None and vid not in node.mutates:
                producer[vid] = i
    if region.nodes:
        steps.append(region.close(readers, cost))
    part = Partition(tuple(steps))
    check(window, part, dag)
    return part


class _Open:
    """The open region of ``partition``: its nodes, the storages they write, the index
    checks its compiled call needs (Note [Compiled code never sees an index eager would
    reject])."""

    def __init__(self, window: Window, roots: StorageRoots, producer: Mapping[int, int]):
        self.window, self.roots, self.producer = window, roots, producer
        self.nodes: list[int] = []
        self.mask = 0
        self.inside: set[int] = set()
        self.written: set[int] = set()
        self.checks: list[tuple[int, int, int, int | None]] = []

    def checks_for(self, uses: tuple[IndexUse, ...]) -> list | None:
        """(entry value, lo, hi, allowed) per use; None if one is computed in the region."""
        out = []
        for u in uses:
            at = entry_value(u.vid, self.window, self.producer, self.inside, self.written,
                             self.roots.root)
            if isinstance(at, tuple):  # made in the region, from known values
                if u.lo <= at[0] and at[1] < u.hi:
                    continue
                at = None
            if at is None:
                return None
            out.append((at, u.lo, u.hi, u.allowed))
        return out

    def add(self, i: int, checks: list) -> None:
        self.nodes.append(i)
        self.mask |= 1 << i
        self.inside.add(i)
        self.written.update(self.roots.root(v) for v in self.window.nodes[i].mutates)
        self.checks.extend(c for c in checks if c not in self.checks)

    def close(self, readers: Mapping[int, list[int]], cost: CostModel) -> Region:
        return _close(self.window, self.nodes, readers, self.roots, cost, self.producer,
                      tuple(self.checks))


def _readers(window: Window) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, node in enumerate(window.nodes):
        for vid in node.inputs():
            out.setdefault(vid, []).append(i)
    return out


def _io(window: Window, nodes: list[int], readers: Mapping[int, list[int]],
        roots: StorageRoots):
    inside = set(nodes)
    made: list[int] = []
    made_set: set[int] = set()
    inputs: list[int] = []
    seen: set[int] = set()
    written: set[int] = set()
    for i in nodes:
        node = window.nodes[i]
        for vid in node.inputs():
            if vid not in made_set and vid not in seen:
                seen.add(vid)
                inputs.append(vid)
        for vid in node.mutates:
            written.add(roots.root(vid))
        for vid in node.outputs:
            if vid is not None and vid not in made_set and vid not in seen:
                made_set.add(vid)
                made.append(vid)
    # Note [Writes through views made inside a region]
    # ``p.data.add_(g)`` writes p through a view (``detach``) made inside the region: the
    # node mutates the view's id, not p's. Every input whose storage the region writes,
    # directly or through such a view, is mutated: the first compiled call runs on
    # copies of exactly these (runtime/compiled.py), and aliasing checks see the write.
    mutated = [v for v in inputs if roots.root(v) in written]
    outputs = [v for v in made
               if v in window.outputs or any(j not in inside for j in readers.get(v, ()))]
    return tuple(inputs), tuple(outputs), tuple(mutated)


def _eager(window: Window, nodes: list[int], readers: Mapping[int, list[int]],
           roots: StorageRoots, reason: str) -> Region:
    inputs, outputs, mutated = _io(window, nodes, readers, roots)
    return Region(tuple(nodes), inputs, outputs, mutated, False, reason)


def _close(window: Window, nodes: list[int], readers: Mapping[int, list[int]],
           roots: StorageRoots, cost: CostModel, producer: Mapping[int, int],
           index_checks: tuple = ()) -> Region:
    inputs, outputs, mutated = _io(window, nodes, readers, roots)
    # Note [Aliased inputs are rebuilt as views] (fusion/aliasing.py)
    rebased = rebase(window, nodes, inputs, mutated, roots.root, producer, index_checks)
    if isinstance(rebased, str):
        return Region(tuple(nodes), inputs, outputs, mutated, False, rebased)
    derived, fused_inputs, fused_mutated = rebased
    summary = summarize([window.nodes[i] for i in nodes], list(fused_inputs), list(outputs),
                        list(fused_mutated), dict(window.specs))
    reason = cost.decide(summary)
    if reason is not None:  # replayed op by op: its inputs as the nodes read them
        return Region(tuple(nodes), inputs, outputs, mutated, False, reason)
    key = region_key(window, tuple(nodes), fused_inputs, outputs,
                     {v: roots.root(v) for v in fused_inputs}, derived)
    return Region(tuple(nodes), fused_inputs, outputs, fused_mutated, True, "", key, index_checks,
                  derived)


def check(window: Window, part: Partition, dag: Dag) -> None:
    """Invariants, like ``Graph.lint()``: every node once; steps respect every DAG edge."""
    position: dict[int, int] = {}
    for s, region in enumerate(part.steps):
        for i in region.nodes:
            assert i not in position, f"node {i} in two regions"
            position[i] = s
    assert len(position) == len(window.nodes), "a node is in no region"
    for a, b in dag.edges:
        assert position[a] <= position[b], f"edge {a}->{b} runs backwards"


__all__ = ["Region", "Partition", "partition", "check"]
