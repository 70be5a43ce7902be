"""Differential test over PyTorch's OpInfo database: every op with CPU float32
samples, run eagerly and under adaptive eager, must give the same values, output
strides, in-place effects on its arguments, exceptions and gradients.

Per op: the first few forward samples (values, strides, argument mutations), the
first sample of its in-place variant, and, for ops that support autograd, the
gradient of the first sample for fixed random cotangents, computed (forward and
backward) under the mode. Random ops are included on purpose: both runs are seeded
alike, and the runtime must consume the generator in eager order (Note [RNG]).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from helpers import assert_same, assert_same_exception, grads_of, run_both

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

N_SAMPLES = 3

# name (OpInfo.name, or "name.variant") -> why it is not compared.
SKIPS: dict[str, str] = {
    "empty": "returns uninitialized memory: values legitimately differ",
    "empty_like": "returns uninitialized memory: values legitimately differ",
    "empty_strided": "returns uninitialized memory: values legitimately differ",
    "empty_permuted": "returns uninitialized memory: values legitimately differ",
    "new_empty": "returns uninitialized memory: values legitimately differ",
    "new_empty_strided": "returns uninitialized memory: values legitimately differ",
    "as_strided.partial_views": "BUG: as_strided past the end of its input's storage raises at the "
                                "flush, not at the op (meta stand-ins are sized to the view; the "
                                "cloned sample input no longer has the larger storage)",
}


# Gradient checks only.
GRAD_SKIPS: dict[str, str] = {
    "linalg.eig": "BUG (by design of wrapper subclasses): linalg_eig_backward skips its "
                  "'loss depends on the eigenvector phase' check for tensor subclasses "
                  "(isTensorSubclassLike), so it does not raise under the mode",
}


def _key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _ops():
    out = []
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        reason = SKIPS.get(_key(op), SKIPS.get(op.name))
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        out.append(pytest.param(op, id=_key(op), marks=marks))
    return out


OPS = _ops()


def _samples(op, n: int, requires_grad: bool = False) -> list:
    torch.manual_seed(0)
    return list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad), n))


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _check(fn, sample, *, strides: bool) -> None:
    (exp, args_e), (got, args_g) = run_both(lambda *a: fn(*a[:-1], **a[-1]),
                                           sample.input, *sample.args, sample.kwargs)
    if isinstance(exp, Exception) or isinstance(got, Exception):
        if not isinstance(exp, Exception):
            raise got
        assert_same_exception(exp, got)
        return
    assert_same(exp, got, strides=strides)
    assert_same(args_e, args_g)  # in-place effects on the arguments


@pytest.mark.parametrize("op", OPS)
def test_forward(op):
    for sample in _samples(op, N_SAMPLES):
        _check(op.op, sample, strides=True)


@pytest.mark.parametrize("op", [p for p in OPS if p.values[0].inplace_variant is not None])
def test_inplace_variant(op):
    for sample in _samples(op, 1):
        _check(op.inplace_variant, sample, strides=False)


@pytest.mark.parametrize("op", [p for p in OPS if p.values[0].supports_autograd])
def test_grad(op):
    if _key(op) in GRAD_SKIPS:
        pytest.skip(GRAD_SKIPS[_key(op)])
    for sample in _samples(op, 1, requires_grad=True):
        def fwd_bwd(*a):
            out = op.op(*a[:-1], **a[-1])
            return out, grads_of(out, a)

        (exp, _), (got, _) = run_both(fwd_bwd, sample.input, *sample.args, sample.kwargs)
        if isinstance(exp, Exception) or isinstance(got, Exception):
            if not isinstance(exp, Exception):
                raise got
            assert_same_exception(exp, got)
            continue
        assert_same(exp[1], got[1])
        assert_same(_detached(exp[0]), _detached(got[0]))


def _detached(out):
    from torch.utils import _pytree as pytree
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)
