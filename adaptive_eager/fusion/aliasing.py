"""Inputs of a region that share storage the region writes: rebuilt as views of one input.

# Note [Aliased inputs are not fused]
# A compiler sees each input of a region as its own buffer. If two inputs share storage
# and the region writes it, the compiled code could read stale data: AOTAutograd and
# Inductor read every input as it was at entry and write mutated ones back at the end
# (Inductor may even write an input in place before a kernel that reads another input of
# the same memory, since nothing tells it they alias). Two inputs that share storage but
# are only read are fine, and so is one input written alone.
#
# Note [Aliased inputs are rebuilt as views]
# The common case is a view held from before the region: a training step cut in two (by
# an eager op between forward and backward) hands its second half ``W.t()``, made by the
# forward pass, beside ``W``, which the optimizer step then updates; a GAN's generator
# step gets both as real tensors of the previous window. Rather than replay such a region
# eagerly (issue 26 measured 243 of 1,250 ops of an MLP step fused because of it), the
# region takes the one base and rebuilds the others inside its graph with the view ops
# that made them: the ``t`` (any chain of view ops) recorded in the window, or a
# ``permute`` for a real tensor that is a permutation of the base (same offset, sizes
# and strides permuted; the identity for the same tensor passed twice). Inside the
# graph the aliasing is visible: AOTAutograd's functionalization regenerates the views
# after each write, and what the region computes is what eager computes. Where no such
# view exists (two overlapping slices of one tensor, a view with ``as_strided``, a base
# made by an earlier region), the region replays eagerly, and its reason names the
# inputs that share storage and the op that writes it.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import TensorSpec
    >>> s = lambda t: TensorSpec.of(t)
    >>> w = torch.zeros(10, 64)
    >>> permutation(s(w), s(w.t())), permutation(s(w), s(w)), permutation(s(w), s(w[1:]))
    ((1, 0), (0, 1), None)
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from .ir import OpNode, TensorSpec, ValueRef, Window, op_name
from ..reasons import R

aten = torch.ops.aten


def permutation(base: TensorSpec, view: TensorSpec) -> tuple[int, ...] | None:
    """``perm`` with ``base.permute(perm)`` having ``view``'s metadata, else None."""
    if base.storage_offset != view.storage_offset or base.dtype != view.dtype or \
            len(base.shape) != len(view.shape):
        return None
    free = list(range(len(base.shape)))
    perm = []
    for size, stride in zip(view.shape, view.stride):
        d = next((d for d in free if base.shape[d] == size and base.stride[d] == stride), None)
        if d is None:
            return None
        free.remove(d)
        perm.append(d)
    return tuple(perm)


def _chain(vid: int, window: Window, producer: Mapping[int, int]) -> tuple[int, list[int]] | None:
    """(origin, indices of the view nodes from it to ``vid``) for a value made by view ops
    of one tensor (``vid`` itself and no nodes when it is not a view); None when a view
    op in the chain takes another tensor or is an ``as_strided``."""
    nodes: list[int] = []
    while True:
        i = producer.get(vid)
        if i is None:
            return vid, nodes
        node = window.nodes[i]
        if not node.is_view:
            return vid, nodes
        refs = list(node.inputs())
        base = node.args[0] if node.args else None
        if type(base) is not ValueRef or len(refs) != 1 or "as_strided" in op_name(node.target):
            return None
        nodes.append(i)
        vid = base.id


def _describe(vid: int, window: Window, producer: Mapping[int, int]) -> str:
    spec = window.specs[vid]
    what = "x".join(map(str, spec.shape)) + " " + str(spec.dtype).replace("torch.", "")
    i = producer.get(vid)
    if i is None:
        at = f" at offset {spec.storage_offset}" if spec.storage_offset else ""
        return f"a {what} tensor{at}"
    return f"the {op_name(window.nodes[i].target)} result ({what}, made before the region)"


def rebase(window: Window, region_nodes: Sequence[int], inputs: tuple[int, ...],
           mutated: tuple[int, ...], root: Callable[[int], int], producer: Mapping[int, int],
           index_checks: tuple = ()) -> tuple[tuple[OpNode, ...], tuple[int, ...], tuple[int, ...]] | str:
    """(derived view nodes, inputs, mutated inputs) with every input that shares a written
    storage with another rebuilt from one base (Note [Aliased inputs are rebuilt as
    views]); or the ``aliased_inputs`` reason when some cannot be."""
    written = {root(v) for v in mutated}
    groups: dict[int, list[int]] = {}
    for v in inputs:
        if root(v) in written:
            groups.setdefault(root(v), []).append(v)
    derived_nodes: set[int] = set()
    made: list[OpNode] = []
    replaced: dict[int, int] = {}  # first input of a group -> its base
    for r, group in groups.items():
        if len(group) < 2:
            continue
        chains = [_chain(v, window, producer) for v in group]
        origins = list(dict.fromkeys(c[0] for c in chains if c is not None))
        base = None if None in chains else _base(origins, window)
        if base is None or any(o not in window.inputs and o not in inputs for o in origins):
            return _reason(window, region_nodes, group, r, root, producer)
        for c in chains:
            derived_nodes.update(c[1])
        for o in origins:
            if o != base:
                perm = permutation(window.specs[base], window.specs[o])
                made.append(OpNode(aten.permute.default, (ValueRef(base), list(perm)), (), (o,),
                                   is_view=True))
        replaced[group[0]] = base
    if not replaced:
        return (), inputs, mutated
    derived = tuple(made) + tuple(window.nodes[i] for i in sorted(derived_nodes))
    out = {v for n in derived for v in n.outputs if v is not None}
    if any(c[0] in out for c in index_checks):
        return _reason(window, region_nodes, [c[0] for c in index_checks if c[0] in out], None,
                       root, producer)
    new_inputs: list[int] = []
    for v in inputs:
        v = replaced.get(v, v)
        if v not in out and v not in new_inputs:
            new_inputs.append(v)
    return derived, tuple(new_inputs), tuple(v for v in new_inputs if root(v) in written)


def _base(origins: list[int], window: Window) -> int | None:
    """The origin the others are permutations of (all of them real tensors), or None."""
    if len(origins) == 1:
        return origins[0]
    if any(o not in window.inputs for o in origins):
        return None
    for b in origins:
        if all(o == b or permutation(window.specs[b], window.specs[o]) is not None for o in origins):
            return b
    return None


def _reason(window: Window, region_nodes: Sequence[int], group: list[int], r: int | None,
            root: Callable[[int], int], producer: Mapping[int, int]) -> str:
    names = ", ".join(_describe(v, window, producer) for v in group[:3])
    writer = next((op_name(window.nodes[i].target) for i in region_nodes
                   if r is not None and any(root(v) == r for v in window.nodes[i].mutates)), None)
    tail = f"; {writer} writes it" if writer else ""
    return f"{R.ALIASED_INPUTS}: {names} share storage{tail}"


__all__ = ["permutation", "rebase"]
