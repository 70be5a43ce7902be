"""Logs users can switch on: torch._logging's TORCH_LOGS, artifacts, ADAPTIVE_EAGER_LOG."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import textwrap

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager._logging import ARTIFACTS, register_with_torch
from helpers import run_concurrently

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    import torch
    import adaptive_eager as ae

    for n in (4096, 4096, 4096, 2048):
        with ae.adaptive_eager(backend="aot_eager", async_compile=False):
            y = torch.randn(n)
            ((y * 2 + 1).relu() * 3).sum().item()
''')


# The four runs of SCRIPT the tests read, each a fresh process (a few seconds of imports),
# all at once (helpers.run_concurrently), at the first test that asks.
_RUNS = {"torch_logs": {"TORCH_LOGS": "+adaptive_eager"}, "artifacts": {"TORCH_LOGS": "ae_compiles"},
         "debug": {"ADAPTIVE_EAGER_LOG": "debug"}, "plain": {}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("logging")
    path = tmp / "prog.py"
    path.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADAPTIVE_EAGER", "TORCH_LOGS"))}
    env["ADAPTIVE_EAGER_WARMUP"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return run_concurrently({name: [sys.executable, str(path)] for name in _RUNS}, cwd=tmp, timeout=240,
                            each={name: {"env": {**env, **extra}} for name, extra in _RUNS.items()})


def test_torch_logs_plus_adaptive_eager_prints_compile_events(runs):
    r = runs["torch_logs"]
    assert r.returncode == 0, r.stderr
    for event in ("compile queued", "compile started", "compile finished", "flush item",
                  "window plan miss"):
        assert event in r.stderr, (event, r.stderr[-3000:])
    assert "shape change at op" in r.stderr  # the 2048 window: its cause


def _entry_point_installed() -> bool:
    return any(e.value == "adaptive_eager.autoload:autoload"
               for e in importlib.metadata.entry_points(group="torch.backends"))


@pytest.mark.skipif(not _entry_point_installed(), reason="package not installed (pip install -e .)")
def test_named_artifacts_pick_events(runs):
    # The entry point registers the names before `import torch` parses TORCH_LOGS.
    r = runs["artifacts"]
    assert r.returncode == 0, r.stderr
    assert "compile finished" in r.stderr
    assert "flush item" not in r.stderr and "plan miss" not in r.stderr


def test_adaptive_eager_log_still_works(runs):
    r = runs["debug"]
    assert r.returncode == 0, r.stderr
    assert "[adaptive_eager DEBUG] compile finished" in r.stderr
    assert runs["plain"].returncode == 0 and runs["plain"].stderr == ""  # nothing unless asked


def test_artifacts_are_registered_with_torch():
    from torch._logging import _internal

    assert register_with_torch()
    for name in ARTIFACTS:
        assert _internal.log_registry.is_artifact(name)
    assert _internal.log_registry.is_log("adaptive_eager")


def test_warmup_end_names_the_programs_line(caplog):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    caplog.set_level(logging.DEBUG, logger="adaptive_eager")
    with ae.adaptive_eager(backend="eager", warmup=True):
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    text = caplog.text
    assert "warm-up ended: optimizer step at " in text and "None" not in text
    assert "test_logging.py" in ae.stats().warmup_ended


def test_parking_is_logged_with_its_reason(caplog):
    caplog.set_level(logging.DEBUG, logger="adaptive_eager")
    x = torch.randn(8)
    with ae.adaptive_eager(backend="eager", warmup=False):
        for _ in range(40):
            ((x * 2 + 1).relu() * 3).sum().item()  # tiny windows: nothing worth compiling
    assert "parked (ops pass straight through): " in caplog.text
    assert "nothing worth compiling" in caplog.text or "do not recur" in caplog.text
