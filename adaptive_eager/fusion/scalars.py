"""Scalar lifting: Python floats that change between iterations become region inputs.

# Note [Scalar lifting]
# Learning-rate schedules, Adam's bias corrections and decays reach the window as Python
# floats in op arguments (``p.mul_(1 - lr * wd)``, ``p.addcdiv_(m, d, value=-step)``).
# Baked into the key or the compiled code, every step would miss the cache and compile
# again. So, for the ops in ``LIFT_RULES``, the float is left out of the key and passed
# at call time as a 0-dim CPU tensor, a plain graph input Inductor accepts (no SymFloat,
# no guard). Type promotion must not change: a Python float is a "wrapped number" that
# never raises the result dtype, a 0-dim tensor of a higher category would. Since the
# output dtype is known (window specs), the scalar tensor is made in that dtype (float32
# for float16/bfloat16 outputs, which is the op math type eager uses for the scalar), and
# only floating outputs are lifted. Scalar-typed arguments (``alpha``, ``value``) cannot
# take a tensor, so those ops are rewritten: ``add(x, y, alpha=a)`` becomes
# ``add(x, mul(y, a))``, ``addcdiv(x, t1, t2, value=v)`` becomes
# ``add(x, mul(div(t1, t2), v))`` (equal up to rounding: one more rounding step).
# Any other float stays in the key by value: a change there is a new region.

Example::

    >>> import torch
    >>> aten = torch.ops.aten
    >>> LIFT_RULES[aten.addcdiv_.default].where
    'value'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from .ir import OpNode, TensorSpec

aten = torch.ops.aten


@dataclass(frozen=True)
class LiftRule:
    """Where the liftable float sits (a position or keyword name) and how to emit the op."""

    where: int | str
    emit: Callable[[fx.Graph, Any, list, dict, fx.Node, torch.dtype], fx.Node]


def _replace_at(tensor_overload: Any, pos: int, same_dtype: bool = False) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        args = list(args)
        if same_dtype and dtype != scalar_dtype(dtype):  # lerp wants weight.dtype == self.dtype
            s = g.call_function(aten._to_copy.default, (s,), {"dtype": dtype})
        args[pos] = s
        return g.call_function(tensor_overload, tuple(args), kwargs)
    return emit


def _alpha(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
           dtype: torch.dtype) -> fx.Node:
    kwargs = {k: v for k, v in kwargs.items() if k != "alpha"}
    args = list(args[:2])
    args[1] = g.call_function(aten.mul.Tensor, (args[1], s))
    return g.call_function(target, tuple(args), kwargs)


def _value(combine: Any, inplace: bool) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        t = g.call_function(combine, (args[1], args[2]))
        t = g.call_function(aten.mul.Tensor, (t, s))
        return g.call_function(aten.add_.Tensor if inplace else aten.add.Tensor, (args[0], t))
    return emit


def _rules() -> dict[Any, LiftRule]:
    rules: dict[Any, LiftRule] = {}
    for op in ("mul", "div", "add", "sub"):
        for suffix in ("", "_"):
            packet = getattr(aten, op + suffix)
            rules[packet.Tensor] = LiftRule(1, _replace_at(packet.Tensor, 1))
            if hasattr(packet, "Scalar"):
                rules[packet.Scalar] = LiftRule(1, _replace_at(packet.Tensor, 1))
    for op in ("add", "sub"):
        for suffix in ("", "_"):
            packet = getattr(aten, op + suffix)
            # Tensor-Tensor with a float alpha (a float `other` is handled above).
            rules[(packet.Tensor, "alpha")] = LiftRule("alpha", _alpha)
    for name, combine in (("addcmul", aten.mul.Tensor), ("addcdiv", aten.div.Tensor)):
        rules[getattr(aten, name).default] = LiftRule("value", _value(combine, False))
        rules[getattr(aten, name + "_").default] = LiftRule("value", _value(combine, True))
    rules[aten.lerp.Scalar] = LiftRule(2, _replace_at(aten.lerp.Tensor, 2, True))
    rules[aten.lerp_.Scalar] = LiftRule(2, _replace_at(aten.lerp_.Tensor, 2, True))
    return rules


LIFT_RULES: dict[Any, LiftRule] = _rules()


def _get(node: OpNode, where: int | str) -> Any:
    if isinstance(where, int):
        return node.args[where] if where < len(node.args) else None
    for k, v in node.kwargs:
        if k == where:
            return v
    return None


# NB: OpOverload.__hash__ is Python code; this memo is keyed by id() (a C-level int hash)
# and keeps the target alive, so the id cannot be reused.
_BY_ID: dict[int, tuple[Any, LiftRule | None, LiftRule | None]] = {}


def rules_for(target: Any) -> tuple[Any, LiftRule | None, LiftRule | None]:
    """(target, rule for its float operand, rule for a float alpha), memoized."""
    r = _BY_ID.get(id(target))
    if r is None:
        r = _BY_ID[id(target)] = (target, LIFT_RULES.get(target), LIFT_RULES.get((target, "alpha")))
    return r


def lift_rule(node: OpNode, specs: dict[int, TensorSpec]) -> LiftRule | None:
    """The rule that lifts a float out of ``node``, or None (the float, if any, is baked)."""
    _, rule, alpha = rules_for(node.target)
    if rule is None or type(_get(node, rule.where)) is not float:
        rule = alpha
        if rule is None or type(_get(node, "alpha")) is not float:
            return None
    out = node.outputs[0] if node.outputs else None
    if out is None or not specs[out].dtype.is_floating_point:
        return None
    return rule


def lifted_value(node: OpNode, rule: LiftRule) -> float:
    return _get(node, rule.where)


def scalar_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """dtype of the 0-dim tensor carrying a lifted float (Note [Scalar lifting])."""
    return torch.float64 if out_dtype == torch.float64 else torch.float32


class _Lifted:
    """Stands for a lifted float inside a structural key."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<lifted>"


LIFTED = _Lifted()


def strip(node: OpNode, rule: LiftRule) -> tuple[tuple, tuple]:
    """``node``'s (args, kwargs) with the lifted float replaced by :data:`LIFTED`."""
    if isinstance(rule.where, int):
        args = list(node.args)
        args[rule.where] = LIFTED
        return tuple(args), node.kwargs
    return node.args, tuple((k, LIFTED if k == rule.where else v) for k, v in node.kwargs)


__all__ = ["LiftRule", "LIFT_RULES", "rules_for", "lift_rule", "lifted_value", "scalar_dtype", "LIFTED", "strip"]
