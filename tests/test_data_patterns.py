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
# optimizer_step=False: these measure how windows fuse; a compiled optimizer step (issue
# 24, dispatch/optim_compile.py) takes the AdamW ops out of the windows altogether, which
# lowers the windows' fused share without fusing anything less (81% of the rest, gather).
FORCED = {"backend": "aot_eager", "adaptive_passthrough": False, "async_compile": False,
          "optimizer_step": False}


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


def test_word_language_model_compiles_no_region_that_never_runs():
    """word_language_model (8 batches x 2 epochs, capture forced): every region compiled
    is called compiled afterwards. Before issue 26 its 12 regions were keyed by the slice
    start and none ran; with the start out of the key, the epochs' last batches and the
    evaluations' first windows (seen once an epoch) compiled 3 regions that never ran
    (Note [Rare windows wait])."""
    from collections import Counter
    from unittest import mock

    import adaptive_eager as ae
    from adaptive_eager import session
    from adaptive_eager.benchmarks.patterns import _same
    from adaptive_eager.benchmarks.workloads.patterns import PATTERNS, TEST_STEPS
    from adaptive_eager.runtime.compiled import CompiledExecutor
    from adaptive_eager.runtime.compiler import CompileService

    calls: Counter = Counter()
    submitted: list = []
    bind, submit = CompiledExecutor._bind, CompileService.submit

    def counting_bind(self, region, env, outs):
        calls[region.key] += 1
        return bind(self, region, env, outs)

    def counting_submit(self, entry, build):
        submitted.append(entry.key)
        return submit(self, entry, build)

    steps = TEST_STEPS["lstm_lm"]
    expected = PATTERNS["lstm_lm"](steps)
    session.clear_sessions()
    with mock.patch.object(CompiledExecutor, "_bind", counting_bind), \
            mock.patch.object(CompileService, "submit", counting_submit), \
            ae.adaptive_eager(backend="eager", adaptive_passthrough=False, min_region_work=0,
                              async_compile=False):
        actual = PATTERNS["lstm_lm"](steps)
    session.clear_sessions()
    assert _same(expected, actual)
    assert submitted and all(calls[k] > 0 for k in submitted), [calls[k] for k in submitted]


def test_sampling_a_growing_sequence_stays_eager_under_forced_capture():
    """120 tokens of nanoGPT sampling, capture forced: no region compiles (at most 4 were
    asked for), values equal eager's, and after a window comes back grown the runtime
    stays eager and its report says so (Note [Growing windows stay eager under forced
    capture]). Times: ``python -m benchmarks.data_patterns sample --reps 7``."""
    from adaptive_eager.benchmarks.data_patterns import sample_setup
    from adaptive_eager.reporting import format_report

    r = measure(lambda: sample_setup(120), **FORCED)
    s = r["stats"]
    assert r["same"]
    assert s.regions_compiled <= 4 and s.windows <= 3, (s.regions_compiled, s.windows)
    text = " ".join(format_report(s).split())
    assert "parked staying eager: a window came back grown" in text, text


def test_forced_policy_stays_eager_on_growth_not_on_one_new_shape():
    from adaptive_eager.runtime.adapt import RESHAPED_STREAK, DeferPolicy
    from adaptive_eager.runtime.executor import Verdict

    forced = DeferPolicy(enabled=False)
    forced.note(Verdict(50, novel=True))
    forced.note(Verdict(50, novel=True, reshaped=True))  # a last, shorter batch
    forced.note(Verdict(50, worth=True))  # a known window: the streaks start again
    forced.note(Verdict(50, novel=True, reshaped=True, grew=True))  # one larger batch
    assert forced.should_defer()
    forced.note(Verdict(50, novel=True, reshaped=True, grew=True))  # and again: growing
    assert not forced.should_defer() and forced.reason.startswith("staying eager: a window came back grown")
    shapes = DeferPolicy(enabled=False)
    for _ in range(RESHAPED_STREAK):
        assert shapes.should_defer()
        shapes.note(Verdict(50, novel=True, reshaped=True))
    assert not shapes.should_defer() and f"{RESHAPED_STREAK} windows in a row came back with new shapes" in shapes.reason
