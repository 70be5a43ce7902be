"""The recorder: records ops in program order into the window builder.

The recorder numbers values (real inputs and op outputs share one counter),
encodes op arguments with ValueRefs, memoizes output metadata (MetaMemo) and appends
the node to the open window (:class:`~adaptive_eager.dispatch.builder.WindowBuilder`,
which it extends), which hands out LazyTensor handles. It never runs an op for real;
the mode decides when to flush and asks the runtime to run the sealed Window.

Example::

    >>> import torch
    >>> from adaptive_eager.dispatch.recorder import Recorder
    >>> from adaptive_eager.dispatch.meta import MetaMemo
    >>> rec = Recorder(torch.device("cpu"), MetaMemo(64), owner=None)
    >>> x = torch.ones(3)
    >>> y = rec.record(torch.ops.aten.mul.Tensor, rec.traits_for_test(torch.ops.aten.mul.Tensor),
    ...                (x, 2.0), {})
    >>> len(rec), type(y).__name__
    (1, 'LazyTensor')
"""

from __future__ import annotations

from typing import Any

import torch

from ..fusion.ir import ValueRef, op_name
from ..reasons import R
from .builder import OutputMismatch, Sealed, WindowBuilder
from .interrupts import critical
from .keys import BY_VALUE, FACTORY, MemoSeeder, leaf_key
from .lazy import LazyTensor, Owner
from .match import Made
from .meta import MetaFailure, MetaMemo, MetaResult, meta_execute
from .optable import OpTraits, derive_traits
from .trace import TraceBook
from .validity import check as check_validity

_TensorBase = torch._C.TensorBase  # isinstance against the C base is fast


def _refs(obj: Any):
    if isinstance(obj, ValueRef):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _refs(o)


class Recorder(WindowBuilder):
    """Records calls into the open window (see the module docstring)."""

    def __init__(self, device: torch.device, memo: MetaMemo, owner: Owner | None,
                 book: TraceBook | None = None):
        super().__init__(device, memo, owner, book)
        self.seeder = MemoSeeder(memo, self.device)  # also the op flags of the meta key

    # -- encoding -------------------------------------------------------------------
    def _encode_tensor(self, x: torch.Tensor) -> int:
        if type(x) is LazyTensor:
            real = x._ae_real
            if real is None:
                if x._ae_owner is self.owner:
                    return x._ae_vid
                real = x._ae_materialize(R.FOREIGN_HANDLE)
            x = real
        return self.add_input(x)

    def _encode(self, args: Any, by_value: bool, enc: list, key: list) -> None:
        """Append the encoding of each element of ``args`` to ``enc`` (ValueRefs in
        place of tensors) and its meta-key part to ``key`` (Note [Scalars in the meta
        key]; tensors are keyed by interned spec id, numbers by (type, value))."""
        for x in args:
            tx = type(x)
            if tx is LazyTensor or isinstance(x, _TensorBase):
                vid = self._encode_tensor(x)
                enc.append(self._refs[vid])
                key.append(self._sids[vid])
            elif tx is list or tx is tuple:
                sub_enc: list = []
                sub_key: list = []
                # Floats in lists key like floats (a foreach op's Scalar[]: Note [Scalar
                # lists are lifted too]); the few ops whose float lists shape the output
                # (upsample scale factors) are _FLOAT_SHAPED and key them by value.
                self._encode(x, by_value, sub_enc, sub_key)
                enc.append(sub_enc if tx is list else tuple(sub_enc))
                key.append((tx, tuple(sub_key)))
            else:
                enc.append(x)
                key.append(leaf_key(x, tx, by_value))

    # -- recording ------------------------------------------------------------------
    def record(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        """Append ``func(*args, **kwargs)`` to the window; return handles (or mutated args).

        Raises MetaFailure when meta execution fails, OutputMismatch when an in-place or
        out= op would change metadata. Nothing is appended in either case.
        """
        if self.at is not None:
            self.leave(op_name(func))
        mark = len(self._refs)
        try:
            return self._record(func, traits, args, kwargs)
        except BaseException:
            self.rollback(mark)
            raise

    def _record(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        flags = self.seeder.flags.get(func)
        if flags is None:
            flags = self.seeder.flags_of(func)
        by_value = flags & BY_VALUE
        enc_list: list = []
        key_list: list = [func]
        self._encode(args, by_value, enc_list, key_list)
        enc_args = tuple(enc_list)
        enc_kwargs: dict[str, Any] = {}
        if kwargs:
            for k, v in kwargs.items():
                e: list = []
                self._encode((v,), by_value, e, key_list)
                enc_kwargs[k] = e[0]
                key_list.append(k)
        default_dtype = flags & FACTORY and enc_kwargs.get("dtype") is None
        if default_dtype:  # Note [Global state that kernels read], dispatch/kernel_state.py
            key_list.append(torch.get_default_dtype())
        key = tuple(key_list)
        mr = self.memo.get(key)
        if mr is None:
            self._check_devices(enc_args, enc_kwargs)
            mr = self.memo.seeded.pop(key, None) if self.memo.seeded else None
            if mr is None:  # not seeded (Note [Seeding the memo from real runs], meta.py)
                with critical():  # a Ctrl-C in a meta kernel's first (lazy) imports would
                    # leave modules half-imported, and every later meta run failing (Note
                    # [Interrupts wait for the flush]); a miss costs ~60 µs, this ~1 µs
                    mr = meta_execute(func, enc_args, enc_kwargs, self.specs, self.device)
            check_validity(func, enc_args, enc_kwargs, self.specs)  # Notes in dispatch/validity.py
            mr = MetaResult(mr.specs, mr.structure,
                            tuple(None if s is None else self.memo.intern(s) for s in mr.specs))
            self.memo.put(key, mr)
        if default_dtype and mr.structure == "tensor":
            enc_kwargs["dtype"] = mr.specs[0].dtype  # replay must not read the default
        out = self.append(func, traits, args, kwargs, enc_args, enc_kwargs, mr)
        made = self.made
        if made is not None:
            made.append(Made(traits, mr.structure, key_list[-1], "dtype" in kwargs) if default_dtype
                        else Made(traits, mr.structure))
        return out

    # -- seeding the memo ---------------------------------------------------------------
    def seed(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict, out: Any) -> None:
        """``func(*args, **kwargs)`` ran for real and returned ``out``: seed the memo with
        its output specs (:meth:`keys.MemoSeeder.seed`)."""
        self.seeder.seed(func, traits, args, kwargs, out)

    def _check_devices(self, enc_args: tuple, enc_kwargs: dict) -> None:
        """Meta tensors hide device mismatches: find them as eager would (0-dim CPU
        tensors mix with any device)."""
        devices = set()
        for ref in _refs((enc_args, tuple(enc_kwargs.values()))):
            spec = self.specs[ref.id]
            if not (spec.device.type == "cpu" and len(spec.shape) == 0):
                devices.add(spec.device)
        if len(devices) > 1:
            raise MetaFailure(RuntimeError(f"Expected all tensors to be on the same device, found {devices}"))

    def traits_for_test(self, func: Any) -> OpTraits:
        return derive_traits(func)


__all__ = ["Recorder", "Sealed", "OutputMismatch"]
