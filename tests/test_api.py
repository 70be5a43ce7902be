"""The public API: stats(), reset_stats(), report(), the decorator, enable()/disable()
across threads, option errors, logging and profiler ranges."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor

REQUIRED_STATS = (
    "ops_captured", "flushes", "sync_sites", "regions_compiled", "compiled_calls", "ops_fused",
    "ops_eager", "fallback_ops", "cache_hits", "cache_misses", "cache_evictions",
    "compile_time_s", "compiles_in_flight",
)


def _item_loop(n: int = 3) -> float:
    total = 0.0
    x = torch.arange(8.0)
    for _ in range(n):
        total += (x * 2 + 1).sum().item()  # the sync site
    return total


def test_public_names_have_docstrings_with_examples():
    for name in ("adaptive_eager", "enable", "disable", "sync", "stats", "reset_stats", "report"):
        obj = getattr(ae, name)
        assert obj.__doc__ and ">>>" in obj.__doc__, name
    assert set(ae.__all__) <= set(dir(ae))


def test_stats_snapshot_fields_and_json():
    with ae.adaptive_eager(backend="eager"):
        assert _item_loop(3) == 3 * 64.0
    s = ae.stats()
    assert dataclasses.is_dataclass(s)
    for name in REQUIRED_STATS:
        assert hasattr(s, name), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.ops_captured = 0  # type: ignore[misc]
    assert s.ops_captured >= 9
    assert s.flushes["item"] == 3
    site, count = next(iter(s.sync_sites.items()))  # most frequent first
    assert "test_api.py" in site and "_item_loop" in site and count == 3
    data = json.loads(s.to_json())
    assert data["flushes"]["item"] == 3
    assert set(REQUIRED_STATS) <= set(data)


def test_sync_sites_are_ordered_most_frequent_first():
    x = torch.ones(4)
    with ae.adaptive_eager(backend="eager"):
        (x + 1).sum().item()
        for _ in range(4):
            (x * 3).sum().item()
    counts = list(ae.stats().sync_sites.values())
    assert counts == sorted(counts, reverse=True) and counts[0] == 4


def test_reset_stats():
    with ae.adaptive_eager(backend="eager"):
        _item_loop(1)
    assert ae.stats().ops_captured > 0
    ae.reset_stats()
    s = ae.stats()
    assert s.ops_captured == 0 and s.flushes == {} and s.sync_sites == {}


def test_fallback_ops_name_the_op_and_reason():
    with ae.adaptive_eager(backend="eager"):
        x = torch.tensor([0.0, 1.0, 0.0, 2.0]) * 1
        idx = torch.nonzero(x)
    assert idx.tolist() == [[1], [3]]
    s = ae.stats()
    assert s.fallback_ops["aten::nonzero"] >= 1
    assert "data_dependent" in s.fallback_reasons["aten::nonzero"]


def test_report_has_sites_advice_and_fallbacks():
    with ae.adaptive_eager(backend="eager"):
        _item_loop(5)
        torch.nonzero(torch.ones(3) * 2)
    text = ae.report()
    assert "adaptive_eager report" in text
    assert "ops captured" in text and "compiles " in text and "cache" in text
    assert "total += (x * 2 + 1).sum().item()" in text  # the source line itself
    assert "keep the value as a tensor" in text        # advice for .item() in a loop
    assert "aten::nonzero" in text and "data_dependent" in text
    assert "fixed-shape forms" in text                 # advice for the fallback


def test_decorator_form():
    @ae.adaptive_eager(backend="eager")
    def f(x):
        y = x * 2 + 1
        assert isinstance(y, LazyTensor)
        return y

    out = f(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 3.0))
    assert f.__name__ == "f"
    assert session.current_mode() is None
    assert ae.stats().ops_captured >= 2


def test_sync_flushes_explicitly():
    with ae.adaptive_eager(backend="eager"):
        y = torch.ones(2) + 1
        ae.sync()
        assert y._ae_real is not None
    assert ae.stats().flushes["explicit_sync"] == 1
    ae.sync()  # outside: a no-op


def _run_in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(result=fn()))
    t.start()
    t.join()
    return out["result"]


def test_enable_reaches_threads_started_later():
    def work():
        x = torch.ones(4) * 2
        lazy = isinstance(x, LazyTensor)
        return lazy, x.sum().item()

    assert _run_in_thread(work) == (False, 8.0)
    ae.enable(backend="eager")
    try:
        assert ae.is_enabled()
        assert isinstance(torch.ones(2) + 1, LazyTensor)   # the calling thread
        ae.reset_stats()
        assert _run_in_thread(work) == (True, 8.0)         # a thread started after enable
        s = ae.stats()
        assert s.flushes["item"] == 1
        assert any("work" in site for site in s.sync_sites)

        class Sub(threading.Thread):                        # subclasses overriding run()
            def run(self):
                self.lazy = isinstance(torch.ones(2) * 3, LazyTensor)

        t = Sub()
        t.start()
        t.join()
        assert t.lazy
    finally:
        ae.disable()
    assert not ae.is_enabled()
    assert session.current_mode() is None
    assert _run_in_thread(work) == (False, 8.0)            # after disable: plain eager


def test_enable_leaves_running_threads_alone():
    go, done = threading.Event(), threading.Event()
    seen = {}

    def already_running():
        go.wait(10)
        seen["lazy"] = isinstance(torch.ones(2) * 2, LazyTensor)
        done.set()

    t = threading.Thread(target=already_running)
    t.start()
    ae.enable(backend="eager")
    try:
        go.set()
        done.wait(10)
    finally:
        ae.disable()
    t.join()
    assert seen["lazy"] is False


def test_threads_can_opt_out():
    ae.enable(backend="eager")
    try:
        seen = {}
        t = threading.Thread(target=lambda: seen.update(lazy=isinstance(torch.ones(2) * 2, LazyTensor)))
        t.adaptive_eager_exempt = True
        t.start()
        t.join()
    finally:
        ae.disable()
    assert seen["lazy"] is False


def test_enable_inside_a_block_is_refused():
    with ae.adaptive_eager(backend="eager"):
        with pytest.raises(RuntimeError, match="outside"):
            ae.enable(backend="eager")


def test_disable_without_enable_is_a_noop():
    ae.disable()
    assert session.current_mode() is None


@pytest.mark.parametrize("kwargs, words", [
    ({"windowsize": 8}, ["unknown adaptive_eager option 'windowsize'", "window_size"]),
    ({"window_size": 0}, ["'window_size'", "integer >= 1"]),
    ({"window_size": "lots"}, ["'window_size'", "'lots'"]),
    ({"backend": "tensorrt"}, ["'backend'", "inductor", "eager", "'tensorrt'"]),
    ({"async_compile": "maybe"}, ["'async_compile'", "boolean"]),
])
def test_bad_options_raise_one_clear_config_error(kwargs, words):
    for make in (lambda: ae.adaptive_eager(**kwargs), lambda: ae.enable(**kwargs),
                 lambda: ae.adaptive_eager(**kwargs)(lambda: None)):
        with pytest.raises(ae.ConfigError) as info:
            make()
        for w in words:
            assert w in str(info.value)
    assert not ae.is_enabled()


@pytest.mark.parametrize("var, value, words", [
    ("ADAPTIVE_EAGER_WINDOW_SIZE", "abc", ["'window_size'", "ADAPTIVE_EAGER_WINDOW_SIZE", "'abc'"]),
    ("ADAPTIVE_EAGER_BACKEND", "tvm", ["'backend'", "ADAPTIVE_EAGER_BACKEND", "inductor"]),
    ("ADAPTIVE_EAGER_WINDOWSIZE", "8", ["unknown adaptive_eager option 'windowsize'",
                                         "ADAPTIVE_EAGER_WINDOWSIZE", "window_size"]),
])
def test_bad_env_vars_raise_one_clear_config_error(monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    with pytest.raises(ae.ConfigError) as info:
        ae.adaptive_eager()
    for w in words:
        assert w in str(info.value)


def test_env_options_apply(monkeypatch):
    monkeypatch.setenv("ADAPTIVE_EAGER_WINDOW_SIZE", "3")
    monkeypatch.setenv("ADAPTIVE_EAGER_BACKEND", "eager")
    ctx = ae.adaptive_eager()
    assert ctx.options.window_size == 3 and ctx.options.backend == "eager"
    assert ae.adaptive_eager(window_size=5).options.window_size == 5  # kwargs win


def test_flush_events_are_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="adaptive_eager"):
        with ae.adaptive_eager(backend="eager"):
            (torch.ones(2) * 2).sum().item()
    assert any("flush item" in r.getMessage() for r in caplog.records)


def test_warn_once(caplog):
    from adaptive_eager._logging import warn_once

    with caplog.at_level(logging.WARNING, logger="adaptive_eager"):
        warn_once("test-key-unique", "careful %s", "now")
        warn_once("test-key-unique", "careful %s", "now")
    assert [r.getMessage() for r in caplog.records].count("careful now") == 1


def test_profiler_trace_contains_flush_range(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with ae.adaptive_eager(backend="eager"):
            (torch.ones(16) * 2 + 1).sum().item()
    names = {e.name for e in prof.events()}
    assert "adaptive_eager.flush[item]" in names
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert "adaptive_eager.flush[item]" in trace.read_text()


def test_a_registered_backend_is_accepted_by_name():
    """register_backend's names are options' names (issue 11: config used to reject them)."""
    from adaptive_eager import config
    from adaptive_eager.runtime import register_backend

    seen = []

    def spy(gm, example_inputs):
        seen.append(gm)
        return gm

    register_backend("test_spy_backend", spy, debugging=True)
    assert config.resolve(backend="test_spy_backend").backend == "test_spy_backend"
    x = torch.randn(1 << 13)
    with ae.adaptive_eager(backend="test_spy_backend", compile_after=1, async_compile=False,
                           adaptive_passthrough=False):
        y = ((x * 2).relu() + 1).sum().item()
    assert y == pytest.approx(((x * 2).relu() + 1).sum().item())
    assert seen, "the registered backend compiled the region"
    with pytest.raises(ae.ConfigError, match="test_spy_backend"):
        config.resolve(backend="test_spy_backendd")  # did you mean it
