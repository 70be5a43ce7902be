"""The window buffer: records ops in program order and seals them into a Window.

The recorder numbers values (real inputs and op outputs share one counter),
encodes op arguments with ValueRefs, memoizes output metadata (MetaMemo) and hands
out LazyTensor handles. It never runs an op for real; the mode decides when to
flush and asks the runtime to run the sealed Window.

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

import weakref
from typing import Any

import torch

from ..fusion.ir import OpNode, TensorSpec, ValueRef, Window
from .lazy import LazyTensor, Owner
from .meta import MetaFailure, MetaMemo, MetaResult, meta_execute
from .optable import OpTraits, derive_traits

# Ops whose float arguments can change output shapes (Note [Scalars in the meta key]).
_FLOAT_SHAPED = ("arange", "range", "linspace", "logspace", "upsample", "interpolate", "histc")


def _refs(obj: Any):
    if isinstance(obj, ValueRef):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _refs(o)


class OutputMismatch(Exception):
    """An in-place/out= op would change a tensor's metadata: must run for real."""


class Recorder:
    """One open window. Not thread-safe by itself; the mode serializes access."""

    def __init__(self, device: torch.device, memo: MetaMemo, owner: Owner | None):
        self.device = device
        self.memo = memo
        self.owner = owner
        self._float_by_value: dict[Any, bool] = {}
        self._reset()

    def _reset(self) -> None:
        self.nodes: list[OpNode] = []
        self.inputs: dict[int, torch.Tensor] = {}
        self._input_ids: dict[int, int] = {}
        self.specs: dict[int, TensorSpec] = {}
        self.alias_root: dict[int, int] = {}
        self.handles: list[weakref.ref] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self.nodes)

    # -- encoding -------------------------------------------------------------------
    def _new_vid(self) -> int:
        vid = self._next
        self._next += 1
        return vid

    def _input_vid(self, t: torch.Tensor) -> int:
        vid = self._input_ids.get(id(t))
        if vid is None:
            vid = self._new_vid()
            self._input_ids[id(t)] = vid
            self.inputs[vid] = t
            self.specs[vid] = TensorSpec.of(t)
        return vid

    def _encode(self, x: Any, by_value: bool) -> tuple[Any, Any]:
        """(encoded arg with ValueRefs, meta-key part)."""
        if isinstance(x, torch.Tensor):
            if type(x) is LazyTensor:
                real = x._ae_real
                if real is None:
                    if x._ae_owner is self.owner:
                        vid = x._ae_vid
                        return ValueRef(vid), self.specs[vid]
                    real = x._ae_materialize("foreign_handle")
                x = real
            vid = self._input_vid(x)
            return ValueRef(vid), self.specs[vid]
        if isinstance(x, (list, tuple)):
            encs = []
            keys = []
            for item in x:
                e, k = self._encode(item, True)
                encs.append(e)
                keys.append(k)
            enc = encs if isinstance(x, list) else tuple(encs)
            return enc, (type(x), tuple(keys))
        if type(x) is float and not by_value:
            return x, float
        if type(x) is complex and not by_value:
            return x, complex
        return x, (type(x), x)

    # -- recording ------------------------------------------------------------------
    def record(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        """Append ``func(*args, **kwargs)`` to the window; return handles (or mutated args).

        Raises MetaFailure when meta execution fails, OutputMismatch when an in-place or
        out= op would change metadata. Nothing is appended in either case.
        """
        mark = (self._next, len(self.inputs))
        try:
            return self._record(func, traits, args, kwargs)
        except BaseException:
            self._rollback(*mark)
            raise

    def _rollback(self, next_vid: int, n_inputs: int) -> None:
        for vid in [v for v in self.inputs if v >= next_vid]:
            t = self.inputs.pop(vid)
            self._input_ids.pop(id(t), None)
            self.specs.pop(vid, None)
        self._next = next_vid

    def _record(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
        by_value = self._float_by_value.get(func)
        if by_value is None:
            name = func._schema.name
            by_value = self._float_by_value[func] = any(s in name for s in _FLOAT_SHAPED)
        enc_args, key_args = self._encode(args, by_value)
        enc_kwargs: dict[str, Any] = {}
        key_kwargs = []
        for k, v in kwargs.items():
            e, kk = self._encode(v, by_value)
            enc_kwargs[k] = e
            key_kwargs.append((k, kk))
        key = (func, key_args, tuple(key_kwargs))
        mr = self.memo.get(key)
        if mr is None:
            self._check_devices(enc_args, enc_kwargs)
            mr = meta_execute(func, enc_args, enc_kwargs, self.specs, self.device)
            self.memo.put(key, mr)
        return self._append(func, traits, args, kwargs, enc_args, enc_kwargs, mr)

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

    def _arg(self, args: tuple, kwargs: dict, where: int | str) -> Any:
        return kwargs.get(where) if isinstance(where, str) else args[where]

    def _append(self, func: Any, traits: OpTraits, args: tuple, kwargs: dict,
                enc_args: tuple, enc_kwargs: dict, mr: MetaResult) -> Any:
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
        for i, spec in enumerate(mr.specs):
            if spec is None:
                outputs.append(None)
                results.append(None)
                continue
            alias = ret_alias[i] if i < len(ret_alias) else (ret_alias[0] if ret_alias else None)
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
            vid = self._new_vid()
            self.specs[vid] = spec
            if alias is not None:
                base = enc_kwargs.get(alias) if isinstance(alias, str) else enc_args[alias]
                if isinstance(base, ValueRef):
                    self.alias_root[vid] = self.alias_root.get(base.id, base.id)
            handle = LazyTensor(spec, vid, self.owner)
            self.handles.append(weakref.ref(handle))
            outputs.append(vid)
            results.append(handle)
        self.nodes.append(OpNode(
            func, enc_args, tuple(enc_kwargs.items()), tuple(outputs), tuple(mutates),
            is_view=traits.mutated_args == () and any(a is not None for a in ret_alias),
        ))
        if mr.structure == "tensor":
            return results[0]
        if mr.structure == "none":
            return None
        return results if mr.structure == "list" else tuple(results)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether real tensor ``t`` is an input of the open window."""
        return id(t) in self._input_ids

    # -- sealing --------------------------------------------------------------------
    def seal(self, reason: str, source: str | None) -> tuple[Window, list[LazyTensor]]:
        """Close the window: the frozen Window and the live, unbound handles to bind."""
        live: list[LazyTensor] = []
        for ref in self.handles:
            h = ref()
            if h is not None and h._ae_real is None and h._ae_error is None:
                live.append(h)
        window = Window(
            inputs=self.inputs, nodes=tuple(self.nodes), specs=self.specs,
            outputs=frozenset(h._ae_vid for h in live), alias_root=self.alias_root,
            reason=reason, source=source,
        )
        self._reset()
        return window, live

    def traits_for_test(self, func: Any) -> OpTraits:
        return derive_traits(func)


__all__ = ["Recorder", "OutputMismatch"]
