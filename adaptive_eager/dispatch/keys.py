"""The meta memo's key of one call, and seeding the memo from calls that ran for real.

The recorder keys each call it records by the op, its tensors' interned spec ids and its
other arguments (Note [Scalars in the meta key]: floats by type, ints by value; floats by
value for the few ops whose floats shape the output). :class:`MemoSeeder` builds the same
key for a call that ran for real and keeps its output specs (Note [Seeding the memo from
real runs], meta.py), so that capturing the call later needs no meta run.

Example::

    >>> import torch
    >>> from adaptive_eager.dispatch.meta import MetaMemo
    >>> from adaptive_eager.dispatch.optable import OpTable
    >>> memo = MetaMemo(64)
    >>> seeder = MemoSeeder(memo, torch.device("cpu"))
    >>> x = torch.ones(3)
    >>> neg = torch.ops.aten.neg.default
    >>> seeder.seed(neg, OpTable().traits(neg), (x,), {}, -x)
    >>> len(memo.seeded)
    1
"""

from __future__ import annotations

from typing import Any

import torch

from ..fusion.ir import TensorSpec
from ..fusion.policy import data_dependent
from .lazy import LazyTensor
from .meta import MetaMemo, MetaResult
from .optable import Kind, OpTraits

_TensorBase = torch._C.TensorBase

# Ops whose float arguments can change output shapes (Note [Scalars in the meta key]).
_FLOAT_SHAPED = ("arange", "range", "linspace", "logspace", "upsample", "interpolate", "histc")

BY_VALUE = 1  # its floats are keyed by value (_FLOAT_SHAPED)
FACTORY = 2   # no tensor argument, a keyword-only dtype: reads the default dtype when None


def op_flags(func: Any) -> int:
    """``func``'s key flags: ``BY_VALUE`` | ``FACTORY`` (see above)."""
    schema = func._schema
    flags = BY_VALUE if any(s in schema.name for s in _FLOAT_SHAPED) else 0
    args = schema.arguments
    if any(a.name == "dtype" and a.kwarg_only for a in args) and \
            not any("Tensor" in str(a.type) for a in args):
        flags |= FACTORY
    return flags


def leaf_key(x: Any, tx: type, by_value: Any) -> Any:
    """A non-tensor argument's part of the meta key (Note [Scalars in the meta key]):
    floats by type (by value for ops whose floats shape the output), ints by value."""
    if tx is float or tx is complex:
        return (tx, x) if by_value else tx
    if tx is int or tx is bool:
        return (tx, x)
    return x


def plain_strided(t: Any) -> bool:
    """Whether a spec describes ``t`` (strided; no conj, neg or zero-tensor bit)."""
    return t.layout == torch.strided and not (t.is_conj() or t.is_neg() or t._is_zerotensor())


class MemoSeeder:
    """Seeds ``memo`` from calls that ran for real on ``device`` (one per recorder)."""

    def __init__(self, memo: MetaMemo, device: torch.device):
        self.memo = memo
        self.device = device
        # func -> BY_VALUE | FACTORY / seedable; bounded by the number of ATen overloads.
        self.flags: dict[Any, int] = {}
        self._seedable: dict[Any, bool] = {}

    def flags_of(self, func: Any) -> int:
        flags = self.flags.get(func)
        if flags is None:
            flags = self.flags[func] = op_flags(func)
        return flags

    def seed(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict, out: Any) -> None:
        """``func(*args, **kwargs)`` ran for real and returned ``out``: keep its output specs
        for the memo key a capture of the same call would build (Note [Seeding the memo
        from real runs], meta.py)."""
        seedable = self._seedable.get(func)
        if seedable is None:
            seedable = self._seedable[func] = traits.kind is Kind.RECORD and \
                isinstance(func, torch._ops.OpOverload) and not data_dependent(func)
        if not seedable:
            return
        key = self._key(func, args, kwargs)
        if key is None:
            return
        if isinstance(out, _TensorBase):
            outs, structure = (out,), "tensor"
        elif type(out) is list or type(out) is tuple:
            outs, structure = out, "list" if type(out) is list else "tuple"
        elif out is None:
            outs, structure = (), "none"
        else:
            return
        specs = []
        for t in outs:
            if t is None:
                specs.append(None)
            elif not isinstance(t, _TensorBase) or not plain_strided(t):
                return
            else:
                specs.append(TensorSpec(tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                                        t.dtype, self.device))
        self.memo.seed(key, MetaResult(tuple(specs), structure))

    def _key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The key the recorder would build for this call (None: not seedable)."""
        flags = self.flags_of(func)
        key_list: list = [func]
        by_value = flags & BY_VALUE
        if not self._seed_key(args, by_value, key_list):
            return None
        for k, v in kwargs.items():
            if not self._seed_key((v,), by_value, key_list):
                return None
            key_list.append(k)
        if flags & FACTORY and kwargs.get("dtype") is None:
            key_list.append(torch.get_default_dtype())
        return tuple(key_list)

    def _seed_key(self, args: Any, by_value: bool, key: list) -> bool:
        """The recorder's key part for real arguments (False: not seedable)."""
        for x in args:
            tx = type(x)
            if tx is LazyTensor or isinstance(x, _TensorBase):
                if tx is LazyTensor:
                    x = x._ae_real
                    if x is None:
                        return False
                if not plain_strided(x):
                    return False
                key.append(self.memo.intern(TensorSpec.of(x)))
            elif tx is list or tx is tuple:
                sub: list = []
                if not self._seed_key(x, by_value, sub):
                    return False
                key.append((tx, tuple(sub)))
            else:
                key.append(leaf_key(x, tx, by_value))
        return True


__all__ = ["MemoSeeder", "op_flags", "leaf_key", "plain_strided", "BY_VALUE", "FACTORY"]
