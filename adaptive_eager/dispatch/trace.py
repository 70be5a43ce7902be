"""Traces of recurring windows: capture that matches what it recorded last time.

Note [Recurring windows are matched, not recorded]
Recording an op costs ~25 µs in Python (encoding its arguments, a meta-memo key and
lookup, ValueRefs, an OpNode, a handle made through a Python ``__new__``), 8x the op.
Most windows recur (a training step, an optimizer step, a forward): the second time a
window key is flushed, its nodes become a trace (:class:`TraceBook`, a trie of
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
   from that op (``Recorder.leave`` restores its value tables, no replay);
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

Example::

    >>> import torch, adaptive_eager as ae
    >>> ae.reset_stats()
    >>> x = torch.ones(8)
    >>> with ae.adaptive_eager(backend="eager", adaptive_passthrough=False, warmup=False):
    ...     for _ in range(4):
    ...         total = ((x * 2 + 1) * 3).sum().item()
    >>> ae.stats().fast_ops                   # windows 3 and 4 were matched: 4 ops each
    8
"""

from __future__ import annotations

import struct
import threading
import time
import weakref
from math import copysign
from typing import Any, Callable, NamedTuple

import torch

from ..fusion.ir import OpNode, TensorSpec, ValueRef, Window
from ..fusion.scalars import lift_rule
from ..fusion.signature import _freeze
from .exported import _EXPORTED, is_exported
from .lazy import LazyTensor, contiguous_strides
from .optable import Kind, OpTraits

_make = torch.Tensor._make_wrapper_subclass
_storage_id_of = torch._C._storage_id
_get_default_dtype = torch.get_default_dtype
_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_PLAIN_DISPATCH = torch._C._disabled_torch_dispatch_impl
_F64 = struct.Struct("<d")
_INT_LISTS = ("int[", "SymInt[", "bool[")  # schema types whose lists box only ints (bools)


class _Miss:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS: Any = _Miss()  # an emitter's answer when the op is not the node it expects

# Template tags: what one argument of a node was when it was recorded (SAME: an input
# first seen by an earlier argument of the same node).
HANDLE, FIRST, AGAIN, CONST, LIFTED, NESTED, SAME = range(7)


class Made(NamedTuple):
    """What the recorder knew about one recorded node besides its OpNode: its traits, its
    return structure, the default dtype a factory read (None: none) and whether the
    program passed ``dtype=`` (None) itself."""

    traits: OpTraits
    structure: str
    default_dtype: torch.dtype | None = None
    dtype_given: bool = False


class Tables:
    """The recorder's value tables for the values of one path: ValueRefs, specs, and the
    memo's interned spec ids (Recorder._refs / specs / _sids)."""

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

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.roots: dict[Any, list[TNode]] = {}
        self.size = 0
        self.dtype = _get_default_dtype()
        self.verify = False  # tests: check every fast window's key against window_key
        self._lock = threading.Lock()

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
            if self.size > self.MAX_NODES:
                self.roots = {}
                self.size = 0
            try:
                self._add(window, made, sids, key, groups)
            except _Untraceable:
                pass

    def _add(self, window: Window, made: list[Made], sids: dict, key: Any, groups: dict) -> None:
        specs = window.specs
        tables: Tables | None = None  # made with the first new node (a slow window's)
        enc = _Encoder(window)
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
        nd.emit = _generate(nd, pos, kw, outs, lift)
        return nd


class _Untraceable(Exception):
    """A window the trace builder does not handle (it stays on the slow path)."""


def _count(nd: TNode) -> int:
    return 1 + sum(_count(c) for c in nd.children)


def _direct(traits: OpTraits, pos: tuple, depth: int) -> bool:
    """Whether the mode's router would record this node and do nothing else (invariant 4):
    an op it records as such, not one that could run now (Note [Host scalars run now]:
    0-dim real tensors only), not the first of a window (the router asks the policy)."""
    if traits.kind not in (Kind.RECORD, Kind.VIEW) or traits.want_source or depth == 0:
        return False
    tensors = [e for e in _leaves(pos) if e[0] in (HANDLE, FIRST, AGAIN, SAME)]
    if tensors and all(e[0] != HANDLE for e in tensors):
        # Only real tensors: the router runs the op now if they are all 0-dim and untouched.
        if all(e[0] != FIRST or len(e[2]) == 0 for e in tensors):
            return False
    return True


def _leaves(entries: tuple):
    for e in entries:
        if e[0] == NESTED:
            yield from _leaves(e[2])
        else:
            yield e


class _Encoder:
    """Turns a recorded window's nodes into argument templates, in recording order."""

    def __init__(self, window: Window):
        self.inputs = window.inputs
        self.specs = window.specs
        self.alias_root = window.alias_root
        self.seen: set[int] = set()
        self.top = -1

    def node(self, node: OpNode, m: Made) -> tuple[tuple, tuple, tuple, Any]:
        self.fresh: set[int] = set()  # inputs first seen by this node
        rule = lift_rule(node, self.specs) if node.args else None
        lift = rule.where if rule is not None else None
        many = rule.many if rule is not None else False
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            raise _Untraceable(node.target)
        types = {}
        for i, a in enumerate(schema.arguments):
            types[a.name if a.kwarg_only else i] = str(a.type)
        pos = tuple(self._lifted(a, many) if lift == i else self.arg(a, types.get(i, ""))
                    for i, a in enumerate(node.args))
        kw = []
        injected = m.default_dtype is not None and m.structure == "tensor"
        for k, v in node.kwargs:
            if k == "dtype" and injected:
                if m.dtype_given:
                    kw.append((k, (CONST, type(None), None, None)))
                continue
            kw.append((k, self._lifted(v, many) if lift == k else self.arg(v, types.get(k, ""))))
        outs = []
        ret_alias, mutated = m.traits.return_alias, m.traits.mutated_args
        kwargs = dict(node.kwargs)
        for i, vid in enumerate(node.outputs):
            if vid is None:
                outs.append(None)
                continue
            # As Recorder._append: a return aliasing a written argument is that argument.
            alias = ret_alias[i] if i < len(ret_alias) else (ret_alias[0] if ret_alias else None)
            if alias is not None and alias in mutated:
                arg = kwargs.get(alias) if isinstance(alias, str) else node.args[alias]
                outs.append((1, alias, i if isinstance(arg, (list, tuple)) else None))
                continue
            if vid in self.seen:
                raise _Untraceable(f"value %{vid} made twice")
            self.seen.add(vid)
            self.top = max(self.top, vid)
            outs.append((0, vid, self.specs[vid], self.alias_root.get(vid)))
        return pos, tuple(kw), tuple(outs), lift

    def _lifted(self, a: Any, many: bool) -> tuple:
        return (LIFTED, many, len(a) if many else 0)

    def arg(self, a: Any, schema_type: str) -> tuple:
        t = type(a)
        if t is ValueRef:
            v = a.id
            self.top = max(self.top, v)
            if v in self.inputs:
                if v in self.seen:
                    return (SAME, v) if v in self.fresh else (AGAIN, v)
                self.seen.add(v)
                self.fresh.add(v)
                s = self.specs[v]
                return (FIRST, v, s.shape, s.stride, s.storage_offset, s.dtype, s.device,
                        self.alias_root.get(v))
            if v not in self.seen:
                raise _Untraceable(f"value %{v} used before it is made")
            return (HANDLE, v)
        if (t is list or t is tuple) and any(type(b) in (ValueRef, list, tuple) for b in a):
            return (NESTED, t, tuple(self.arg(b, "") for b in a))
        exact = _freeze(a)
        if t is list and schema_type.startswith(_INT_LISTS):
            return (CONST, t, a, exact, True)  # boxed ints (bools): == is exact
        return (CONST, t, a, exact)


# -- code generation -------------------------------------------------------------------------
def _first(rec: Any, a: Any, e: tuple, pending: list) -> bool:
    """Whether ``a`` is a real input the slow path would number ``e[1]`` with ``e``'s spec
    and aliasing (the checks of Recorder._input_vid); queues it in ``pending``."""
    t = a
    tt = type(t)
    if tt is LazyTensor:
        t = t._ae_real
        if t is None:
            return False
    elif tt not in _PLAIN and not (isinstance(t, torch.Tensor) and tt.__torch_dispatch__ is _PLAIN_DISPATCH):
        return False
    if t.dtype is not e[5] or t.shape != e[2] or t.stride() != e[3] or t.storage_offset() != e[4] \
            or t.device != e[6]:
        return False
    if t.layout is not _STRIDED or t.is_conj() or t.is_neg() or t._is_zerotensor():
        return False
    if id(t) in rec._input_ids or any(p[1] is t for p in pending):
        return False  # the slow path would reuse that input's value id
    try:
        sid = _storage_id_of(t)
    except Exception:  # noqa: BLE001 - storage-less tensors
        sid = None
    root = None
    if sid is not None:
        if sid in _EXPORTED and is_exported(sid):
            return False  # Note [Exported memory]: the slow path runs the op now
        root = rec._storages.get(sid)
        if root is None:
            root = next((p[0] for p in pending if p[2] == sid), None)
    if root != e[7]:
        return False
    pending.append((e[1], t, sid))
    return True


def _same(a: Any, vid: int, pending: list) -> bool:
    """Whether ``a`` is the input an earlier argument of this node matched as ``vid``."""
    t = a._ae_real if type(a) is LazyTensor else a
    return t is not None and any(p[0] == vid and p[1] is t for p in pending)


def _register(rec: Any, pending: list) -> None:
    """Make the matched real inputs inputs of the window (as Recorder._input_vid does)."""
    H = rec.H
    for vid, t, sid in pending:
        H[vid] = t
        rec._input_ids[id(t)] = vid
        rec.inputs[vid] = t
        if sid is not None:
            first = rec._storages.setdefault(sid, vid)
            if first != vid:
                rec.alias_root[vid] = first


def _rebuild(node: OpNode, where: int | str, value: Any) -> OpNode:
    """``node`` holding this window's value of its lifted float (eager replay reads it)."""
    if type(where) is int:
        args = list(node.args)
        args[where] = value
        return node._replace(args=tuple(args))
    return node._replace(kwargs=tuple((k, value if k == where else v) for k, v in node.kwargs))


def _all_floats(a: list) -> bool:
    for x in a:
        if type(x) is not float:
            return False
    return True


def _generate(nd: TNode, pos: tuple, kw: tuple, outs: tuple, lift: Any) -> Callable:
    """Straight-line ``emit(rec, args, kwargs)`` for ``nd`` (see TNode). Every check comes
    before the first side effect, so a MISS leaves the recorder as it was."""
    ns: dict[str, Any] = {
        "MISS": MISS, "LT": LazyTensor, "make": _make, "wref": weakref.ref, "ND": nd,
        "NODE": nd.node, "first": _first, "same": _same, "register": _register, "rebuild": _rebuild,
        "freeze": _freeze, "pack": _F64.pack, "copysign": copysign, "all_floats": _all_floats,
        "perf_ns": time.perf_counter_ns, "default_dtype": _get_default_dtype,
    }
    counter = [0]

    def const(v: Any) -> str:
        counter[0] += 1
        name = f"K{counter[0]}"
        ns[name] = v
        return name

    L: list[str] = ["def emit(rec, args, kwargs):"]
    w = L.append
    n = len(pos)
    if kw:
        w(f"    if len(args) != {n} or not kwargs or len(kwargs) != {len(kw)}: return MISS")
    else:
        w(f"    if len(args) != {n} or kwargs: return MISS")
    if n == 1:
        w("    a0, = args")
    elif n:
        w("    " + ", ".join(f"a{j}" for j in range(n)) + " = args")
    entries = list(_leaves(pos)) + list(_leaves(tuple(e for _, e in kw)))
    if any(e[0] in (HANDLE, AGAIN) for e in entries):
        w("    H = rec.H")
    has_first = any(e[0] == FIRST for e in entries)
    if has_first:
        w("    P = []")

    def check(var: str, e: tuple) -> None:
        tag = e[0]
        if tag == HANDLE:
            w(f"    if H[{e[1]}]() is not {var}: return MISS")
        elif tag == AGAIN:
            w(f"    if {var} is not H[{e[1]}] and (type({var}) is not LT or {var}._ae_real is not H[{e[1]}]):"
              " return MISS")
        elif tag == FIRST:
            w(f"    if not first(rec, {var}, {const(e)}, P): return MISS")
        elif tag == SAME:
            w(f"    if not same({var}, {e[1]}, P): return MISS")
        elif tag == LIFTED:
            if e[1]:
                w(f"    if type({var}) is not list or len({var}) != {e[2]} or not all_floats({var}):"
                  " return MISS")
            else:
                w(f"    if type({var}) is not float: return MISS")
        elif tag == NESTED:
            items = e[2]
            w(f"    if type({var}) is not {const(e[1])} or len({var}) != {len(items)}: return MISS")
            for j, sub in enumerate(items):
                check(f"{var}[{j}]", sub)
        else:
            _check_const(w, const, var, e)

    for j, e in enumerate(pos):
        check(f"a{j}", e)
    kwvars: dict[str, str] = {}
    for k, e in kw:
        var = kwvars[k] = f"k{len(kwvars)}"
        w(f"    {var} = kwargs.get({k!r}, MISS)")
        w(f"    if {var} is MISS: return MISS")
        check(var, e)
    if nd.made.default_dtype is not None:
        w(f"    if default_dtype() is not {const(nd.made.default_dtype)}: return MISS")
    # -- matched: from here on, what the slow path's record does ---------------------------
    if has_first:
        w("    register(rec, P)")
    w("    node = NODE")
    if lift is not None:
        var = f"a{lift}" if type(lift) is int else kwvars[lift]
        old = nd.node.args[lift] if type(lift) is int else dict(nd.node.kwargs)[lift]
        w(f"    rec.floats.append({var})")
        if type(old) is float:
            w(f"    if {var} is not {const(old)} and ({var} != {const(old)} or {var} == 0.0):")
        else:
            w(f"    if {var} != {const(old)} or 0.0 in {var}:")
        w(f"        node = rebuild(NODE, {lift!r}, {var})")
    if nd.depth == 0:
        w("    rec.opened_ns = perf_ns()")
    results = []
    made_any = False
    for o in outs:
        if o is None:
            results.append("None")
            continue
        if o[0] == 1:
            _, where, idx = o
            var = f"a{where}" if type(where) is int else kwvars[where]
            results.append(var if idx is None else f"{var}[{idx}]")
            continue
        _, vid, spec, root = o
        if not made_any:
            w("    owner = rec.owner")
            if not any(e[0] in (HANDLE, AGAIN) for e in entries):
                w("    H = rec.H")
            w("    handles = rec.handles")
            made_any = True
        extra = ""
        if spec.storage_offset:
            extra = f", strides={const(spec.stride)}, storage_offset={spec.storage_offset}"
        elif spec.stride != contiguous_strides(spec.shape):
            extra = f", strides={const(spec.stride)}"
        w(f"    h{vid} = make(LT, {const(spec.shape)}{extra}, dtype={const(spec.dtype)},"
          f" device={const(spec.device)})")
        w(f"    h{vid}._ae_vid = {vid}")
        w(f"    h{vid}._ae_owner = owner")
        w(f"    h{vid}._ae_spec = {const(spec)}")
        w(f"    H[{vid}] = r = wref(h{vid})")
        w("    handles.append(r)")
        if root is not None:
            w(f"    rec.alias_root[{vid}] = {root}")
        results.append(f"h{vid}")
    w("    rec.nodes.append(node)")
    w("    rec.at = ND")
    w("    rec.next = ND.first")
    structure = nd.made.structure
    if structure == "tensor":
        w(f"    return {results[0]}")
    elif structure == "none":
        w("    return None")
    elif structure == "list":
        w(f"    return [{', '.join(results)}]")
    else:
        w(f"    return ({''.join(r + ', ' for r in results)})")
    src = "\n".join(L)
    code = compile(src, f"<adaptive_eager trace node {nd.depth}: {nd.func}>", "exec")
    exec(code, ns)  # noqa: S102 - generated from the recorded node
    fn = ns["emit"]
    fn.source = src
    return fn


def _check_const(w: Callable[[str], None], const: Callable[[Any], str], var: str, e: tuple) -> None:
    """Code that returns MISS unless ``var`` is the recorded constant, by type and value as
    the window key compares it (Note [Floats in keys are compared by bits])."""
    t, v = e[1], e[2]
    if v is None:
        w(f"    if {var} is not None: return MISS")
    elif t is bool:
        w(f"    if {var} is not {v!r}: return MISS")
    elif t is int:
        w(f"    if type({var}) is not int or {var} != {v!r}: return MISS")
    elif t is float:
        if v == v and v != 0.0:
            w(f"    if type({var}) is not float or {var} != {const(v)}: return MISS")
        else:  # zeros by sign, NaNs by payload
            w(f"    if type({var}) is not float or pack({var}) != {const(_F64.pack(v))}: return MISS")
    elif t is str or isinstance(v, torch.dtype):
        w(f"    if {var} is not {const(v)} and {var} != {const(v)}: return MISS")
    elif t is list and len(e) > 4:  # a list the schema boxes as ints: == is exact
        w(f"    if type({var}) is not list or {var} != {const(v)}: return MISS")
    else:
        w(f"    if type({var}) is not {const(t)} or freeze({var}) != {const(e[3])}: return MISS")


def verify_key(window: Window, groups: dict, key: Any, floats: list) -> None:
    """Raise unless ``key`` and ``floats`` are what window_key derives for ``window`` (a
    debugging check of invariants 1 and 6: ``TraceBook.verify``)."""
    from ..fusion.signature import window_key  # noqa: PLC0415 - debugging only

    k, f = window_key(window, groups)
    if k != key or [_freeze(x) for x in f] != [_freeze(x) for x in floats]:
        raise AssertionError(f"a fast window's key differs from the slow path's: {len(window)} ops, "
                             f"floats {floats} vs {f}")


__all__ = ["MISS", "Made", "TNode", "TraceBook", "Ending", "Tables", "verify_key"]
