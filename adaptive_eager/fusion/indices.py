"""Index operands: which tensor arguments of an op index into another tensor, and their bounds.

# Note [Compiled code never sees an index eager would reject]
# Eager checks every index it reads and raises (IndexError, RuntimeError). Inductor's
# generated code checks too, but inside an OpenMP region, where a C++ exception cannot
# propagate: an out-of-range embedding index killed the process (SIGABRT) instead of
# raising eager's error. So no compiled region is called with such an index:
#
# * ``index_uses(node, specs)`` lists each index operand of a node with the range its
#   values must lie in (``[lo, hi)``, or one ``allowed`` value such as nll_loss's
#   ``ignore_index``), from the recorded shapes: static, since shapes are in the region
#   key. A range may be stricter than eager's (gather's ``[0, n)``): a value outside it
#   only sends the call to eager, which raises or computes as it would have.
# * The partitioner puts an index op in a compiled region only if the index's value at
#   the op is known at the region's entry: it is a region input, or elements of one
#   (views, copies, ``reshape``), not written in the region before the op. Otherwise
#   the region is closed before the op, and the index becomes the next region's input.
#   A factory in the region with known values (``arange(T)`` for a position embedding
#   under backends that fuse factories) needs no check when its range fits.
# * Before each compiled call the runtime checks those inputs (one ``aminmax`` each:
#   3 µs for 2,048 int64 indices, 50 µs when an ``ignore_index`` needs an element-wise
#   test) and replays the region eagerly on a violation, so eager's own error is raised.
#   A GPT training step gets two checks (token ids, targets) and the same regions.
# * An op that reads an index argument (named index/indices/target/offsets, of an
#   integer or bool dtype) that no rule here covers is never compiled.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef
    >>> specs = {0: TensorSpec.of(torch.ones(10, 4)), 1: TensorSpec.of(torch.zeros(3, dtype=torch.long))}
    >>> index_uses(OpNode(torch.ops.aten.embedding.default, (ValueRef(0), ValueRef(1)), (), (2,)), specs)
    (IndexUse(vid=1, lo=0, hi=10, allowed=None),)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .ir import OpNode, TensorSpec, ValueRef, Window

_INDEX_NAMES = frozenset({"index", "indices", "target", "targets", "offsets"})
_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8})
_MASK_DTYPES = frozenset({torch.bool, torch.uint8})  # uint8 in an index list is a mask


@dataclass(frozen=True)
class IndexUse:
    """Every element of value ``vid`` must lie in ``[lo, hi)`` or equal ``allowed``."""

    vid: int
    lo: int
    hi: int
    allowed: int | None = None


Get = Callable[[str], Any]
Shape = Callable[[Any], tuple]


def _dim(shape: tuple, dim: int) -> int:
    """Size of ``dim`` (a 0-dim tensor has one element along dim 0 or -1)."""
    if not shape:
        return 1
    return shape[dim % len(shape)]


def _one(index: str, source: str) -> Callable[[Get, Shape], list]:
    """``index`` indexes dim ``dim`` of ``source``."""
    return lambda a, shape: [(a(index), 0, _dim(shape(a(source)), a("dim")), None)]


def _dim0(index: str, source: str) -> Callable[[Get, Shape], list]:
    return lambda a, shape: [(a(index), 0, _dim(shape(a(source)), 0), None)]


def _flat(index: str, source: str) -> Callable[[Get, Shape], list]:
    def rule(a: Get, shape: Shape) -> list:
        n = math.prod(shape(a(source)))
        return [(a(index), -n, n, None)]
    return rule


def _listed(source: str = "self") -> Callable[[Get, Shape], list]:
    """``indices[k]`` indexes dim k of ``source`` (None entries are full slices)."""
    def rule(a: Get, shape: Shape) -> list:
        s = shape(a(source))
        return [(ix, -s[k], s[k], None) for k, ix in enumerate(a("indices") or ())
                if ix is not None and k < len(s)]
    return rule


def _classes(target: str, source: str, ignore: str) -> Callable[[Get, Shape], list]:
    """Class indices into dim 1 of ``source`` (dim 0 of a 1-d one), or ``ignore``'s value."""
    def rule(a: Get, shape: Shape) -> list:
        s = shape(a(source))
        return [(a(target), 0, s[1] if len(s) >= 2 else s[0], a(ignore))]
    return rule


def _plane(index: str, source: str, dims: int) -> Callable[[Get, Shape], list]:
    """Pooling indices: flat positions in the input's last ``dims`` dims."""
    return lambda a, shape: [(a(index), 0, math.prod(shape(a(source))[-dims:]), None)]


_DIMMED = ("gather", "index_select", "index_add", "index_add_", "index_copy", "index_copy_",
           "index_fill", "index_fill_", "index_reduce", "index_reduce_", "scatter", "scatter_",
           "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_")
_LISTED = ("index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl",
           "_index_put_impl_", "_unsafe_index_put", "_unsafe_masked_index",
           "_unsafe_masked_index_put_accumulate")

# schema name -> rule(get argument by name, shape of a ValueRef) -> [(ref, lo, hi, allowed)]
RULES: dict[str, Callable[[Get, Shape], list]] = {
    **{f"aten::{n}": _one("index", "self") for n in _DIMMED},
    **{f"aten::{n}": _listed() for n in _LISTED},
    "aten::embedding": _dim0("indices", "weight"),
    "aten::embedding_renorm": _dim0("indices", "self"),
    "aten::embedding_renorm_": _dim0("indices", "self"),
    "aten::embedding_dense_backward": lambda a, shape: [(a("indices"), 0, a("num_weights"), None)],
    "aten::take": _flat("index", "self"),
    "aten::put": _flat("index", "self"),
    "aten::put_": _flat("index", "self"),
    "aten::nll_loss_forward": _classes("target", "self", "ignore_index"),
    "aten::nll_loss2d_forward": _classes("target", "self", "ignore_index"),
    "aten::nll_loss_backward": _classes("target", "self", "ignore_index"),
    "aten::nll_loss2d_backward": _classes("target", "self", "ignore_index"),
    "aten::multi_margin_loss": lambda a, shape: [(a("target"), 0, shape(a("self"))[-1], None)],
    "aten::multi_margin_loss_backward": lambda a, shape: [(a("target"), 0, shape(a("self"))[-1], None)],
    "aten::multilabel_margin_loss_forward": lambda a, shape: [(a("target"), -1, shape(a("self"))[-1], None)],
    "aten::multilabel_margin_loss_backward": lambda a, shape: [(a("target"), -1, shape(a("self"))[-1], None)],
    "aten::max_pool2d_with_indices_backward": _plane("indices", "self", 2),
    "aten::max_pool3d_with_indices_backward": _plane("indices", "self", 3),
    "aten::adaptive_max_pool2d_backward": _plane("indices", "self", 2),
    "aten::adaptive_max_pool3d_backward": _plane("indices", "self", 3),
    "aten::max_unpool2d": lambda a, shape: [(a("indices"), 0, math.prod(a("output_size")), None)],
    "aten::max_unpool3d": lambda a, shape: [(a("indices"), 0, math.prod(a("output_size")), None)],
    "aten::cummaxmin_backward": lambda a, shape: [(a("indices"), 0, _dim(shape(a("input")), a("dim")), None)],
    "aten::value_selecting_reduction_backward":
        lambda a, shape: [(a("indices"), 0, _dim(tuple(a("sizes")), a("dim")), None)],
}

_POSITIONS: dict[Any, dict[str, tuple[int, bool, Any]]] = {}  # target -> name -> (pos, kw-only, default)


def _positions(target: Any) -> dict[str, tuple[int, bool, Any]]:
    pos = _POSITIONS.get(target)
    if pos is None:
        pos = _POSITIONS[target] = {
            a.name: (i, a.kwarg_only, a.default_value if a.has_default_value() else None)
            for i, a in enumerate(target._schema.arguments)}
    return pos


def _getter(node: OpNode) -> Get:
    pos = _positions(node.target)
    kwargs = dict(node.kwargs)

    def get(name: str) -> Any:
        i, kw_only, default = pos[name]
        if not kw_only and i < len(node.args):
            return node.args[i]
        return kwargs.get(name, default)
    return get


def index_uses(node: OpNode, specs: Mapping[int, TensorSpec]) -> tuple[IndexUse, ...] | None:
    """The index operands of ``node`` and their ranges: () when it reads none, None when it
    reads one that cannot be checked (Note [Compiled code never sees an index eager would
    reject])."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return ()
    rule = RULES.get(schema.name)
    if rule is None:
        return None if _reads_index(node, schema, specs) else ()
    uses = []
    for ref, lo, hi, allowed in rule(_getter(node), lambda r: specs[r.id].shape):
        if not isinstance(ref, ValueRef):
            continue  # an absent optional index
        if specs[ref.id].dtype not in _INDEX_DTYPES:
            return None  # a mask (bool, uint8) or a float where the rule expects indices
        uses.append(IndexUse(ref.id, int(lo), int(hi), None if allowed is None else int(allowed)))
    return tuple(uses)


def _reads_index(node: OpNode, schema: Any, specs: Mapping[int, TensorSpec]) -> bool:
    get = _getter(node)
    for a in schema.arguments:
        if a.name not in _INDEX_NAMES or (a.alias_info is not None and a.alias_info.is_write):
            continue
        v = get(a.name)
        refs = v if isinstance(v, (list, tuple)) else (v,)
        for r in refs:
            if isinstance(r, ValueRef) and (specs[r.id].dtype in _INDEX_DTYPES or
                                            specs[r.id].dtype in _MASK_DTYPES):
                return True
    return False


# Ops whose result holds only elements of their first argument (views, copies, reshapes):
# an index read through them is checked on that argument (a superset of its elements).
_ELEMENTS_OF_FIRST = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::slice", "aten::select",
    "aten::expand", "aten::t", "aten::transpose", "aten::permute", "aten::unsqueeze",
    "aten::squeeze", "aten::alias", "aten::detach", "aten::narrow", "aten::unfold",
    "aten::diagonal", "aten::split", "aten::split_with_sizes", "aten::unbind", "aten::chunk",
    "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::repeat", "aten::flatten",
    "aten::movedim", "aten::lift_fresh", "aten::lift_fresh_copy",
    # gathers: a batch of targets drawn as ``Y[idx]`` (Note [Compiled code never sees an
    # index eager would reject]); their own indices are checked by their own rules
    "aten::index", "aten::_unsafe_index", "aten::index_select", "aten::gather", "aten::take",
})


def _made_range(node: OpNode) -> tuple[int, int] | None:
    """(min, max) of the values a factory with integer arguments makes, else None."""
    name = node.target._schema.name if hasattr(node.target, "_schema") else ""
    args = node.args
    if not all(type(a) is int for a in args if not isinstance(a, (list, tuple))):
        return None
    if name == "aten::arange":
        start, end, step = (0, args[0], 1) if len(args) == 1 else (args + (1,))[:3]
        n = max(0, -(-(end - start) // step)) if step else 0
        if n == 0:
            return None
        last = start + (n - 1) * step
        return min(start, last), max(start, last)
    if name in ("aten::zeros", "aten::zeros_like"):
        return 0, 0
    if name in ("aten::ones", "aten::ones_like"):
        return 1, 1
    if name in ("aten::full", "aten::full_like") and len(args) > 1 and type(args[1]) is int:
        return args[1], args[1]
    return None


def entry_value(vid: int, window: Window, producer: Mapping[int, int], inside: set[int],
                written: set[int], root: Callable[[int], int]) -> int | tuple[int, int] | None:
    """What bounds ``vid``'s values at the op that reads it: the value, read at the
    region's entry, whose elements include all of ``vid``'s; or (min, max) when a
    factory in the region made them (``arange(T)`` feeding a position embedding); None
    when they are computed (or their storage written) in the region. ``inside``: node
    indices in the region so far; ``written``: the storage roots they wrote."""
    specs = window.specs
    while True:
        i = producer.get(vid)
        if i is None or i not in inside:
            break
        node = window.nodes[i]
        schema = getattr(node.target, "_schema", None)
        base = node.args[0] if node.args else None
        if schema is not None and not any(isinstance(a, ValueRef) for a in node.args):
            made = _made_range(node)
            return made if made is not None and root(vid) not in written else None
        if schema is None or schema.name not in _ELEMENTS_OF_FIRST or node.target is \
                torch.ops.aten.view.dtype or not isinstance(base, ValueRef) or \
                specs[base.id].dtype != specs[vid].dtype:
            return None
        vid = base.id
    return None if root(vid) in written else vid


__all__ = ["IndexUse", "RULES", "index_uses", "entry_value"]
