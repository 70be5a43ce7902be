"""Lower a fused Region to an ATen-level ``torch.fx.GraphModule``.

Placeholders are the region's tensor inputs (in ``Region.inputs`` order) followed by one
0-dim tensor per lifted scalar (Note [Scalar lifting]). The graph replays the region's
ops as recorded, in-place ops included; a compiler that functionalizes (AOTAutograd,
Inductor) writes input mutations back. It returns a tuple: ``Region.outputs`` in order.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> from adaptive_eager.fusion.partition import Region
    >>> aten = torch.ops.aten
    >>> x = torch.ones(4); s = TensorSpec.of(x)
    >>> w = Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), 0.5), (), (1,)),
    ...                     OpNode(aten.relu.default, (ValueRef(1),), (), (2,))),
    ...            {0: s, 1: s, 2: s}, frozenset({2}))
    >>> lowered = lower(w, Region((0, 1), (0,), (2,), (), True))
    >>> lowered.scalar_dtypes
    (torch.float32,)
    >>> lowered.module(x, torch.tensor(0.5))
    (tensor([0.5000, 0.5000, 0.5000, 0.5000]),)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from .ir import TensorSpec, ValueRef, Window
from .partition import Region
from .scalars import lift_rule, lifted_dtype, lifted_shape, scalar_dtype

# fx node meta keys: the program's line that issued a node's op, its first output's
# value id, and the spec it was recorded with (runtime/layouts.py: which op a compiler
# lays out otherwise than eager)
SOURCE_META = "ae_source"
VALUE_META = "ae_value"
SPEC_META = "ae_spec"
_aten = torch.ops.aten


@dataclass(frozen=True)
class Lowered:
    """A region as a GraphModule, with what is needed to call and compile it."""

    module: fx.GraphModule
    input_specs: tuple[TensorSpec, ...]
    scalar_dtypes: tuple[torch.dtype, ...]
    scalar_shapes: tuple[tuple[int, ...], ...] = ()  # () for a float, (n,) for a list

    def example_inputs(self, device: torch.device | None = None) -> list[torch.Tensor]:
        """Fresh tensors with the recorded specs (values are irrelevant to compilers);
        ``device``: made there instead of on the specs' device.

        Uninitialized (``torch.empty``): zero-filled examples of a large region were
        memory the program's peak paid for while it compiled (Note [Replay frees at last
        use], fusion/liveness.py); untouched, the pages are never made resident.
        """
        out = []
        for s in self.input_specs:
            base = torch.empty(max(s.extent, 1), dtype=s.dtype, device=device or s.device)
            out.append(base.as_strided(s.shape, s.stride, s.storage_offset))
        shapes = self.scalar_shapes or ((),) * len(self.scalar_dtypes)
        out.extend(torch.ones(shape, dtype=d) for d, shape in zip(self.scalar_dtypes, shapes))
        return out


def _single_tensor_return(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"


# Note [Cat's layout is explicit]
# Eager's ``cat`` skips legacy empty inputs (a 1-D tensor of size 0, as the key/value
# caches of Hugging Face models start: ``torch.cat([torch.tensor([]), k], dim=-2)``) and
# returns a new tensor in the inputs' memory format: contiguous for a transposed ``k``.
# Inductor's decomposition of ``cat`` drops empty inputs too (1-D of size 0, or size 0
# along ``dim``), and when one input is left (or only one was given), returns its
# ``clone()``, which keeps that input's strides. The graph Inductor traces then holds
# other strides than the region was recorded with: a later ``view`` of the key fails
# ("Cannot view a tensor with shape [4, 4, 16, 32] and strides (2048, 16, 1, 64)",
# GPT-2 with eager attention; every attention block lost to eager) or the region's
# output comes back with other strides (Llama: "compiled outputs differ"). Such a
# ``cat`` is lowered as what it is, a copy in eager's layout: ``clone(k,
# memory_format=...)`` with the format of the recorded output, so every backend's
# tracer sees the layout eager produced. Values and dtype are the copy's; a cat whose
# layout is not a memory format (or whose dtype promotion involves the dropped inputs)
# is left as recorded. Found with runtime/layouts.py (Note [Which op's layout
# disagreed]).
_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)


def _format_of(spec: TensorSpec) -> torch.memory_format | None:
    """The memory format whose strides ``spec`` has (size-1 dims aside), or None."""
    for fmt in _FORMATS:
        if (fmt is torch.channels_last and len(spec.shape) != 4) or \
                (fmt is torch.channels_last_3d and len(spec.shape) != 5):
            continue
        want = torch.empty(spec.shape, device="meta", memory_format=fmt).stride()
        if all(n <= 1 or a == b for n, a, b in zip(spec.shape, spec.stride, want)):
            return fmt
    return None


def _explicit_layout(g: fx.Graph, node: Any, args: list, kwargs: dict,
                     specs: Any, env: dict) -> fx.Node | None:
    """A node computing ``node`` with its recorded layout made explicit, or None: keep it."""
    if node.target is not _aten.cat.default or not node.outputs:
        return None
    refs = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else dict(node.kwargs).get("dim", 0)
    kept = []
    for ref in refs:
        if not isinstance(ref, ValueRef):
            return None
        shape = specs[ref.id].shape
        empty = (len(shape) == 1 and shape[0] == 0) or (-len(shape) <= dim < len(shape) and shape[dim] == 0)
        if not empty:
            kept.append(ref)
    out = specs.get(node.outputs[0])
    if len(kept) != 1 or out is None:
        return None
    only = specs[kept[0].id]
    fmt = _format_of(out)
    if fmt is None or only.dtype != out.dtype or only.shape != out.shape:
        return None
    return g.call_function(_aten.clone.default, (env[kept[0].id],), {"memory_format": fmt})


def lower(window: Window, region: Region) -> Lowered:
    """Build the GraphModule of a fused ``region`` of ``window``."""
    g = fx.Graph()
    env: dict[int, fx.Node] = {}
    for j, vid in enumerate(region.inputs):
        env[vid] = g.placeholder(f"in{j}")
    # Note [Aliased inputs are rebuilt as views]: the derived views first
    nodes = list(region.derived) + [window.nodes[i] for i in region.nodes]
    rules = [lift_rule(n, window.specs) if n.args else None for n in nodes]
    scalar_nodes = [g.placeholder(f"s{j}") for j in range(sum(r is not None for r in rules))]
    dtypes: list[torch.dtype] = []
    shapes: list[tuple[int, ...]] = []

    def m(x: Any) -> Any:
        if isinstance(x, ValueRef):
            return env[x.id]
        if isinstance(x, (list, tuple)):
            return type(x)(m(a) for a in x)
        return x

    for node, rule in zip(nodes, rules):
        args = [m(a) for a in node.args]
        kwargs = {k: m(v) for k, v in node.kwargs}
        if rule is None:
            result = _explicit_layout(g, node, args, kwargs, window.specs, env)
            if result is None:
                result = g.call_function(node.target, tuple(args), kwargs)
        else:
            out_dtype = lifted_dtype(node, window.specs)
            dtypes.append(scalar_dtype(out_dtype))
            shapes.append(lifted_shape(node, rule))
            result = rule.emit(g, node.target, args, kwargs, scalar_nodes[len(dtypes) - 1], out_dtype)
        result.meta[SOURCE_META] = node.source
        result.meta[VALUE_META] = node.outputs[0] if node.outputs else None
        if _single_tensor_return(node.target):
            if node.outputs and node.outputs[0] is not None:
                env[node.outputs[0]] = result
                result.meta[SPEC_META] = window.specs.get(node.outputs[0])
            continue
        for k, vid in enumerate(node.outputs):
            if vid is not None:
                env[vid] = g.call_function(operator.getitem, (result, k))
                env[vid].meta[SPEC_META] = window.specs.get(vid)
    g.output(tuple(env[v] for v in region.outputs))
    g.lint()
    gm = fx.GraphModule(torch.nn.Module(), g)
    specs = tuple(window.specs[v] for v in region.inputs)
    return Lowered(gm, specs, tuple(dtypes), tuple(shapes))


__all__ = ["Lowered", "lower", "SOURCE_META", "VALUE_META", "SPEC_META"]
