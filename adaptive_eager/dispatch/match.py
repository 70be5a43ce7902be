"""Matching one recorded node: argument templates, and the code generated to match them.

The matcher half of Note [Recurring windows are matched, not recorded] (trace.py, which
keeps the traces): :class:`Encoder` turns a recorded window's nodes into templates, one
tagged tuple per argument (``HANDLE``: a value made earlier in the window; ``FIRST``: a
real input at its first use, with its spec and aliasing; ``AGAIN``/``SAME``: that input
used again by a later node / the same one; ``CONST``: a constant by type and value;
``LIFTED``: a lifted float, Note [Scalar lifting]; ``NESTED``: a list holding any of
these), and :func:`generate` makes a node's ``emit(rec, args, kwargs)`` from them:
straight-line code that returns MISS
unless the op's arguments fit the templates, and otherwise does what the recorder's slow
path would have done (the node appended, its handles made from the recorded specs).

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> from adaptive_eager.dispatch.optable import OpTable
    >>> mul = torch.ops.aten.mul.Tensor
    >>> x = torch.ones(3)
    >>> node = OpNode(mul, (ValueRef(0), ValueRef(0)), (), (1,))   # x * x
    >>> spec = TensorSpec.of(x)
    >>> w = Window(inputs={0: x}, nodes=(node,), specs={0: spec, 1: spec}, outputs=frozenset({1}))
    >>> pos, kw, outs, lift = Encoder(w).node(node, Made(OpTable().traits(mul), "tensor"))
    >>> [e[0] for e in pos] == [FIRST, SAME]       # a real input's first use, then again
    True
"""

from __future__ import annotations

import struct
import threading
import time
import weakref
from math import copysign
from typing import Any, Callable, NamedTuple

import torch

from ..fusion.ir import OpNode, ValueRef, Window
from ..fusion.scalars import lift_rule
from ..fusion.signature import _freeze
from .exported import exported_input
from .lazy import LazyTensor, contiguous_strides
from .optable import OpTraits

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


class Untraceable(Exception):
    """A window the trace builder does not handle (it stays on the slow path)."""


def leaves(entries: tuple):
    for e in entries:
        if e[0] == NESTED:
            yield from leaves(e[2])
        else:
            yield e


class Encoder:
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
            raise Untraceable(node.target)
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
                raise Untraceable(f"value %{vid} made twice")
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
                raise Untraceable(f"value %{v} used before it is made")
            return (HANDLE, v)
        if (t is list or t is tuple) and any(type(b) in (ValueRef, list, tuple) for b in a):
            return (NESTED, t, tuple(self.arg(b, "") for b in a))
        exact = _freeze(a)
        if t is list and schema_type.startswith(_INT_LISTS):
            return (CONST, t, a, exact, True)  # boxed ints (bools): == is exact
        return (CONST, t, a, exact)


# -- code generation -------------------------------------------------------------------------
class Pending:
    """The real inputs one node matched so far: (vid, tensor, storage id) in order, indexed
    by the tensor's id and by storage (a foreach op over 100 parameters matched each
    against a list of the ones before: 5,000 comparisons an op, ~40% of a matched AdamW
    step)."""

    __slots__ = ("items", "ids", "sids")

    def __init__(self) -> None:
        self.items: list[tuple[int, Any, Any]] = []
        self.ids: dict[int, int] = {}
        self.sids: dict[Any, int] = {}


def _first(rec: Any, a: Any, e: tuple, pending: Pending) -> bool:
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
    if id(t) in rec._input_ids or id(t) in pending.ids:
        return False  # the slow path would reuse that input's value id
    try:
        sid = _storage_id_of(t)
    except Exception:  # noqa: BLE001 - storage-less tensors
        sid = None
    root = None
    if sid is not None:
        if exported_input(t, sid):
            return False  # Note [Exported memory]: the slow path runs the op now
        root = rec._storages.get(sid)
        if root is None:
            root = pending.sids.get(sid)
    if root != e[7]:
        return False
    pending.items.append((e[1], t, sid))
    pending.ids[id(t)] = e[1]  # the tensor is held by items while the node matches
    if sid is not None:
        pending.sids.setdefault(sid, e[1])
    return True


def _same(a: Any, vid: int, pending: Pending) -> bool:
    """Whether ``a`` is the input an earlier argument of this node matched as ``vid``."""
    t = a._ae_real if type(a) is LazyTensor else a
    return t is not None and pending.ids.get(id(t)) == vid


def _register(rec: Any, pending: Pending) -> None:
    """Make the matched real inputs inputs of the window (as Recorder._input_vid does)."""
    H = rec.H
    for vid, t, sid in pending.items:
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


# Note [Generated matchers share their code]
# A matcher's source names its constants (K1, K2, ...: bound in its own namespace) and
# the window-relative value ids it checks and makes, so windows of the same shape
# generate the same source node for node. compile() costs ~200 µs a node; executing a
# compiled code object in a fresh namespace ~2 µs. Measured on the LBFGS pattern with
# capture forced (windows of thousands of ops, recurring with new keys): 17,323 compile
# calls, 3.6 s of a 9-10 s run (3-4 s without the fast path). So code objects are kept
# by source, process-wide (pure: a function of the text), bounded, oldest dropped first.
_CODE: dict[str, Any] = {}
_CODE_MAX = 8192
_CODE_LOCK = threading.Lock()


def generate(nd: Any, pos: tuple, kw: tuple, outs: tuple, lift: Any) -> Callable:
    """Straight-line ``emit(rec, args, kwargs)`` for ``nd`` (a trace.TNode: its ``node``,
    ``made``, ``depth`` and ``func`` are read, and the code points the recorder at it).
    Every check comes before the first side effect, so a MISS leaves the recorder as it
    was."""
    ns: dict[str, Any] = {
        "MISS": MISS, "LT": LazyTensor, "make": _make, "Pending": Pending, "wref": weakref.ref, "ND": nd,
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
    entries = list(leaves(pos)) + list(leaves(tuple(e for _, e in kw)))
    if any(e[0] in (HANDLE, AGAIN) for e in entries):
        w("    H = rec.H")
    has_first = any(e[0] == FIRST for e in entries)
    if has_first:
        w("    P = Pending()")

    def check(var: str, e: tuple) -> None:
        tag = e[0]
        if tag == HANDLE:
            w(f"    if H[{const(e[1])}]() is not {var}: return MISS")
        elif tag == AGAIN:
            k = const(e[1])
            w(f"    if {var} is not H[{k}] and (type({var}) is not LT or {var}._ae_real is not H[{k}]):"
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
            extra = f", strides={const(spec.stride)}, storage_offset={const(spec.storage_offset)}"
        elif spec.stride != contiguous_strides(spec.shape):
            extra = f", strides={const(spec.stride)}"
        # Value ids and every value are constants, not literals (Note [Generated matchers
        # share their code]); a handle's local name is its position among the outputs.
        h, v = f"h{len(results)}", const(vid)
        w(f"    {h} = make(LT, {const(spec.shape)}{extra}, dtype={const(spec.dtype)},"
          f" device={const(spec.device)})")
        w(f"    {h}._ae_vid = {v}")
        w(f"    {h}._ae_owner = owner")
        w(f"    {h}._ae_spec = {const(spec)}")
        w(f"    H[{v}] = r = wref({h})")
        w("    handles.append(r)")
        if root is not None:
            w(f"    rec.alias_root[{v}] = {const(root)}")
        results.append(h)
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
    code = _CODE.get(src)
    if code is None:  # Note [Generated matchers share their code]
        code = compile(src, f"<adaptive_eager trace node {nd.depth}: {nd.func}>", "exec")
        with _CODE_LOCK:  # matchers are generated by whichever thread first tries them
            if len(_CODE) >= _CODE_MAX and _CODE:
                _CODE.pop(next(iter(_CODE)), None)
            _CODE[src] = code
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
        w(f"    if type({var}) is not int or {var} != {const(v)}: return MISS")
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


__all__ = ["MISS", "Made", "Encoder", "Untraceable", "generate", "leaves",
           "HANDLE", "FIRST", "AGAIN", "CONST", "LIFTED", "NESTED", "SAME"]
