"""Layouts: which op of a region's graph gets other strides than eager, and where.

A region is recorded with eager's layouts (meta kernels, or specs seeded from real
runs), and its GraphModule's views are valid for them. A compiler traces the graph
again, on fake tensors, after its own decompositions, and a decomposition that lays out
its result otherwise makes a later ``view`` fail ("Cannot view a tensor with shape ...
and strides ...") or a region output come back with other strides than the program was
promised. :func:`layout_disagreements` finds those ops: it runs each node of the graph
on fake tensors with eager's layouts, and once more through the backend's decompositions
(and, with ``real=True``, through the real kernel on zero-filled stand-ins on the
examples' devices: CPU or the emulated neuron device), and reports every node whose
output strides differ (Note [Which op's layout disagreed]).

Example::

    >>> import torch, torch.fx as fx
    >>> from torch._inductor.decomposition import select_decomp_table
    >>> aten = torch.ops.aten
    >>> g = fx.Graph(); e = g.placeholder("e"); x = g.placeholder("x")
    >>> t = g.call_function(aten.transpose.int, (x, 1, 2))
    >>> c = g.call_function(aten.cat.default, ([e, t], -2))
    >>> _ = g.output((c,))
    >>> gm = fx.GraphModule(torch.nn.Module(), g)
    >>> found = layout_disagreements(gm, [torch.zeros(0), torch.zeros(2, 3, 4)],
    ...                              select_decomp_table())
    >>> found[0].op, found[0].eager_stride, found[0].compiled_stride
    ('aten::cat', (12, 3, 1), (12, 1, 4))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from ..fusion.fxgraph import SOURCE_META, SPEC_META, VALUE_META
from ..fusion.ir import TensorSpec, Window, op_name
from ..fusion.partition import Region
from .checks import meta_problem


@dataclass(frozen=True)
class LayoutDisagreement:
    """One node whose output strides differ between eager and a compiler (or the kernel).

    ``by``: "compiler" (the backend's decompositions) or "kernel" (the real kernel on
    the examples' device, against the meta kernel). ``output``: which of the node's
    tensor results.
    """

    node: str
    op: str
    by: str
    output: int
    shape: tuple[int, ...]
    eager_stride: tuple[int, ...]
    compiled_stride: tuple[int, ...]
    source: str | None = None
    value: int | None = None
    target: Any = field(default=None, compare=False, repr=False)  # the OpOverload

    def describe(self) -> str:
        """One line for a report or a log.

        Example::

            >>> print(LayoutDisagreement("cat", "aten::cat", "compiler", 0, (2, 3), (3, 1),
            ...                          (1, 2), "m.py:3").describe())
            aten::cat (at m.py:3): strides (3, 1) in eager, (1, 2) after the compiler's decompositions, shape (2, 3)
        """
        where = f" (at {self.source})" if self.source else ""
        how = "after the compiler's decompositions" if self.by == "compiler" else "from the real kernel"
        return (f"{self.op}{where}: strides {self.eager_stride} in eager, {self.compiled_stride} "
                f"{how}, shape {self.shape}")


class _Decomposing(TorchDispatchMode):
    """Runs ops through ``table``'s decompositions, recursively, as a compiler's tracer does."""

    def __init__(self, table: Mapping[Any, Any]):
        super().__init__()
        self.table = table

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        decomposition = self.table.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _tensors(value: Any) -> list[torch.Tensor | None]:
    leaves = tree_flatten(value)[0] if isinstance(value, (list, tuple)) else [value]
    return [v if isinstance(v, torch.Tensor) else None for v in leaves]


def _strided_differently(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Shapes equal and a stride of a dim longer than 1 differs (a size-1 dim's stride
    is never read, Note [Layouts only the kernel knows] in dispatch/meta.py)."""
    if tuple(a.shape) != tuple(b.shape):
        return True
    return any(n > 1 and x != y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def _like(t: torch.Tensor, device: Any) -> torch.Tensor:
    """A zero-filled tensor of ``t``'s layout on ``device`` (fake under a FakeTensorMode)."""
    extent = t.storage_offset() + (1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
                                   if t.numel() else 0)
    base = torch.zeros(max(extent, 1), dtype=t.dtype, device=device)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _recorded(node: fx.Node, value: Any) -> Any:
    """``value`` (meta tensors) restrided to the specs the region was recorded with."""
    spec = node.meta.get(SPEC_META)
    if spec is None or not isinstance(value, torch.Tensor) or tuple(value.shape) != spec.shape:
        return value
    return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="meta")


def layout_disagreements(gm: fx.GraphModule, example_inputs: Sequence[Any],
                         decompositions: Mapping[Any, Any] | None = None,
                         real: bool = False, first: bool = False) -> list[LayoutDisagreement]:
    """The nodes of ``gm`` whose output strides differ from eager's (Note [Which op's
    layout disagreed]), in graph order: under ``decompositions`` (a compiler's table,
    e.g. Inductor's ``select_decomp_table()``, run on fake tensors as a compiler's tracer
    does), and with ``real``, from the real kernel on zero-filled stand-ins on the
    examples' device. Eager's layouts are the ones the region was recorded with (fx
    node meta set by ``lower``), else the meta kernels'. Each node is run on eager's
    layouts of its inputs, so a disagreement is the node's own, not inherited.
    ``first``: stop at the first one. Nodes that fail to run are skipped.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415 - rare path

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    device = next((x.device for x in example_inputs
                   if isinstance(x, torch.Tensor) and x.dim() > 0), torch.device("cpu"))
    env: dict[fx.Node, Any] = {}
    placeholders = iter(example_inputs)
    found: list[LayoutDisagreement] = []
    decomposing = _Decomposing(decompositions) if decompositions else None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            x = next(placeholders)
            env[node] = _like(x, "meta") if isinstance(x, torch.Tensor) else x
            continue
        if node.op != "call_function":
            continue
        args = fx.node.map_arg(node.args, lambda n: env.get(n))
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env.get(n))
        try:
            eager = env[node] = _recorded(node, node.target(*args, **kwargs))
        except Exception:  # noqa: BLE001 - a node meta tensors cannot run: not judged
            env[node] = None
            continue
        if not hasattr(node.target, "_schema"):
            continue  # operator.getitem: its tuple's node was checked
        others = []
        if decomposing is not None and node.target in decomposing.table:
            others.append(("compiler", lambda: _run_decomposed(mode, decomposing, node, args,
                                                               kwargs, device)))
        if real:
            others.append(("kernel", lambda: _run_real(node, args, kwargs, device)))
        for by, run in others:
            try:
                other = run()
            except Exception:  # noqa: BLE001 - not judged
                continue
            for k, (a, b) in enumerate(zip(_tensors(eager), _tensors(other))):
                if a is not None and b is not None and _strided_differently(a, b):
                    found.append(LayoutDisagreement(
                        node.name, op_name(node.target), by, k, tuple(a.shape), tuple(a.stride()),
                        tuple(b.stride()), node.meta.get(SOURCE_META), node.meta.get(VALUE_META),
                        node.target))
                    if first:
                        return found
    return found


def _on(device: Any, args: Any, kwargs: Any) -> tuple:
    return tree_map_only(torch.Tensor, lambda t: _like(t, device), (args, kwargs))


def _run_decomposed(mode: Any, decomposing: _Decomposing, node: fx.Node, args: Any,
                    kwargs: Any, device: Any) -> Any:
    with mode:
        args, kwargs = _on(device, args, kwargs)
        with decomposing:
            return node.target(*args, **kwargs)


def _run_real(node: fx.Node, args: Any, kwargs: Any, device: Any) -> Any:
    args, kwargs = _on(device, args, kwargs)
    with torch.no_grad():
        return node.target(*args, **kwargs)


# Note [Which op's layout disagreed]
# Inductor's compile failure "Cannot view a tensor with shape [4, 4, 16, 32] and strides
# (2048, 16, 1, 64) as a tensor with shape (16, 16, 32)" (GPT-2 with eager attention)
# names the view that failed, not the op that laid out its input otherwise: here a
# ``cat`` of the key cache 15 nodes earlier, which Inductor's decomposition turns into a
# ``clone`` of the one non-empty input, keeping that input's transposed strides where
# eager's cat returns a contiguous tensor. So a compile failure that mentions strides or
# a view, and a compiled output whose strides differ, are followed by this check, and
# the report's reason names the op and the program's line. It runs only on a failure
# (a fake run of each node, ~1 ms a node).
def explains_layout(error: BaseException | str) -> bool:
    """Whether a compile failure may come from a layout disagreement.

    Example::

        >>> explains_layout("ValueError: Cannot view a tensor with shape [4] and strides (2,)")
        True
    """
    text = str(error).lower()
    return any(w in text for w in ("stride", "cannot view", "view size is not compatible"))


def input_disagreement(window: Window, region: Region, args: Sequence[Any],
                       compiled_for: Sequence[TensorSpec] = ()) -> str | None:
    """``"input %v (aten::op at line): got strides ..., recorded ..."`` for the first
    argument of a compiled call whose layout is not the one its region was compiled for
    (``compiled_for``: the example inputs' specs; the recorded specs where not given), or
    None: what a compiled call's stride assertion ("expected size 4==4, stride 32==0 at
    dim=0") does not say (Note [Which op's layout disagreed])."""
    for j, (vid, a) in enumerate(zip(region.inputs, args)):
        want = compiled_for[j] if j < len(compiled_for) else window.specs[vid]
        problem = meta_problem(a, want) if isinstance(a, torch.Tensor) else None
        if problem is None:
            continue
        if j < len(compiled_for):
            problem = problem.replace("recorded", "compiled for")
        node = next((n for n in window.nodes if vid in n.outputs), None)
        made = f" ({node.name}{' at ' + node.source if node.source else ''})" if node else \
            " (a real tensor)"
        return f"input %{vid}{made}: {problem}"
    return None


__all__ = ["LayoutDisagreement", "layout_disagreements", "explains_layout", "input_disagreement"]
