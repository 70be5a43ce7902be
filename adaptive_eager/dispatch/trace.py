"""Traces of recurring windows: capture that matches what it recorded last time.

Note [Recurring windows are matched, not recorded]
Recording an op costs ~25 µs in Python (encoding its arguments, a meta-memo key and
lookup, ValueRefs, an OpNode, a handle made through a Python ``__new__``), 8x the op.
Most windows recur (a training step, an optimizer step, a forward): the third time a
window key is flushed (Note [Traces start at the third sighting]), its nodes become a trace (:class:`TraceBook`, a trie of
:class:`TNode` per first op, so that windows sharing a prefix share its nodes), and from
then on a window opening with that op is *matched*: each op is compared with the node
expected next by straight-line code generated for it (the op object, each tensor argument
by identity with the handle made in this window or, at a real input's first use, by its
spec, layout bits, storage aliasing and exported state; each constant by type and exact
value; a lifted float by type only, Note [Scalar lifting]) and, when it matches, the
trace's own node is appended and handles are made straight from the recorded specs: no
encoding, no memo, no meta key. It holds because the slow path would record exactly that
node: the same op on inputs of the same specs with the same constants has the same meta
result (the memo's own key), and the values are numbered in the same order.

Invariants (the capture study, ../shared/reference/capture-study/README.md):
1. a node matches only where the slow path would record exactly it (above; floats by bits,
   ints and bools by type; factories reading the default dtype check it);
2. the recorder is always in the slow path's state: a mismatch continues on the slow path
   from that op (``WindowBuilder.leave`` restores its value tables, no replay);
3. the trace holds no strong reference to a handle (weak references, as the recorder);
4. random, sync, metadata and device-crossing ops are never matched at the top of the
   dispatch (``TNode.direct``): they take the mode's router, which matches the node it
   records, after drawing random numbers or checking indices as always;
5. only recorded nodes are in a trace: data-dependent errors stay at the flush;
6. a flush at a trace's end reuses the window's key only when its storage groups and live
   outputs are those of the trace's ending (``TNode.ends``);
7. under FakeTensorMode, ``suspended()`` or while Dynamo runs, ops take the router;
8. the mode's lock is held while matching;
9. a window is flushed where the slow path would flush it (window-full at the same op).
A trace is built only when a window key comes back, never on a first sighting (generating
the code costs ~0.2 ms per node). What invalidates traces empties the book: a learned
kernel layout or a missing meta kernel (the specs or the kind of an op changed), an op
that starts wanting its source line, a new default dtype.

This module keeps the traces (the trie, its bounds, what ended where); match.py encodes a
recorded node's arguments as templates and generates the code that matches them.

Example::

    >>> import torch, adaptive_eager as ae
    >>> ae.reset_stats()
    >>> x = torch.ones(8)
    >>> with ae.adaptive_eager(backend="eager", adaptive_passthrough=False, warmup=False):
    ...     for _ in range(4):
    ...         total = ((x * 2 + 1) * 3).sum().item()
    >>> ae.stats().fast_ops                   # window 4 was matched: 4 ops
    4
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..fusion.ir import OpNode, ValueRef, Window
from ..fusion.signature import freeze
from .match import AGAIN, FIRST, HANDLE, SAME, Encoder, Made, Untraceable, leaves
from .optable import Kind, OpTraits

_get_default_dtype = torch.get_default_dtype


class Tables:
    """The recorder's value tables for the values of one path: ValueRefs, specs, and the
    memo's interned spec ids (the builder's ``_refs`` / ``specs`` / ``_sids``)."""

    __slots__ = ("refs", "specs", "sids")

    def __init__(self, refs: list, specs: dict, sids: dict):
        self.refs, self.specs, self.sids = refs, specs, sids

    def upto(self, n: int) -> "Tables":
        """Fresh copies holding values ``0 .. n-1``."""
        return Tables(self.refs[:n], {v: self.specs[v] for v in range(n)},
                      {v: self.sids[v] for v in range(n)})


class Ending:
    """A window that ended at a node: its key, storage groups and live outputs."""

    __slots__ = ("key", "groups", "outputs")

    def __init__(self, key: Any, groups: dict, outputs: frozenset):
        self.key, self.groups, self.outputs = key, groups, outputs


class TNode:
    """One node of a trace: what to expect, and what to emit when it comes.

    ``emit(rec, args, kwargs)`` returns the op's result (the recorder updated as the slow
    path would have) or MISS (nothing changed). ``direct``: the mode may match it at the top
    of its dispatch (the router would record it with no other effect). ``children``: the
    nodes that followed it in recorded windows (``first`` is tried first); ``ends``: the
    windows that ended here.
    """

    __slots__ = ("func", "node", "made", "sig", "direct", "full", "emit", "children", "first",
                 "ends", "parent", "depth", "vid_end", "tables", "exact", "no_slice")

    def path(self) -> list["TNode"]:
        """The nodes from the trace's first to this one."""
        out = []
        nd: TNode | None = self
        while nd is not None:
            out.append(nd)
            nd = nd.parent
        out.reverse()
        return out

    def exact_specs(self) -> dict:
        """The specs of exactly the values defined up to here (memoized)."""
        t = self.exact
        if t is None:
            t = self.exact = self.tables.upto(self.vid_end)
        return t.specs


class TraceBook:
    """The traces of one session's recurring windows (Note [Recurring windows are
    matched, not recorded]): a trie per first op, bounded. Shared by the session's modes
    in every thread: building is locked, matching reads only."""

    MAX_NODES = 1 << 16
    MAX_CHILDREN = 8
    MAX_OFFERED = 1024

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.roots: dict[Any, list[TNode]] = {}
        self.size = 0
        self.dtype = _get_default_dtype()
        self.verify = False  # tests: check every fast window's key against window_key
        self._lock = threading.Lock()
        # Note [Traces start at the third sighting]: keys offered once, most recent last
        self._offered: dict[Any, None] = {}

    def openers(self, func: Any) -> list[TNode] | None:
        """The traces whose first node is ``func``, most recent first."""
        roots = self.roots.get(func)
        if roots and self.dtype is not _get_default_dtype():
            self.clear()  # type promotion and factories follow the default dtype
            return None
        return roots

    def clear(self) -> None:
        """Forget every trace (what they recorded may no longer be what capture gives)."""
        with self._lock:
            self.roots = {}
            self.size = 0
            self.dtype = _get_default_dtype()

    def add(self, window: Window, made: list[Made], sids: dict, key: Any, groups: dict) -> None:
        """Make ``window`` (recorded with ``made``, ``sids``) a trace ending with ``key``."""
        if len(made) != len(window.nodes) or not window.nodes:
            return
        with self._lock:
            # Note [Traces start at the third sighting]
            # A key offered here has been seen before (its second sighting); it becomes a
            # trace when offered again. Windows seen exactly twice are common where
            # window_size cuts a long loop at drifting offsets (LBFGS on an LSTMCell
            # sequence: 65 of its 256-op windows), and building a trace costs ~90 µs a
            # node (encoding its arguments, the trie), ~1.6 s there.
            if key not in self._offered:
                if len(self._offered) >= self.MAX_OFFERED:
                    self._offered.pop(next(iter(self._offered)))
                self._offered[key] = None
                return
            del self._offered[key]
            if self.size > self.MAX_NODES:
                self.roots = {}
                self.size = 0
            try:
                self._add(window, made, sids, key, groups)
            except Untraceable:
                pass

    def _add(self, window: Window, made: list[Made], sids: dict, key: Any, groups: dict) -> None:
        specs = window.specs
        tables: Tables | None = None  # made with the first new node (a slow window's)
        enc = Encoder(window)
        parent: TNode | None = None
        for i, (node, m) in enumerate(zip(window.nodes, made)):
            pos, kw, outs, lift = enc.node(node, m)
            sig = (node.target, pos, kw, outs, m.structure, node.mutates, node.is_view,
                   m.default_dtype)
            siblings = self.roots.get(node.target, []) if parent is None else parent.children
            nd = next((c for c in siblings if c.sig == sig), None)
            if nd is None:
                if tables is None:
                    n_values = max(specs) + 1
                    tables = Tables([ValueRef(v) for v in range(n_values)], specs,
                                    {v: sids[v] for v in range(n_values)})
                nd = self._new_node(node, m, sig, pos, kw, outs, lift, parent, i, enc.top + 1, tables)
                self._adopt(parent, nd)
            parent = nd
        assert parent is not None
        ending = Ending(key, groups, window.outputs)
        parent.ends = [ending] + [e for e in parent.ends
                                  if (e.outputs, e.groups) != (ending.outputs, ending.groups)][:3]

    def _adopt(self, parent: TNode | None, nd: TNode) -> None:
        if parent is None:
            siblings = self.roots.get(nd.func, [])
        else:
            siblings = parent.children
        siblings = [nd] + siblings
        for dropped in siblings[self.MAX_CHILDREN:]:
            self.size -= _count(dropped)
        siblings = siblings[:self.MAX_CHILDREN]
        if parent is None:
            self.roots[nd.func] = siblings
        else:
            parent.children = siblings
            parent.first = nd
        self.size += 1

    def _new_node(self, node: OpNode, m: Made, sig: tuple, pos: tuple, kw: tuple, outs: tuple,
                  lift: Any, parent: TNode | None, depth: int, vid_end: int,
                  tables: Tables) -> TNode:
        nd = TNode()
        nd.func, nd.node, nd.made, nd.sig = node.target, node, m, sig
        nd.children, nd.first, nd.ends, nd.parent = [], None, [], parent
        nd.depth, nd.vid_end, nd.tables, nd.exact = depth, vid_end, tables, None
        nd.no_slice = set()
        nd.direct = _direct(m.traits, pos, depth)
        nd.full = depth + 1 >= self.window_size
        nd.emit = _lazy(nd, pos, kw, outs, lift)
        return nd


# Note [Matchers are generated when first tried]
# A window key seen three times becomes a trace, but some are not seen again (LBFGS on
# an LSTMCell sequence with capture forced: 65 traces of 256-op windows cut by
# window_size at drifting offsets; generating all their matchers was ~1.8 s of a 4.6 s
# run, against 2.3 s with the fast path off). So a node's matcher is generated the first
# time the mode tries it: a trace that never recurs costs its trie nodes only.
def _lazy(nd: TNode, pos: tuple, kw: tuple, outs: tuple, lift: Any) -> Any:
    def emit(rec: Any, args: tuple, kwargs: dict) -> Any:
        fn = nd.emit = rec.matcher(nd, pos, kw, outs, lift)
        return fn(rec, args, kwargs)
    return emit


def _count(nd: TNode) -> int:
    return 1 + sum(_count(c) for c in nd.children)


def _direct(traits: OpTraits, pos: tuple, depth: int) -> bool:
    """Whether the mode's router would record this node and do nothing else (invariant 4):
    an op it records as such, not one that could run now (Note [Host scalars run now]:
    0-dim real tensors only), not the first of a window (the router asks the policy)."""
    if traits.kind not in (Kind.RECORD, Kind.VIEW) or traits.want_source or depth == 0:
        return False
    tensors = [e for e in leaves(pos) if e[0] in (HANDLE, FIRST, AGAIN, SAME)]
    if tensors and all(e[0] != HANDLE for e in tensors):
        # Only real tensors: the router runs the op now if they are all 0-dim and untouched.
        if all(e[0] != FIRST or len(e[2]) == 0 for e in tensors):
            return False
    return True


def verify_key(window: Window, groups: dict, key: Any, floats: list) -> None:
    """Raise unless ``key`` and ``floats`` are what window_key derives for ``window`` (a
    debugging check of invariants 1 and 6: ``TraceBook.verify``)."""
    from ..fusion.signature import window_key  # noqa: PLC0415 - debugging only

    k, f = window_key(window, groups)
    if k != key or [freeze(x) for x in f] != [freeze(x) for x in floats]:
        raise AssertionError(f"a fast window's key differs from the slow path's: {len(window)} ops, "
                             f"floats {floats} vs {f}")


__all__ = ["TNode", "TraceBook", "Ending", "Tables", "verify_key"]
