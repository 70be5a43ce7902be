"""Checks of a compiled region's first results against the recorded specs and eager.

Example::

    >>> import torch
    >>> close(torch.ones(3), torch.ones(3) + 1e-7)
    True
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..fusion.ir import TensorSpec, Window
from ..fusion.partition import Region

_TOL = {  # dtype -> (rtol, atol); as torch.testing.assert_close, a little looser
    torch.float16: (1e-2, 1e-3), torch.bfloat16: (3e-2, 1e-2),
    torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-9),
}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within the tolerance of their dtype (exact for integers and bools)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        return bool(torch.equal(a, b))
    rtol, atol = _TOL.get(a.dtype, (1e-4, 1e-5))
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def meta_problem(t: Any, spec: TensorSpec) -> str | None:
    """Why ``t`` does not match ``spec`` (shape, dtype, device, strides of non-unit dims)."""
    if not isinstance(t, torch.Tensor):
        return f"expected a tensor, got {type(t).__name__}"
    if tuple(t.shape) != spec.shape or t.dtype != spec.dtype or t.device != spec.device:
        return f"got {tuple(t.shape)} {t.dtype} {t.device}, recorded {spec.shape} {spec.dtype} {spec.device}"
    for n, got, want in zip(spec.shape, t.stride(), spec.stride):
        if n > 1 and got != want:
            return f"got strides {t.stride()}, recorded {spec.stride}"
    return None


def outputs_match(window: Window, region: Region, outs: Sequence[Any], ref: Sequence[Any] | None,
                  clones: Sequence[Any] | None, env: dict | None) -> str | None:
    """None when compiled ``outs`` (and mutated ``clones``) agree with specs and eager ``ref``."""
    if outs is None or len(outs) != len(region.outputs):
        return "wrong number of outputs"
    for vid, t in zip(region.outputs, outs):
        problem = meta_problem(t, window.specs[vid])
        if problem is not None:
            return f"value {vid}: {problem}"
    if ref is not None:
        for vid, t, r in zip(region.outputs, outs, ref):
            if not close(t, r):
                return f"value {vid}: values differ from eager"
    if clones is not None and env is not None:
        for j, vid in enumerate(region.inputs):
            if vid in region.mutated and not close(clones[j], env[vid]):
                return f"input {vid}: in-place update differs from eager"
    return None


def clone_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy with ``t``'s strides (clone() may make non-dense layouts contiguous)."""
    try:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    except RuntimeError:
        return t.clone()


__all__ = ["close", "meta_problem", "outputs_match", "clone_strided"]
