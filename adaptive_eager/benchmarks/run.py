"""Benchmark suite runner: ``python -m benchmarks`` or ``benchmarks.run.main(argv)``.

Runs every (workload, mode) in its own fresh subprocess (``benchmarks.worker``),
prints a table and writes JSON. See benchmarks/README.md for the columns.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from tqdm import tqdm

from adaptive_eager.benchmarks import table as T
from adaptive_eager.benchmarks import workloads as W

PKG_DIR = Path(__file__).resolve().parent
ROOT = PKG_DIR.parent.parent               # directory that contains the adaptive_eager package
# In a source checkout results go to benchmarks/results/ (git-ignored); from an install,
# to the current directory (the package's own folder may not be writable).
_CHECKOUT_RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_JSON = (_CHECKOUT_RESULTS if (ROOT / "pyproject.toml").is_file() else Path.cwd()) \
    / ("latest.json" if (ROOT / "pyproject.toml").is_file() else "adaptive-eager-bench.json")
MODES = T.MODES


def _csv(s: str) -> List[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="adaptive-eager bench",
        description="adaptive-eager benchmark suite: eager vs adaptive eager vs torch.compile, "
                    "one fresh process per (workload, mode).")
    p.add_argument("--workloads", type=_csv, default=None,
                   help="comma-separated workloads (default: all). Known: "
                        + ", ".join(s.name for s in W.SPECS))
    p.add_argument("--modes", type=_csv, default=list(MODES),
                   help="comma-separated modes among eager,adaptive,compile (default: all)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per run (default: per workload; total steps for 'total' metrics)")
    p.add_argument("--warmup", type=int, default=None, help="warmup iterations (default: per workload)")
    p.add_argument("--quick", action="store_true", help="small sizes and few iterations (tests, smoke)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads / OMP_NUM_THREADS (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu",
                   help="device the workloads run on: cpu (default) or cuda (scripts/gpu-check); "
                        "the neuron-sim row always runs on the emulated neuron device")
    p.add_argument("--json", default=str(DEFAULT_JSON), help=f"JSON output path (default {DEFAULT_JSON})")
    p.add_argument("--no-json", action="store_true", help="do not write JSON")
    p.add_argument("--timeout", type=float, default=900.0, help="per-run subprocess timeout in s (default 900)")
    p.add_argument("--settle", type=float, default=150.0,
                   help="adaptive: after warmup, keep stepping (at most this many s) while compiles are in flight")
    p.add_argument("--adaptive-options", default="",
                   help="k=v,... passed to ae.adaptive_eager(**options) (values parsed as JSON when possible)")
    p.add_argument("--launch-latency-us", type=float, default=20.0,
                   help="neuron-sim workload: simulated launch latency (default 20)")
    p.add_argument("--inductor-cache", choices=("fresh", "shared"), default="fresh",
                   help="fresh: an empty TORCHINDUCTOR_CACHE_DIR per run, so compile costs are cold "
                        "(default); shared: the user's normal cache")
    p.add_argument("--stat", choices=("median", "min", "p10", "mean"), default="median",
                   help="statistic of the per-iteration times used in the table and ratios (default median; "
                        "min or p10 resist interference from other processes on a loaded machine)")
    p.add_argument("--list", action="store_true", help="list workloads and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="show each run's stdout/stderr")
    return p


def _run_subprocess(spec: W.Spec, mode: str, a: argparse.Namespace, log) -> Dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="ae-bench-")
    out = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", "adaptive_eager.benchmarks.worker", "--workload", spec.name, "--mode", mode,
           "--out", out, "--threads", str(a.threads), "--seed", str(a.seed), "--settle", str(a.settle),
           "--adaptive-options", a.adaptive_options,
           "--workload-options", f"launch_latency_us={a.launch_latency_us}", "--device", a.device]
    if a.iters is not None:
        cmd += ["--iters", str(a.iters)]
    if a.warmup is not None:
        cmd += ["--warmup", str(a.warmup)]
    if a.quick:
        cmd.append("--quick")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = str(a.threads)
    if a.inductor_cache == "fresh":
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        # and no compiled region from an earlier run (runtime/disk_cache.py): cold is cold
        env["ADAPTIVE_EAGER_CACHE_DIR"] = os.path.join(tmp, "regions")
    t0 = time.perf_counter()
    try:
        cp = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=a.timeout)
        rc, stdout, stderr = cp.returncode, cp.stdout, cp.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = None, e.stdout or "", e.stderr or ""
        if isinstance(stdout, bytes):
            stdout, stderr = stdout.decode(errors="replace"), (stderr or b"").decode(errors="replace")
    wall = time.perf_counter() - t0
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        tail = (stderr or stdout or "").strip().splitlines()[-15:]
        res = {"workload": spec.name, "mode": mode,
               "status": "timeout" if rc is None else "crashed",
               "message": (f"no result after {a.timeout:.0f}s" if rc is None else f"exit code {rc}")
                          + (": " + tail[-1] if tail else ""),
               "stderr_tail": "\n".join(tail)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = wall
    res["returncode"] = rc
    if a.verbose and (stdout or stderr):
        log((stdout or "") + (stderr or ""))
    return res


def load_warning(load: Optional[float], own: float = 0.0, ncpu: Optional[int] = None) -> str:
    """A warning line when other processes took at least half the machine: the 1-min load
    average ``load`` less ``own`` (the suite's own runs: their threads and the compile
    worker) above half the CPUs; else ``""``.

    Example::

        >>> load_warning(2.5, ncpu=2).startswith("WARNING")
        True
        >>> load_warning(2.5, own=3, ncpu=2)
        ''
    """
    ncpu = ncpu or os.cpu_count() or 1
    if load is None or load - own <= 0.5 * ncpu:
        return ""
    return (f"WARNING: the 1-min load average was {load:.1f} on {ncpu} CPUs: other processes "
            "compete for the cores, so times are inflated and the ratios below may be "
            "meaningless (rerun on an idle machine, or compare --stat min)")


def main(argv: Optional[List[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if a.list:
        for s in W.SPECS:
            print(f"{s.name:15s} {s.title}  (modes: {','.join(s.modes)}; iters {s.iters}, warmup {s.warmup})")
        return 0
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        log(f"unknown mode(s) {bad}; choose among {','.join(MODES)}")
        return 2
    try:
        specs = [W.get(n) for n in a.workloads] if a.workloads else [s for s in W.SPECS if s.default]
    except KeyError as e:
        log(str(e.args[0]))
        return 2

    jobs = [(s, m) for s in specs for m in a.modes if m in s.modes]
    runs: List[Dict[str, Any]] = []
    busy = load_warning(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    if busy:
        log(busy)
    t_suite = time.perf_counter()
    # A progress bar with an ETA on a terminal (tqdm: no bar, and these lines, in a log).
    with tqdm(total=len(jobs), unit="run", file=sys.stderr, disable=None, dynamic_ncols=True,
              bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}") as bar:
        say = log if bar.disable else (lambda text: bar.write(text, file=sys.stderr))
        for i, (s, m) in enumerate(jobs, 1):
            bar.set_postfix_str(f"{s.name} / {m}")
            if bar.disable:
                log(f"[{i}/{len(jobs)}] {s.name} / {m} ...")
            r = _run_subprocess(s, m, a, say)
            what = T.fmt_time(r.get("time_s")) if r.get("status") == "ok" else f"{r.get('status')}: {r.get('message')}"
            say(f"[{i}/{len(jobs)}] {s.name} / {m}: {what}  (process {r['wall_s']:.1f}s)")
            runs.append(r)
            bar.update(1)
    suite_s = time.perf_counter() - t_suite

    if a.stat != "median":
        for r in runs:
            if r.get("status") == "ok" and r.get("metric") != "total" and r.get(f"{a.stat}_s") is not None:
                r["time_s"], r["time_stat"] = r[f"{a.stat}_s"], a.stat
    rows = T.summarize(runs, [s.name for s in specs])
    import torch  # only for the version string; imported after the runs
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "python": platform.python_version(), "torch": torch.__version__,
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "threads": a.threads, "quick": a.quick, "seed": a.seed, "modes": a.modes,
        "iters": a.iters, "warmup": a.warmup, "stat": a.stat, "inductor_cache": a.inductor_cache,
        "adaptive_options": a.adaptive_options, "suite_wall_s": suite_s,
        "sizes": {s.name: next((r.get("size") for r in runs if r["workload"] == s.name and r.get("size")), None)
                  for s in specs},
    }
    print(f"adaptive-eager benchmarks  (torch {torch.__version__}, {a.threads} threads"
          f"{', QUICK sizes' if a.quick else ''}; {a.stat} time per iteration ±half-IQR/median; "
          f"suite {suite_s:.0f}s)")
    loads = [x for r in runs for x in (r.get("loadavg_start"), r.get("loadavg_end")) if x is not None]
    busy = load_warning(max(loads) if loads else None, own=a.threads + 1)
    meta["load_warning"] = busy
    if busy:
        print(busy)  # before the ratios it puts in doubt
    print(T.format_table(rows))
    notes = T.format_notes(rows)
    if notes:
        print("notes:")
        print(notes)
    if not a.no_json:
        path = Path(a.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"meta": meta, "summary": rows, "runs": runs}, f, indent=1, default=repr)
        print(f"JSON: {path}")
    return 1 if any(r.get("status") in ("error", "crashed", "timeout") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
