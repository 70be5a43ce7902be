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
            result = g.call_function(node.target, tuple(args), kwargs)
        else:
            out_dtype = lifted_dtype(node, window.specs)
            dtypes.append(scalar_dtype(out_dtype))
            shapes.append(lifted_shape(node, rule))
            result = rule.emit(g, node.target, args, kwargs, scalar_nodes[len(dtypes) - 1], out_dtype)
        if _single_tensor_return(node.target):
            if node.outputs and node.outputs[0] is not None:
                env[node.outputs[0]] = result
            continue
        for k, vid in enumerate(node.outputs):
            if vid is not None:
                env[vid] = g.call_function(operator.getitem, (result, k))
    g.output(tuple(env[v] for v in region.outputs))
    g.lint()
    gm = fx.GraphModule(torch.nn.Module(), g)
    specs = tuple(window.specs[v] for v in region.inputs)
    return Lowered(gm, specs, tuple(dtypes), tuple(shapes))


__all__ = ["Lowered", "lower"]
