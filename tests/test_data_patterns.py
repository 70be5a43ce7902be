"""Issue 26: batches drawn from one dataset tensor, and sampling loops that grow, under
forced capture (``python -m benchmarks.data_patterns`` measures the same programs).

Each program is built outside the block twice (eager, then under the runtime) by
``adaptive_eager.benchmarks.data_patterns.measure``, which compares the results (losses
and parameters, or the sampled tokens) exactly.
"""

from __future__ import annotations

import functools

import pytest
import torch

from adaptive_eager.benchmarks.data_patterns import measure, mlp_setup

# Capture forced, synchronous compiles (as the issue measured), aot_eager: the regions
# run AOTAutograd's functionalized graphs, where aliasing between inputs matters.
FORCED = {"backend": "aot_eager", "adaptive_passthrough": False, "async_compile": False}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("draw", ["gather", "gather_fixed"])
def test_gathered_batches_fuse(draw):
    """``xb, yb = X[idx], Y[idx]``: the step is one region (the targets' index check is
    made on Y), >= 85% of ops fused, and nothing falls back for aliasing."""
    r = measure(lambda: functools.partial(mlp_setup(draw), 30), **FORCED)
    assert r["same"]
    assert r["pct"] >= 85.0, (r["fused"], r["ran"])
    assert r["compiled"] == 1 and r["calls"] >= 25, (r["compiled"], r["calls"])
    assert not r["reasons"], r["reasons"]


def test_a_moving_slice_is_one_region():
    """``X[i:i + 64]`` with i moving: one window key, one compiled region, the slices
    eager beside it (Note [View offsets are inputs])."""
    r = measure(lambda: functools.partial(mlp_setup("slice"), 30), **FORCED)
    assert r["same"]
    assert r["compiled"] == 1 and r["calls"] >= 25, (r["compiled"], r["calls"])
    assert r["pct"] >= 85.0, (r["fused"], r["ran"])
    assert set(r["reasons"].values()) == {("offset_view",)}, r["reasons"]
