"""Opt-in without code changes: ADAPTIVE_EAGER=1 through torch's backend autoload.

Every test runs a fresh interpreter on a script that never imports adaptive_eager;
the entry point comes from the installed package's metadata (pip install -e .).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import run_concurrently

SCRIPT = textwrap.dedent('''
    import sys, threading
    import torch

    x = torch.arange(8.0)
    total = 0.0
    for _ in range(3):
        total += (x * 2).sum().item()
    seen = {}
    def work():
        seen["thread"] = type(torch.ones(2) * 2).__name__
    t = threading.Thread(target=work)
    t.start(); t.join()
    print("main", type(x * 2).__name__)
    print("thread", seen["thread"])
    print("total", total)
    print("loaded", sorted(m for m in sys.modules if m.startswith("adaptive_eager")))
''')


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="torch.backends")
    return any(ep.value.startswith("adaptive_eager.autoload") for ep in eps)


pytestmark = pytest.mark.skipif(not _entry_point_installed(),
                                reason="package not installed (pip install -e .)")


# Note [The autoload scripts run at once]
# Every script below runs in a fresh interpreter (2-5 s of imports each, 46 s one after
# another). The module's runs are listed in RUNS and started together, as many at a time as
# there are cores (helpers.run_concurrently), when the first test asks; each test reads its
# own. A run is started only where a test that reads it was selected.
@dataclass(frozen=True)
class Run:
    tests: tuple            # the tests that read it
    env: dict               # on top of the environment less ADAPTIVE_EAGER*; "{dir}": its folder
    script: str = ""        # default SCRIPT
    root: bool = False      # this checkout first on the path
    neuronx: str | None = None  # a fake torch_neuronx on the path, this the rest of its body


def _fake_torch_neuronx(root, body=""):
    pkg = root / "torch_neuronx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import torch\n" + body)
    return str(root)


def _command(folder: Path, run: Run) -> tuple[list, dict]:
    folder.mkdir()
    path = folder / "train.py"
    path.write_text(run.script or SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("ADAPTIVE_EAGER") or k == "ADAPTIVE_EAGER_CACHE_DIR") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["ADAPTIVE_EAGER_WARMUP"] = "0"  # the scripts check capture from their first op
    env.update({k: v.replace("{dir}", str(folder)) for k, v in run.env.items()})
    extra = (_ROOT if run.root else
             _fake_torch_neuronx(folder / "site", run.neuronx) if run.neuronx is not None else "")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, env.get("PYTHONPATH", "")])
    return [sys.executable, str(path)], env


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory) -> dict:
    """{run name: (CompletedProcess, its folder)} for the runs the selected tests read."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    tmp = tmp_path_factory.mktemp("autoload")
    commands, each = {}, {}
    for name, run in RUNS.items():
        if selected & set(run.tests):
            commands[name], env = _command(tmp / name, run)
            each[name] = {"env": env, "cwd": tmp / name}
    done = run_concurrently(commands, each=each, timeout=240)
    return {name: (r, tmp / name) for name, r in done.items()}


def _lines(out):
    return dict(line.split(" ", 1) for line in out.strip().splitlines() if " " in line)


def test_unset_is_a_cheap_noop(ran):
    r = ran["unset"][0]
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["main"] == "Tensor" and out["thread"] == "Tensor" and out["total"] == "168.0"
    loaded = eval(out["loaded"])
    # the entry point imports only itself, the (empty) package init and two leaves
    assert set(loaded) <= {"adaptive_eager", "adaptive_eager.autoload", "adaptive_eager._logging",
                           "adaptive_eager._env"}
    assert r.stderr == ""


def test_env_var_runs_whole_program_and_reports(ran):
    r, folder = ran["env_var"]
    report = folder / "report.txt"
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["main"] == "LazyTensor"          # the main thread runs under the runtime
    assert out["thread"] == "LazyTensor"        # and so does a thread started later
    assert out["total"] == "168.0"              # with eager's values
    text = report.read_text()
    assert "adaptive_eager report" in text
    assert "train.py:8" in text and "total += (x * 2).sum().item()" in text
    assert "keep the value as a tensor" in text
    # ADAPTIVE_EAGER_LOG=debug: flush events on stderr
    assert "[adaptive_eager DEBUG]" in r.stderr and "flush item" in r.stderr


def test_bad_option_logs_and_stays_off(ran):
    r = ran["bad_option"][0]
    assert r.returncode == 0, r.stderr                   # import torch did not break
    assert _lines(r.stdout)["main"] == "Tensor"          # plain eager
    assert "ADAPTIVE_EAGER=1 ignored" in r.stderr
    assert "'window_size'" in r.stderr and "ADAPTIVE_EAGER_WINDOW_SIZE" in r.stderr


def test_torch_autoload_switch_turns_it_off(ran):
    r = ran["autoload_off"][0]
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)["main"] == "Tensor"


def test_unrecognized_switch_value_warns_in_process(monkeypatch, caplog):
    from adaptive_eager import autoload

    monkeypatch.setenv("ADAPTIVE_EAGER", "please")
    with caplog.at_level("WARNING", logger="adaptive_eager"):
        autoload.autoload()                     # torch is imported: nothing is deferred
    assert "ADAPTIVE_EAGER='please' not understood" in caplog.text
    import adaptive_eager as ae

    assert not ae.is_enabled()


def test_entry_point_never_raises(monkeypatch, caplog):
    from adaptive_eager import autoload

    def boom(name, callback):
        raise RuntimeError("broken hook")

    monkeypatch.setattr(autoload, "when_imported", boom)
    with caplog.at_level("WARNING", logger="adaptive_eager"):
        autoload.autoload()
    assert "autoload failed" in caplog.text


def test_when_imported_fires_for_a_module_imported_later(tmp_path, monkeypatch):
    from adaptive_eager.autoload import when_imported

    (tmp_path / "ae_late_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("ae_late_module", lambda m: seen.append(m.VALUE))
    assert seen == []
    import ae_late_module  # noqa: F401

    assert seen == [7]
    when_imported("ae_late_module", lambda m: seen.append(m.VALUE + 1))  # already imported: now
    assert seen == [7, 8]
    monkeypatch.delitem(sys.modules, "ae_late_module")


CHECK_NEURONX = textwrap.dedent('''
    import torch_neuronx
    import adaptive_eager
    from adaptive_eager import session
    print("attached", torch_neuronx.adaptive_eager is adaptive_eager.adaptive_eager)
    print("value", torch_neuronx.adaptive_eager if isinstance(torch_neuronx.adaptive_eager, str) else "-")
    o = session.resolve_options()
    print("defaults", o.device, o.backend)
    print("override", session.resolve_options(backend="eager").backend)
''')


def test_torch_neuronx_gets_the_context_manager_and_neuron_defaults(ran):
    r = ran["neuronx"][0]
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["attached"] == "True"
    assert out["defaults"] == "neuron neuron"
    assert out["override"] == "eager"


def test_torch_neuronx_imported_after_torch(ran):
    r = ran["neuronx_after_torch"][0]
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["attached"] == "True"
    assert out["defaults"] == "cpu neuron"        # an env var beats the platform default


def test_torch_neuronx_own_attribute_is_kept(ran):
    r = ran["neuronx_own"][0]
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["attached"] == "False" and out["value"] == "theirs"


def test_enables_when_adaptive_eager_itself_imports_torch(ran):
    # The program's own import of adaptive_eager triggers `import torch`: enabling must
    # wait until adaptive_eager.session has finished importing.
    r = ran["self_import"][0]
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)["main"] == "LazyTensor"
    assert "ignored" not in r.stderr


def test_neuron_sim_from_env(ran):
    r = ran["neuron_sim"][0]
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)["main"] == "LazyTensor neuron [2.0, 2.0]"


def test_neuron_sim_from_env_with_device_auto_and_launch_model(ran):
    # An unmodified program on the emulated device, environment only: device="auto"
    # (the default) picks the neuron device (Note [device="auto"]), and the launch model
    # comes from ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US / _ASYNC.
    r = ran["neuron_sim_auto"][0]
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    assert lines["main"] == "LazyTensor neuron [2.0, 2.0]"
    assert lines["launch"] == "50.0 False"
    assert lines["device"].startswith("neuron (device=auto"), lines["device"]


SHORT = textwrap.dedent('''
    import sys
    import torch
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    for i in range(2):
        y = (x * 2 + 1).relu().sum(0).softmax(0) - x.mean()
        z = y.exp().log1p().tanh()
    print("value", repr(float(z.sum())))
    loaded = set(m for m in sys.modules if m.startswith("adaptive_eager") or m == "torch._dynamo")
    print("loaded", sorted(loaded))
    from adaptive_eager import session
    mode = session.current_mode()
    print("idle", mode is not None and mode.flusher is None and len(mode.recorder) == 0)
''')

# Modules of capture: the window (recorder, flush, traces), the compile pipeline, the
# compiled optimizer step, stats and Dynamo (Note [The window is built at the first
# capture], dispatch/mode.py; Note [The step compiler is imported at the first step],
# dispatch/parking.py).
CAPTURE_MODULES = {
    "adaptive_eager.dispatch.recorder", "adaptive_eager.dispatch.builder",
    "adaptive_eager.dispatch.flush", "adaptive_eager.dispatch.trace",
    "adaptive_eager.dispatch.match", "adaptive_eager.dispatch.optim_compile",
    "adaptive_eager.runtime.compiled", "adaptive_eager.runtime.executor",
    "adaptive_eager.runtime.windows", "adaptive_eager.fusion.partition",
    "adaptive_eager.fusion.signature", "adaptive_eager.statistics", "torch._dynamo",
}
_ROOT = str(Path(__file__).resolve().parents[1])  # this checkout, not the installed copy


def test_a_short_script_that_never_captures_imports_nothing_of_capture(ran):
    plain, r = ran["short_plain"][0], ran["short_warm_up"][0]
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["value"] == _lines(plain.stdout)["value"]       # eager's value
    loaded = set(eval(out["loaded"]))
    assert "adaptive_eager.dispatch.mode" in loaded              # it ran under the runtime
    assert out["idle"] == "True"                                 # its window was never built
    assert loaded & CAPTURE_MODULES == set()


def test_capture_builds_the_window_and_imports_it(ran):
    plain, r = ran["short_plain"][0], ran["short_capture"][0]  # warm-up off: capture at once
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert out["value"] == _lines(plain.stdout)["value"]
    loaded = set(eval(out["loaded"]))
    assert {"adaptive_eager.dispatch.recorder", "adaptive_eager.dispatch.flush",
            "adaptive_eager.dispatch.trace", "torch._dynamo"} <= loaded
    assert out["idle"] == "False"


# Note [The autoload scripts run at once]: every run the tests above read.
_ON = {"ADAPTIVE_EAGER": "1", "ADAPTIVE_EAGER_BACKEND": "eager"}
_NEURON = ("import torch\nx = torch.ones(2, device='neuron') * 2\n"
           "print('main', type(x).__name__, x.device.type, x.cpu().tolist())\n")
RUNS = {
    "unset": Run(("test_unset_is_a_cheap_noop",), {}),
    "env_var": Run(("test_env_var_runs_whole_program_and_reports",),
                   {**_ON, "ADAPTIVE_EAGER_REPORT": "{dir}/report.txt", "ADAPTIVE_EAGER_LOG": "debug"}),
    "bad_option": Run(("test_bad_option_logs_and_stays_off",),
                      {"ADAPTIVE_EAGER": "1", "ADAPTIVE_EAGER_WINDOW_SIZE": "abc"}),
    "autoload_off": Run(("test_torch_autoload_switch_turns_it_off",),
                        {**_ON, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    "neuronx": Run(("test_torch_neuronx_gets_the_context_manager_and_neuron_defaults",), {},
                   CHECK_NEURONX, neuronx=""),
    "neuronx_after_torch": Run(("test_torch_neuronx_imported_after_torch",), {"ADAPTIVE_EAGER_DEVICE": "cpu"},
                               "import torch\n" + CHECK_NEURONX, neuronx=""),
    "neuronx_own": Run(("test_torch_neuronx_own_attribute_is_kept",), {}, CHECK_NEURONX,
                       neuronx="adaptive_eager = 'theirs'\n"),
    "self_import": Run(("test_enables_when_adaptive_eager_itself_imports_torch",), _ON,
                       "from adaptive_eager import adaptive_eager, stats\nimport torch\n"
                       "print('main', type(torch.ones(2) * 2).__name__)\n"),
    "neuron_sim": Run(("test_neuron_sim_from_env",),
                      {**_ON, "ADAPTIVE_EAGER_DEVICE": "neuron", "ADAPTIVE_EAGER_NEURON_SIM": "1"}, _NEURON),
    "neuron_sim_auto": Run(("test_neuron_sim_from_env_with_device_auto_and_launch_model",),
                           {**_ON, "ADAPTIVE_EAGER_NEURON_SIM": "1", "ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US": "50",
                            "ADAPTIVE_EAGER_NEURON_SIM_ASYNC": "0"},
                           _NEURON + "from adaptive_eager import neuron_sim, session\n"
                           "print('launch', neuron_sim.launch_latency_us(), neuron_sim.async_launch())\n"
                           "print('device', session.counters().device)\n", root=True),
    "short_plain": Run(("test_a_short_script_that_never_captures_imports_nothing_of_capture",
                        "test_capture_builds_the_window_and_imports_it"), {}, SHORT),
    "short_warm_up": Run(("test_a_short_script_that_never_captures_imports_nothing_of_capture",),
                         {"ADAPTIVE_EAGER": "1", "ADAPTIVE_EAGER_WARMUP": "1"}, SHORT, root=True),
    "short_capture": Run(("test_capture_builds_the_window_and_imports_it",), _ON, SHORT, root=True),
}
