"""Issue 26: a minibatch drawn from one dataset tensor (gathered or sliced), and a
generation loop whose sequence grows, under forced capture.

``python -m benchmarks.data_patterns [own|gather|gather_fixed|slice|sample] [--steps N]
[--tokens N] [--reps N] [--report]`` prints, per pattern, whether values equal eager's,
the ops fused, regions compiled, compiled calls, the fallback reasons, and the median
wall and CPU times of ``--reps`` alternating eager and runtime runs (the first runtime
run of a process also pays the runtime's imports: it is printed apart). Capture is
forced (``adaptive_passthrough=False``), compiles are synchronous
(``async_compile=False``), backend ``aot_eager`` unless ``--backend`` says otherwise; the
data and model are made before the block, one intra-op thread.

Example::

    >>> r = measure(lambda: functools.partial(mlp_setup("gather_fixed"), 3), backend="eager",
    ...             adaptive_passthrough=False)
    >>> r["same"]
    True
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager import session

from .patterns import _same


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(1024, 32, generator=g), torch.randint(0, 10, (1024,), generator=g)


def mlp_setup(draw: str) -> Callable[[int], dict[str, Any]]:
    """Data and model for :func:`mlp_loop`, made outside the measured block."""
    X, Y = _data()
    model, opt = _mlp()
    g = torch.Generator().manual_seed(2)
    fixed = torch.randint(0, 1024, (64,), generator=g)
    own = [(X[k * 64:(k + 1) * 64].clone(), Y[k * 64:(k + 1) * 64].clone()) for k in range(16)]

    def loop(steps: int) -> dict[str, Any]:
        """AdamW on a two-layer MLP, the batch drawn by ``draw``: ``gather`` (random idx),
        ``gather_fixed``, ``slice`` (X[i:i+64], i moving) or ``own`` (a tensor per step)."""
        losses = []
        for step in range(steps):
            if draw == "gather":
                idx = torch.randint(0, 1024, (64,), generator=g)
                xb, yb = X[idx], Y[idx]
            elif draw == "gather_fixed":
                xb, yb = X[fixed], Y[fixed]
            elif draw == "slice":
                i = (step * 64) % (1024 - 64)
                xb, yb = X[i:i + 64], Y[i:i + 64]
            else:
                xb, yb = own[step % 16]
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"losses": losses, "params": list(model.parameters())}
    return loop


def sample_setup(tokens: int) -> Callable[[], dict[str, Any]]:
    """nanoGPT sample.py: the model made (loaded) outside the measured block; the loop
    samples ``tokens`` tokens with top-k + multinomial, the sequence growing one a step."""
    from .workloads.patterns import GPT  # noqa: PLC0415
    torch.manual_seed(1337)
    model = GPT(block_size=256)
    model.eval()

    def loop() -> dict[str, Any]:
        torch.manual_seed(1337)
        x = torch.tensor([[0]], dtype=torch.long)
        with torch.no_grad():
            y = model.generate(x, tokens, temperature=0.8, top_k=10)
        return {"tokens": y[0].tolist()}
    return loop


def measure(make: Callable[[], Callable[[], Any]], reps: int = 1, **options: Any) -> dict[str, Any]:
    """``make()`` builds the program (outside any block) afresh for each run: eagerly,
    then under ``adaptive_eager(**options)``, ``reps`` times alternating; results of the
    first pair compared after the block, stats of the last run under the runtime, times
    the median (wall and process CPU) of the pairs."""
    eager_s, ae_s, eager_cpu, ae_cpu = [], [], [], []
    for rep in range(reps):
        fn = make()
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        eager_s.append(time.perf_counter() - t)
        eager_cpu.append(time.process_time() - c)
        expected = result if rep == 0 else expected
        session.clear_sessions()
        ae.reset_stats()
        fn = make()
        t, c = time.perf_counter(), time.process_time()
        with ae.adaptive_eager(**options):
            result = fn()
        ae_s.append(time.perf_counter() - t)
        ae_cpu.append(time.process_time() - c)
        actual = result if rep == 0 else actual
        s = ae.stats()
        session.clear_sessions()
    ran = s.ops_fused + s.ops_eager
    return {"same": _same(expected, actual), "fused": s.ops_fused, "ran": ran,
            "pct": 100.0 * s.ops_fused / ran if ran else 0.0, "compiled": s.regions_compiled,
            "calls": s.compiled_calls, "reasons": dict(s.fallback_reasons),
            "eager_s": statistics.median(eager_s), "ae_s": statistics.median(ae_s),
            "eager_cpu_s": statistics.median(eager_cpu), "ae_cpu_s": statistics.median(ae_cpu),
            "first_ae_s": ae_s[0], "stats": s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("patterns", nargs="*", default=["own", "gather", "gather_fixed", "slice", "sample"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--reps", type=int, default=1,
                    help="alternating eager/runtime runs; times are their medians")
    a = ap.parse_args()
    torch.set_num_threads(1)
    # windows' fusion, as issue 26 measured it: the compiled optimizer step (issue 24) off
    options = {"backend": a.backend, "adaptive_passthrough": False, "async_compile": False,
               "optimizer_step": False}
    for name in a.patterns:
        if name == "sample":
            make: Callable[[], Callable[[], Any]] = lambda: sample_setup(a.tokens)  # noqa: E731
        else:
            make = lambda name=name: functools.partial(mlp_setup(name), a.steps)  # noqa: E731
        r = measure(make, a.reps, **options)
        print(f"{name:13s} same={r['same']} fused {r['fused']:,}/{r['ran']:,} ({r['pct']:.1f}%) "
              f"compiled {r['compiled']} calls {r['calls']}")
        print(f"{'':13s} median of {a.reps}: eager {r['eager_s']:.3f}s wall {r['eager_cpu_s']:.3f}s cpu, "
              f"runtime {r['ae_s']:.3f}s wall {r['ae_cpu_s']:.3f}s cpu "
              f"({r['ae_s'] / r['eager_s']:.2f}x wall, {r['ae_cpu_s'] / r['eager_cpu_s']:.2f}x cpu); "
              f"first runtime run {r['first_ae_s']:.2f}s")
        reasons = sorted({x for v in r["reasons"].values() for x in v})
        print(f"{'':13s} fallback reasons: {reasons}")
        if a.report:
            from adaptive_eager.reporting import format_report  # noqa: PLC0415
            print(format_report(r["stats"]))


if __name__ == "__main__":
    main()
