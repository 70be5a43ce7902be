"""Structural keys: one for a whole window (to reuse its plan), one per region (the guard).

A window key lists everything that decides the plan: each node's target, its arguments
with value ids and baked scalars, the lifted-scalar slots (not their values, Note
[Scalar lifting]), the input specs, which inputs share storage, the view structure and
the live outputs. Two windows with equal keys get the same plan, so the plan (partition,
fx graphs, compiled artifacts) is built once and looked up by key on every later flush.

A region key is the same idea for one region, with value ids renumbered from the region's
own inputs, so that equal regions in different windows share a compiled artifact. It is
the only guard of a compiled artifact (Note [Our signature is the guard]).

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> aten = torch.ops.aten
    >>> x = torch.ones(4); s = TensorSpec.of(x)
    >>> def win(lr):
    ...     return Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), lr), (), (1,)),),
    ...                   {0: s, 1: s}, frozenset({1}))
    >>> k1, f1 = window_key(win(0.1), {0: 0})
    >>> k2, f2 = window_key(win(0.2), {0: 0})
    >>> k1 == k2, f1, f2
    (True, [0.1], [0.2])
    >>> hash(k1) == hash(k2)          # computed once, when the key was made
    True
"""

from __future__ import annotations

import struct
from typing import Any, Hashable, Mapping

from .ir import OpNode, TensorSpec, ValueRef, Window
from .offsets import OFFSET_VIEWS, input_spec_key, is_offset_view, key_part
from .scalars import _BY_ID, lift_rule, lifted_value, rules_for, strip

_F64 = struct.Struct("<d")

# Note [Our signature is the guard]
# A compiled artifact is called directly, with no second layer of guards (no Dynamo).
# So its key must list everything the compiled code may have specialized on: the graph
# (targets, constants, structure), each input's shape, stride, storage offset, dtype and
# device, which inputs alias each other, and which values are returned. Lifted scalars
# contribute their slot and dtype only; an input alone in its storage, its alignment
# instead of its offset (Note [View offsets are inputs]). Nothing else reaches the
# compiled code.


# Note [Keys hash once]
# A window key is a tuple of every node of the window (an AdamW window: 800 nodes), and a
# tuple re-hashes all of it on every dict lookup: each cachetools lookup (the window log,
# the region cache, each with its LRU order dict) re-hashed it, ~0.35 ms per lookup on that
# window, with a Python-level OpOverload.__hash__ per node. Keys are therefore
# :class:`Key` objects that hash their parts once, when made, and compare by identity first
# (a recurring window's trace hands back the very key object it was planned with).
class Key:
    """A structural key (``parts``, a hashable tuple) whose hash is computed once."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: Hashable):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return type(other) is Key and other._hash == self._hash and other.parts == self.parts

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __reduce__(self) -> tuple:
        return (Key, (self.parts,))  # hashes differ between processes (str hashing)

    def __repr__(self) -> str:
        return f"Key({self._hash:#x})"


def spec_key(spec: TensorSpec) -> tuple:
    """A TensorSpec as a plain tuple (fast hash and equality)."""
    return (spec.shape, spec.stride, spec.storage_offset, spec.dtype, spec.device)


# Note [Floats in keys are compared by bits]
# A baked float is part of what the compiled code computes, and Python's == is not
# equality of values there: -0.0 == 0.0 (but ``1 / (x * -0.0)`` is -inf, not inf), and
# NaN != NaN (so a NaN made afresh each step would miss every cache, and two NaNs with
# different payloads must not share an artifact). Zeros and NaNs are keyed by their bits;
# every other float by itself, where == is exact. Complex numbers by both parts (a bare
# ``3+0j`` would equal a value id 3).
def _float_key(x: float) -> tuple:
    if x == x and x != 0.0:
        return (float, x)
    return (float, _F64.pack(x))


def _complex_key(x: complex) -> tuple:
    return (complex, _float_key(x.real), _float_key(x.imag))


def _freeze(x: Any) -> Any:
    t = type(x)
    if t is ValueRef:
        return x.id  # ids are ints: a literal int is tagged below only if it collides
    if t is tuple:
        return tuple([_freeze(a) for a in x])
    if t is list:
        return ("L", tuple([_freeze(a) for a in x]))
    if t is float:
        return _float_key(x)  # 1, 1.0 and True are equal in Python, not to ATen
    if t is bool:
        return (t, x)
    if t is int:
        return ("i", x)
    if t is complex:
        return _complex_key(x)
    return x


def _freeze_args(args: tuple) -> tuple:
    """``_freeze`` for a flat argument tuple, without recursion in the common case."""
    out = []
    for a in args:
        t = type(a)
        if t is ValueRef:
            out.append(a.id)
        elif t is float:
            out.append((float, a) if a == a and a != 0.0 else _float_key(a))
        elif t is bool:
            out.append((t, a))
        elif t is int:
            out.append(("i", a))
        elif t is tuple or t is list or t is complex:
            out.append(_freeze(a))
        else:
            out.append(a)
    return tuple(out)


def window_key(window: Window, groups: Mapping[int, int]) -> tuple[Key, list[float]]:
    """(structural key, lifted float values in node order) for ``window``.

    ``groups`` maps each real input to its storage group (``graph.storage_groups``).
    Linear in the window; a few hundred ns per node.
    """
    specs = window.specs
    floats: list[float] = []
    parts: list[Any] = []
    append = parts.append
    memo = _BY_ID
    inputs = window.inputs
    for node in window.nodes:
        target = node.target
        if target in OFFSET_VIEWS and is_offset_view(node, inputs):
            append(key_part(node, specs))  # Note [View offsets are inputs]
            continue
        rule = None
        r = memo.get(id(target))
        if r is None:
            r = rules_for(target)
        if (r[1] is not None or r[2] is not None) and node.args:
            rule = lift_rule(node, specs)
        if rule is None:
            args, kwargs = node.args, node.kwargs
        else:
            floats.append(lifted_value(node, rule))
            args, kwargs = strip(node, rule)
        append((target, _freeze_args(args), _freeze(kwargs) if kwargs else (), node.outputs,
                node.mutates))
    in_keys = tuple((vid, spec_key(specs[vid]), groups.get(vid, vid)) for vid in inputs)
    key = (in_keys, tuple(parts), tuple(window.alias_root.items()), tuple(sorted(window.outputs)))
    return Key(key), floats


def region_key(window: Window, nodes: tuple[int, ...], inputs: tuple[int, ...],
               outputs: tuple[int, ...], root_of: Mapping[int, int],
               derived: tuple[OpNode, ...] = ()) -> Key:
    """Structural key of one region (value ids renumbered; see the module docstring).

    ``root_of`` maps each input id to its storage root, so aliasing among the region's
    inputs is part of the key. ``derived``: the view ops the region runs first (Note
    [Aliased inputs are rebuilt as views]), keyed like its own nodes.
    """
    local: dict[int, int] = {v: i for i, v in enumerate(inputs)}
    specs = window.specs

    def renum(x: Any) -> Any:
        t = type(x)
        if t is ValueRef:
            return ("v", local[x.id])
        if t is tuple or t is list:
            return (t.__name__, tuple(renum(a) for a in x))
        if t is float:
            return _float_key(x)  # Note [Floats in keys are compared by bits]
        if t is int or t is bool:
            return (t, x)
        if t is complex:
            return _complex_key(x)
        return x

    parts = []
    for node in tuple(derived) + tuple(window.nodes[i] for i in nodes):
        rule = lift_rule(node, specs) if node.args else None
        args, kwargs = (node.args, node.kwargs) if rule is None else strip(node, rule)
        a, k = renum(args), renum(kwargs)
        for vid in node.outputs:
            if vid is not None and vid not in local:
                local[vid] = len(local)
        outs = tuple(None if v is None else local[v] for v in node.outputs)
        parts.append((node.target, a, k, outs))
    first_root: dict[int, int] = {}
    aliasing = tuple(first_root.setdefault(root_of[v], j) for j, v in enumerate(inputs))
    # Note [View offsets are inputs]: an input alone in its storage is keyed without its
    # offset, unless the region reinterprets storage (as_strided takes absolute offsets)
    strided = any("as_strided" in str(p[0]) for p in parts)
    alone = {r for r in first_root if sum(root_of[v] == r for v in inputs) == 1}
    in_specs = tuple(input_spec_key(specs[v], strided or root_of[v] not in alone) for v in inputs)
    out_ids = tuple(local[v] for v in outputs)
    out_specs = tuple(input_spec_key(specs[v], strided) for v in outputs)
    return Key((tuple(parts), in_specs, aliasing, out_ids, out_specs))


# Note [Why a window missed the plan cache]
# For the ae_recompiles log only (built when that artifact is enabled): a window's
# outline (per node: its op, the shape and dtype of each tensor argument, the type of
# each other argument) is kept per flush site, and a miss is explained by the first
# difference from the previous window flushed at the same line: a new op, a shape
# change, or a scalar kind (an int where a float was, a constant baked into the key).
def outline(window: Window) -> tuple:
    """A small, tensor-free summary of ``window`` for :func:`miss_cause`."""
    from .ir import _leaves, op_name  # noqa: PLC0415

    specs = window.specs
    rows = []
    for node in window.nodes:
        args = []
        for a in _leaves(tuple(node.args) + tuple(v for _, v in node.kwargs)):
            if isinstance(a, ValueRef):
                sp = specs.get(a.id)
                args.append(("tensor", tuple(sp.shape), str(sp.dtype)) if sp is not None else ("tensor",))
            else:
                args.append((type(a).__name__,))
        rows.append((op_name(node.target), tuple(args)))
    return tuple(rows)


def miss_cause(previous: tuple | None, current: tuple) -> str:
    """Why ``current`` (an :func:`outline`) missed, against the ``previous`` one at its line."""
    if previous is None:
        return "first window flushed at this line"
    for i, (old, new) in enumerate(zip(previous, current)):
        if old[0] != new[0]:
            return f"new op at op {i}: {new[0]} where {old[0]} was"
        for a, b in zip(old[1], new[1]):
            if a != b:
                if a[0] == b[0] == "tensor":
                    return f"shape change at op {i} ({new[0]}): {_fmt(a)} -> {_fmt(b)}"
                return f"scalar kind at op {i} ({new[0]}): {a[0]} -> {b[0]}"
        if len(old[1]) != len(new[1]):
            return f"new arguments at op {i} ({new[0]})"
    if len(previous) != len(current):
        return f"window length {len(previous)} -> {len(current)} ops"
    return "same ops and shapes: strides, aliasing, outputs or a baked constant differ"


def _fmt(arg: tuple) -> str:
    return f"{arg[2].replace('torch.', '')}{list(arg[1])}" if len(arg) == 3 else "tensor"


# The exact form of a constant as keys compare it (Note [Floats in keys are compared by
# bits]), for the trace matchers that check constants the way keys do (dispatch/match.py).
freeze = _freeze

__all__ = ["Key", "spec_key", "window_key", "region_key", "outline", "miss_cause", "freeze"]
