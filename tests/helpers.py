"""Shared helpers for the differential tests: run code eagerly and under the mode,
compare values and gradients.

Example::

    >>> import torch
    >>> a, b = run_both(lambda x: x * 2, torch.ones(2))
    >>> assert_same(a, b)
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree

import adaptive_eager as ae

BACKEND = "eager"
# Capture always: the pass-through policy would stop deferring when nothing pays,
# and these tests are about what deferral does.
OPTIONS = {"backend": BACKEND, "adaptive_passthrough": False}


def mode(**options: Any) -> ae.adaptive_eager:
    """``adaptive_eager`` with the test options (always capture, eager backend)."""
    return ae.adaptive_eager(**{**OPTIONS, **options})


def clone_tree(obj: Any) -> Any:
    """Deep copy of every tensor in ``obj`` (same values, dtype, strides when dense;
    requires_grad kept, so leaves stay leaves)."""
    def c(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            # clone() keeps the strides of a non-overlapping, dense tensor (preserve_format)
            return t.detach().clone().requires_grad_(t.requires_grad)
        return t
    return pytree.tree_map(c, obj)


def assert_same(expected: Any, actual: Any, *, strides: bool = False, exact: bool = False,
                rtol: float | None = None, atol: float | None = None) -> None:
    """Compare two (nested) results: tensors by value (NaNs equal), dtype and shape,
    optionally strides; other leaves with ==."""
    fe, se = pytree.tree_flatten(expected)
    fa, sa = pytree.tree_flatten(actual)
    assert len(fe) == len(fa), f"structure differs: {se} vs {sa}"
    for e, a in zip(fe, fa):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"expected a tensor, got {type(a)}"
            if e.layout != torch.strided:
                e, a = e.to_dense(), a.to_dense()
            if exact:
                torch.testing.assert_close(a, e, equal_nan=True, rtol=0, atol=0)
            else:
                torch.testing.assert_close(a, e, equal_nan=True, rtol=rtol, atol=atol)
            assert a.requires_grad == e.requires_grad, "requires_grad differs"
            if strides and e.numel() > 1:
                assert a.stride() == e.stride(), f"strides differ: {e.stride()} vs {a.stride()}"
        elif isinstance(e, np.ndarray):
            np.testing.assert_array_equal(a, e)
        elif isinstance(e, float) and e != e:
            assert a != a, f"expected nan, got {a!r}"
        else:
            assert e == a, f"expected {e!r}, got {a!r}"


def run_both(fn: Callable[..., Any], *args: Any, seed: int = 0, **options: Any) -> tuple[Any, Any]:
    """``fn(*args)`` eagerly and under adaptive eager, each on its own copy of ``args``
    and with the same seed. Exceptions are returned, not raised."""
    a1, a2 = clone_tree(args), clone_tree(args)
    torch.manual_seed(seed)
    try:
        expected = fn(*a1)
    except Exception as e:  # noqa: BLE001 - compared by the caller
        expected = e
    torch.manual_seed(seed)
    with mode(**options):
        try:
            actual = fn(*a2)
        except Exception as e:  # noqa: BLE001
            actual = e
    return (expected, a1), (actual, a2)


def grads_of(outputs: Any, inputs: Any, seed: int = 1) -> tuple:
    """Gradients of ``outputs`` (every tensor that requires grad) with respect to the
    tensors in ``inputs`` that require grad, for fixed random output cotangents."""
    outs = [o for o in pytree.tree_leaves(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    leaves = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return ()
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    return torch.autograd.grad(outs, leaves, cot, allow_unused=True)


def assert_same_exception(expected: BaseException, actual: Any) -> None:
    assert isinstance(actual, BaseException), f"eager raised {expected!r}, the mode returned {actual!r}"
    assert type(actual) is type(expected), f"eager raised {expected!r}, the mode raised {actual!r}"


__all__ = ["clone_tree", "assert_same", "run_both", "grads_of", "assert_same_exception", "BACKEND",
           "OPTIONS", "mode"]


def inductor_table() -> dict:
    """Inductor's decomposition table (what its tracer decomposes before lowering)."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def decomposing(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """A backend with Inductor's decompositions and layouts, run by AOTAutograd without
    code generation (torch's ``aot_eager_decomp_partition``): a region compiles in well
    under a second where Inductor takes tens, and a decomposition that lays a result out
    otherwise than eager fails as it does under Inductor (plain aot_eager decomposes
    nothing). Its ``decompositions`` name the op (runtime/layouts.py)."""
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition

    with torch.no_grad():
        return aot_eager_decomp_partition(gm, example_inputs)


decomposing.decompositions = inductor_table  # type: ignore[attr-defined]


def assert_optimizer_states_equal(a: Any, b: Any, exact: bool = True, groups: bool = True) -> None:
    """Two optimizers' ``state_dict()`` agree: groups (unless ``groups=False``) and every
    state value, tensors bit for bit (compared on the CPU) or, with ``exact=False``,
    floating tensors within 1e-6 of the largest value."""
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    if groups:
        assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            w = sb["state"][k][name]
            if isinstance(v, torch.Tensor):
                v, w = v.cpu(), w.cpu()
                if exact or not v.is_floating_point():
                    torch.testing.assert_close(w, v, rtol=0, atol=0)
                else:
                    assert (w - v).abs().max() <= 1e-6 * v.abs().max().clamp_min(1e-30), name
            else:
                assert v == w


def run_concurrently(commands: Mapping[Any, Sequence[str]], *, timeout: float = 300,
                     each: Mapping[Any, Mapping[str, Any]] | None = None,
                     **popen: Any) -> dict[Any, subprocess.CompletedProcess]:
    """Run independent child processes at once, as many at a time as the machine has cores;
    ``{name: CompletedProcess}`` (text output captured). Each child pays its own interpreter
    start and imports (~2-10 s): a test's several children, one after another, cost it the sum.
    ``popen`` goes to every child (``env``, ``cwd``), ``each[name]``'s items to that one on
    top of them; a child past ``timeout`` is killed and raises ``subprocess.TimeoutExpired``.
    Children that run several threads of their own gain little (the two cores are busy).

    Example::

        >>> import sys
        >>> r = run_concurrently({"a": [sys.executable, "-c", "print(1)"]})
        >>> r["a"].returncode, r["a"].stdout
        (0, '1\\n')
    """
    from concurrent.futures import ThreadPoolExecutor

    limit = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, min(limit, len(commands)))) as pool:
        futures = {name: pool.submit(subprocess.run, list(cmd), capture_output=True, text=True,
                                     timeout=timeout, **{**popen, **(each or {}).get(name, {})})
                   for name, cmd in commands.items()}
        return {name: f.result() for name, f in futures.items()}
