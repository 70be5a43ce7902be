"""An optimizer step as one graph: torch.optim's multi-tensor step, traced once per
signature on meta stand-ins, with its per-step floats lifted to 0-d tensor inputs.

:func:`gather` reads what one step of an optimizer works on (its flat tensor inputs, its
float hyperparameters and a signature key), or says why the step is not a candidate.
:func:`trace_step` runs the optimizer class's own ``step`` once on a shadow of the
optimizer whose tensors are meta stand-ins (step counters: real CPU copies), records the
ATen ops and builds a :class:`StepProgram`: an fx graph over (tensors, constants, lifted
scalars) and the Python function that computes the lifted scalars for new hyperparameter
and step values (Note [Hyperparameters are traced, not baked], optim_scalars.py).

Example::

    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.full((4,), 0.5)
    >>> opt = torch.optim.SGD([p], lr=0.1, momentum=0.9); opt.step()
    >>> got = gather(opt, (torch.Tensor, torch.nn.Parameter))
    >>> prog = trace_step(opt, got)
    >>> isinstance(prog, StepProgram), len(got.inputs), prog.n_scalars
    (True, 3, 2)
"""

from __future__ import annotations

import collections
import operator
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..fusion.scalars import rules_for, scalar_dtype
from .optim_scalars import Traced, compile_program, one_step_program, trace_value

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float64)
_SKIP = {aten._local_scalar_dense.default, aten.lift_fresh.default, aten.detach.default}
MAX_EXACT_STEP = 2.0 ** 24  # step counters are float32: integers up to here are exact


class NotTraceable(Exception):
    """The step cannot be one graph; the message says why (it runs eagerly)."""


class StateNotReady(NotTraceable):
    """The step creates optimizer state (a first step): eager now, traced again later."""


@dataclass(frozen=True)
class Gathered:
    """One step's work: ``key`` (signature: class, options, tensor specs, never float
    values), ``inputs`` (flat: per param with a grad, the param, its grad, its state
    tensors in the state's order), ``hyper`` (the groups' float options in order),
    ``grads`` (the grads' positions in ``inputs``), ``known`` (re-checked by a known step,
    optim_fast.py: every input but the grads is a plain tensor)."""

    key: tuple
    inputs: list
    hyper: list
    grads: frozenset = frozenset()  # positions of the grads in ``inputs``
    known: bool = False  # from a known step: only the grads may be runtime handles


def _spec(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)  # a handle and its real tensor alike


def gather(opt: torch.optim.Optimizer, plain: tuple) -> Gathered | str:
    """What one step of ``opt`` works on, or the reason it is not a candidate.

    ``plain``: the tensor types accepted (plain tensors, parameters, the runtime's handles).
    """
    key: list = [type(opt)]
    inputs: list = []
    hyper: list = []
    grads: list = []
    state = opt.state
    for group in opt.param_groups:
        for name, v in group.items():
            if name == "params":
                continue
            if name == "foreach" and v is not False:  # traced at the foreach level either way
                continue
            tv = type(v)
            if tv is float:
                hyper.append(v)
                key.append((name, float))
            elif tv is tuple and v and all(type(x) is float for x in v):
                hyper.extend(v)
                key.append((name, (float,) * len(v)))
            elif isinstance(v, torch.Tensor):
                return f"a tensor {name}"
            else:
                try:
                    hash(v)
                except TypeError:
                    return f"option {name} is not hashable"
                key.append((name, v))
        for p in group["params"]:
            g = p.grad
            if g is None:
                key.append(None)
                continue
            if type(p) not in plain or type(g) not in plain:
                return "a tensor subclass"
            if g.layout != torch.strided or p.dtype not in _DTYPES or g.dtype not in _DTYPES:
                return "a sparse, complex or low-precision tensor"
            st = state.get(p) or {}
            inputs.append(p)
            grads.append(len(inputs))
            inputs.append(g)
            parts = [_spec(p), _spec(g)]
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    inputs.append(v)
                    parts.append((k, _spec(v)))
                else:
                    parts.append((k, v))
            key.append(tuple(parts))
    return Gathered(tuple(key), inputs, hyper, frozenset(grads))


def _raw_step(cls: type) -> Callable:
    fn = cls.step
    if getattr(fn, "hooked", False):  # torch's profile_hook_step wrapper: its hooks are the program's
        fn = fn.__wrapped__
    return fn


# -- the recorder ------------------------------------------------------------------------
class _Recorder:
    """Records one run of a step on stand-ins (see :func:`trace_step`)."""

    def __init__(self, ids: dict[int, int], pre: dict[int, float]):
        self.refs: dict[int, tuple] = {i: ("in", n) for i, n in ids.items()}
        self.pre = pre                      # input index -> step value before the step
        self.reads: list[int] = []          # input indices read with .item(), in order
        self.deltas: dict[int, float] = {}  # input index -> value read minus value before
        self.ops: list[tuple] = []          # (func, args, kwargs, outputs)
        self.dtypes: dict[tuple, torch.dtype] = {}
        self.consts: list[torch.Tensor] = []
        self.keep: list = []                # every tensor seen: ids must not be reused
        self.pending: list[Traced] = []
        self.guards: list = []

    def ref(self, t: torch.Tensor) -> tuple:
        r = self.refs.get(id(t))
        if r is None:
            if t.device.type == "meta" or t.numel() > 1:
                raise NotTraceable("the step uses a tensor that is not its own state")
            self.consts.append(t.detach().clone())
            r = self.refs[id(t)] = ("k", len(self.consts) - 1)
            self.keep.append(t)
        self.dtypes[r] = t.dtype
        return r

    def leaf(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return self.ref(x)
        if isinstance(x, (list, tuple)):
            return [self.leaf(y) for y in x] if isinstance(x, list) else tuple(self.leaf(y) for y in x)
        if type(x) is float or isinstance(x, Traced):
            v = float(x)
            for i, t in enumerate(self.pending):  # the traced float it came from
                if float(t).hex() == v.hex():
                    del self.pending[i]
                    return ("f", v, t.expr)
            return ("f", v, None)
        return x

    def out(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            r = self.refs.get(id(x))
            if r is None:
                r = self.refs[id(x)] = ("v", len(self.keep))
                self.keep.append(x)
            self.dtypes[r] = x.dtype
            return r
        if isinstance(x, (list, tuple)):
            return [self.out(y) for y in x]
        return None


class _Dispatch(TorchDispatchMode):
    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        if func in _SKIP:
            out = func(*args, **kwargs)
            if func is not aten._local_scalar_dense.default and isinstance(out, torch.Tensor):
                rec.refs[id(out)] = rec.ref(args[0])
                rec.keep.append(out)
            return out
        a = rec.leaf(list(args))
        kw = {k: rec.leaf(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        rec.ops.append((func, a, kw, rec.out(out)))
        return out


class _Function(TorchFunctionMode):
    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        if func is torch.Tensor.item:
            r = rec.refs.get(id(args[0]))
            if r is None or r[0] != "in" or r[1] not in rec.pre:
                raise NotTraceable("the step reads a tensor value other than its step counters")
            value = func(*args, **kwargs)
            n = r[1]
            if n not in rec.reads:
                rec.reads.append(n)
            delta = value - rec.pre[n]
            rec.deltas.setdefault(n, delta)
            return Traced(value, ("+", ("s", rec.reads.index(n)), ("c", delta)))
        traced = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, Traced)]
        rec.pending = traced
        out = func(*args, **kwargs)
        if rec.pending:
            raise NotTraceable(f"a hyperparameter reached {getattr(func, '__name__', func)} "
                               "other than as a float argument")
        return out


def _shadow(opt: torch.optim.Optimizer, got: Gathered, scale: float, step_shift: float,
            ) -> tuple[Any, dict[int, int], dict[int, float], list]:
    """A shadow of ``opt`` on stand-ins; (shadow, id -> input index, step values, stand-ins)."""
    cls = type(opt)
    sh = object.__new__(cls)
    sh.__dict__.update(opt.__dict__)
    sh.state = collections.defaultdict(dict)
    ids: dict[int, int] = {}
    pre: dict[int, float] = {}
    stand: list = []
    slot = 0

    def hyper(v: Any) -> Any:
        nonlocal slot
        if type(v) is float:
            slot += 1
            return trace_value(v * scale, slot - 1)
        if type(v) is tuple and v and all(type(x) is float for x in v):
            return tuple(hyper(x) for x in v)
        return v

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    k = 0
    groups = []
    for group in opt.param_groups:
        g2 = {name: hyper(v) for name, v in group.items() if name != "params"}
        if g2.get("foreach") is None:
            g2["foreach"] = True
        params = []
        for p in group["params"]:
            sp = meta(p)
            params.append(sp)
            stand.append(sp)
            if p.grad is None:
                continue
            sp.grad = meta(p.grad)
            ids[id(sp)], ids[id(sp.grad)] = k, k + 1
            k += 2
            for name, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    if v.device.type == "cpu" and v.dim() == 0:
                        s = v.detach().clone()
                        pre[k] = s.item() + step_shift
                        s.fill_(pre[k])
                    else:
                        s = meta(v)
                    ids[id(s)] = k
                    k += 1
                    stand.append(s)
                    v = s
                sh.state[sp][name] = v
        g2["params"] = params
        groups.append(g2)
    sh.param_groups = groups
    return sh, ids, pre, stand


# One trace at a time in the process: Traced.guards (the comparisons a trace records) is a
# class-level slot, set only while this lock is held.
_TRACE_LOCK = threading.Lock()


def _record(opt: torch.optim.Optimizer, got: Gathered, scale: float, shift: float) -> _Recorder:
    with _TRACE_LOCK:
        return _record_locked(opt, got, scale, shift)


def _record_locked(opt: torch.optim.Optimizer, got: Gathered, scale: float, shift: float) -> _Recorder:
    sh, ids, pre, stand = _shadow(opt, got, scale, shift)
    before = {id(sp): dict(st) for sp, st in sh.state.items()}
    rec = _Recorder(ids, pre)
    rec.keep.extend(stand)
    Traced.guards = rec.guards
    try:
        with torch.no_grad(), _Function(rec), _Dispatch(rec):
            _raw_step(type(opt))(sh)
    except NotTraceable:
        if {id(sp) for sp, st in sh.state.items() if st} != {i for i, st in before.items() if st}:
            raise StateNotReady("the step creates state (a first step)") from None
        raise
    finally:
        Traced.guards = None
    after = {id(sp): st for sp, st in sh.state.items()}
    if after.keys() != before.keys() or any(
            after[i].keys() != st.keys() or any(after[i][n] is not v for n, v in st.items()
                                                if isinstance(v, torch.Tensor))
            for i, st in before.items()):
        raise StateNotReady("the step creates or replaces state (a first step)")
    return rec


@dataclass(frozen=True)
class StepProgram:
    """One signature's compiled-step recipe: ``gm`` over (inputs, ``consts``, lifted
    scalars), ``program(h, s) -> (values, guards hold)`` for the scalars (h: the float
    hyperparameters, s: the step counters ``reads`` before the step), their dtypes and
    shapes, and the baked-in float count (``baked``: floats that are not lifted, held by
    guards)."""

    gm: fx.GraphModule
    consts: tuple
    reads: tuple
    program: Callable[[list, list], tuple]
    slots: tuple      # (dtype, length or None) per lifted scalar
    baked: int
    deltas: tuple = ()  # per read step counter: what the step adds to it (1.0)
    # the program with every step counter read as the first: for steps all equal (Note
    # [Equal step counters share their arithmetic])
    uniform: Callable[[list, list], tuple] | None = None

    @property
    def n_scalars(self) -> int:
        return len(self.slots)

    def scalars(self, hyper: list, steps: list) -> list | None:
        """The lifted scalars as tensors for these values; None when a guard fails (torch's
        code would take another branch)."""
        uniform = self.uniform
        if uniform is not None and steps and steps.count(steps[0]) == len(steps):
            values, ok = uniform(hyper, steps)
        else:
            values, ok = self.program(hyper, steps)
        if not ok:
            return None
        return [torch.tensor(v, dtype=dt) for v, (dt, _) in zip(values, self.slots)]


def _first_dtype(rec: _Recorder, arg: Any) -> torch.dtype | None:
    first = arg[0] if isinstance(arg, list) and arg else arg
    return rec.dtypes.get(first) if isinstance(first, tuple) else None


def _is_float(x: Any) -> bool:
    return type(x) is tuple and len(x) == 3 and x[0] == "f"


def _plan(rec: _Recorder) -> tuple[list, list, list]:
    """Per op, which argument is lifted (and its rule); the slots; guards for baked floats."""
    plans, slots, guards = [], [], []
    for func, args, kw, _ in rec.ops:
        _, rule, alpha = rules_for(func)
        lifted = None
        if rule is not None:
            where = rule.where
            x = (args[where] if where < len(args) else None) if isinstance(where, int) else kw.get(where)
            traced = (rule.many and isinstance(x, list) and x and all(_is_float(e) for e in x)
                      and any(e[2] is not None for e in x)) or (not rule.many and _is_float(x) and x[2] is not None)
            if traced:
                lifted = (rule, where)
        if lifted is None and alpha is not None and _is_float(kw.get("alpha")) and kw["alpha"][2] is not None:
            lifted = (alpha, "alpha")
        if lifted is not None:
            dtype = _first_dtype(rec, args[0])
            if dtype is None or (lifted[0].rewrite and dtype not in _DTYPES):
                lifted = None
        if lifted is not None:
            rule, where = lifted
            x = args[where] if isinstance(where, int) else kw[where]
            exprs = [e[2] if e[2] is not None else ("c", e[1]) for e in x] if rule.many else x[2]
            slots.append((exprs, scalar_dtype(dtype), len(x) if rule.many else None))
        plans.append(lifted)
        skip: set[int] = set()
        if lifted is not None:
            x = args[lifted[1]] if isinstance(lifted[1], int) else kw[lifted[1]]
            skip = {id(e) for e in x} if lifted[0].many else {id(x)}
        for leaf in torch.utils._pytree.tree_leaves((args, kw), is_leaf=_is_float):
            if _is_float(leaf) and leaf[2] is not None and id(leaf) not in skip:
                guards.append((leaf[2], "==", ("c", leaf[1]), True))
    return plans, slots, guards


def _written(rec: _Recorder) -> set:
    """The refs the recorded ops write in place (their schemas' mutable arguments)."""
    out: set = set()
    for func, args, kw, _ in rec.ops:
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            x = args[i] if i < len(args) else kw.get(a.name)
            for r in (x if isinstance(x, list) else [x]):
                if isinstance(r, tuple) and r and r[0] in ("in", "k", "v"):
                    out.add(r)
    return out


def _build(rec: _Recorder, inputs: list, plans: list, n_slots: int,
           grads: frozenset = frozenset()) -> fx.GraphModule:
    n_inputs = len(inputs)
    devices = {t.device for t in inputs if t.dim() > 0}
    device = next(iter(devices)) if len(devices) == 1 else None
    g = fx.Graph()
    env: dict[tuple, Any] = {("in", i): g.placeholder(f"in{i}") for i in range(n_inputs)}
    env.update({("k", j): g.placeholder(f"k{j}") for j in range(len(rec.consts))})
    scalars = [g.placeholder(f"s{j}") for j in range(n_slots)]
    # Note [Grads stay the program's]: torch's multi-tensor SGD with nesterov adds the
    # momentum into the grads in place (``_foreach_add_(grads, bufs, alpha=momentum)``);
    # its single-tensor step, eager's default on CPU, leaves p.grad alone. A grad the
    # traced step writes is copied first, so the program's grads stay as eager leaves them.
    for r in _written(rec):
        if r[0] == "in" and r[1] in grads:
            env[r] = g.call_function(aten.clone.default, (env[r],))

    def node_of(x: Any) -> Any:
        if isinstance(x, list):
            return [node_of(y) for y in x]
        if isinstance(x, tuple) and x and x[0] in ("in", "k", "v"):
            return env[x]
        if _is_float(x):
            return x[1]
        if isinstance(x, torch.device) and x.type == "meta":  # a tensor made in the step
            if device is None:
                raise NotTraceable("the step makes tensors and its params are on several devices")
            return device
        return x

    used = 0
    for (func, args, kw, outs), lifted in zip(rec.ops, plans):
        a = [node_of(x) for x in args]
        k = {name: node_of(v) for name, v in kw.items()}
        if lifted is not None:
            rule, _ = lifted
            dtype = _first_dtype(rec, args[0])
            node = rule.emit(g, func, a, k, scalars[used], dtype)
            used += 1
        else:
            node = g.call_function(func, tuple(a), k)
        if isinstance(outs, tuple) and outs[0] == "v" and outs not in env:
            env[outs] = node
        elif isinstance(outs, list):
            for i, r in enumerate(outs):
                if isinstance(r, tuple) and r[0] == "v" and r not in env:
                    env[r] = g.call_function(operator.getitem, (node, i))
    g.output(())
    gm = fx.GraphModule(torch.nn.Module(), g)
    gm.meta = {}
    return gm


def _same(a: Any, b: Any, check: list) -> bool:
    """Whether two recordings match structurally; traced floats go to ``check``."""
    if _is_float(a) and _is_float(b):
        if a[2] is None:
            return b[2] is None and a[1].hex() == b[1].hex()
        check.append((a[2], b[1]))
        return b[2] is not None
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], check) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y, check) for x, y in zip(a, b))
    return a == b


def trace_step(opt: torch.optim.Optimizer, got: Gathered) -> StepProgram:
    """``opt``'s step on ``got`` as one :class:`StepProgram`; raises :class:`NotTraceable`.

    Traced twice: with the real values, and with every float hyperparameter scaled and
    the step counters moved, to prove that each float in the graph is either constant or
    recomputed exactly by the traced program, and that the ops do not depend on values.
    """
    rec = _record(opt, got, 1.0, 0.0)
    other = _record(opt, got, 1.0009765625, 7.0)
    if len(rec.ops) != len(other.ops) or len(rec.guards) != len(other.guards):
        raise NotTraceable("the step's ops depend on hyperparameter values")
    check: list = []
    for x, y in zip(rec.ops, other.ops):
        if x[0] is not y[0] or not _same(list(x[1:3]), list(y[1:3]), check):
            raise NotTraceable("the step's ops depend on hyperparameter values")
    plans, slots, guards = _plan(rec)
    all_guards = rec.guards + guards
    program = compile_program([s[0] for s in slots], all_guards)
    probe = compile_program([e for e, _ in check], [])
    h2 = [float(v) * 1.0009765625 if type(v) is float else v for v in got.hyper]
    s2 = [other.pre[n] for n in rec.reads]
    values, _ = probe(h2, s2)
    if any(float(v).hex() != float(w).hex() for v, (_, w) in zip(values, check)):
        raise NotTraceable("a hyperparameter leaves Python's traced arithmetic (math.*, float())")
    _, holds = program(got.hyper, [rec.pre[n] for n in rec.reads])
    if not holds:
        raise NotTraceable("the traced guards do not hold for the traced values")
    gm = _build(rec, got.inputs, plans, len(slots), got.grads)
    # Note [Equal step counters share their arithmetic]
    uniform = one_step_program([sl[0] for sl in slots], all_guards) if len(rec.reads) > 1 else None
    return StepProgram(gm, tuple(rec.consts), tuple(rec.reads), program,
                       tuple((dt, n) for _, dt, n in slots), len(guards),
                       tuple(rec.deltas[n] for n in rec.reads), uniform)


# Note [Lerp for a compiler]
# The lifted weight of ``_foreach_lerp_`` (Adam's ``1 - beta1``) makes it the ``List``
# overload, which Inductor has no lowering or decomposition for: it ran as a fallback
# kernel out of place, with a copy back, splitting the step's fusion. For a compiler the
# op is written as Inductor decomposes the Scalar overload torch.compile(opt.step) traces,
# ``start + (end - start) * weight``: within torch.compile's own rounding of the step,
# not eager's lerp formula (the debugging backends keep the exact op).
def lerp_for_compiler(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with its list-weight foreach lerps written as add/sub/mul (see the Note)."""
    g = gm.graph
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in (aten._foreach_lerp_.List, aten._foreach_lerp.List):
            continue
        start, end, weights = node.args[:3]
        if not weights or any(w is not weights[0] for w in weights):
            continue
        with g.inserting_before(node):
            diff = g.call_function(aten._foreach_sub.List, (end, start))
            scaled = g.call_function(aten._foreach_mul.Tensor, (diff, weights[0]))
            inplace = node.target is aten._foreach_lerp_.List
            new = g.call_function(aten._foreach_add_.List if inplace else aten._foreach_add.List,
                                  (start, scaled))
        node.replace_all_uses_with(new)
        g.erase_node(node)
    g.lint()
    gm.recompile()
    return gm


def step_values(prog: StepProgram, inputs: list) -> list | None:
    """The step counters ``prog`` reads, before the step (None: not exact float32 integers)."""
    out = []
    for n in prog.reads:
        v = inputs[n].item()
        if not (0.0 <= v < MAX_EXACT_STEP) or v != int(v):
            return None
        out.append(v)
    return out


__all__ = ["Gathered", "StepProgram", "NotTraceable", "StateNotReady", "lerp_for_compiler", "gather", "trace_step", "step_values",
           "MAX_EXACT_STEP"]
