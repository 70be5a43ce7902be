"""The micro-graph IR: what a flushed window hands to the runtime.

A window is a straight-line program of ATen ops in the order the user's program
issued them. Values are numbered with small ints ("value ids"), shared by the
window's real-tensor inputs and its ops' outputs.

+------------+----------------------------------------------------------------+
| piece      | meaning                                                        |
+============+================================================================+
| ValueRef   | stands for a tensor argument inside ``OpNode.args``/``kwargs``  |
| OpNode     | one ATen op: target, args with ValueRefs, the value ids of its |
|            | tensor results (in-place ops name the id they mutate), and the |
|            | ids it mutates                                                 |
| TensorSpec | metadata of one value (shape, stride, offset, dtype, device)   |
| Window     | inputs (id -> real tensor), nodes, specs, live outputs, and    |
|            | the reason the window was flushed                              |
| Progress   | how far a run of the window got (filled in by whoever runs it) |
+------------+----------------------------------------------------------------+

Semantics: running ``nodes`` in order with real tensors, in-place ops mutating
their arguments and view ops returning real views, is exactly what eager would
have done. Anything that reorders or fuses nodes (the partitioner, a compiler)
must preserve that meaning; the aliasing facts it needs are ``OpNode.mutates``,
``OpNode.is_view`` and ``Window.alias_root``.

Example::

    >>> import torch
    >>> aten = torch.ops.aten
    >>> x = torch.ones(3)
    >>> spec = TensorSpec.of(x)
    >>> w = Window(
    ...     inputs={0: x},
    ...     nodes=(OpNode(aten.mul.Tensor, (ValueRef(0), ValueRef(0)), (), (1,)),),
    ...     specs={0: spec, 1: spec},
    ...     outputs=frozenset({1}),
    ... )
    >>> [n.target for n in w.nodes]
    [<OpOverload(op='aten.mul', overload='Tensor')>]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple

import torch


# Note [Cheap IR records]
# ValueRef and OpNode are created once per captured op, on the hot path (a few µs
# budget per op). A frozen dataclass costs ~2 µs to build; these are a __slots__
# class and a NamedTuple instead. Treat both as immutable.
class ValueRef:
    """A tensor argument of an op, by value id. Immutable by convention."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __eq__(self, other: object) -> bool:
        return type(other) is ValueRef and other.id == self.id

    def __hash__(self) -> int:
        return hash(("ValueRef", self.id))

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Everything about a tensor except its data."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: torch.Tensor) -> "TensorSpec":
        return TensorSpec(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.device)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def extent(self) -> int:
        """Elements of storage the view reaches: the largest offset it reads plus one (its
        offset alone when it has no elements). The one formula for every stand-in made
        from a spec (meta tensors, compile examples, restrided wrappers).

        Example::

            >>> TensorSpec((2, 3), (1, 2), 4, torch.float32, torch.device("cpu")).extent
            10
        """
        if any(n == 0 for n in self.shape):
            return self.storage_offset
        return self.storage_offset + 1 + sum((n - 1) * abs(st) for n, st in zip(self.shape, self.stride))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class OpNode(NamedTuple):
    """One recorded ATen op.

    ``outputs`` lists the value id of each tensor in the op's flattened result
    (``None`` for a ``None`` slot); an in-place or ``out=`` op lists the id of the
    tensor it returns, which is the id it mutates. ``mutates`` lists every id the op
    writes. ``is_view`` is true when the results alias an argument without writing.
    ``source`` is optional: the user's line that issued the op, when recorded.
    """

    target: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]
    outputs: tuple[int | None, ...]
    mutates: tuple[int, ...] = ()
    is_view: bool = False
    source: str | None = None

    def inputs(self) -> Iterator[int]:
        """Value ids read by this op, in argument order (with repeats)."""
        for a in _leaves(self.args):
            if isinstance(a, ValueRef):
                yield a.id
        for _, a in self.kwargs:
            for leaf in _leaves((a,)):
                if isinstance(leaf, ValueRef):
                    yield leaf.id

    @property
    def name(self) -> str:
        return op_name(self.target)


def op_name(target: Any) -> str:
    """The name reports use for an op: ``aten::add.Tensor``, ``aten::nonzero`` (as
    ``OpOverload.name()`` says; the mode names ops the same way), else its ``__name__``."""
    name = getattr(target, "name", None)
    if callable(name) and hasattr(target, "_schema"):
        return name()
    return str(getattr(target, "__name__", target))


def _leaves(args: tuple) -> Iterator[Any]:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _leaves(a)
        else:
            yield a


class Progress:
    """How far the current run of a window got; whoever runs the window keeps it.

    ``env``: the dict of values by id the run computes into (from :meth:`start`);
    ``done``: indices of the nodes whose effects have been applied; ``at``: the index
    of the node running eagerly right now (-1: none). After a run failed part-way,
    this is what lets the rest of the window be finished without applying any
    in-place update twice (Note [A failed flush loses no work], runtime/recovery.py).
    """

    __slots__ = ("env", "done", "at")

    def __init__(self) -> None:
        self.env: dict[int, Any] | None = None
        self.done: list[int] = []
        self.at = -1

    def start(self, inputs: dict[int, Any], take: bool = False) -> dict[int, Any]:
        """A fresh env holding ``inputs``, recorded as this run's (progress reset).

        ``take``: the run owns the input tensors from here (``Window.start_run``): the
        values of ``inputs`` become None (its ids stay), so that an input the program
        dropped is freed at its last use in the run (Note [Replay frees at last use],
        fusion/liveness.py).
        """
        env = self.env = dict(inputs)
        if take:
            for k in inputs:
                inputs[k] = None
        self.done = []
        self.at = -1
        return env


@dataclass(frozen=True)
class Window:
    """A flushed window: the unit of work handed from dispatch to the runtime.

    ``outputs`` are the ids whose tensors the program can still see (live handles);
    values outside it are intermediates that need never be materialized. Inputs
    listed in some node's ``mutates`` must be updated in place by whoever runs the
    window. ``alias_root`` maps a value produced by a view op to the value whose
    storage it shares (absent: the value is its own root). ``owned``: the window is run
    once and its run takes the input tensors (:meth:`start_run`; the recorder's windows):
    after the run starts, ``inputs`` keeps only their ids, so a dead input is freed at
    its last use (Note [Replay frees at last use], fusion/liveness.py).
    """

    inputs: Mapping[int, torch.Tensor]
    nodes: tuple[OpNode, ...]
    specs: Mapping[int, TensorSpec]
    outputs: frozenset[int]
    alias_root: Mapping[int, int] = field(default_factory=dict)
    reason: str = "sync"
    source: str | None = None
    opened_ns: int = 0  # perf_counter_ns() when its first op was recorded (0: unknown)
    progress: Progress = field(default_factory=Progress, compare=False, repr=False)
    owned: bool = False

    def start_run(self) -> dict[int, Any]:
        """Start a run: the env holding the inputs (``Progress.start``)."""
        return self.progress.start(self.inputs, take=self.owned)  # type: ignore[arg-type]

    def mutated_inputs(self) -> frozenset[int]:
        """Ids of real input tensors (or views of them) written by some node."""
        roots = set()
        for node in self.nodes:
            for vid in node.mutates:
                roots.add(self.alias_root.get(vid, vid))
        return frozenset(r for r in roots if r in self.inputs)

    def root(self, vid: int) -> int:
        return self.alias_root.get(vid, vid)

    def __len__(self) -> int:
        return len(self.nodes)


def map_refs(obj: Any, env: Mapping[int, Any]) -> Any:
    """Replace every ValueRef in a (nested) args structure by ``env[id]``."""
    if isinstance(obj, ValueRef):
        return env[obj.id]
    if isinstance(obj, tuple):
        return tuple(map_refs(o, env) for o in obj)
    if isinstance(obj, list):
        return [map_refs(o, env) for o in obj]
    return obj


__all__ = ["ValueRef", "TensorSpec", "OpNode", "Window", "Progress", "map_refs", "op_name"]
