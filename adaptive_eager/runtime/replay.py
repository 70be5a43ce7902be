"""Straight-line eager replay of a planned region: generated Python, one call per node.

Note [Generated eager replay]
Replaying a region op by op (executor.run_nodes) costs, per node, a map_refs walk of its
arguments, the OpOverload's Python ``__call__`` frame, a dict store per result and two
progress updates: 9-10 µs per op on a 200-op window of fp32[32] ops, more than the
kernels. A planned window recurs with the same key, and equal keys mean equal nodes up
to their lifted floats (Note [Scalar lifting]), so each eager step of a plan can be
generated once as straight-line Python: values in local variables, each op called
through its C++ handle (``OpOverload._op``), lifted floats read from this window's list,
only the step's outputs stored back. It is generated at the step's second run (a plan
is made at its window's second sighting: its third one is the first to use this), so
windows seen twice pay nothing for it. Progress (Note [A failed flush loses no work],
runtime/recovery.py) is kept by a local counter: when a node raises, the nodes before it
are marked done, it is the node that raised, and every value computed so far is put in
the env, exactly what run_nodes would have left. Nodes whose target is not an
OpOverload, or that the generator does not handle, leave the step on run_nodes.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> aten = torch.ops.aten
    >>> x = torch.ones(2); s = TensorSpec.of(x)
    >>> w = Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), 3.0), (), (1,)),
    ...                     OpNode(aten.add.Tensor, (ValueRef(1), ValueRef(0)), (), (2,))),
    ...            {0: s, 1: s, 2: s}, frozenset({2}))
    >>> fn = generate(w, (0, 1), (2,), {0: (0, 1)})     # node 0's float is lifted: F[0]
    >>> env = w.progress.start(w.inputs)
    >>> fn(env, [5.0], w.progress); env[2]
    tensor([6., 6.])
"""

from __future__ import annotations

import keyword
from typing import Any, Callable, Mapping

import torch

from ..fusion.ir import ValueRef, Window

_OpOverload = torch._ops.OpOverload
_NONE: Mapping[int, tuple[int, ...]] = {}


def _returns_list(op: Any) -> bool:
    """Whether ``op`` returns a list of tensors (a foreach op): one over a single tensor
    has one output value, which is the list's element, as ``run_node`` stores it (issue
    27: a one-parameter AdamW step cut by a full window replayed ``[[t]]``)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any(isinstance(r.type, torch._C.ListType) for r in schema.returns)


class Unsupported(Exception):
    """A node the generator does not handle: the step keeps run_nodes."""


class _Emitter:
    """The lines of one generated replay: loads from ``env``, calls, releases."""

    def __init__(self, nodes: tuple[int, ...]) -> None:
        self.ns: dict[str, Any] = {"NODES": nodes}
        self.lines: list[str] = []
        self.loaded: set[int] = set()
        self.from_env: set[int] = set()
        self.consts: dict[int, str] = {}

    def const(self, v: Any) -> str:
        name = self.consts.get(id(v))
        if name is None:
            name = self.consts[id(v)] = f"K{len(self.consts)}"
            self.ns[name] = v
        return name

    def value(self, vid: int) -> str:
        if vid not in self.loaded:
            self.loaded.add(vid)
            self.from_env.add(vid)
            self.lines.append(f"        v{vid} = env[{vid}]")
        return f"v{vid}"

    def expr(self, a: Any) -> str:
        t = type(a)
        if t is ValueRef:
            return self.value(a.id)
        if (t is list or t is tuple) and any(type(b) in (ValueRef, list, tuple) for b in a):
            inner = ", ".join(self.expr(b) for b in a)
            return f"[{inner}]" if t is list else f"({inner},)"
        if a is None or t is bool or t is int:
            return repr(a)
        return self.const(a)

    def call(self, node: Any, slot: tuple[int, int | str] | None) -> str:
        """The node's call, its lifted float (``slot``) read from ``F``."""
        args = [self.expr(a) for a in node.args]
        kwargs = [(k, self.expr(v)) for k, v in node.kwargs]
        if slot is not None:
            fi, where = slot
            if isinstance(where, int):
                args[where] = f"F[{fi}]"
            else:
                kwargs = [(k, f"F[{fi}]" if k == where else v) for k, v in kwargs]
        plain = [f"{k}={v}" for k, v in kwargs if k.isidentifier() and not keyword.iskeyword(k)]
        odd = [f"{k!r}: {v}" for k, v in kwargs if not (k.isidentifier() and not keyword.iskeyword(k))]
        call_args = args + plain + ([f"**{{{', '.join(odd)}}}"] if odd else [])
        return f"{self.const(node.target._op)}({', '.join(call_args)})"

    def store(self, node: Any, call: str) -> None:
        """``call``'s fresh outputs bound to their value names (mutated ones are not new)."""
        outs, mutated = node.outputs, set(node.mutates)
        fresh = [v for v in outs if v is not None and v not in mutated]
        if not fresh:
            self.lines.append(f"        {call}")
        elif len(outs) == 1 and not _returns_list(node.target):
            self.lines.append(f"        v{outs[0]} = {call}")
        else:
            self.lines.append(f"        r = {call}")
            self.lines += [f"        v{vid} = r[{j}]" for j, vid in enumerate(outs)
                           if vid is not None and vid not in mutated]
            self.lines.append("        del r")
        self.loaded.update(fresh)

    def release(self, vids: tuple[int, ...], outputs: tuple[int, ...]) -> None:
        for vid in vids:
            if vid in self.loaded and vid not in outputs:
                self.loaded.discard(vid)
                self.lines.append(f"        del v{vid}")
                if vid in self.from_env:
                    self.lines.append(f"        env.pop({vid}, None)")


def generate(window: Window, nodes: tuple[int, ...], outputs: tuple[int, ...],
             lifted: Mapping[int, tuple[int, int | str]],
             release: Mapping[int, tuple[int, ...]] = _NONE) -> Callable[[dict, list, Any], None]:
    """``replay(env, floats, progress)`` running ``window.nodes[i]`` for ``i`` in ``nodes``.

    ``outputs``: the value ids stored back into ``env``; ``lifted``: node index ->
    (index in ``floats``, where the node holds its lifted float); ``release``: node index
    -> the value ids dropped (from the locals and ``env``) right after it (Note [Replay
    frees at last use], fusion/liveness.py). Raises Unsupported.
    """
    em = _Emitter(nodes)
    for n, i in enumerate(nodes):
        node = window.nodes[i]
        if type(node.target) is not _OpOverload:
            raise Unsupported(f"target {node.target!r}")
        em.lines.append(f"        n = {n}")  # before its loads: a failure is this node's
        em.store(node, em.call(node, lifted.get(i)))
        em.release(release.get(i, ()), outputs)
    body = ["def replay(env, F, progress):", "    n = 0", "    try:"]
    body += em.lines or ["        pass"]
    body += [
        "    except BaseException:",
        "        progress.done.extend(NODES[:n])",
        "        progress.at = NODES[n]",
        "        _spill(env, locals())",
        "        raise",
        "    progress.done.extend(NODES)",
    ]
    body += [f"    env[{vid}] = v{vid}" for vid in outputs if vid in em.loaded]
    ns = em.ns
    ns["_spill"] = _spill
    src = "\n".join(body)
    code = compile(src, f"<adaptive_eager replay of {len(nodes)} nodes>", "exec")
    exec(code, ns)  # noqa: S102 - generated from the window's own nodes
    fn = ns["replay"]
    fn.source = src
    return fn


class EagerReplay:
    """One step's generated replay, made at the step's second run (Note [Generated eager
    replay]); shared by every run of its plan (in any thread: it holds no run's state)."""

    __slots__ = ("nodes", "outputs", "lifted", "release", "runs", "fn")

    def __init__(self, nodes: tuple[int, ...], outputs: tuple[int, ...],
                 lifted: Mapping[int, tuple[int, int | str]],
                 release: Mapping[int, tuple[int, ...]] = _NONE):
        self.nodes = nodes
        self.outputs = outputs
        self.lifted = lifted
        self.release = release  # node index -> ids dropped after it (fusion/liveness.py)
        self.runs = 0
        self.fn: Callable[[dict, list, Any], None] | None = None

    def run(self, window: Window, env: dict, floats: list) -> bool:
        """Run the step's nodes on ``env`` if generated (True), else count a run (False:
        the caller runs them with run_nodes)."""
        fn = self.fn
        if fn is not None:
            fn(env, floats, window.progress)
            return True
        self.runs += 1
        if self.runs == 2:
            try:
                self.fn = generate(window, self.nodes, self.outputs, self.lifted, self.release)
            except Unsupported:
                pass
        return False


def _spill(env: dict, local: dict) -> None:
    """Put the values a failed replay computed into ``env`` (for runtime.recovery)."""
    for name, value in local.items():
        if name[0] == "v" and name[1:].isdigit():
            env[int(name[1:])] = value


__all__ = ["generate", "EagerReplay", "Unsupported"]
