"""Op tables: what the mode does with each ATen op, derived once per overload.

Each ``OpOverload`` gets an :class:`OpTraits` (memoized in :class:`OpTable`) read
from its schema and tags:

+----------------+-------------------------------------------------------------+
| kind           | what the mode does                                          |
+================+=============================================================+
| RECORD         | defer: meta-execute for metadata, append to the window      |
| VIEW           | like RECORD; all-real arguments: run at once (no data read) |
| METADATA       | answer from metadata (meta tensors); no flush               |
| SYNC           | flush, then run for real (scalars out, data-dependent       |
|                | shapes, no meta kernel, in-place metadata changes)          |
| RANDOM         | consume the generator now, in program order (Note [RNG])    |
| COLLECTIVE     | flush, then run for real (a window boundary)                |
+----------------+-------------------------------------------------------------+

Example::

    >>> import torch
    >>> OpTable().traits(torch.ops.aten.add_.Tensor).mutated_args
    (0,)
    >>> OpTable().traits(torch.ops.aten._local_scalar_dense.default).kind
    <Kind.SYNC: 'sync'>
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

import torch

from ..fusion.policy import FIXED_SHAPE_IF_INTEGER_INDICES, data_dependent, dropout_arg
from ..reasons import R

aten = torch.ops.aten


class Kind(enum.Enum):
    RECORD = "record"
    VIEW = "view"
    METADATA = "metadata"
    SYNC = "sync"
    RANDOM = "random"
    COLLECTIVE = "collective"


@dataclass(frozen=True, slots=True)
class OpTraits:
    """What the schema says about one overload.

    ``mutated_args``: positions (int) or keyword names (str) of arguments written.
    ``return_alias``: for each return, the argument position/name it aliases, or None.
    ``reason``: why a SYNC op syncs (for flush statistics).
    """

    kind: Kind
    mutated_args: tuple[int | str, ...] = ()
    return_alias: tuple[int | str | None, ...] = ()
    reason: str = ""
    random_fill: bool = False
    is_view: bool = False
    # RANDOM ops with a ``dropout_p`` argument (the SDPA kernels): its position or name.
    # With dropout_p == 0 they draw nothing and are recorded like any op.
    dropout_arg: int | str | None = None
    # Data-dependent SYNC ops whose calls may have a fixed output shape all the same
    # (fusion.policy.fixed_shape_call, Note [Integer indexing is not data-dependent]):
    # the traits such a call is recorded with.
    when_fixed: "OpTraits | None" = None
    # The op fell back to eager in a flushed window: its next recording notes the
    # program's line for the report (AdaptiveEagerMode._note_source), then this is cleared.
    want_source: bool = False


# Ops that answer from metadata alone, though they return Python values.
_METADATA_OPS = {
    "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::size", "aten::stride", "aten::numel", "aten::dim", "aten::is_contiguous",
    "aten::is_strides_like_format", "aten::is_non_overlapping_and_dense", "aten::is_same_size",
    "aten::is_complex", "aten::is_floating_point", "aten::is_signed", "aten::is_conj",
    "aten::is_neg", "aten::_has_compatible_shallow_copy_type", "aten::is_inference",
    "aten::is_leaf", "aten::output_nr", "aten::_version", "aten::requires_grad_",
    "aten::retain_grad", "aten::retains_grad", "aten::_is_zerotensor", "aten::result_type",
    "aten::can_cast", "aten::promote_types", "aten::is_set_to", "aten::is_distributed",
    "aten::_nnz", "aten::sparse_dim", "aten::dense_dim",
}

# In-place ops that change a tensor's metadata (or storage), not only its values.
_METADATA_MUTATING = {
    "aten::resize_", "aten::resize_as_", "aten::set_", "aten::as_strided_", "aten::t_",
    "aten::transpose_", "aten::squeeze_", "aten::unsqueeze_", "aten::swapdims_",
    "aten::swapaxes_", "aten::_resize_output_", "aten::detach_", "aten::_coalesced_",
    "aten::sparse_resize_", "aten::sparse_resize_and_clear_", "aten::share_memory_",
}

# In-place random ops whose result does not depend on the values they overwrite,
# provided their other tensor arguments are real (Note [RNG]).
_RANDOM_FILL = {
    "aten::uniform_", "aten::normal_", "aten::bernoulli_", "aten::random_",
    "aten::exponential_", "aten::geometric_", "aten::cauchy_", "aten::log_normal_",
}

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor")

_TENSOR_TYPES = ("Tensor", "Tensor?", "Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]")


def _is_tensor_type(t: Any) -> bool:
    return str(t) in _TENSOR_TYPES


def derive_traits(func: torch._ops.OpOverload) -> OpTraits:
    """Read an overload's schema and tags into OpTraits (pure; see OpTable for the cache)."""
    schema = func._schema
    name = schema.name
    namespace = name.split("::", 1)[0]
    if namespace in _COLLECTIVE_NAMESPACES:
        return OpTraits(Kind.COLLECTIVE, reason=R.COLLECTIVE)
    if name in _METADATA_OPS:
        return OpTraits(Kind.METADATA)
    if name in _METADATA_MUTATING:
        return OpTraits(Kind.SYNC, reason=R.METADATA_MUTATION)
    if data_dependent(func):  # one list, shared with fusion (Note [One list of data-dependent ops])
        fixed = _schema_traits(func) if name in FIXED_SHAPE_IF_INTEGER_INDICES else None
        return OpTraits(Kind.SYNC, reason=R.DATA_DEPENDENT, when_fixed=fixed)
    return _schema_traits(func)


def _schema_traits(func: torch._ops.OpOverload) -> OpTraits:
    """Traits from the schema's returns, aliasing and tags (not the op lists)."""
    schema = func._schema
    name = schema.name
    tags = func.tags
    if not all(_is_tensor_type(r.type) for r in schema.returns):
        return OpTraits(Kind.SYNC, reason=R.NON_TENSOR_OUTPUT)

    mutated: list[int | str] = []
    alias_sets: dict[str, int | str] = {}
    for i, a in enumerate(schema.arguments):
        key: int | str = a.name if a.kwarg_only else i
        info = a.alias_info
        if info is None:
            continue
        for s in info.before_set:
            alias_sets.setdefault(s, key)
        if info.is_write:
            mutated.append(key)
    return_alias: list[int | str | None] = []
    writes_return = False
    for r in schema.returns:
        info = r.alias_info
        if info is None:
            return_alias.append(None)
            continue
        target = next((alias_sets[s] for s in info.before_set if s in alias_sets), None)
        return_alias.append(target)
        writes_return = writes_return or info.is_write
    if torch.Tag.nondeterministic_seeded in tags:
        fill = name in _RANDOM_FILL and mutated == [0]
        return OpTraits(Kind.RANDOM, tuple(mutated), tuple(return_alias), random_fill=fill,
                        dropout_arg=dropout_arg(schema))
    is_view = not mutated and any(a is not None for a in return_alias)
    kind = Kind.VIEW if is_view else Kind.RECORD
    return OpTraits(kind, tuple(mutated), tuple(return_alias), is_view=is_view)


def raise_if_out_of_range(func: torch._ops.OpOverload, args: tuple) -> None:
    """Raise eager's error now when a gather's real CPU index is out of range.

    Recorded, an index out of range would raise only at the flush, and the whole window
    would fail with it; eager raises at the op's line, before anything after it runs.
    Real CPU indices (data, ``torch.tensor``, Python lists) cost a min/max to check;
    indices that are pending themselves (or on a device) are checked when the op runs.
    """
    base, indices = args[0], args[1]
    shape = base.shape
    with torch._C.DisableTorchFunction():
        for dim, idx in enumerate(indices):
            if type(idx) is not torch.Tensor or idx.device.type != "cpu" or not idx.numel() \
                    or dim >= len(shape):
                continue
            lo, hi = torch.aminmax(idx)
            if int(lo) < -shape[dim] or int(hi) >= shape[dim]:
                # The real op on a stand-in of the base's shape (no data) raises eager's error.
                stand_in = torch.empty((), dtype=base.dtype).expand(shape)
                func(stand_in, *args[1:])


class OpTable:
    """Memoized :func:`derive_traits`, plus ops learned at run time to lack a meta kernel."""

    def __init__(self) -> None:
        self._traits: dict[Any, OpTraits] = {}

    def traits(self, func: torch._ops.OpOverload) -> OpTraits:
        t = self._traits.get(func)
        if t is None:
            t = self._traits[func] = derive_traits(func)
        return t

    def want_source(self, func: Any, wanted: bool = True) -> None:
        """Set (or clear) ``want_source`` on ``func``'s traits."""
        self._traits[func] = dataclasses.replace(self.traits(func), want_source=wanted)

    def mark_no_meta(self, func: torch._ops.OpOverload) -> None:
        """After meta execution failed and the real op worked: always sync this op."""
        self._traits[func] = OpTraits(Kind.SYNC, reason=R.NO_META_KERNEL)


__all__ = ["Kind", "OpTraits", "OpTable", "derive_traits", "raise_if_out_of_range"]
