"""The adaptive-eager command: run, explain, options, bench, demo.

Most commands run in-process through ``cli.main`` (fast); one test per entry form
(console script, ``python -m adaptive_eager``) runs a fresh interpreter. Scripts under
test never import adaptive_eager.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import adaptive_eager as ae
from adaptive_eager import cli, session

SCRIPT = textwrap.dedent('''
    import sys
    import torch

    x = torch.randn(64)
    total = 0.0
    for step in range(4):
        y = x * 2 + 1
        total += y.sum().item()
    positive = torch.nonzero(x > 0)
    print("argv", sys.argv[1:], "name", __name__, "lazy", type(y).__name__)
''')


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_run_executes_script_under_runtime_and_reports(script, capsys):
    rc = cli.main(["run", "--backend", "eager", str(script), "--lr", "3"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "argv ['--lr', '3'] name __main__ lazy LazyTensor" in out
    assert "adaptive_eager report" in err
    assert "total += y.sum().item()" in err and "keep the value as a tensor" in err
    assert "aten::nonzero" in err
    assert not ae.is_enabled() and session.current_mode() is None


def test_run_report_to_file_and_exit_status(tmp_path, capsys):
    path = tmp_path / "fails.py"
    path.write_text("import sys, torch\nprint((torch.ones(2) * 2).tolist())\nsys.exit(3)\n")
    report = tmp_path / "r.txt"
    rc = cli.main(["run", "-o", "backend=eager", "--report", str(report), str(path)])
    assert rc == 3
    assert "[2.0, 2.0]" in capsys.readouterr().out
    assert "adaptive_eager report" in report.read_text()


def test_run_script_exception_is_shown_and_runtime_left(tmp_path, capsys):
    path = tmp_path / "raises.py"
    path.write_text("import torch\nx = torch.ones(2) * 2\nraise ValueError('boom')\n")
    rc = cli.main(["run", "--backend", "eager", str(path)])
    err = capsys.readouterr().err
    assert rc == 1 and "ValueError: boom" in err
    assert not ae.is_enabled() and session.current_mode() is None


def test_run_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "ae_cli_mod.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = cli.main(["run", "--backend", "eager", "-m", "ae_cli_mod", "x"])
    assert rc == 0
    assert "argv ['x'] name __main__ lazy LazyTensor" in capsys.readouterr().out


def test_explain_lists_sites_and_fallbacks(script, capsys):
    rc = cli.main(["explain", "--backend", "eager", str(script)])
    err = capsys.readouterr().err
    assert rc == 0
    assert "Sync sites" in err and "Fallback ops" in err
    assert "train.py:9" in err and "total += y.sum().item()" in err
    assert "train.py:10" in err and "torch.nonzero(x > 0)" in err
    assert "fixed-shape forms" in err


@pytest.mark.parametrize("argv, words", [
    (["run", "--backend", "tvm", "x.py"], ["'backend'", "inductor"]),
    (["run", "-o", "window_size=0", "x.py"], ["'window_size'", ">= 1"]),
    (["explain", "-o", "no_such_option=1", "x.py"], ["unknown adaptive_eager option"]),
])
def test_bad_options_exit_2_with_a_clear_message(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err
    assert not ae.is_enabled()


def test_options_table(capsys):
    assert cli.main(["options"]) == 0
    out = capsys.readouterr().out
    assert "ADAPTIVE_EAGER_WINDOW_SIZE" in out and "backend" in out


def test_bench_forwards_to_the_suite(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    assert "benchmark" in capsys.readouterr().out.lower()


def test_demo_in_process(capsys):
    rc = cli.main(["demo", "--steps", "3", "--size", "tiny", "--backend", "eager"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "eager" in out and "3/3" in out
    assert "loss curves" in out and "speedup" in out and "adaptive_eager report" in out


def _env():
    env = {k: v for k, v in os.environ.items() if (not k.startswith("ADAPTIVE_EAGER") or k == "ADAPTIVE_EAGER_CACHE_DIR")}
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["ADAPTIVE_EAGER_WARMUP"] = "0"  # the scripts check capture from their first op
    return env


def test_python_dash_m_run(script, tmp_path):
    r = subprocess.run([sys.executable, "-m", "adaptive_eager", "run", "--backend", "eager",
                        str(script), "a"], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "argv ['a'] name __main__ lazy LazyTensor" in r.stdout
    assert "Top sync sites" in r.stderr


@pytest.mark.skipif(shutil.which("adaptive-eager") is None, reason="console script not installed")
def test_console_script_demo(tmp_path):
    r = subprocess.run(["adaptive-eager", "demo", "--steps", "2", "--size", "tiny",
                        "--backend", "eager"], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "loss curves      identical" in r.stdout and "Where the time went" in r.stdout


# -- JSON, --version, did-you-mean -----------------------------------------------------------

def test_run_json_parses_and_matches_stats(script, tmp_path, capsys):
    import json

    for argv, path in ((["--json", "--report", str(tmp_path / "r.txt")], tmp_path / "r.txt"),
                       (["--report", str(tmp_path / "r.json")], tmp_path / "r.json")):
        rc = cli.main(["run", "--backend", "eager", *argv, str(script)])
        assert rc == 0
        data = json.loads(path.read_text())
        assert data == json.loads(session.stats().to_json())
        assert data["flushes"]["item"] == 4 and data["ops_captured"] > 0


def test_explain_json(script, capsys):
    import json

    rc = cli.main(["explain", "--backend", "eager", "--json", str(script)])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out[out.index("{\n"):])  # after the script's own print
    site = data["sync_sites"][0]
    assert site["code"] == "total += y.sum().item()" and site["reasons"] == {"item": 4}
    assert "keep the value as a tensor" in site["advice"]
    assert data["fallbacks"][0]["op"] == "aten::nonzero"
    assert data["fallbacks"][0]["code"] == "positive = torch.nonzero(x > 0)"


def test_report_env_var_with_a_json_path_writes_json(script, tmp_path):
    import json

    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "adaptive_eager", "run", "--backend", "eager",
                        "--report", "0", str(script)], cwd=tmp_path,
                       env={**_env(), "ADAPTIVE_EAGER_REPORT": str(out)},
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["flushes"]["item"] == 4


def test_version(capsys):
    import adaptive_eager

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"adaptive-eager {adaptive_eager.__version__}"


@pytest.mark.parametrize("argv, suggestion", [
    (["run", "--backend", "inducter", "x.py"], "did you mean 'inductor'?"),
    (["run", "-o", "window_sise=3", "x.py"], "did you mean 'window_size'?"),
])
def test_did_you_mean(argv, suggestion, capsys):
    assert cli.main(argv) == 2
    assert suggestion in capsys.readouterr().err


def test_did_you_mean_for_environment_variables(monkeypatch, capsys):
    monkeypatch.setenv("ADAPTIVE_EAGER_WINDOWSIZE", "3")
    assert cli.main(["run", "x.py"]) == 2
    assert "did you mean 'ADAPTIVE_EAGER_WINDOW_SIZE'?" in capsys.readouterr().err


def _see_this_torch(venv, folder) -> None:
    """Make ``venv`` see this interpreter's torch and the packages it requires (links in
    ``folder``, which a .pth file of the venv adds to its path), so that pip finds the
    pinned torch installed; nothing of adaptive_eager (the checkout's editable install)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    todo, seen = ["torch"], set()
    folder.mkdir()
    while todo:
        try:
            dist = metadata.distribution(todo.pop())
        except metadata.PackageNotFoundError:
            continue  # pip installs it
        if dist.name.lower() in seen:
            continue
        seen.add(dist.name.lower())
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
        for top in {f.parts[0] for f in dist.files or []}:
            link = folder / top
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not link.exists():
                link.symlink_to(dist.locate_file(top))
    assert "torch" in seen
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "_this_torch.pth").write_text(f"{folder}\n")


@pytest.mark.slow
def test_pip_install_then_bench_works_from_anywhere(tmp_path):
    """A normal (not editable) install into a fresh venv ships the benchmarks: `adaptive-eager
    bench` runs outside the checkout (it used to exit 2, "benchmarks/ folder is not found")."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = tmp_path / "venv"
    env = {k: v for k, v in _env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])

    def sh(*cmd, cwd=tmp_path, timeout=300):
        r = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
        return r

    # a venv without its own pip (4.8 s of the test's 32 s), installed into by this one's
    sh(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _see_this_torch(venv, tmp_path / "beside")  # installing its wheel took 27 of the test's 52 s
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    sh(*pip, root)              # not editable: what `pip install .` does
    r = sh(str(venv / "bin" / "python"), "-c", "import adaptive_eager, torch; print(adaptive_eager.__file__)")
    assert r.stdout.startswith(str(venv)), r.stdout  # the installed copy, not the checkout
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = sh(str(venv / "bin" / "adaptive-eager"), "bench", "--quick", "--workloads", "tiny-ops",
           "--modes", "eager,adaptive", cwd=work)
    assert "tiny-ops" in r.stdout and "eager/adapt" in r.stdout
    assert (work / "adaptive-eager-bench.json").is_file()  # results land where it was run
    r = sh(str(venv / "bin" / "adaptive-eager"), "--version", cwd=work)
    assert r.stdout.startswith("adaptive-eager ")


def test_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    from adaptive_eager.runtime.disk_cache import DiskCache

    folder = tmp_path / "regions"
    monkeypatch.setenv("ADAPTIVE_EAGER_CACHE_DIR", str(folder))
    assert cli.main(["cache"]) == 0
    assert "empty" in capsys.readouterr().out and not folder.exists()
    DiskCache(str(folder)).put("a", bytes(3000))
    DiskCache(str(folder)).put("b", bytes(3000))
    assert cli.main(["cache", "info"]) == 0
    assert f"{folder}: 2 entries" in capsys.readouterr().out
    assert cli.main(["cache", "clear"]) == 0
    assert "2 entries deleted" in capsys.readouterr().out
    assert DiskCache(str(folder)).info().entries == 0
    assert cli.main(["cache", "-o", "cache_dir=off"]) == 0
    assert "off" in capsys.readouterr().out
    os.chmod(folder, 0o777)
    assert cli.main(["cache", "-o", f"cache_dir={folder}"]) == 1
    assert "writable by other users" in capsys.readouterr().out
