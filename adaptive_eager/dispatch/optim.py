"""torch.optim steps at the foreach level (Note [Optimizer steps at the foreach level]).

Example::

    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)
    >>> opt = torch.optim.AdamW([p], lr=0.1)
    >>> switched = use_foreach(opt)
    >>> [g["foreach"] for g in opt.param_groups], len(switched)
    ([True], 1)
    >>> restore(switched); opt.param_groups[0]["foreach"] is None
    True
    >>> big = torch.nn.Parameter(torch.ones(1 << 19)); big.grad = torch.ones(1 << 19)  # 2 MiB
    >>> print(use_foreach(torch.optim.AdamW([big]), resident=lambda: (8 << 20, 8 << 20)))
    None
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from ..runtime.memory import resident_bytes
from .lazy import LazyTensor

_optim = torch.optim

# Note [Optimizer steps at the foreach level]
# On CPU, torch.optim leaves ``foreach=None`` to mean the single-tensor implementation
# (``_default_to_fused_or_foreach`` picks foreach only on cuda, xpu and the PrivateUse1
# device): AdamW over 100 tensors is ~1,700 dispatcher ops per step, each costing far more
# to capture than to run, so the runtime could only pass the step through. The
# multi-tensor implementation is ~15 ops for all parameters, and for the optimizers in
# FOREACH_EQUAL it gives parameters and state bitwise equal to the single-tensor one on
# float32 and float64 tensors (checked on torch 2.13 over 50 steps with an lr schedule,
# weight decay, amsgrad, momentum/nesterov/dampening, centered, lr_decay, maximize and
# grads that are None on some steps; tests/test_optim.py re-checks it against the
# installed torch). It is also 2.7x faster eagerly (AdamW, 100 tensors: 37.8 against
# 101.7 ms on a loaded machine). So while a runtime is active in the thread, a step whose
# param group left ``foreach`` unset (None) runs with ``foreach=True``, and the group gets
# its None back after the step. Left alone: an explicit ``foreach=False``/``True`` or
# ``fused``; other optimizer classes (subclasses included: they may override step), and
# NAdam, RAdam and ASGD, whose foreach paths round differently (up to 1e-6 relative);
# groups with a tensor lr, ``differentiable`` or ``capturable``; half-precision, complex
# or sparse parameters or gradients (the foreach kernels compute those in another
# precision); SGD groups with nesterov, no weight decay and no maximize, whose foreach
# step adds the momentum into the grads in place (``_foreach_add_(grads, bufs)``) where
# the single-tensor step leaves p.grad alone (params and state agree; p.grad did not).
FOREACH_EQUAL: frozenset[type] = frozenset({
    _optim.Adam, _optim.AdamW, _optim.SGD, _optim.RMSprop, _optim.Adagrad, _optim.Adamax,
    _optim.Adadelta, _optim.Rprop,
})
_DTYPES = (torch.float32, torch.float64)
# Gradients made inside the block are handles (their metadata is the real tensor's).
_PLAIN = (torch.Tensor, torch.nn.Parameter, LazyTensor)


def _tensor_ok(t: Any) -> bool:
    return t is None or (type(t) in _PLAIN and t.dtype in _DTYPES and t.layout == torch.strided)


def qualifies(group: dict) -> bool:
    """Whether a param group may run its step with ``foreach=True`` (see the Note)."""
    if group.get("foreach", False) is not None or group.get("fused") or \
            group.get("differentiable") or group.get("capturable"):
        return False
    if isinstance(group.get("lr"), torch.Tensor):
        return False
    if group.get("nesterov") and not group.get("weight_decay") and not group.get("maximize"):
        return False  # torch's multi-tensor SGD would add the momentum into p.grad (see the Note)
    return all(_tensor_ok(p) and _tensor_ok(p.grad) for p in group["params"])


# Note [The foreach switch never raises the peak]
# torch's multi-tensor step makes each intermediate for all of a group's parameters at
# once (``_foreach_sqrt(exp_avg_sqs)``: a parameter-sized list), where the single-tensor
# step, torch's CPU default, makes one parameter's at a time: on the CPU the switch holds
# up to one more copy of the parameters during the step. After a backward that is under
# the activations' peak, but where the step holds most of the memory (no activations: an
# optimizer over large parameters, a fine-tune at batch 1) it raised the process's peak:
# ``python -m benchmarks.memory --workloads adamw-step --modes eager,no-verify`` (AdamW
# over the GPT's 49.6 MiB of parameters, its compile not ready in the measured steps):
# +57.4 MiB eagerly, +114.9 MiB switched. Memory is not to be above eager's for a
# speed-up, so on the CPU a group whose lists are larger than the process's headroom (how
# far its resident set is below its own peak so far: runtime/memory.py) keeps torch's
# single-tensor step. Lists within 1/FOREACH_SHARE of the resident set switch whatever
# the headroom (100 tensors of 24-32 KiB: 2.9 MiB, which single-tensor would capture as
# ~1,200 ops instead of 8), as do groups under FOREACH_FREE_BYTES (without reading the
# headroom, ~30 µs) and any where the platform cannot tell (no /proc). The step's values
# are the same either way (FOREACH_EQUAL); the report counts the steps left single-tensor.
FOREACH_FREE_BYTES = 1 << 20
FOREACH_SHARE = 32


def _fits(groups: list[dict], resident: Callable[[], tuple[int, int] | None] | None) -> bool:
    size = sum(p.nbytes for g in groups for p in g["params"]
               if p.grad is not None and p.device.type == "cpu")
    if size < FOREACH_FREE_BYTES:
        return True
    got = (resident or resident_bytes)()
    if got is None:
        return True
    now, peak = got
    return size <= max(peak - now, now // FOREACH_SHARE)


def use_foreach(opt: torch.optim.Optimizer,
                resident: Callable[[], tuple[int, int] | None] | None = None) -> list[dict] | None:
    """Switch ``opt``'s qualifying param groups to ``foreach=True``; the groups switched,
    or None when they qualify but their lists could raise the process's peak
    (``resident()``: the resident set and its peak, default
    :func:`~..runtime.memory.resident_bytes`: Note [The foreach switch never raises the peak]).

    Only for optimizer classes in :data:`FOREACH_EQUAL` (exact type). Hand the result to
    :func:`restore` when the step is over.
    """
    if type(opt) not in FOREACH_EQUAL:
        return []
    switched = [g for g in opt.param_groups if qualifies(g)]
    if switched and not _fits(switched, resident):
        return None
    for g in switched:
        g["foreach"] = True
    return switched


def restore(groups: Iterable[dict]) -> None:
    """Give groups switched by :func:`use_foreach` their ``foreach=None`` back."""
    for g in groups:
        if g.get("foreach") is True:
            g["foreach"] = None


__all__ = ["FOREACH_EQUAL", "FOREACH_FREE_BYTES", "FOREACH_SHARE", "qualifies", "use_foreach", "restore"]
