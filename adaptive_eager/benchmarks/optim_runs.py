"""300-step training runs of a tiny model, one per optimizer: ``python -m benchmarks.optim_runs``.

Issue 24's run: a tiny MLP trained ``--steps`` steps (300) with a cosine learning-rate
schedule (``CosineAnnealingLR``), reading its loss every step, for AdamW, SGD with
Nesterov momentum, Adam with amsgrad, RMSprop and LBFGS (a closure). Each run is a fresh
Python process (as a program's run is), which trains eagerly and then inside one
``adaptive_eager()`` block. Per optimizer and configuration there are two runs on one
compiled-region cache folder: ``fresh`` (an empty folder, with the configuration's
options) and ``kept`` (a second run of the same program on the folder the fresh run
left, with the default options: what a user's second run gets) and ``kept-ind`` (the same
after 4 untimed steps of another optimizer whose step ran compiled, so that an Inductor
artifact was loaded in the process: Note [A saved step skips the cost threshold]). Per
run it prints what
the runtime reports about the step (``stats().optimizer_step_kinds``): signatures,
compiles, loads from disk, steps compiled and the first step that ran compiled, why the
other steps ran eagerly; whether every loss and the final params equal eager's bit for
bit (else the largest loss difference); the program thread's CPU and wall time against
eager's, and the adaptive run's process CPU time (``proc``: the runtime's threads too, not
the compile worker's process).

Configurations (``--configs``): ``default`` (the options as a program gets them,
``optimizer_step_after_ms`` included), ``after0`` (``optimizer_step_after_ms=0``: traced
from its second step, compiled in the background), ``after0-sync`` (the same with
``async_compile=False``: the compile waits, so every step after it can run compiled).

Example::

    python -m benchmarks.optim_runs                               # 5 optimizers x 3 configs x 2 runs
    python -m benchmarks.optim_runs --only adamw,lbfgs --backend eager --configs after0-sync
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import torch

O = torch.optim
# name -> (optimizer class, keyword arguments); LBFGS steps with a closure
OPTIMIZERS: Dict[str, tuple] = {
    "adamw": (O.AdamW, dict(lr=3e-3, weight_decay=0.1)),
    "sgd-nesterov": (O.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "adam-amsgrad": (O.Adam, dict(lr=3e-3, amsgrad=True)),
    "rmsprop": (O.RMSprop, dict(lr=1e-3)),
    "lbfgs": (O.LBFGS, dict(lr=0.5, max_iter=4)),
}
# fresh: an empty cache folder; kept: a second run on it (default options); kept-ind: a
# third, whose program ran 4 steps with a compiled step before its loop (untimed): an
# Inductor artifact loaded in the process already
RUNS = ("fresh", "kept", "kept-ind")
CONFIGS: Dict[str, Dict[str, Any]] = {
    "default": {},
    "after0": {"optimizer_step_after_ms": 0},
    "after0-sync": {"optimizer_step_after_ms": 0, "async_compile": False},
}


def train(name: str, steps: int, on_step: Callable[[], None] | None = None) -> tuple[List[float], List[torch.Tensor]]:
    """``steps`` steps of a tiny MLP (16 -> 32 -> 32 -> 1, 1,633 params in 6 tensors) with
    optimizer ``name`` and a cosine schedule; the loss of every step and the final params.
    ``on_step``: called after each step."""
    cls, kw = OPTIMIZERS[name]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                torch.nn.Tanh(), torch.nn.Linear(32, 1))
    x, y = torch.randn(64, 16, generator=gen), torch.randn(64, 1, generator=gen)
    opt = cls(model.parameters(), **kw)
    sched = O.lr_scheduler.CosineAnnealingLR(opt, steps)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    losses = []
    for _ in range(steps):
        if cls is O.LBFGS:
            loss = opt.step(closure)
        else:
            loss = closure()
            opt.step()
        sched.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step()
    return losses, [p.detach().clone() for p in model.parameters()]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, thread CPU s, wall s)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    r = fn()
    return r, time.thread_time() - c0, time.perf_counter() - w0


def run_one(name: str, steps: int, config: str, backend: str, cache: str, run: str) -> Dict[str, Any]:
    """One run, in this process: optimizer ``name`` eagerly, then adaptively with
    ``config``'s options (``run`` "kept"/"kept-ind": the default options) on the cache folder
    ``cache``; a result row."""
    import adaptive_eager as ae
    from adaptive_eager import session
    from adaptive_eager.session import _COUNTERS

    if run == "kept-ind":  # a program that ran a compiled step already (not timed)
        with ae.adaptive_eager(cache_dir=os.path.join(cache, "regions"), backend=backend,
                               optimizer_step_after_ms=0, async_compile=False):
            train(name, 4)
        session.clear_sessions()
    train(name, 2)  # torch's own first-call costs are no one's
    (ref_losses, ref_params), eager_cpu, eager_wall = _timed(lambda: train(name, steps))
    options = dict(CONFIGS[config] if run == "fresh" else {}, backend=backend)
    cls_name = OPTIMIZERS[name][0].__name__
    first = []  # the first step that ran compiled (1-based)
    n = [0]

    def on_step() -> None:
        n[0] += 1
        if not first and _COUNTERS.optimizer_steps_compiled:
            first.append(n[0])

    ae.reset_stats()
    p0 = time.process_time()  # the process's: the runtime's threads (a disk load, Inductor) too
    with ae.adaptive_eager(cache_dir=os.path.join(cache, "regions"), **options):
        (losses, params), cpu, wall = _timed(lambda: train(name, steps, on_step))
    proc_cpu = time.process_time() - p0
    stats = ae.stats()
    kinds = {k.partition("|")[2]: n for k, n in stats.optimizer_step_kinds.items()
             if k.partition("|")[0] == cls_name}
    bitwise = losses == ref_losses and all(torch.equal(a, b) for a, b in zip(params, ref_params))
    diff = max((abs(a - b) for a, b in zip(losses, ref_losses) if not (math.isnan(a) and math.isnan(b))),
               default=0.0)
    return {
        "optimizer": name, "class": cls_name, "config": config, "run": run, "backend": backend,
        "steps": steps, "signatures": kinds.get("signatures", 0), "compiles": kinds.get("compiles", 0),
        "loads": kinds.get("loads from disk", 0), "steps_compiled": kinds.get("compiled steps", 0),
        "first_compiled": first[0] if first else None,
        "threshold_skipped": kinds.get("saved before: no threshold", 0),
        "eager_reasons": {k[len("eager: "):]: n for k, n in kinds.items() if k.startswith("eager: ")},
        "bitwise": bitwise, "max_loss_diff": diff,
        "eager_cpu_s": eager_cpu, "eager_wall_s": eager_wall, "adaptive_cpu_s": cpu, "adaptive_wall_s": wall,
        "adaptive_process_cpu_s": proc_cpu,
        "disk_load_s": stats.disk_load_time_s, "options": options, "load": os.getloadavg()[0],
    }


def _in_process(name: str, a: argparse.Namespace, config: str, cache: str, run: str) -> Dict[str, Any]:
    """:func:`run_one` in a fresh Python process (a program's run)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "adaptive_eager.benchmarks.optim_runs", "--one", name,
               "--configs", config, "--run", run, "--cache", cache, "--steps", str(a.steps),
               "--backend", a.backend, "--threads", str(a.threads), "--json", out.name]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),  # Inductor's too: kept
                   PYTHONPATH=os.pathsep.join([root] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
        cp = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
        if cp.returncode != 0:
            tail = (cp.stderr or cp.stdout).strip().splitlines()[-1:]
            return {"optimizer": name, "config": config, "run": run, "error": " ".join(tail)}
        with open(out.name) as f:
            return json.load(f)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.optim_runs")
    p.add_argument("--only", default="", help=f"comma-separated optimizers (default: {','.join(OPTIMIZERS)})")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--backend", default="inductor", help="the runtime's backend (default inductor)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="", help="write the rows here")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated runs among {','.join(RUNS)}")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)    # a run's own process
    p.add_argument("--run", default="fresh", help=argparse.SUPPRESS)
    p.add_argument("--cache", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.one:
        row = run_one(a.one, a.steps, a.configs, a.backend, a.cache, a.run)
        with open(a.json, "w") as f:
            json.dump(row, f, default=str)
        return 0
    names = [n for n in a.only.split(",") if n] or list(OPTIMIZERS)
    configs = [c for c in a.configs.split(",") if c]
    runs = [r for r in a.runs.split(",") if r]
    bad = [n for n in names if n not in OPTIMIZERS] + [c for c in configs if c not in CONFIGS] + \
        [r for r in runs if r not in RUNS]
    if bad:
        p.error(f"unknown optimizer or configuration {', '.join(bad)}; optimizers: "
                f"{', '.join(OPTIMIZERS)}; configurations: {', '.join(CONFIGS)}")
    print(f"load average {os.getloadavg()[0]:.2f}, {a.threads} thread(s), {a.steps} steps, backend {a.backend}"
          "; kept: a second process on the fresh run's cache folder, default options")
    print(f"{'optimizer':13s} {'config':12s} {'run':8s} {'sigs':>4s} {'compiles':>8s} {'disk':>4s} "
          f"{'compiled':>8s} {'first':>5s} {'bitwise':>7s} {'max diff':>9s} {'cpu e/a ms':>11s} "
          f"{'wall e/a ms':>11s} {'proc':>5s} {'load':>4s}  eager because")
    rows = []
    for name in names:
        for config in configs:
            with tempfile.TemporaryDirectory(prefix="ae-optim-runs-") as cache:
                for run in runs:
                    row = _in_process(name, a, config, cache, run)
                    rows.append(row)
                    if "error" in row:
                        print(f"{name:13s} {config:12s} {run:8s} failed: {row['error']}", flush=True)
                        continue
                    why = "; ".join(f"{k} x{n}" for k, n in row["eager_reasons"].items())
                    first = row["first_compiled"] if row["first_compiled"] is not None else "-"
                    print(f"{name:13s} {config:12s} {run:8s} {row['signatures']:4d} {row['compiles']:8d} "
                          f"{row['loads']:4d} {row['steps_compiled']:8d} {first:>5} {str(row['bitwise']):>7s} "
                          f"{row['max_loss_diff']:9.2e} "
                          f"{row['eager_cpu_s'] * 1e3:5.0f}/{row['adaptive_cpu_s'] * 1e3:5.0f} "
                          f"{row['eager_wall_s'] * 1e3:5.0f}/{row['adaptive_wall_s'] * 1e3:5.0f} "
                          f"{row['adaptive_process_cpu_s'] * 1e3:5.0f} {row['load']:4.1f}  "
                          f"{why}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
