"""Traced hyperparameters: torch.optim's own Python scalar arithmetic, recorded once and
replayed as straight-line Python (Note [Hyperparameters are traced, not baked]).

A :class:`Traced` is a Python float that remembers how it was computed from the optimizer's
hyperparameters (``("h", i)``) and its step counters (``("s", k)``). torch.optim's
multi-tensor code computes its per-step floats (``1 - lr * weight_decay``, Adam's bias
corrections and step sizes) with ordinary Python arithmetic; run on Traced inputs, every
such float carries its expression, and :func:`compile_program` turns the expressions into
one Python function that recomputes them, with the same float operations in the same
order, for new values.

Example::

    >>> lr, b1 = Traced(0.1, ("h", 0)), Traced(0.9, ("h", 1))
    >>> step = Traced(3.0, ("s", 0))
    >>> size = (lr / (1 - b1 ** step)) * -1
    >>> fn = compile_program([size.expr], [])
    >>> fn([0.1, 0.9], [3.0])[0][0] == size, fn([0.2, 0.9], [3.0])[0][0] == (0.2 / (1 - 0.9 ** 3.0)) * -1
    (True, True)
"""

from __future__ import annotations

import operator
from typing import Any, Callable

# Note [Hyperparameters are traced, not baked]
# A compiled step must not be keyed by lr (a schedule changes it every step), yet its
# floats must be eager's to the last bit. torch.optim computes them in Python doubles; a
# Traced float records that arithmetic (+ - * / ** neg abs) while torch's own code runs
# on it, and comparisons (``weight_decay != 0``, ``momentum != 0``) are recorded as
# guards: a value that would take the other branch of torch's code is a new trace, never
# a wrong graph. A float that leaves the traced arithmetic (``math.sqrt``, ``float()``,
# a tensor operand) is caught by tracing twice with other values (optim_graph.py).
_BINOPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "**": operator.pow,
}
_CMPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}


def _expr(x: Any) -> Any:
    """The expression of an operand: a Traced's, or ("c", value) for a plain number."""
    return x.expr if isinstance(x, Traced) else ("c", x)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Traced(float):
    """A float that remembers its expression (see the module docstring).

    ``guards`` (class level, set by the tracer while a trace runs) collects the comparisons
    made on traced values: (expression, op, expression, result).
    """

    guards: list | None = None

    def __new__(cls, value: float, expr: Any) -> "Traced":
        obj = float.__new__(cls, value)
        obj.expr = expr
        return obj

    def _bin(self, other: Any, op: str, reflected: bool) -> Any:
        if not _number(other):
            return NotImplemented
        o = float(other) if isinstance(other, Traced) else other
        a, b = (o, float(self)) if reflected else (float(self), o)
        ea, eb = (_expr(other), self.expr) if reflected else (self.expr, _expr(other))
        return Traced(_BINOPS[op](a, b), (op, ea, eb))

    def __add__(self, o: Any) -> Any: return self._bin(o, "+", False)
    def __radd__(self, o: Any) -> Any: return self._bin(o, "+", True)
    def __sub__(self, o: Any) -> Any: return self._bin(o, "-", False)
    def __rsub__(self, o: Any) -> Any: return self._bin(o, "-", True)
    def __mul__(self, o: Any) -> Any: return self._bin(o, "*", False)
    def __rmul__(self, o: Any) -> Any: return self._bin(o, "*", True)
    def __truediv__(self, o: Any) -> Any: return self._bin(o, "/", False)
    def __rtruediv__(self, o: Any) -> Any: return self._bin(o, "/", True)
    def __pow__(self, o: Any, mod: Any = None) -> Any:
        return NotImplemented if mod is not None else self._bin(o, "**", False)
    def __rpow__(self, o: Any, mod: Any = None) -> Any:
        return NotImplemented if mod is not None else self._bin(o, "**", True)
    def __neg__(self) -> "Traced": return Traced(-float(self), ("neg", self.expr))
    def __pos__(self) -> "Traced": return self
    def __abs__(self) -> "Traced": return Traced(abs(float(self)), ("abs", self.expr))

    def _cmp(self, other: Any, op: str) -> Any:
        if not _number(other):
            return NotImplemented
        result = _CMPS[op](float(self), float(other))
        if Traced.guards is not None:
            Traced.guards.append((self.expr, op, _expr(other), result))
        return result

    def __eq__(self, o: Any) -> Any: return self._cmp(o, "==")
    def __ne__(self, o: Any) -> Any: return self._cmp(o, "!=")
    def __lt__(self, o: Any) -> Any: return self._cmp(o, "<")
    def __le__(self, o: Any) -> Any: return self._cmp(o, "<=")
    def __gt__(self, o: Any) -> Any: return self._cmp(o, ">")
    def __ge__(self, o: Any) -> Any: return self._cmp(o, ">=")
    def __bool__(self) -> bool: return bool(self._cmp(0, "!="))
    __hash__ = float.__hash__

    def __reduce__(self) -> Any:  # copies (deepcopy of a param group) are plain floats
        return (float, (float(self),))


def trace_value(value: Any, slot: int) -> Any:
    """``value`` as a traced hyperparameter number ``slot`` (floats only; else as is)."""
    return Traced(value, ("h", slot)) if type(value) is float else value


def compile_program(outputs: list, guards: list) -> Callable[[list, list], tuple]:
    """One Python function ``(h, s) -> (values, guards_hold)`` for expressions ``outputs``
    (each an expression or a list of them) and ``guards`` ((expr, op, expr, result)):
    straight-line code, each shared subexpression computed once, in torch's order."""
    lines: list[str] = []
    names: dict[int, str] = {}
    consts: dict[str, Any] = {}

    def emit(e: Any) -> str:
        got = names.get(id(e))
        if got is not None:
            return got
        kind = e[0]
        if kind == "h":
            text = f"h[{e[1]}]"
        elif kind == "s":
            text = f"s[{e[1]}]"
        elif kind == "c":
            name = f"c{len(consts)}"
            consts[name] = e[1]
            text = name
        elif kind == "neg":
            text = f"(-{emit(e[1])})"
        elif kind == "abs":
            text = f"abs({emit(e[1])})"
        else:
            text = f"({emit(e[1])} {kind} {emit(e[2])})"
        if kind in ("h", "s", "c"):
            names[id(e)] = text
            return text
        name = f"t{len(names)}"
        lines.append(f"    {name} = {text}")
        names[id(e)] = name
        return name

    outs = []
    for o in outputs:
        outs.append("[" + ", ".join(emit(e) for e in o) + "]" if isinstance(o, list) else emit(o))
    checks = [f"({emit(a)} {op} {emit(b)}) == {bool(r)}" for a, op, b, r in guards]
    body = "\n".join(lines)
    src = (f"def _program(h, s):\n{body}\n"
           f"    return [{', '.join(outs)}], ({' and '.join(checks) or 'True'})\n")
    scope: dict[str, Any] = dict(consts)
    exec(compile(src, "<adaptive_eager optimizer scalars>", "exec"), scope)  # noqa: S102
    return scope["_program"]


# Note [Equal step counters share their arithmetic]
# Adam's multi-tensor step computes its bias corrections and step sizes per parameter,
# from each parameter's own step counter: the traced program (optim_scalars.py) repeats
# that arithmetic 100 times for 100 tensors (AdamW over the benchmark's 100 tensors:
# ~100 µs of Python a step, measured with a no-op kernel, against ~10 µs for SGD's). A
# training loop steps every parameter together, so the counters are almost always equal;
# for them a second program reads every counter as the first, and with the repeated
# expressions shared (one node per distinct expression, constants told apart by type and
# exact value), computes each distinct float once: the same operations on the same
# values, so the same floats bit for bit. Counters that differ (a parameter that had no
# grad some steps) run the full program.
def _one_step(e: Any, memo: dict, canon: dict) -> Any:
    """Expression ``e`` with every step counter read as the first, shared (see the Note)."""
    got = memo.get(id(e))
    if got is not None:
        return got
    kind = e[0]
    key: Any
    if kind == "s":
        key = new = ("s", 0)
    elif kind == "h":
        key = new = e
    elif kind == "c":
        key, new = ("c", type(e[1]).__name__, repr(e[1])), e
    else:
        new = (kind,) + tuple(_one_step(a, memo, canon) for a in e[1:])
        key = (kind,) + tuple(map(id, new[1:]))
    new = canon.setdefault(key, new)
    memo[id(e)] = new
    return new


def one_step_program(outputs: list, guards: list) -> Callable[[list, list], tuple]:
    """:func:`compile_program` of ``outputs`` and ``guards`` with every step counter read
    as the first, repeated expressions computed once (Note [Equal step counters share
    their arithmetic]).

    Example::

        >>> lr, b1 = Traced(0.1, ("h", 0)), Traced(0.9, ("h", 1))
        >>> sizes = [(lr / (1 - b1 ** Traced(3.0, ("s", k)))) * -1 for k in range(3)]
        >>> one = one_step_program([[x.expr for x in sizes]], [])
        >>> one([0.1, 0.9], [3.0])[0][0] == sizes
        True
    """
    memo: dict = {}
    canon: dict = {}
    return compile_program(
        [[_one_step(e, memo, canon) for e in x] if isinstance(x, list) else _one_step(x, memo, canon)
         for x in outputs],
        [(_one_step(a, memo, canon), op, _one_step(b, memo, canon), r) for a, op, b, r in guards])


__all__ = ["Traced", "trace_value", "compile_program", "one_step_program"]
