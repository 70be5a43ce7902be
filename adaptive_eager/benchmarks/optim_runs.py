"""300-step training runs of a tiny model, one per optimizer: ``python -m benchmarks.optim_runs``.

Issue 24's run: a tiny MLP trained ``--steps`` steps (300) with a cosine learning-rate
schedule (``CosineAnnealingLR``), reading its loss every step, for AdamW, SGD with
Nesterov momentum, Adam with amsgrad, RMSprop and LBFGS (a closure), eagerly and then
inside one ``adaptive_eager()`` block per configuration (a fresh session and an empty
compiled-region cache each). Per optimizer and configuration it prints what the runtime
reports about the step (``stats().optimizer_step_kinds``): signatures, compiles, steps
compiled, why the other steps ran eagerly; whether every loss and the final params equal
eager's bit for bit (else the largest loss difference); and thread CPU time against
eager's.

Configurations (``--configs``): ``default`` (the options as a program gets them,
``optimizer_step_after_ms`` included), ``after0`` (``optimizer_step_after_ms=0``: traced
from its second step, compiled in the background), ``after0-sync`` (the same with
``async_compile=False``: the compile waits, so every step after it can run compiled).

Example::

    python -m benchmarks.optim_runs                               # 5 optimizers x 3 configs
    python -m benchmarks.optim_runs --only adamw,lbfgs --backend eager --configs after0-sync
"""
from __future__ import annotations

import argparse
import json
import math
import os
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
CONFIGS: Dict[str, Dict[str, Any]] = {
    "default": {},
    "after0": {"optimizer_step_after_ms": 0},
    "after0-sync": {"optimizer_step_after_ms": 0, "async_compile": False},
}


def train(name: str, steps: int) -> tuple[List[float], List[torch.Tensor]]:
    """``steps`` steps of a tiny MLP (16 -> 32 -> 32 -> 1, 1,633 params in 6 tensors) with
    optimizer ``name`` and a cosine schedule; the loss of every step and the final params."""
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
    return losses, [p.detach().clone() for p in model.parameters()]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    r = fn()
    return r, time.thread_time() - c0, time.perf_counter() - w0


def run_one(name: str, steps: int, config: str, backend: str, eager: tuple) -> Dict[str, Any]:
    """The adaptive run of optimizer ``name`` under configuration ``config``; a result row."""
    import adaptive_eager as ae
    from adaptive_eager import session

    (ref_losses, ref_params), eager_cpu, _ = eager
    options = dict(CONFIGS[config], backend=backend)
    cls_name = OPTIMIZERS[name][0].__name__
    with tempfile.TemporaryDirectory(prefix="ae-optim-runs-") as cache:
        session.clear_sessions()
        ae.reset_stats()
        with ae.adaptive_eager(cache_dir=cache, **options):
            (losses, params), cpu, wall = _timed(lambda: train(name, steps))
        stats = ae.stats()
    kinds = {k.partition("|")[2]: n for k, n in stats.optimizer_step_kinds.items()
             if k.partition("|")[0] == cls_name}
    bitwise = losses == ref_losses and all(torch.equal(a, b) for a, b in zip(params, ref_params))
    diff = max((abs(a - b) for a, b in zip(losses, ref_losses) if not (math.isnan(a) and math.isnan(b))),
               default=0.0)
    return {
        "optimizer": name, "class": cls_name, "config": config, "backend": backend, "steps": steps,
        "signatures": kinds.get("signatures", 0), "compiles": kinds.get("compiles", 0),
        "loads": kinds.get("loads from disk", 0), "steps_compiled": kinds.get("compiled steps", 0),
        "eager_reasons": {k[len("eager: "):]: n for k, n in kinds.items() if k.startswith("eager: ")},
        "bitwise": bitwise, "max_loss_diff": diff,
        "eager_cpu_s": eager_cpu, "adaptive_cpu_s": cpu, "adaptive_wall_s": wall,
        "options": options,
    }


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.optim_runs")
    p.add_argument("--only", default="", help=f"comma-separated optimizers (default: {','.join(OPTIMIZERS)})")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--backend", default="inductor", help="the runtime's backend (default inductor)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="", help="write the rows here")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(OPTIMIZERS)
    configs = [c for c in a.configs.split(",") if c]
    bad = [n for n in names if n not in OPTIMIZERS] + [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"unknown optimizer or configuration {', '.join(bad)}; optimizers: "
                f"{', '.join(OPTIMIZERS)}; configurations: {', '.join(CONFIGS)}")
    torch.set_num_threads(a.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, {a.threads} thread(s), {a.steps} steps, backend {a.backend}")
    print(f"{'optimizer':13s} {'config':12s} {'sigs':>4s} {'compiles':>8s} {'compiled':>8s} "
          f"{'bitwise':>7s} {'max diff':>9s} {'cpu e/a ms':>13s}  eager because")
    rows = []
    for name in names:
        train(name, 2)  # torch's own first-call costs are no one's
        eager = _timed(lambda: train(name, a.steps))
        for config in configs:
            row = run_one(name, a.steps, config, a.backend, eager)
            rows.append(row)
            why = "; ".join(f"{k} x{n}" for k, n in row["eager_reasons"].items())
            print(f"{name:13s} {config:12s} {row['signatures']:4d} {row['compiles'] + row['loads']:8d} "
                  f"{row['steps_compiled']:8d} {str(row['bitwise']):>7s} {row['max_loss_diff']:9.2e} "
                  f"{row['eager_cpu_s'] * 1e3:6.0f}/{row['adaptive_cpu_s'] * 1e3:6.0f}  {why}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
