"""Policies passed into the partitioner: what a backend can run, and whether fusing pays.

The partitioner never names a backend. A backend describes what it can compile as data
(an :class:`OpSupport`); a :class:`CostModel` decides, per candidate region, whether a
compiled call beats running its ops one by one.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, ValueRef
    >>> aten = torch.ops.aten
    >>> support = OpSupport()
    >>> support.unsupported(OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,))) is None
    True
    >>> support.unsupported(OpNode(aten.nonzero.default, (ValueRef(0),), (), (1,)))
    'data_dependent'
    >>> op_class(aten.mm.default), op_class(aten.relu.default), op_class(aten.view.default)
    ('matmul', 'pointwise', 'view')
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from .ir import OpNode, TensorSpec, ValueRef
from ..reasons import R

_MATMUL = frozenset({
    "aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear", "aten::baddbmm",
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::addbmm", "aten::addmv", "aten::mv", "aten::dot",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
})
_REDUCTION_HINTS = ("sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "var", "std",
                    "softmax", "logsumexp", "argmax", "argmin", "any", "all", "cumsum")
# Note [One list of data-dependent ops]
# Ops whose result (its shape, a Python value) or effect depends on tensor values, beyond
# what torch's tags (dynamic_output_shape, data_dependent_output) say. Capture syncs on
# them (dispatch/optable.py) and no region compiles them (OpSupport); both read this
# list and :func:`data_dependent`, so the two never disagree.
DATA_DEPENDENT_OPS = frozenset({
    "aten::nonzero", "aten::nonzero_static", "aten::nonzero_numpy", "aten::masked_select",
    "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::argwhere",
    "aten::repeat_interleave", "aten::_assert_async", "aten::_assert_scalar",
    "aten::_print", "aten::_local_scalar_dense", "aten::item", "aten::equal",
    "aten::is_nonzero", "aten::allclose", "aten::to_sparse", "aten::_to_sparse",
    "aten::histc", "aten::bincount", "aten::histogram", "aten::_histogramdd_bin_edges",
    "aten::record_stream", "aten::_assert_tensor_metadata", "aten::_functional_assert_async",
    "aten::_make_dep_token", "aten::_sparse_coo_tensor_with_dims_and_tensors",
    "aten::_pin_memory", "aten::pin_memory", "aten::is_pinned",
})

# Note [Integer indexing is not data-dependent]
# aten::index.Tensor is tagged dynamic_output_shape because of boolean masks (x[x > 0]:
# as many elements as are true). With integer indices (x[idx], x[:, [-1], :]) the
# output's shape follows from the indices' shapes, the meta kernel computes it, and the
# op is an ordinary gather: recorded, and fusible. So the verdict is taken per call,
# from the dtypes of its indices: op schema name -> position of its indices list.
# (An index out of range raises eager's IndexError when the op runs: at its flush.)
FIXED_SHAPE_IF_INTEGER_INDICES = {"aten::index": 1}
_MASK_DTYPES = (torch.bool, torch.uint8)  # uint8 indices are masks too (deprecated)


def data_dependent(target: Any) -> bool:
    """Whether an overload is data-dependent by its name or tags (before any per-call
    refinement, see :func:`fixed_shape_call`)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    tags = getattr(target, "tags", ())
    return schema.name in DATA_DEPENDENT_OPS or torch.Tag.dynamic_output_shape in tags or \
        torch.Tag.data_dependent_output in tags


def fixed_shape_call(target: Any, args: Sequence[Any], dtype_of: Callable[[Any], Any]) -> bool:
    """Whether this call of a data-dependent op has a fixed output shape all the same:
    indexing with integer indices only (Note [Integer indexing is not data-dependent]).
    ``dtype_of(arg)``: the dtype of a tensor argument (or of a ValueRef), else None."""
    schema = getattr(target, "_schema", None)
    where = FIXED_SHAPE_IF_INTEGER_INDICES.get(schema.name) if schema is not None else None
    if where is None or len(args) <= where or not isinstance(args[where], (list, tuple)):
        return False
    dtypes = [dtype_of(i) for i in args[where] if i is not None]
    return bool(dtypes) and all(d is not None and not d.is_floating_point and not d.is_complex
                                and d not in _MASK_DTYPES for d in dtypes)


_RANDOM_HINTS = ("rand", "normal", "bernoulli", "dropout", "uniform", "multinomial", "poisson",
                 "exponential", "geometric", "cauchy", "log_normal")


def op_class(target: object) -> str:
    """Coarse class of an op for the cost model: matmul, view, pointwise, reduction, other."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return "other"
    name = schema.name
    if name in _MATMUL:
        return "matmul"
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        return "pointwise"
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return "view"
    base = name.split("::", 1)[-1]
    if any(h in base for h in _REDUCTION_HINTS):
        return "reduction"
    return "other"


# The op classes fusion can speed up: a fused region saves their launches and their
# intermediates' memory traffic; a matmul or an opaque kernel (aten::mkldnn_rnn_layer)
# runs as fast alone as inside a region (Note [Only fusible ops pay for capture],
# runtime/adapt.py).
FUSIBLE_CLASSES = frozenset({"pointwise", "reduction", "view"})


def fusible(target: object) -> bool:
    """Whether fusing ``target`` with its neighbours can make it faster (its
    :func:`op_class` is pointwise, a reduction or a view).

    Example::

        >>> fusible(torch.ops.aten.mul.Tensor), fusible(torch.ops.aten.mm.default)
        (True, False)
    """
    return op_class(target) in FUSIBLE_CLASSES


class SupportPolicy(Protocol):
    """``unsupported(node, specs)``: None when the backend can compile ``node``, else a
    reason. ``specs`` (the window's value specs) lets a verdict depend on the call's
    tensors (Note [Integer indexing is not data-dependent]); without it, be conservative."""

    def unsupported(self, node: OpNode, specs: Mapping[int, TensorSpec] | None = None) -> str | None:
        ...


def dropout_arg(schema: Any) -> int | str | None:
    """Where an op's ``dropout_p`` sits: its position, its name if keyword-only, or None."""
    return next(((a.name if a.kwarg_only else i) for i, a in enumerate(schema.arguments)
                 if a.name == "dropout_p"), None)


def without_dropout(where: int | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call passes ``dropout_p == 0`` (absent: its default, 0), so that an
    attention op tagged random draws nothing (Note [Attention without dropout is not
    random], dispatch/mode.py)."""
    p = kwargs.get(where, 0.0) if isinstance(where, str) else (
        args[where] if where < len(args) else kwargs.get("dropout_p", 0.0))
    return isinstance(p, (int, float)) and p == 0


def _spec_dtype(arg: Any, specs: Mapping[int, TensorSpec]) -> Any:
    spec = specs.get(arg.id) if isinstance(arg, ValueRef) else None
    return spec.dtype if spec is not None else None


# Note [NaN payloads run eagerly]
# Generated code spells a baked NaN ``nan`` (torch.fx's Python, Inductor's C++), which is
# the canonical NaN: a constant NaN with another payload (rare, but a value eager keeps
# bit for bit) would come out canonical. Ops that bake one run eagerly.
_CANONICAL_NAN = struct.pack("<d", float("nan"))


def _odd_nan(args: Any) -> bool:
    for a in args:
        t = type(a)
        if t is float:
            if a != a and struct.pack("<d", a) != _CANONICAL_NAN:
                return True
        elif t is complex:
            if _odd_nan((a.real, a.imag)):
                return True
        elif t is tuple or t is list:
            if _odd_nan(a):
                return True
    return False


def _no_dropout(node: OpNode) -> bool:
    schema = getattr(node.target, "_schema", None)
    where = dropout_arg(schema) if schema is not None else None
    return where is not None and without_dropout(where, node.args, dict(node.kwargs))


@dataclass(frozen=True)
class OpSupport:
    """Data-driven support: which namespaces compile, which ops never do.

    ``deny`` holds schema names ("aten::foo") the backend cannot compile; data-dependent
    ops, random ops and ops outside ``namespaces`` (opaque custom ops) are always refused.
    ``allow_classes`` restricts compilation to op classes (see :func:`op_class`); ``None``
    allows every class. ``factories=False`` keeps ops that take no tensor out of regions
    (they run before the region, which takes their outputs as inputs).
    """

    namespaces: frozenset[str] = frozenset({"aten", "prims"})
    deny: frozenset[str] = frozenset()
    allow_classes: frozenset[str] | None = None
    # Ops that take no tensor (arange, zeros, full): inside a region or run before it.
    factories: bool = True
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def unsupported(self, node: OpNode, specs: Mapping[int, TensorSpec] | None = None) -> str | None:
        target = node.target
        try:
            reason = self._memo[target]
        except KeyError:
            reason = self._memo[target] = self._classify(target)
        if reason == R.DATA_DEPENDENT and specs is not None and \
                fixed_shape_call(target, node.args, lambda a: _spec_dtype(a, specs)):
            return self._classify(target, fixed_shape=True)
        if reason == R.RANDOM and _no_dropout(node):
            # Note [Attention without dropout is not random] (dispatch/mode.py): capture
            # records these; so may a region.
            return self._classify(target, random_ok=True)
        if reason is None and (_odd_nan(node.args) or _odd_nan(v for _, v in node.kwargs)):
            return R.NAN_PAYLOAD  # Note [NaN payloads run eagerly]
        return reason

    def _classify(self, target: object, random_ok: bool = False,
                  fixed_shape: bool = False) -> str | None:
        schema = getattr(target, "_schema", None)
        if schema is None:
            return R.OPAQUE
        name = schema.name
        if name.split("::", 1)[0] not in self.namespaces:
            return R.OPAQUE
        if not fixed_shape and data_dependent(target):
            return R.DATA_DEPENDENT
        if not random_ok and (torch.Tag.nondeterministic_seeded in target.tags or
                              any(h in name.split("::", 1)[1] for h in _RANDOM_HINTS)):
            return R.RANDOM
        if name in self.deny:
            return R.UNSUPPORTED_BY_BACKEND
        if not self.factories and not any("Tensor" in str(a.type) for a in schema.arguments):
            return R.FACTORY
        if self.allow_classes is not None and op_class(target) not in self.allow_classes:
            return R.UNSUPPORTED_BY_BACKEND
        return None


@dataclass(frozen=True)
class RegionSummary:
    """What the cost model sees of a candidate region."""

    n_ops: int            # kernels eager would launch (views excluded)
    io_bytes: int         # bytes the fused region reads (inputs) and writes (outputs, mutations)
    eager_bytes: int      # bytes eager's ops read and write, intermediates included
    work: int             # largest number of elements any op produces or reads
    has_matmul: bool


class CostModel(Protocol):
    """``decide(summary)``: None when fusing pays, else the reason it does not."""

    def decide(self, summary: RegionSummary) -> str | None:
        ...


@dataclass(frozen=True)
class DefaultCost:
    """Fusing pays when launches saved plus memory traffic avoided exceed a compiled call.

    Estimates (this 2-core CPU; override per backend): an eager op ~``launch_us``, a
    compiled call ~``call_us``, memory at ``bytes_per_us``. Regions touching fewer than
    ``min_work`` elements never compile.

    Example::

        >>> DefaultCost().decide(RegionSummary(3, 8 << 20, 24 << 20, 1 << 20, False)) is None
        True
        >>> DefaultCost().decide(RegionSummary(3, 96, 288, 8, False))
        'too_small'
    """

    launch_us: float = 3.0
    call_us: float = 25.0
    bytes_per_us: float = 4000.0
    min_work: int = 4096

    def decide(self, s: RegionSummary) -> str | None:
        if s.work < self.min_work:
            return R.TOO_SMALL
        if s.n_ops < 1 or (s.n_ops < 2 and not s.has_matmul):
            return R.NOTHING_TO_FUSE
        saved = (s.n_ops - 1) * self.launch_us + max(0, s.eager_bytes - s.io_bytes) / self.bytes_per_us
        if saved <= self.call_us:
            return R.NOT_WORTH_IT
        return None


def summarize(nodes: list[OpNode], inputs: list[int], outputs: list[int],
              mutated: list[int], specs: dict[int, TensorSpec]) -> RegionSummary:
    """Build the :class:`RegionSummary` of a candidate region."""
    n_ops, eager_bytes, work, mm = 0, 0, 0, False
    for node in nodes:
        cls = op_class(node.target)
        mm = mm or cls == "matmul"
        if cls == "view":
            continue
        n_ops += 1
        # what the op reads, writes as results, and writes in place (a foreach op's
        # in-place writes are its only outputs: it returns nothing)
        mutated_only = [v for v in node.mutates if v not in node.outputs]
        for vid in list(node.inputs()) + [v for v in node.outputs if v is not None] + mutated_only:
            spec = specs.get(vid)
            if spec is not None:
                eager_bytes += spec.nbytes
                work = max(work, spec.numel)
    io = sum(specs[v].nbytes for v in list(inputs) + list(outputs) + list(mutated) if v in specs)
    return RegionSummary(n_ops, io, eager_bytes, work, mm)


__all__ = ["DATA_DEPENDENT_OPS", "data_dependent", "fixed_shape_call", "op_class", "SupportPolicy", "OpSupport", "RegionSummary", "CostModel",
           "DefaultCost", "summarize"]
