"""Matching one recorded node: argument templates, and the code generated to match them.

The matcher half of Note [Recurring windows are matched, not recorded] (trace.py, which
keeps the traces): :class:`Encoder` turns a recorded window's nodes into templates, one
tagged tuple per argument (``HANDLE``: a value made earlier in the window; ``FIRST``: a
real input at its first use, with its spec and aliasing; ``AGAIN``/``SAME``: that input
used again by a later node / the same one; ``CONST``: a constant by type and value;
``LIFTED``: a lifted float, Note [Scalar lifting]; ``NESTED``: a list holding any of
these), and :func:`generate` makes a node's ``emit(rec, args, kwargs)`` from them:
straight-line code that returns MISS unless the op's arguments fit the templates, and
otherwise does what the recorder's slow path would have done (the node appended, its
handles made from the recorded specs). The checks of real inputs and the code that
appends are the window builder's (recorder.py), passed in as ``builder``: this module
reads the recorder and writes none of its fields.

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
from typing import Any, Callable, NamedTuple, Protocol

import torch

from ..fusion.ir import OpNode, ValueRef, Window
from ..fusion.scalars import lift_rule
from ..fusion.signature import freeze
from .answers import MISS  # an emitter's answer when the op is not the node it expects
from .lazy import LazyTensor
from .optable import OpTraits

_get_default_dtype = torch.get_default_dtype
_F64 = struct.Struct("<d")
_INT_LISTS = ("int[", "SymInt[", "bool[")  # schema types whose lists box only ints (bools)


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


def returned_alias(ret_alias: tuple, i: int) -> Any:
    """The argument output ``i`` of an op aliases (``OpTraits.return_alias``; one entry
    stands for every output), or None."""
    return ret_alias[i] if i < len(ret_alias) else (ret_alias[0] if ret_alias else None)


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
            # A return aliasing a written argument is that argument (Recorder's rule).
            alias = returned_alias(ret_alias, i)
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
        exact = freeze(a)
        if t is list and schema_type.startswith(_INT_LISTS):
            return (CONST, t, a, exact, True)  # boxed ints (bools): == is exact
        return (CONST, t, a, exact)


# -- code generation -------------------------------------------------------------------------
class Source:
    """The text of one generated function and the namespace it runs in: ``line`` adds a
    line, ``const`` binds a value to a fresh name (K1, K2, ...: Note [Generated matchers
    share their code]) and returns the name. match.py writes a matcher's checks into it,
    the window builder (recorder.py) the code that appends the matched node.

    Example::

        >>> src = Source({})
        >>> src.line(f"    return {src.const(42)}")
        >>> src.ns["K1"], src.lines
        (42, ['    return K1'])
    """

    __slots__ = ("ns", "lines", "count")

    def __init__(self, ns: dict[str, Any]):
        self.ns = ns
        self.lines: list[str] = []
        self.count = 0

    def line(self, text: str) -> None:
        self.lines.append(text)

    def const(self, value: Any) -> str:
        self.count += 1
        name = f"K{self.count}"
        self.ns[name] = value
        return name


def _same(a: Any, vid: int, pending: Any) -> bool:
    """Whether ``a`` is the input an earlier argument of this node matched as ``vid``."""
    t = a._ae_real if type(a) is LazyTensor else a
    return t is not None and pending.ids.get(id(t)) == vid


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


class Builder(Protocol):
    """What a matcher needs of the window builder (``recorder.Recorder``): the check of
    a real input at its first use, an empty queue for the inputs one node matches, and
    the code that appends the matched node (Note [The builder writes its own fields],
    recorder.py)."""

    @staticmethod
    def first_use(rec: Any, a: Any, e: tuple, pending: Any) -> bool: ...

    @staticmethod
    def pending() -> Any: ...

    @staticmethod
    def append_source(src: Source, nd: Any, outs: tuple, lift: Any, kwvars: dict[str, str],
                      has_first: bool, has_h: bool) -> list[str]: ...


def generate(nd: Any, pos: tuple, kw: tuple, outs: tuple, lift: Any, builder: Builder) -> Callable:
    """Straight-line ``emit(rec, args, kwargs)`` for ``nd`` (a trace.TNode: its ``node``,
    ``made``, ``depth`` and ``func`` are read). Every check comes before the first side
    effect, so a MISS leaves the recorder as it was; the side effects are ``builder``'s
    code (``builder.append_source``)."""
    src = Source({"MISS": MISS, "LT": LazyTensor, "same": _same, "freeze": freeze,
                  "pack": _F64.pack, "all_floats": _all_floats, "default_dtype": _get_default_dtype,
                  "first": builder.first_use, "Pending": builder.pending})
    src.line("def emit(rec, args, kwargs):")
    entries = list(leaves(pos)) + list(leaves(tuple(e for _, e in kw)))
    has_h = any(e[0] in (HANDLE, AGAIN) for e in entries)
    has_first = any(e[0] == FIRST for e in entries)
    kwvars = _checks(src, pos, kw, has_h, has_first)
    if nd.made.default_dtype is not None:
        src.line(f"    if default_dtype() is not {src.const(nd.made.default_dtype)}: return MISS")
    # -- matched: from here on, what the slow path's record does ---------------------------
    results = builder.append_source(src, nd, outs, lift, kwvars, has_first, has_h)
    _return(src, nd.made.structure, results)
    return _compiled(src, nd)


def _checks(src: Source, pos: tuple, kw: tuple, has_h: bool, has_first: bool) -> dict[str, str]:
    """The checks of the arguments against their templates; the kwargs' local names."""
    w = src.line
    n = len(pos)
    if kw:
        w(f"    if len(args) != {n} or not kwargs or len(kwargs) != {len(kw)}: return MISS")
    else:
        w(f"    if len(args) != {n} or kwargs: return MISS")
    if n == 1:
        w("    a0, = args")
    elif n:
        w("    " + ", ".join(f"a{j}" for j in range(n)) + " = args")
    if has_h:
        w("    H = rec.H")
    if has_first:
        w("    P = Pending()")
    for j, e in enumerate(pos):
        _check(src, f"a{j}", e)
    kwvars: dict[str, str] = {}
    for k, e in kw:
        var = kwvars[k] = f"k{len(kwvars)}"
        w(f"    {var} = kwargs.get({k!r}, MISS)")
        w(f"    if {var} is MISS: return MISS")
        _check(src, var, e)
    return kwvars


def _check(src: Source, var: str, e: tuple) -> None:
    """Code that returns MISS unless ``var`` fits the template ``e``."""
    w, const = src.line, src.const
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
            _check(src, f"{var}[{j}]", sub)
    else:
        _check_const(w, const, var, e)


def _return(src: Source, structure: str, results: list[str]) -> None:
    if structure == "tensor":
        src.line(f"    return {results[0]}")
    elif structure == "none":
        src.line("    return None")
    elif structure == "list":
        src.line(f"    return [{', '.join(results)}]")
    else:
        src.line(f"    return ({''.join(r + ', ' for r in results)})")


def _compiled(src: Source, nd: Any) -> Callable:
    """The function ``src`` defines, its code object shared by source (Note [Generated
    matchers share their code])."""
    text = "\n".join(src.lines)
    code = _CODE.get(text)
    if code is None:
        code = compile(text, f"<adaptive_eager trace node {nd.depth}: {nd.func}>", "exec")
        with _CODE_LOCK:  # matchers are generated by whichever thread first tries them
            if len(_CODE) >= _CODE_MAX and _CODE:
                _CODE.pop(next(iter(_CODE)), None)
            _CODE[text] = code
    exec(code, src.ns)  # noqa: S102 - generated from the recorded node
    fn = src.ns["emit"]
    fn.source = text
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


__all__ = ["MISS", "Made", "Encoder", "Untraceable", "Source", "Builder", "generate", "leaves", "returned_alias",
           "HANDLE", "FIRST", "AGAIN", "CONST", "LIFTED", "NESTED", "SAME"]
