"""The window builder: the open window's state, and the one API that writes it.

:class:`WindowBuilder` holds the open window (its nodes, real inputs, value tables,
handles, the trace node it is matched to) and is the only code that writes it: an
input is added with :meth:`~WindowBuilder.add_input`, a node appended with
:meth:`~WindowBuilder.append` (or by a trace's matcher, whose appending code the builder
generates: Note [The builder writes its own fields]), and the window is closed with
:meth:`~WindowBuilder.seal` or :meth:`~WindowBuilder.take_slice` (a frozen
:class:`Sealed`). The recorder (recorder.py) builds on it: it encodes a call's arguments,
finds its output specs in the meta memo and appends the node.

A window that opens like a recurring one is matched against its trace instead
(:meth:`WindowBuilder.replay`, Note [Recurring windows are matched, not recorded] in
dispatch/trace.py): while matching, ``at`` is the trace node matched last, and the
value tables (``specs``, ``_refs``, ``_sids``) are the trace's, restored by
:meth:`WindowBuilder.leave` before anything records the slow way.

Example::

    >>> import torch
    >>> from adaptive_eager.dispatch.meta import MetaMemo
    >>> b = WindowBuilder(torch.device("cpu"), MetaMemo(64), owner=None)
    >>> x = torch.ones(3)
    >>> b.add_input(x), b.add_input(x), b.holds(x)
    (0, 0, True)
    >>> sealed = b.seal("explicit_sync", None)
    >>> len(sealed.window), list(sealed.window.inputs), len(b)
    (0, [0], 0)
"""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..fusion.ir import OpNode, TensorSpec, ValueRef, Window
from ..fusion.slicing import needed_nodes
from .answers import OutputMismatch
from .exported import Exported, exported_input
from .keys import plain_strided
from .lazy import LazyTensor, Owner, contiguous_strides, new_handle
from .match import MISS, Made, Source, generate, returned_alias
from .meta import MetaMemo, MetaResult, Uncapturable
from .optable import OpTraits
from .source import user_source
from .trace import TNode, TraceBook

_TensorBase = torch._C.TensorBase  # isinstance against the C base is fast
_make = torch.Tensor._make_wrapper_subclass
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_PLAIN_DISPATCH = torch._C._disabled_torch_dispatch_impl
_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage

# Slices longer than this flush everything instead (Note [Partial flush]).
_MAX_SLICE = 8


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return torch._C._storage_id(t)
    except Exception:  # noqa: BLE001 - sparse, storage-less or foreign tensors
        return None

class Pending:
    """The real inputs one matched node checked so far (:meth:`Recorder.first_use`):
    (vid, tensor, storage id) in order, indexed by the tensor's id and by storage (a
    foreach op over 100 parameters matched each against a list of the ones before: 5,000
    comparisons an op, ~40% of a matched AdamW step)."""

    __slots__ = ("items", "ids", "sids")

    def __init__(self) -> None:
        self.items: list[tuple[int, Any, Any]] = []
        self.ids: dict[int, int] = {}
        self.sids: dict[Any, int] = {}


def _rebuild(node: OpNode, where: int | str, value: Any) -> OpNode:
    """``node`` holding this window's value of its lifted float (eager replay reads it)."""
    if type(where) is int:
        args = list(node.args)
        args[where] = value
        return node._replace(args=tuple(args))
    return node._replace(kwargs=tuple((k, value if k == where else v) for k, v in node.kwargs))


def _var(where: int | str, kwvars: dict[str, str]) -> str:
    """The matcher's local name of argument ``where``."""
    return f"a{where}" if type(where) is int else kwvars[where]


def _handles_source(src: Source, outs: tuple, kwvars: dict[str, str], has_h: bool) -> list[str]:
    """Code making a matched node's outputs (``Encoder.node``'s ``outs``): a written
    argument returned as itself, else a handle of the recorded spec (as ``_append``)."""
    w, const = src.line, src.const
    results: list[str] = []
    made_any = False
    for o in outs:
        if o is None:
            results.append("None")
            continue
        if o[0] == 1:
            _, where, idx = o
            var = _var(where, kwvars)
            results.append(var if idx is None else f"{var}[{idx}]")
            continue
        _, vid, spec, root = o
        if not made_any:
            w("    owner = rec.owner")
            if not has_h:
                w("    H = rec.H")
            w("    handles = rec.handles")
            made_any = True
        extra = ""
        if spec.storage_offset:
            extra = f", strides={const(spec.stride)}, storage_offset={const(spec.storage_offset)}"
        elif spec.stride != contiguous_strides(spec.shape):
            extra = f", strides={const(spec.stride)}"
        # Value ids and every value are constants, not literals (Note [Generated matchers
        # share their code], match.py); a handle's local name is its position among the outputs.
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
    return results


@dataclass(frozen=True, slots=True)
class Sealed:
    """A closed window (:meth:`Recorder.seal`, :meth:`Recorder.take_slice`) and what the
    recorder knew of it: ``live``, its unbound handles to bind; ``at``, the trace node it
    was matched to (None: recorded, or a slice); ``made``, per node what a trace is built
    from (None: it cannot become one); ``sids``, its values' interned spec ids;
    ``floats``, the lifted floats matched so far; ``failed``, values of earlier slices
    that failed (Note [A failed flush loses no work])."""

    window: Window
    live: list[LazyTensor]
    at: TNode | None
    made: list[Made] | None
    sids: dict[int, int]
    floats: list
    failed: dict[int, BaseException]


class WindowBuilder:
    """The open window and its writers. Not thread-safe by itself; the mode serializes
    access."""

    def __init__(self, device: torch.device, memo: MetaMemo, owner: Owner | None,
                 book: TraceBook | None = None):
        # Tensors on an indexed device report an index (neuron:0, cuda:0); handles must
        # too (autograd routes backward by device index).
        if device.type != "cpu" and device.index is None:
            device = torch.device(device.type, 0)
        self.device = device
        self.memo = memo
        self.owner = owner
        self.book = book  # the session's traces (None: every window records)
        self.counters = memo.counters
        self._reset()

    def _reset(self) -> None:
        self.nodes: list[OpNode] = []
        self.inputs: dict[int, torch.Tensor] = {}
        self._input_ids: dict[int, int] = {}
        self.specs: dict[int, TensorSpec] = {}
        self._sids: dict[int, int] = {}
        self._refs: list[ValueRef] = []
        self.alias_root: dict[int, int] = {}
        self._storages: dict[int, int] = {}  # storage id of a real input -> first vid
        self.handles: list[weakref.ref] = []
        self.opened_ns = 0
        # Values of this window computed by a slice that failed (Note [A failed flush
        # loses no work]): the rest of the window reads them, and must fail alike.
        self.failed: dict[int, BaseException] = {}
        # Matching a trace (dispatch/trace.py): the node matched last (None: recording
        # the slow way), the one expected next, value id -> handle (weakly) or input,
        # the lifted floats so far. ``made``: per recorded node, what a trace is built
        # from (None: this window cannot become one).
        self.at: TNode | None = None
        self.next: TNode | None = None
        self.H: dict[int, Any] = {}
        self.floats: list = []
        self.made: list[Made] | None = []

    def __len__(self) -> int:
        return len(self.nodes)

    # -- inputs and values ---------------------------------------------------------
    def _new_value(self, spec: TensorSpec, sid: int) -> int:
        vid = len(self._refs)
        self._refs.append(ValueRef(vid))
        self.specs[vid] = spec
        self._sids[vid] = sid
        return vid

    def add_input(self, t: torch.Tensor) -> int:
        """The value id of real tensor ``t``, added as an input of the window at its first
        use (raises Uncapturable / Exported when a spec cannot stand for it)."""
        vid = self._input_ids.get(id(t))
        if vid is None:
            if not plain_strided(t):
                # A spec cannot describe it (no strides; no conj/neg bit): run for real.
                raise Uncapturable(RuntimeError(f"input of layout {t.layout}, conj={t.is_conj()}"))
            sid = _storage_id(t)
            if sid is not None and exported_input(t, sid):
                raise Exported(RuntimeError("the op touches memory read outside the dispatcher"))
            spec = TensorSpec.of(t)
            vid = self._new_value(spec, self.memo.intern(spec))
            self._add_input(vid, t, sid)
        return vid

    def _add_input(self, vid: int, t: torch.Tensor, sid: int | None) -> None:
        """Make real tensor ``t`` the window's input ``vid`` (aliasing by storage)."""
        self._input_ids[id(t)] = vid
        self.inputs[vid] = t
        if sid is not None:
            first = self._storages.setdefault(sid, vid)
            if first != vid:
                self.alias_root[vid] = first  # real inputs sharing storage (p, p.data)

    def vid_of(self, t: Any) -> int | None:
        """The window's value id for a tensor the program holds, if the window touches it."""
        if type(t) is LazyTensor:
            if t._ae_real is None:
                return t._ae_vid if t._ae_owner is self.owner else None
            t = t._ae_real
        if not isinstance(t, _TensorBase):
            return None
        vid = self._input_ids.get(id(t))
        if vid is None:
            sid = _storage_id(t)
            vid = self._storages.get(sid) if sid is not None else None
        return vid

    # -- matching a trace ------------------------------------------------------------
    def replay(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Match ``func(*args, **kwargs)`` against the nodes that may come next (a trace's
        first nodes, on an empty window): its result, or MISS (nothing changed)."""
        at = self.at
        if at is None:
            if self.nodes or self.book is None:
                return MISS
            nodes = self.book.openers(func)
            if not nodes:
                return MISS
        else:
            nodes = at.children
        for nd in nodes:
            if nd.func is func:
                out = nd.emit(self, args, kwargs)
                if out is not MISS:
                    if at is not None and at.first is not nd:
                        at.first = nd  # what the mode tries first next time
                    return out
        return MISS

    # Note [The builder writes its own fields]
    # A matched node (trace.py) is appended by code generated for it (match.py), which
    # must leave the recorder exactly as recording would have. So the check of a real
    # input at its first use (first_use, with add_input's predicates), the registering
    # of matched inputs (add_inputs, through _add_input) and the code that appends the
    # node (append_source) are the builder's, beside the fields they write; match.py
    # generates the reads only. The appending code stays inlined in each matcher, with
    # constants for the node's specs: moving just its last three writes (nodes, at,
    # next) into a method call measured 0.30 against 0.22 µs (timeit, load ~9 on 2 CPUs),
    # and a method that also made the handles would loop over a description of the
    # outputs, against ~6.5 µs an op on the fast path (benchmarks.overhead).
    pending = Pending

    @staticmethod
    def first_use(rec: "WindowBuilder", a: Any, e: tuple, pending: Pending) -> bool:
        """Whether ``a`` is a real input the slow path would number ``e[1]`` with ``e``'s
        spec and aliasing (FIRST template, match.py); queues it in ``pending``."""
        t = a
        tt = type(t)
        if tt is LazyTensor:
            t = t._ae_real
            if t is None:
                return False
        elif tt not in _PLAIN and not (isinstance(t, torch.Tensor) and tt.__torch_dispatch__ is _PLAIN_DISPATCH):
            return False
        if t.dtype is not e[5] or t.shape != e[2] or t.stride() != e[3] or t.storage_offset() != e[4] \
                or t.device != e[6] or not plain_strided(t):
            return False
        if id(t) in rec._input_ids or id(t) in pending.ids:
            return False  # the slow path would reuse that input's value id
        sid = _storage_id(t)
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

    @classmethod
    def matcher(cls, nd: Any, pos: tuple, kw: tuple, outs: tuple, lift: Any) -> Any:
        """Trace node ``nd``'s generated ``emit(rec, args, kwargs)`` (match.generate, with
        this builder's checks and appending code)."""
        return generate(nd, pos, kw, outs, lift, cls)

    def add_inputs(self, pending: Pending) -> None:
        """Make the real inputs one matched node queued (:meth:`first_use`) inputs of the
        window, as :meth:`add_input` would have."""
        H = self.H
        for vid, t, sid in pending.items:
            H[vid] = t
            self._add_input(vid, t, sid)

    @staticmethod
    def append_source(src: Source, nd: Any, outs: tuple, lift: Any, kwvars: dict[str, str],
                      has_first: bool, has_h: bool) -> list[str]:
        """The matcher's code after its checks (Note [The builder writes its own fields]):
        the matched inputs added, the node (with this call's lifted float) appended, its
        handles made from the recorded specs and the window pointed at ``nd``. Returns the
        outputs' local names (or expressions). An argument is ``a<i>`` or ``kwvars[name]``;
        ``has_h``: the checks bound ``H``."""
        w, const = src.line, src.const
        src.ns.update(NODE=nd.node, ND=nd, make=_make, wref=weakref.ref, rebuild=_rebuild,
                      perf_ns=time.perf_counter_ns)
        if has_first:
            w("    rec.add_inputs(P)")
        w("    node = NODE")
        if lift is not None:
            lift_var = _var(lift, kwvars)
            old = nd.node.args[lift] if type(lift) is int else dict(nd.node.kwargs)[lift]
            w(f"    rec.floats.append({lift_var})")
            if type(old) is float:
                w(f"    if {lift_var} is not {const(old)} and ({lift_var} != {const(old)} or {lift_var} == 0.0):")
            else:
                w(f"    if {lift_var} != {const(old)} or 0.0 in {lift_var}:")
            w(f"        node = rebuild(NODE, {lift!r}, {lift_var})")
        if nd.depth == 0:
            w("    rec.opened_ns = perf_ns()")
        results = _handles_source(src, outs, kwvars, has_h)
        w("    rec.nodes.append(node)")
        w("    rec.at = ND")
        w("    rec.next = ND.first")
        return results

    def matched(self) -> int:
        """Nodes of the open window matched from a trace (0: not matching one)."""
        return self.at.depth + 1 if self.at is not None else 0

    def leave(self, why: str | None = None) -> None:
        """Stop matching: the value tables become those the slow path would hold now, so
        recording continues from here (invariant 2). ``why``: a divergence from every
        trace, counted in ``trace_mismatches`` (the op, and the program's line)."""
        at = self.at
        if at is None:
            return
        self._count_matched()
        tables = at.tables.upto(at.vid_end)
        self._refs, self.specs, self._sids = tables.refs, tables.specs, tables.sids
        self.made = [nd.made for nd in at.path()]
        if why is not None:
            self.counters.trace_mismatches[f"{why} at {user_source(3)}"] += 1

    def _count_matched(self) -> None:
        n = self.at.depth + 1
        self.counters.fast_ops += n
        self.counters.ops_captured += n
        self.at = None
        self.next = None

    def rollback(self, mark: int) -> None:
        """Forget the values numbered from ``mark`` on (a record that failed part-way)."""
        for vid in range(mark, len(self._refs)):
            t = self.inputs.pop(vid, None)
            if t is not None:
                self._input_ids.pop(id(t), None)
                sid = _storage_id(t)
                if sid is not None and self._storages.get(sid) == vid:
                    del self._storages[sid]  # else vid_of() finds a rolled-back value
            self.specs.pop(vid, None)
            self._sids.pop(vid, None)
            self.alias_root.pop(vid, None)
        del self._refs[mark:]

    def _arg(self, args: tuple, kwargs: dict, where: int | str) -> Any:
        return kwargs.get(where) if isinstance(where, str) else args[where]

    def append(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict,
               enc_args: tuple, enc_kwargs: dict, mr: MetaResult) -> Any:
        """Append the node of ``func`` (its arguments encoded, its meta result ``mr``):
        handles for its new outputs, a written argument returned as itself. Raises
        OutputMismatch when that would change the argument's metadata."""
        mutates: list[int] = []
        for where in traits.mutated_args:
            enc = enc_kwargs.get(where) if isinstance(where, str) else enc_args[where]
            if isinstance(enc, ValueRef):
                mutates.append(enc.id)
            elif isinstance(enc, (list, tuple)):
                mutates.extend(e.id for e in enc if isinstance(e, ValueRef))
        outputs: list[int | None] = []
        results: list[Any] = []
        ret_alias = traits.return_alias
        sids = mr.sids
        for i, spec in enumerate(mr.specs):
            if spec is None:
                outputs.append(None)
                results.append(None)
                continue
            alias = returned_alias(ret_alias, i)
            if alias is not None and alias in traits.mutated_args:
                obj = self._arg(args, kwargs, alias)
                enc = enc_kwargs.get(alias) if isinstance(alias, str) else enc_args[alias]
                if isinstance(enc, (list, tuple)):  # Tensor(a!)[] returned
                    obj, enc = obj[i], enc[i]
                if self.specs[enc.id] != spec:
                    raise OutputMismatch(f"{func} would resize its output")
                outputs.append(enc.id)
                results.append(obj)
                continue
            vid = self._new_value(spec, sids[i])
            if alias is not None:
                base = enc_kwargs.get(alias) if isinstance(alias, str) else enc_args[alias]
                if isinstance(base, ValueRef):
                    self.alias_root[vid] = self.alias_root.get(base.id, base.id)
            handle = new_handle(spec, vid, self.owner)
            self.handles.append(weakref.ref(handle))
            outputs.append(vid)
            results.append(handle)
        if not self.nodes:
            self.opened_ns = time.perf_counter_ns()
        self.nodes.append(OpNode(
            func, enc_args, tuple(enc_kwargs.items()) if enc_kwargs else (), tuple(outputs),
            tuple(mutates), traits.is_view,
        ))
        if mr.structure == "tensor":
            return results[0]
        if mr.structure == "none":
            return None
        return results if mr.structure == "list" else tuple(results)

    def dropped_bytes(self) -> int:
        """Bytes of real inputs that only this window keeps alive: the program dropped them
        (Note [A byte budget per window], runtime/memory.py). Storages count once."""
        held: dict[int, int] = {}  # storage -> its bytes, or -1 once the program holds a view of it
        H = self.H
        getrefcount = sys.getrefcount
        inputs = self.inputs
        for vid in inputs:  # not items(): its reused pair would hold one more reference
            t = inputs[vid]
            try:  # TensorBase's: not the read wrapper of observe.py
                st = _UNTYPED_STORAGE(t)
            except Exception:  # noqa: BLE001 - no storage (a wrapper, a functorch tensor)
                continue
            ptr = st.data_ptr()
            # References of ours: self.inputs, H (matched inputs), the loop variable and
            # getrefcount's argument.
            if getrefcount(t) > (4 if H.get(vid) is t else 3):
                held[ptr] = -1
            elif held.get(ptr, 0) >= 0:
                held[ptr] = st.nbytes()
        return sum(n for n in held.values() if n > 0)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether real tensor ``t`` is an input of the open window."""
        return id(t) in self._input_ids

    # -- sealing --------------------------------------------------------------------
    def seal(self, reason: str, source: str | None) -> Sealed:
        """Close the window: the frozen Window, its live unbound handles, what made it."""
        live: list[LazyTensor] = []
        for ref in self.handles:
            h = ref()
            if h is not None and h._ae_real is None and h._ae_error is None:
                live.append(h)
        specs = self.specs
        at = self.at
        if at is not None:  # matched to here: exactly the values defined so far
            specs = at.exact_specs()
            self._count_matched()
        window = Window(
            inputs=self.inputs, nodes=tuple(self.nodes), specs=specs,
            outputs=frozenset(h._ae_vid for h in live), alias_root=self.alias_root,
            reason=reason, source=source, opened_ns=self.opened_ns, owned=True,
        )
        sealed = Sealed(window, live, at, self.made, self._sids, self.floats, self.failed)
        self._reset()
        return sealed

    def take_slice(self, targets: list[int], reason: str, source: str | None) -> Sealed | None:
        """Close just the nodes ``targets`` need (Note [Partial flush]) and keep the rest
        open; None when that is unsafe or not worth it (then flush everything).

        The returned Window's outputs are the values that later nodes or live handles
        still use; once it has run, :meth:`adopt` turns them into inputs of the open window.
        """
        specs = self.specs if self.at is None else self.at.tables.specs
        if any(specs[v].shape for v in targets):
            return None  # only scalar reads (step counters) slice; see Note [Partial flush]
        idx = needed_nodes(self.nodes, targets, self.alias_root.get)
        if idx is None or len(idx) == len(self.nodes) or len(idx) > _MAX_SLICE:
            return None
        self.leave()
        self.made = None  # what is left is no window the program recorded
        chosen = set(idx)
        sliced = [self.nodes[i] for i in idx]
        rest = [n for i, n in enumerate(self.nodes) if i not in chosen]
        produced = {o for n in sliced for o in n.outputs if o is not None}
        used_later = {v for n in rest for v in n.inputs()} | {m for n in rest for m in n.mutates}
        live: list[LazyTensor] = []
        for ref in self.handles:
            h = ref()
            if h is not None and h._ae_real is None and h._ae_error is None and h._ae_vid in produced:
                live.append(h)
        outputs = (produced & used_later) | {h._ae_vid for h in live} | (produced & set(targets))
        read = {v for n in sliced for v in n.inputs()} | {m for n in sliced for m in n.mutates}
        window = Window(
            inputs={v: t for v, t in self.inputs.items() if v in read}, nodes=tuple(sliced),
            specs=self.specs, outputs=frozenset(outputs), alias_root=dict(self.alias_root),
            reason=reason, source=source, owned=True,
        )
        self.nodes = rest
        return Sealed(window, live, None, None, self._sids, self.floats, self.failed)

    def adopt(self, values: Mapping[int, torch.Tensor],
              errors: Mapping[int, BaseException] = {}) -> None:  # noqa: B006 - read only
        """Values computed by a slice become real inputs of the open window; values it
        failed to compute are remembered as failed (``self.failed``)."""
        self.leave()
        self.made = None
        for vid, t in values.items():
            if vid not in self.inputs:
                self.inputs[vid] = t
                self._input_ids.setdefault(id(t), vid)
        if errors:
            self.failed.update(errors)


__all__ = ["WindowBuilder", "Sealed", "Pending", "OutputMismatch"]
