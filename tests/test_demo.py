"""The demo (``adaptive-eager demo``): both runs, a truthful summary, the plot, and the one
GPT model it shares with the benchmarks (Note [The demo's workload])."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from adaptive_eager import cli, demo
from adaptive_eager.statistics import Stats

ROOT = Path(__file__).resolve().parent.parent


def _run(**kw):
    kw.setdefault("backend", "eager")
    return demo.run_demo(size="tiny", out=io.StringIO(), **kw)


def test_demo_compares_both_runs_and_says_what_ran():
    # Windows of the tiny MLP cannot pay for their capture; forced capture compiles them
    # (eager backend, no size floor), so the summary has compiled regions to tell about.
    r = _run(steps=12, adaptive_passthrough=False, min_region_work=0)
    s = r.stats
    assert len(r.eager.losses) == len(r.adaptive.losses) == 12
    assert r.max_abs_diff == 0.0 and r.agree
    assert s.regions_compiled >= 1 and s.compiled_calls >= 1
    text = demo.summarize(r)
    assert "identical (bit for bit" in text and "round" not in text
    assert f"regions compiled {s.regions_compiled}" in text
    assert re.search(r"fused +\d+% of the ops", text)
    assert "(the adaptive run includes compiling" in text
    assert "load average" in text and "ms CPU" in text and "s CPU" in text
    assert "Where the time went" in r.report and "in short" in r.report


def test_without_compiles_the_summary_does_not_claim_compiling():
    r = _run(steps=4)
    assert r.stats.regions_compiled == 0 and r.stats.compiles_in_flight == 0
    text = demo.summarize(r)
    assert "includes compiling" not in text and "nothing compiled" in text


def _result(diff: float, compiled_calls: int) -> demo.DemoResult:
    run = demo.RunResult((1.0, 2.0), (0.01, 0.01), (0.01, 0.01), 0.02, 0.02, None, (1.0, 1.0))
    other = demo.RunResult((1.0, 2.0 + diff), (0.01, 0.01), (0.01, 0.01), 0.02, 0.02, None,
                           (1.0, 1.0))
    stats = Stats(windows=2, compiled_calls=compiled_calls, regions_compiled=int(bool(compiled_calls)))
    return demo.DemoResult("job", {}, 1, run, other, stats, "")


def test_agreement_is_told_truthfully():
    assert "identical" in demo.agreement_line(_result(0.0, 5))
    rounding = demo.agreement_line(_result(1e-6, 5))
    assert "max abs diff 1e-06" in rounding and "max rel diff 5e-07" in rounding
    assert "round differently" in rounding
    # Nothing ran compiled, so rounding cannot explain a difference (issue 14's item 5).
    assert "bug" in demo.agreement_line(_result(1e-6, 0))
    assert "DIFFER" in demo.agreement_line(_result(0.5, 5))


def test_the_gpt_option_uses_the_benchmarks_model():
    from adaptive_eager.benchmarks.workloads import _gpt

    assert demo.GPT is _gpt.GPT
    assert isinstance(demo.build("gpt", "tiny").model, _gpt.GPT)
    r = _run(steps=3, model="gpt")
    assert r.agree and "GPT (vocab 64" in r.title


def test_bad_model_or_size_fails_before_training():
    with pytest.raises(ValueError, match="no 'mlp' of size 'huge'"):
        demo.build("mlp", "huge")


def test_cli_demo_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    rc = cli.main(["demo", "--size", "tiny", "--backend", "eager", "--steps", "3",
                   "--plot", str(out)])
    assert rc == 0 and f"plot written to {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_demo_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    rc = cli.main(["demo", "--size", "tiny", "--backend", "eager", "--steps", "3",
                   "--plot", str(tmp_path / "x.png")])
    captured = capsys.readouterr()
    assert rc == 2 and 'pip install "adaptive-eager[plot]"' in captured.err
    assert "eager " not in captured.out  # refused before training
    assert not (tmp_path / "x.png").exists()


def test_plot_is_an_optional_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^plot = \["matplotlib[^"]*"\]', pyproject, re.M)


def test_readme_shows_the_current_demo_output():
    """README.md's demo output was pasted from a run of this version (its lines are the
    ones summarize() and the report print now)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- demo-output:begin -->")[1].split("<!-- demo-output:end -->")[0]
    header = f"adaptive-eager demo: {demo.build('mlp', 'small').title}; {demo.DEFAULT_STEPS['mlp']} steps"
    for label in (header, "loss curves ",
                  "fused ", "machine ", "whole run ", "per step ", "Where the time went",
                  "  capture ", "  eager replay ", "  compiled regions ", "  in short "):
        assert label in block, label


def test_cli_demo_json_has_each_steps_times_and_the_slow_steps(tmp_path, capsys):
    import json

    out = tmp_path / "demo.json"
    rc = cli.main(["demo", "--size", "tiny", "--backend", "eager", "--steps", "4",
                   "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and f"per-step times written to {out}" in text
    rec = json.loads(out.read_text())
    assert len(rec["eager"]["step_wall_s"]) == len(rec["adaptive"]["step_cpu_s"]) == 4
    median = sorted(rec["eager"]["step_wall_s"])[2]
    slow = [i + 1 for i, t in enumerate(rec["adaptive"]["step_wall_s"]) if i >= 2 and t > 1.3 * median]
    assert rec["slow_steps"] == slow
    assert f"slow steps       {len(slow)} adaptive step" in text and "\nwaiting          " in text
    assert rec["adaptive"]["waiting_steps"] == []  # the eager backend compiles synchronously
    assert set(rec["stats"]) >= {"regions_from_disk", "regions_compiled", "compile_latency_max_s"}


def test_waiting_line_says_what_steps_with_a_compile_in_flight_cost():
    def run(walls, waiting=()):
        return demo.RunResult((1.0,) * len(walls), tuple(walls), tuple(walls), sum(walls), sum(walls),
                              None, (0.0, 0.0), None, tuple(waiting))

    eager = run([0.1] * 6)
    r = demo.DemoResult("t", {}, 1, eager, run([0.5, 0.5, 0.2, 0.12, 0.1, 0.1], waiting=(0, 1, 2, 3)),
                        None, "")
    line = demo.waiting_line(r)   # steps 3 and 4 (the first two left out); upper median, as median_ms
    assert line.startswith("waiting          2 steps after the first two began with a compile in flight")
    assert "median 200.0 ms wall (2.00x eager's), 200.0 ms CPU (2.00x;" in line
    r = demo.DemoResult("t", {}, 1, eager, run([0.1] * 6, waiting=(0, 1)), None, "")
    assert demo.waiting_line(r) == "waiting          no step after the first two began with a compile in flight"
