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
# ``addcmul(x, y, a)``, ``addcdiv(x, t1, t2, value=v)`` becomes
# ``add(x, div(mul(t1, v), t2))``, rounded as eager's CPU kernels round (Note [Lifted
# scalars keep eager's rounding]; float32 and float64 only).
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

from .ir import OpNode, TensorSpec, ValueRef

aten = torch.ops.aten


@dataclass(frozen=True)
class LiftRule:
    """Where the liftable float sits (a position or keyword name) and how to emit the op.

    ``many``: the argument is a list of floats (a foreach op's ``Scalar[]``), lifted as
    one 1-D tensor (Note [Scalar lists are lifted too]).
    """

    where: int | str
    # None: the float is lifted out of the window's key, but no graph can take it as an
    # input, so the op runs eagerly with it (Note [A fused optimizer's learning rate is
    # lifted, and the op runs eagerly]).
    emit: Callable[[fx.Graph, Any, list, dict, fx.Node, torch.dtype], fx.Node] | None
    many: bool = False
    # The op is rewritten (a Scalar-typed argument cannot take a tensor): rounds as eager
    # only in float32/float64 (Note [Lifted scalars keep eager's rounding]).
    rewrite: bool = False


def _replace_at(tensor_overload: Any, pos: int, same_dtype: bool = False) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        args = list(args)
        if same_dtype and dtype != scalar_dtype(dtype):  # lerp wants weight.dtype == self.dtype
            s = g.call_function(aten._to_copy.default, (s,), {"dtype": dtype})
        args[pos] = s
        return g.call_function(tensor_overload, tuple(args), kwargs)
    return emit


def _signed(g: fx.Graph, target: Any, s: fx.Node) -> fx.Node:
    name = target._schema.name  # aten::sub(_): x - alpha * y
    return g.call_function(aten.neg.default, (s,)) if name.startswith(("aten::sub", "aten::_foreach_sub")) else s


def _inplace(target: Any) -> bool:
    return target._schema.name.endswith("_")


def _alpha(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
           dtype: torch.dtype) -> fx.Node:
    # Note [Lifted scalars keep eager's rounding]: x + alpha * y as addcmul(x, y, alpha)
    op = aten.addcmul_.default if _inplace(target) else aten.addcmul.default
    return g.call_function(op, (args[0], args[1], _signed(g, target, s)))


def _value(combine: Any, inplace: bool) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        # value * t1 combined with t2, as eager's CPU kernels round it (Note [Lifted
        # scalars keep eager's rounding]): addcdiv as self + (value * t1) / t2, addcmul as
        # addcmul(self, value * t1, t2) (a multiply-add)
        t = g.call_function(aten.mul.Tensor, (args[1], s))
        if combine is aten.mul.Tensor:
            op = aten.addcmul_.default if inplace else aten.addcmul.default
            return g.call_function(op, (args[0], t, args[2]))
        t = g.call_function(combine, (t, args[2]))
        return g.call_function(aten.add_.Tensor if inplace else aten.add.Tensor, (args[0], t))
    return emit


# Note [Lifted scalars keep eager's rounding]
# A rewrite must round as eager's kernel does, or a region run by any backend (eager's
# included) differs from eager in the last bit. Eager's CPU kernels compute
# ``add(x, y, alpha=a)`` (and ``_foreach_add`` with alpha) and ``addcmul(x, t1, t2,
# value=v)`` with a fused multiply-add (AVX2/AVX512 fmadd): ``add(x, mul(y, a))`` rounds
# twice and was 1 ulp off on ~2% of fp32 elements (26% on the manual SGD update of
# word_language_model; its perplexity moved from 12045.31 to 12045.48). Measured bitwise
# on this CPU over sizes 1-70, 4099 and 100003, fp32 and fp64, and the foreach forms:
# ``addcmul(x, y, a)`` for alpha (``sub``: ``addcmul(x, y, -a)``), ``addcmul(x, mul(t1,
# v), t2)`` for addcmul's value, ``x + div(mul(t1, v), t2)`` for addcdiv's. For float16
# and bfloat16 no rewrite matched (20-28 of 213 cases differ: the kernels round through
# float32 in their own order), so those floats are not lifted there (baked, keyed by
# value: a new value is a new region, never a different result).


# Note [Scalar lists are lifted too]
# torch.optim's multi-tensor steps pass their per-parameter floats as lists (Adam's
# ``_foreach_addcdiv_(params, exp_avgs, denom, step_sizes)``, ``_foreach_div_(denom,
# bias_correction2_sqrt)``) and lr-dependent ones as plain floats of foreach ops
# (AdamW's ``_foreach_mul_(params, 1 - lr * wd)``, SGD's ``_foreach_add_(params, grads,
# alpha=-lr)``). They change every step, so they are lifted like single floats: a list
# becomes one 1-D tensor input of its length (keyed by length and dtype, never by
# value), whose elements the graph selects as 0-dim tensors for the ``List`` overload of
# the op (``_foreach_div_.ScalarList(xs, ss)`` -> ``_foreach_div_.List(xs, [s[0], ...])``);
# a float becomes a 0-dim tensor for the ``Tensor`` overload. ``addcdiv``/``addcmul``
# have no lowering for tensor scalars in Inductor, so they are emitted as eager's CPU
# kernel computes them, ``self + value * t1 / t2`` (and ``* t2``). The scalars are made
# in the dtype of the tensors they apply to (float32 for lower precision), so lists over
# tensors of mixed dtypes are not lifted (they stay in the key by value).
def _elems(g: fx.Graph, s: fx.Node, n: int) -> list:
    return [g.call_function(aten.select.int, (s, 0, i)) for i in range(n)]


def _foreach_list(list_overload: Any) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        return g.call_function(list_overload, (args[0], _elems(g, s, len(args[0]))), kwargs)
    return emit


def _foreach_scalar(tensor_overload: Any, list_overload: Any = None) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        if tensor_overload is None:  # no Tensor overload (sub): the same 0-dim tensor n times
            return g.call_function(list_overload, (args[0], [s] * len(args[0])), kwargs)
        return g.call_function(tensor_overload, (args[0], s), kwargs)
    return emit


def _foreach_alpha(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
                   dtype: torch.dtype) -> fx.Node:
    # Note [Lifted scalars keep eager's rounding]: xs + alpha * ys as a multiply-add
    op = aten._foreach_addcmul_.Scalar if _inplace(target) else aten._foreach_addcmul.Scalar
    s = _signed(g, target, s)
    return g.call_function(op, (args[0], args[1], [s] * len(args[1])))


def _foreach_value(second: Any, inplace: bool, many: bool) -> Callable:
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        self_, t1, t2 = args[0], args[1], args[2]
        if many:
            v = g.call_function(aten._foreach_mul.List, (t1, _elems(g, s, len(t1))))
        else:
            v = g.call_function(aten._foreach_mul.Tensor, (t1, s))
        if second is aten._foreach_mul.List:  # Note [Lifted scalars keep eager's rounding]
            op = aten._foreach_addcmul_.Scalar if inplace else aten._foreach_addcmul.Scalar
            return g.call_function(op, (self_, v, t2))
        v = g.call_function(second, (v, t2))
        add = aten._foreach_add_.List if inplace else aten._foreach_add.List
        return g.call_function(add, (self_, v))
    return emit


def _foreach_lerp(list_overload: Any) -> Callable:
    # Adam's ``_foreach_lerp_(exp_avgs, grads, 1 - beta1)``: the weight as one 0-dim tensor
    # per element (``List`` overload), made in the tensors' dtype as lerp.Tensor wants
    def emit(g: fx.Graph, target: Any, args: list, kwargs: dict, s: fx.Node,
             dtype: torch.dtype) -> fx.Node:
        if dtype != scalar_dtype(dtype):
            s = g.call_function(aten._to_copy.default, (s,), {"dtype": dtype})
        return g.call_function(list_overload, (args[0], args[1], [s] * len(args[0])), kwargs)
    return emit


# Note [A fused optimizer's learning rate is lifted, and the op runs eagerly]
# ``torch.optim.AdamW(fused=True)`` (the Hugging Face Trainer's default optimizer,
# ``adamw_torch_fused``) is one op, ``_fused_adamw_(params, grads, ..., lr=<float>)``, and a
# learning-rate schedule changes that float every step. Keyed by value, the window holding
# it (the Trainer's last: the backward's tail, clipping and the step) was new at every
# step and never planned (GPT-2 under the Trainer, 16 steps: steps 9-16 46% fused). The
# ``tensor_lr`` overload would take lr as a graph input (its CPU kernel reads a float64
# carrier bitwise as the float: measured over sizes 7-4099 and three rates), but it has
# no meta kernel in torch 2.13, so AOTAutograd and Inductor cannot trace it. So the float
# is lifted out of the window's key only: the op runs eagerly between the regions, with
# this step's value (an eager replay reads the window's lifted floats), and the rest of
# the window compiles once.
def _foreach_rules(rules: dict[Any, LiftRule]) -> None:
    for packet in (aten._foreach_lerp, aten._foreach_lerp_):
        rules[packet.Scalar] = LiftRule(2, _foreach_lerp(packet.List))
    for op in ("add", "sub", "mul", "div"):
        for suffix in ("", "_"):
            packet = getattr(aten, f"_foreach_{op}{suffix}")
            rules[packet.ScalarList] = LiftRule(1, _foreach_list(packet.List), many=True)
            tensor = getattr(packet, "Tensor", None)
            rules[packet.Scalar] = LiftRule(1, _foreach_scalar(tensor, packet.List))
    for op in ("add", "sub"):
        for suffix in ("", "_"):
            packet = getattr(aten, f"_foreach_{op}{suffix}")
            rules[(packet.List, "alpha")] = LiftRule("alpha", _foreach_alpha, rewrite=True)
    for name, second in (("addcmul", aten._foreach_mul.List), ("addcdiv", aten._foreach_div.List)):
        for suffix, inplace in (("", False), ("_", True)):
            packet = getattr(aten, f"_foreach_{name}{suffix}")
            rules[packet.ScalarList] = LiftRule(3, _foreach_value(second, inplace, True), many=True,
                                               rewrite=True)
            # Scalar value=1 is positional in the foreach schemas (keyword-only in addcdiv's)
            rules[packet.Scalar] = LiftRule(3, _foreach_value(second, inplace, False), rewrite=True)


def _rules() -> dict[Any, LiftRule]:
    rules: dict[Any, LiftRule] = {}
    _foreach_rules(rules)
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
            rules[(packet.Tensor, "alpha")] = LiftRule("alpha", _alpha, rewrite=True)
    for name, combine in (("addcmul", aten.mul.Tensor), ("addcdiv", aten.div.Tensor)):
        rules[getattr(aten, name).default] = LiftRule("value", _value(combine, False), rewrite=True)
        rules[getattr(aten, name + "_").default] = LiftRule("value", _value(combine, True),
                                                            rewrite=True)
    rules[aten.lerp.Scalar] = LiftRule(2, _replace_at(aten.lerp.Tensor, 2, True))
    rules[aten.lerp_.Scalar] = LiftRule(2, _replace_at(aten.lerp_.Tensor, 2, True))
    for op in (aten._fused_adam_.default, aten._fused_adamw_.default):
        # Note [A fused optimizer's learning rate is lifted, and the op runs eagerly]
        rules[op] = LiftRule("lr", None)
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


def _liftable(value: Any, many: bool) -> bool:
    if not many:
        return type(value) is float
    return type(value) in (list, tuple) and len(value) > 0 and all(type(v) is float for v in value)


def runs_eagerly(node: OpNode, specs: dict[int, TensorSpec]) -> bool:
    """Whether ``node``'s float is lifted but no graph can take it (Note [A fused
    optimizer's learning rate is lifted, and the op runs eagerly]).

    Example::

        >>> runs_eagerly(OpNode(aten._fused_adamw_.default, (), (("lr", 1e-3),), ()), {})
        True
    """
    rule = rules_for(node.target)[1]
    return rule is not None and rule.emit is None and type(_get(node, rule.where)) is float


def lift_rule(node: OpNode, specs: dict[int, TensorSpec]) -> LiftRule | None:
    """The rule that lifts a float out of ``node``, or None (the float, if any, is baked)."""
    _, rule, alpha = rules_for(node.target)
    if rule is None or not _liftable(_get(node, rule.where), rule.many):
        rule = alpha
        if rule is None or type(_get(node, "alpha")) is not float:
            return None
    if rule.emit is None:
        return rule  # the op runs eagerly, with the float as the program passed it
    dtype = lifted_dtype(node, specs)
    if dtype is None or not dtype.is_floating_point:
        return None
    if rule.rewrite and dtype not in (torch.float32, torch.float64):
        return None  # Note [Lifted scalars keep eager's rounding]
    return rule


def lifted_dtype(node: OpNode, specs: dict[int, TensorSpec]) -> torch.dtype | None:
    """The dtype of the tensors a lifted scalar applies to: the op's outputs, or for an
    in-place foreach op (which returns nothing) its first argument's tensors; None when
    they differ (Note [Scalar lists are lifted too])."""
    vids = [v for v in node.outputs if v is not None]
    if not vids and node.args and type(node.args[0]) in (list, tuple):
        vids = [r.id for r in node.args[0] if type(r) is ValueRef]
    if not vids:
        return None
    dtype = specs[vids[0]].dtype
    for v in vids:
        if specs[v].dtype != dtype:
            return None
    return dtype


def lifted_shape(node: OpNode, rule: LiftRule) -> tuple[int, ...]:
    """The shape of the tensor carrying the lifted value: () or (length of the list,)."""
    return (len(_get(node, rule.where)),) if rule.many else ()


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
    """``node``'s (args, kwargs) with the lifted float replaced by :data:`LIFTED` (a list
    by ``(LIFTED, its length)``)."""
    mark = (LIFTED, len(_get(node, rule.where))) if rule.many else LIFTED
    if isinstance(rule.where, int):
        args = list(node.args)
        args[rule.where] = mark
        return tuple(args), node.kwargs
    return node.args, tuple((k, mark if k == rule.where else v) for k, v in node.kwargs)


__all__ = ["LiftRule", "LIFT_RULES", "rules_for", "lift_rule", "lifted_value", "lifted_dtype",
           "lifted_shape", "scalar_dtype", "LIFTED", "strip", "runs_eagerly"]
