"""Views of real tensors at moving offsets: the offset is a runtime value, not a key.

# Note [View offsets are inputs]
# A batch sliced from a dataset tensor (``X[i:i + 64]``, word_language_model's
# ``source[i:i + bptt]``, ``data.narrow(0, i, n)``, ``data[i % n]``) is a view op on a
# real tensor whose integers change every step. Keyed by value, they made every step's
# window new (issue 26 measured 8 regions for 8 offsets of an MLP step, and
# word_language_model compiling regions that ran only once). Only the view's storage
# offset depends on them, and for compiled code a storage offset is a property of an
# input, like a lifted scalar's value (Note [Scalar lifting]). So, for ``slice``,
# ``narrow`` and ``select`` of a window input:
#
# * the window key holds the op, its tensor and dim, and its result's shape and strides
#   (which the integers decide besides the offset: a last, shorter batch is a new key),
#   never the integers themselves (:func:`key_part`);
# * the partitioner runs the view eagerly, just before its region (it depends on nothing
#   in it), and the region takes the view as an input (report reason ``offset_view``);
# * region keys leave out the storage offset of an input that shares storage with no
#   other input of the region (aliasing among inputs keeps offsets in the key), keeping
#   only whether it is 16-byte aligned (:func:`input_spec_key`).
#
# Measured (``python -m benchmarks.data_patterns slice``, capture forced, aot_eager, 30
# steps of a two-layer MLP with AdamW, synchronous compiles): before, 14 regions compiled
# and 0 of 1,298 ops fused; after, one region, 1,107 of 1,298 ops fused (85%, the two
# slices of each step and the first three steps eager), as with a tensor per batch (89%).

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef
    >>> X = torch.zeros(100, 4)
    >>> specs = {0: TensorSpec.of(X), 1: TensorSpec.of(X[8:16])}
    >>> n8 = OpNode(torch.ops.aten.slice.Tensor, (ValueRef(0), 0, 8, 16), (), (1,), (), True)
    >>> n16 = n8._replace(args=(ValueRef(0), 0, 16, 24))
    >>> is_offset_view(n8, {0: X}), key_part(n8, specs) == key_part(n16, specs)
    (True, True)
"""

from __future__ import annotations

from typing import Container, Mapping

import torch

from .ir import OpNode, TensorSpec, ValueRef

aten = torch.ops.aten

# the view ops whose integers only move the result's storage offset (besides its shape)
OFFSET_VIEWS = frozenset({aten.slice.Tensor, aten.narrow.default, aten.select.int})


def is_offset_view(node: OpNode, inputs: Container[int]) -> bool:
    """Whether ``node`` is a slice/narrow/select of a window input (ids in ``inputs``)
    with plain integer arguments (Note [View offsets are inputs])."""
    if node.target not in OFFSET_VIEWS or node.kwargs or not node.args:
        return False
    base = node.args[0]
    if type(base) is not ValueRef or base.id not in inputs:
        return False
    return all(a is None or type(a) is int for a in node.args[1:])


def key_part(node: OpNode, specs: Mapping[int, TensorSpec]) -> tuple:
    """What an offset view contributes to a window key: its op, tensor, dim and result's
    shape and strides; not its integers."""
    out = specs[node.outputs[0]]
    dim = node.args[1] if len(node.args) > 1 else 0
    return (node.target, node.args[0].id, ("i", dim), "offset view", out.shape, out.stride,
            node.outputs, node.mutates)


def input_spec_key(spec: TensorSpec, with_offset: bool) -> tuple:
    """A region input's spec as a key: with its storage offset, or (an input alone in its
    storage) only whether that offset keeps it 16-byte aligned."""
    if with_offset:
        return (spec.shape, spec.stride, spec.storage_offset, spec.dtype, spec.device)
    aligned = spec.storage_offset * spec.dtype.itemsize % 16 == 0
    return (spec.shape, spec.stride, ("aligned", aligned), spec.dtype, spec.device)


__all__ = ["OFFSET_VIEWS", "is_offset_view", "key_part", "input_spec_key"]
