"""Tests of the benchmark suite (adaptive_eager/benchmarks): table formatting, and a quick
end-to-end run of the runner in eager mode (subprocesses; no torch.compile)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptive_eager.benchmarks import table as T  # noqa: E402
from adaptive_eager.benchmarks.adaptive_api import derive, diff_stats  # noqa: E402
from adaptive_eager.benchmarks.worker import summarize_times  # noqa: E402


def _run(wl, mode, status="ok", time_s=None, first=None, **kw):
    r = {"workload": wl, "mode": mode, "status": status, "time_s": time_s,
         "first_iter_s": first, "spread_rel": 0.05 if time_s else None, "metric": "median", "n": 20}
    r.update(kw)
    return r


def test_format_table_and_ratios():
    runs = [
        _run("pointwise", "eager", time_s=0.080, first=0.12),
        _run("pointwise", "adaptive", time_s=0.040, first=0.5,
             derived_total={"compiles": 3, "cache_hit_rate": 0.9, "fused_share": 0.75},
             derived_timed={"ops_captured_per_iter": 28.0, "flushes_per_iter": 1.0, "compiles": 0,
                            "cache_hit_rate": 0.95}, enter_s=2.5),
        _run("pointwise", "compile", time_s=0.050, first=25.0),
        _run("adamw", "eager", time_s=0.0175, first=0.03),
        _run("adamw", "adaptive", status="unavailable", message="adaptive_eager has no adaptive_eager() yet"),
        _run("varying-shape", "eager", time_s=1.04, first=0.03, metric="total", n=100),
        _run("neuron-sim", "eager", status="skipped", message="adaptive_eager.neuron_sim not available"),
    ]
    rows = T.summarize(runs, ["adamw", "pointwise", "varying-shape", "neuron-sim"])
    assert [r["workload"] for r in rows] == ["adamw", "pointwise", "varying-shape", "neuron-sim"]
    pw = rows[1]
    assert pw["speedup_vs_eager"] == pytest.approx(2.0)
    assert pw["vs_compile"] == pytest.approx(1.25)
    assert pw["compile_vs_eager"] == pytest.approx(1.6)
    assert rows[0]["speedup_vs_eager"] is None and rows[0]["vs_compile"] is None

    text = T.format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    for h in T.HEADERS:
        assert h in lines[0]
    # all lines equally wide (fixed-width columns)
    assert len({len(l.rstrip()) for l in lines[:2]}) == 1
    pw_line = next(l for l in lines if l.startswith("pointwise"))
    for cell in ("80.0ms ±5%", "40.0ms ±5%", "50.0ms ±5%", "2.00x", "1.25x", "25.00s", "95%", "75%"):
        assert cell in pw_line, (cell, pw_line)
    adam_line = next(l for l in lines if l.startswith("adamw"))
    assert "unavail" in adam_line and "17.5ms" in adam_line
    assert "varying-shape (total 100 steps)" in text and "1.04s" in text
    assert "skipped" in next(l for l in lines if l.startswith("neuron-sim"))

    notes = T.format_notes(rows)
    assert "adaptive_eager has no adaptive_eager() yet" in notes
    assert "28 ops captured/iter" in notes
    assert "hit rate over the whole run 90%" in notes and "context entry 2.50 s" in notes


def test_simulated_rows_report_launches_and_device_time_beside_wall_time():
    # Note [Honest figures on the emulator] (workloads/neuron_sim.py)
    def sim(mode, time_s, launches):
        return _run("neuron-sim", mode, time_s=time_s, extra={
            "simulated": True, "launch_latency_us": 20.0, "launches_per_iter": launches,
            "device_ms_per_iter": launches * 20.0 / 1e3, "emulator_host_us_per_op": 61.5})

    rows = T.summarize([sim("eager", 0.006, 61.0), sim("adaptive", 0.002, 2.0)], ["neuron-sim"])
    notes = T.format_notes(rows)
    assert "[eager] SIMULATED device: 61.0 launches/iter, device time 1.22 ms/iter" in notes
    assert "the emulator's own host cost 62 us/op" in notes
    assert ("[adaptive] SIMULATED device: 2.0 launches/iter, device time 0.04 ms/iter "
            "(saved vs eager: 59 launches, 1.18 ms device time/iter)") in notes
    # Results from an emulator without the device-time figures still format.
    old = [_run("neuron-sim", "eager", time_s=0.006, extra={"simulated": True, "launches_per_iter": 61.0})]
    assert "61.0 launches/iter" in T.format_notes(T.summarize(old, ["neuron-sim"]))


def test_formatters():
    assert T.fmt_time(None) == "-"
    assert T.fmt_time(12e-6) == "12us"
    assert T.fmt_time(0.0123) == "12.3ms"
    assert T.fmt_time(0.287) == "287ms"
    assert T.fmt_time(3.5) == "3.50s"
    assert T.fmt_ratio(1.234) == "1.23x"
    assert T.fmt_pct(0.5) == "50%"
    assert T.format_table([]).count("\n") == 1


def test_summarize_times_and_stats_helpers():
    s = summarize_times([3.0, 1.0, 2.0, 4.0, 100.0])
    assert s["median_s"] == 3.0 and s["min_s"] == 1.0 and s["n"] == 5
    assert s["p25_s"] == 2.0 and s["p75_s"] == 4.0
    assert s["spread_rel"] == pytest.approx((4.0 - 2.0) / 2 / 3.0)

    before = {"ops_captured": 10, "flushes": {"item": 2}, "cache_hits": 1, "cache_misses": 3,
              "regions_compiled": 3, "ops_fused": 5, "compiles_in_flight": 1}
    after = {"ops_captured": 30, "flushes": {"item": 4, "print": 1}, "cache_hits": 9, "cache_misses": 3,
             "regions_compiled": 3, "ops_fused": 20, "compiles_in_flight": 0}
    d = diff_stats(after, before)
    assert d["ops_captured"] == 20 and d["flushes"] == {"item": 2, "print": 1}
    assert d["cache_hits"] == 8 and d["compiles_in_flight"] == 0
    assert d["ops_eager"] is None               # missing field stays None
    der = derive(d, iters=2)
    assert der["cache_hit_rate"] == 1.0 and der["fused_share"] == pytest.approx(0.75)
    assert der["flushes_per_iter"] == 1.5 and der["ops_captured_per_iter"] == 10
    assert derive({})["cache_hit_rate"] is None


def test_compiled_optimizer_steps_get_their_own_share():
    """A compiled optimizer step runs no op through the mode (ops_fused stays 0): the row
    says which share of the steps ran compiled, beside the fused share."""
    before = {"optimizer_step_kinds": {"AdamW|eager: state creation (first step)": 1,
                                       "AdamW|compiles": 1}}
    after = {"optimizer_step_kinds": {"AdamW|eager: state creation (first step)": 1, "AdamW|compiles": 1,
                                      "AdamW|eager: compile not ready": 1, "AdamW|compiled steps": 3}}
    d = diff_stats(after, before)
    assert derive(d)["optimizer_steps_compiled_share"] == pytest.approx(0.75)
    assert derive(after)["optimizer_steps_compiled_share"] == pytest.approx(0.6)
    assert derive({"optimizer_step_kinds": {}})["optimizer_steps_compiled_share"] is None
    row = {"workload": "adamw", "adaptive_fused_share": 0.0, "adaptive_step_share": 0.6}
    assert T._fused_cell(row) == "0% step 60%"
    assert T._fused_cell({"adaptive_fused_share": 0.5}) == "50%"


def test_quick_eager_run(tmp_path):
    out = tmp_path / "r.json"
    cp = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--modes", "eager",
         "--workloads", "pointwise,tiny-ops", "--json", str(out)],
        cwd=str(ROOT), capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    lines = cp.stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("workload"))
    assert "eager/adapt" in lines[header] and "1st compile" in lines[header]
    assert lines[header + 2].startswith("pointwise") and lines[header + 3].startswith("tiny-ops")

    data = json.loads(out.read_text())
    assert set(data) >= {"meta", "summary", "runs"}
    assert data["meta"]["quick"] is True and data["meta"]["threads"] == 2
    assert [r["workload"] for r in data["summary"]] == ["pointwise", "tiny-ops"]
    assert len(data["runs"]) == 2
    for r in data["runs"]:
        assert r["mode"] == "eager" and r["status"] == "ok", r
        assert r["threads"] == 2
        assert r["time_s"] > 0 and r["first_iter_s"] > 0 and r["n"] == len(r["times_s"]) > 0
        assert r["p25_s"] <= r["median_s"] <= r["p75_s"]
        assert isinstance(r["size"], str)
    for row in data["summary"]:
        assert row["eager"]["status"] == "ok"
        assert row["adaptive"] is None and row["compile"] is None
        assert row["speedup_vs_eager"] is None


class _FakeStats:
    def __init__(self, n):
        self.ops_captured = 10 * n
        self.flushes = {"item": n}
        self.regions_compiled = 1
        self.compiled_calls = n
        self.ops_fused = 8 * n
        self.ops_eager = 2 * n
        self.cache_hits = max(0, n - 1)
        self.cache_misses = 1
        self.cache_evictions = 0
        self.compile_time_s = 0.5
        self.compiles_in_flight = 0
        # no to_json on purpose: the reader must cope with missing pieces

    def __getattr__(self, name):
        raise AttributeError(name)


class _FakeAPI:
    """Stands in for adaptive_eager to exercise the adaptive path of the worker."""
    syncs = 0

    def __init__(self):
        self.n = 0

    def context(self, **options):
        import contextlib
        return contextlib.nullcontext()

    def sync(self):
        type(self).syncs += 1
        self.n += 1

    def reset_stats(self):
        self.n = 0

    def stats(self):
        from adaptive_eager.benchmarks.adaptive_api import read_stats

        class M:
            pass
        m = M()
        m.stats = lambda: _FakeStats(self.n)
        return read_stats(m)


def test_worker_adaptive_path_with_fake_api(monkeypatch):
    import torch
    import adaptive_eager.benchmarks.adaptive_api as api_mod
    from adaptive_eager.benchmarks.worker import run_one

    monkeypatch.setattr(api_mod, "AdaptiveAPI", _FakeAPI)
    threads = torch.get_num_threads()
    try:
        r = run_one("tiny-ops", "adaptive", quick=True, iters=4, warmup=2, threads=threads)
    finally:
        torch.set_num_threads(threads)
    assert r["status"] == "ok", r
    assert _FakeAPI.syncs >= 6 + 1
    assert r["n"] == 4 and r["derived_total"]["compiles"] == 1
    assert r["derived_timed"]["ops_captured_per_iter"] == pytest.approx(10)
    assert r["derived_timed"]["flushes_per_iter"] == pytest.approx(1)
    assert r["stats_total"]["raw"] is None and r["stats_total"]["errors"]
    rows = T.summarize([r])
    assert rows[0]["adaptive_fused_share"] == pytest.approx(0.8)


def test_adaptive_unavailable_is_graceful(monkeypatch):
    import adaptive_eager.benchmarks.adaptive_api as api_mod
    from adaptive_eager.benchmarks.worker import run_one

    def boom():
        raise api_mod.Unavailable("not there yet")
    monkeypatch.setattr(api_mod, "AdaptiveAPI", boom)
    r = run_one("tiny-ops", "adaptive", quick=True)
    assert r["status"] == "unavailable" and "not there yet" in r["message"]


def test_a_busy_machine_gets_a_warning_line_before_the_ratios(monkeypatch, tmp_path, capsys):
    from adaptive_eager.benchmarks import run as R

    def fake(spec, mode, a, log):
        return {"workload": spec.name, "mode": mode, "status": "ok", "time_s": 1e-3,
                "first_iter_s": 2e-3, "metric": "median", "n": 5, "wall_s": 0.1,
                "loadavg_start": 9.0, "loadavg_end": 9.0}

    monkeypatch.setattr(R, "_run_subprocess", fake)
    monkeypatch.setattr(R.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(R.os, "cpu_count", lambda: 2)
    assert R.main(["--quick", "--workloads", "tiny-ops", "--modes", "eager,adaptive",
                   "--json", str(tmp_path / "r.json")]) == 0
    out, err = capsys.readouterr()
    assert "WARNING: the 1-min load average was 9.0" in err     # before the runs
    lines = out.splitlines()
    warn = next(i for i, l in enumerate(lines) if l.startswith("WARNING"))
    assert warn < next(i for i, l in enumerate(lines) if l.startswith("workload"))
    assert json.loads((tmp_path / "r.json").read_text())["meta"]["load_warning"]


def test_an_idle_machine_gets_no_warning():
    from adaptive_eager.benchmarks.run import load_warning

    assert load_warning(0.4, ncpu=2) == ""
    assert load_warning(3.5, own=3, ncpu=2) == ""   # the suite's own runs do not count
    assert load_warning(5.0, own=3, ncpu=2).startswith("WARNING")


def test_step_events_wraps_methods_that_exist():
    """benchmarks.step_events times the runtime's methods by name: a rename or a move
    (optim_compile's trace went to optim_trace) must fail here, not in the benchmark."""
    import importlib

    from adaptive_eager.benchmarks import step_events

    for module, cls, name, _label in step_events._WRAPPED:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        assert callable(getattr(owner, name)), (module, cls, name)


def test_settling_waits_for_optimizer_steps_still_under_their_threshold():
    """The timed loop starts only once no compile is in flight and no optimizer step ran
    eagerly for its cost threshold for SETTLE_QUIET iterations (a compile that starts
    after the warm-up would otherwise be timed)."""
    import types

    from adaptive_eager.benchmarks import worker
    from adaptive_eager.dispatch.optim_records import Why

    calls = []

    class Api:
        def stats(self):
            n = len(calls)
            cheap = min(n, 12)  # the threshold is reached at the 12th step
            return {"compiles_in_flight": 1 if 12 <= n < 15 else 0,
                    "optimizer_step_kinds": {f"AdamW|eager: {Why.CHEAP}": cheap}}

    def one():
        calls.append(1)
        return 0.001

    wl = types.SimpleNamespace(on_timed_start=None)
    warm, extra, times, _before, _after = worker._timed_loop(one, 2, 3, Api(), 60.0, wl)
    # warm-up 2; then threshold steps to 12 and the compile in flight to 15; then 5 quiet
    assert extra >= 15 + worker.SETTLE_QUIET - 2 and len(times) == 3


def test_train_interleave_runs_the_variants_in_rotating_rounds(capsys):
    """``python -m benchmarks.train_interleave``: each variant's step runs ``rounds x chunk``
    times after its warm-up; adaptive settles until its optimizer step compiled (backend
    eager here, so quick) and its timed steps ran compiled; a bad variant names itself."""
    from adaptive_eager.benchmarks import train_interleave

    assert train_interleave.main(["--workload", "gpt-train", "--quick", "--rounds", "3", "--chunk", "2",
                                  "--variants", "eager,adaptive", "--options", "backend=eager",
                                  "--threads", str(__import__("torch").get_num_threads())]) == 0
    out = capsys.readouterr()
    assert "3 rounds x 2 steps" in out.out and "eager/adaptive" in out.out, out.out
    compiled = int(out.out.split("optimizer steps compiled ")[1].split(",")[0])
    assert compiled == 6, out.out  # every timed adaptive step: settled before timing
    with pytest.raises(SystemExit):
        train_interleave.main(["--variants", "eager,fast"])
    assert "unknown variant fast" in capsys.readouterr().err
