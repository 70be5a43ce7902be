"""Checks of a compiled region's first results against the recorded specs and eager.

Example::

    >>> import torch
    >>> close(torch.ones(3), torch.ones(3) + 1e-7)
    True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..fusion.ir import TensorSpec, Window

if TYPE_CHECKING:  # annotations only: the partitioner is not imported at enable()
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
    if a.dtype in (torch.float32, torch.float64) and a.numel() >= _FAST_CLOSE_NUMEL \
            and (_within_atol(a, b, atol) or _all_finite_close(a, b, rtol, atol)):
        return True
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


# Note [Closeness in four passes]
# torch.allclose builds isclose's mask through a dozen temporaries: 346 ms for 16M floats
# on one thread, against 23 ms for torch.equal; the first call of a compiled AdamW step
# compares every parameter and state tensor so (the arrival spike of issue 22, item 3).
# |a - b| <= atol + rtol * |b| with in-place ops is the same test, in the same float
# arithmetic, for finite elements; a NaN or an infinity anywhere makes it fail (NaN
# compares false; the allowance is capped at the dtype's largest finite value, so an
# infinite b no longer allows an infinite difference: a finite a against an infinite b
# read close until 2026-12-03, and the test that meant to show it wrote both sides), and
# then torch.allclose decides, NaN and infinity rules included. So True here means
# allclose says True. Measured: fp32[4096, 4096], one thread, 334 -> 110 ms when close
# (479 ms when not: both run).
_FAST_CLOSE_NUMEL = 1 << 16


# Note [Close within atol in two passes]
# A compiled step or region usually differs from eager by rounding only: AdamW's parameters
# (magnitudes 1e-2..1e-1) by ~1e-9, far below atol. |a - b| <= atol for every element
# implies |a - b| <= atol + rtol * |b|, so the largest difference (one subtraction and one
# aminmax pass, no other temporaries) decides such pairs; a NaN or an infinity makes the
# comparison false (NaN) and the four-pass test below decides, then torch.allclose.
# Measured: fp32[4096 * 4096], one thread, 121 ms -> 45-50 ms when close.
#
# Note [Close within atol in chunks]
# The difference was a temporary as large as the tensors: on the CPU a fresh mapping the
# kernel zeroes page by page (the demo's first compiled AdamW step compared 72M floats in
# 110-123 ms a thread, half each, and held one parameter-sized temporary more). Contiguous
# pairs are compared in chunks of CLOSE_CHUNK elements through one reused buffer (1 MiB for
# float32: it stays in cache), stopping at the first chunk past atol. Measured:
# fp32[4096 * 4096], one thread: 54.9 -> 10.1 ms (chunks of 64K: 12.8 ms, 16K: 23.7 ms).
CLOSE_CHUNK = 1 << 18


def _within_atol(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    n = a.numel()
    if n <= CLOSE_CHUNK or not (a.is_contiguous() and b.is_contiguous()):
        lo, hi = torch.aminmax(torch.sub(a, b))
        return bool(-atol <= float(lo)) and bool(float(hi) <= atol)
    fa, fb = a.reshape(-1), b.reshape(-1)
    buf = torch.empty(CLOSE_CHUNK, dtype=a.dtype, device=a.device)
    for start in range(0, n, CLOSE_CHUNK):
        end = min(n, start + CLOSE_CHUNK)
        lo, hi = torch.aminmax(torch.sub(fa[start:end], fb[start:end], out=buf[:end - start]))
        if not (-atol <= float(lo) and float(hi) <= atol):  # NaN: False, as whole
            return False
    return True


def _all_finite_close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    diff = torch.sub(a, b).abs_()
    # an infinite b allows an infinite difference (inf <= inf): a finite a against it read
    # close, where allclose says not; capped at the dtype's largest finite value, an
    # infinite difference fails here and allclose decides
    allowed = b.abs().mul_(rtol).add_(atol).clamp_(max=torch.finfo(b.dtype).max)
    return bool(diff.le_(allowed).all())


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


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold bit-identical elements (NaN payloads and -0.0 too)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype.is_floating_point:
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return bool(torch.equal(a, b))


def inputs_intact(region: Region, args: Sequence[Any], copies: Sequence[Any]) -> str | None:
    """None when the compiled call left every argument it must only read (every input
    ``region`` does not mutate, and the lifted scalars) as it found it: ``copies`` were
    made of ``args`` before the call and handed to it."""
    mutated = set(region.mutated)
    for j, (a, c) in enumerate(zip(args, copies)):
        if j < len(region.inputs) and region.inputs[j] in mutated:
            continue
        if isinstance(a, torch.Tensor) and not same_bits(a, c):
            what = f"input {region.inputs[j]}" if j < len(region.inputs) else f"scalar {j}"
            return f"{what}: the compiled code wrote an input it only reads"
    return None


def aliases_any(outs: Sequence[Any], tensors: Sequence[Any]) -> bool:
    """Whether some tensor in ``outs`` shares storage with one of ``tensors``."""
    ptrs = {t.untyped_storage().data_ptr() for t in tensors
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()}
    return any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in ptrs
               for o in outs)


def indices_in_range(args: Sequence[Any], checks: Sequence[tuple[int, Sequence[tuple]]]) -> bool:
    """Whether every ``args[j]`` of ``checks`` ((j, ((lo, hi, allowed), ...)), ...) holds
    only values in ``[lo, hi)`` or equal to ``allowed`` (Note [Compiled code never sees an
    index eager would reject], fusion/indices.py). One ``aminmax`` per tensor; the
    element-wise test only when a value outside the range may be the allowed one."""
    for j, ranges in checks:
        t = args[j]
        if t.numel() == 0:
            continue
        low, high = torch.aminmax(t)
        low, high = int(low), int(high)
        for lo, hi, allowed in ranges:
            if lo <= low and high < hi:
                continue
            if allowed is None or not bool(((t >= lo) & (t < hi) | (t == allowed)).all()):
                return False
    return True


def bits_hash(t: torch.Tensor) -> int:
    """A hash of ``t``'s elements' bits (xor of each, upcast: ``torch.hash_tensor``): an
    element written with other bits changes it but for a 2**-64 chance; a permutation of
    the elements does not."""
    if t.numel() == 0:
        return 0
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return int(torch.hash_tensor(t).view(torch.int64))


def summary(t: torch.Tensor) -> tuple:
    """What a lean check compares of an output (Note [The first compiled call runs on
    copies], runtime/compiled.py): its metadata, and for floating values the sum and the
    sum of magnitudes of its finite elements (in float64) and its counts of NaN, +inf and
    -inf (an output whose infinities changed sign is not eager's); other dtypes by
    :func:`bits_hash`."""
    meta = (tuple(t.shape), t.dtype)
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.dtype.is_floating_point:
        return meta + (bits_hash(t),)
    # Note [Summaries of finite tensors take two passes]
    # A finite sum means no NaN and no infinity (either would carry into it), so the usual
    # tensor needs the sum and the 1-norm, two passes: 151 ms instead of 485 ms for 16M
    # floats on one thread (the first call of a GPT or MLP step's large regions summarizes
    # every output twice: the arrival spike of issue 22, item 3). Otherwise the masked path
    # below. The passes go by chunks (_chunk_sums): asked for a float64 result, torch casts
    # the whole tensor first (a 128 MB temporary for 16M floats, ~95 ms a pass), and the
    # demo's two first calls spent 4 x 195 ms summarizing its 4096 x 4096 gradients, the
    # most of their 579 ms steps; in chunks of 2^20 elements summed in float32 (float64
    # for float64 tensors) and added up in Python floats, a pass is ~5 ms and its error
    # ~1e-8 of the 1-norm (rtol is 1e-3), where ``vector_norm(t, 1)`` in float32 over the
    # whole tensor was 2% off.
    total, norm1 = _chunk_sums(t)
    if math.isfinite(total) and math.isfinite(norm1):
        return meta + (total, norm1, 0, 0, 0)
    finite = torch.isfinite(t)
    x = torch.where(finite, t, 0).to(torch.float64)
    return meta + (float(x.sum()), float(x.abs().sum()), int(torch.isnan(t).sum()),
                   int((t == math.inf).sum()), int((t == -math.inf).sum()))


_CHUNK = 1 << 20


def _chunk_sums(t: torch.Tensor) -> tuple[float, float]:
    """The sum and the sum of magnitudes of a floating tensor, by chunks of about _CHUNK
    elements along its first dimension (Note [Summaries of finite tensors take two
    passes]); not finite when it holds a NaN or an infinity (or a chunk overflows)."""
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    if t.dim() == 0:
        t = t.reshape(1)
    rows = max(1, _CHUNK // max(1, t[0].numel())) if t.shape[0] else 1
    total = norm1 = 0.0
    for c in t.split(rows):
        total += float(c.sum(dtype=acc))
        norm1 += float(c.abs().sum(dtype=acc))
    return total, norm1


def summaries_close(a: tuple, b: tuple, rtol: float = 1e-3) -> bool:
    """Whether two :func:`summary` results agree (floating sums within ``rtol`` of the
    magnitude; everything else exactly)."""
    if len(a) != len(b) or a[:2] != b[:2]:
        return False
    if len(a) == 3:
        return a[2] == b[2]
    scale = max(a[3], b[3]) + 1e-30
    return abs(a[2] - b[2]) <= rtol * scale and abs(a[3] - b[3]) <= rtol * scale \
        and a[4:] == b[4:]


def clone_strided(t: torch.Tensor, device: Any = None) -> torch.Tensor:
    """A copy with ``t``'s strides (clone() may make non-dense layouts contiguous), on
    ``device`` (default: ``t``'s). A layout whose elements share memory (``expand``'s
    stride 0) cannot be written element by element: the memory its elements span is
    copied instead and viewed with its strides.

    Example::

        >>> t = torch.arange(4.0)[:, None].expand(4, 3)
        >>> c = clone_strided(t)
        >>> c.stride(), bool(c.equal(t)), c.data_ptr() != t.data_ptr()
        ((1, 0), True, True)
    """
    if t.numel() > 1 and 0 in t.stride():
        # the span, from the first element to the last one's offset (strides are >= 0)
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        flat = t.as_strided((span,), (1,))
        flat = flat.to(device, copy=True) if device is not None else flat.clone()
        return flat.as_strided(t.shape, t.stride())
    try:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device or t.device)
    except RuntimeError:
        return t.to(device, copy=True) if device is not None else t.clone()
    return out.copy_(t)


__all__ = ["close", "meta_problem", "outputs_match", "same_bits", "inputs_intact", "aliases_any",
           "indices_in_range", "bits_hash", "summary", "summaries_close",
           "clone_strided"]
