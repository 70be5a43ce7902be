"""Issue 26: a minibatch drawn from one dataset tensor (gathered or sliced), and a
generation loop whose sequence grows, under forced capture.

``python -m benchmarks.data_patterns [gather|gather_fixed|slice|own|sample] [--steps N]``
prints, per pattern, the fraction of ops fused, regions compiled, compiled calls, the
fallback reasons, whether values equal eager's, and wall time beside eager's.
Capture is forced (``adaptive_passthrough=False``), compiles are synchronous
(``async_compile=False``), backend ``aot_eager`` unless ``--backend`` says otherwise.
"""
from __future__ import annotations

import argparse
import functools
import time
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager import session


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


def sample(steps: int) -> dict[str, Any]:
    """nanoGPT sample.py: top-k + multinomial, the sequence growing one token a step."""
    from adaptive_eager.benchmarks.workloads.patterns import GPT  # noqa: PLC0415
    torch.manual_seed(1337)
    model = GPT(block_size=256)
    model.eval()
    x = torch.tensor([[0]], dtype=torch.long)
    with torch.no_grad():
        y = model.generate(x, steps, temperature=0.8, top_k=10)
    return {"tokens": y[0].tolist()}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def measure(make: Callable[[], Callable[[], Any]], **options: Any) -> dict[str, Any]:
    """``make()`` builds the program (outside any block) twice: run once eagerly, once
    under ``adaptive_eager(**options)``; results compared after the block."""
    fn = make()
    t = time.perf_counter()
    expected = fn()
    eager_s = time.perf_counter() - t
    session.clear_sessions()
    ae.reset_stats()
    fn = make()
    t = time.perf_counter()
    with ae.adaptive_eager(**options):
        actual = fn()
    ae_s = time.perf_counter() - t
    s = ae.stats()
    session.clear_sessions()
    ran = s.ops_fused + s.ops_eager
    return {"same": _same(expected, actual), "fused": s.ops_fused, "ran": ran,
            "pct": 100.0 * s.ops_fused / ran if ran else 0.0, "compiled": s.regions_compiled,
            "calls": s.compiled_calls, "reasons": dict(s.fallback_reasons), "eager_s": eager_s,
            "ae_s": ae_s, "stats": s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("patterns", nargs="*", default=["own", "gather", "gather_fixed", "slice", "sample"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    options = {"backend": a.backend, "adaptive_passthrough": False, "async_compile": False}
    for name in a.patterns:
        if name == "sample":
            make: Callable[[], Callable[[], Any]] = lambda: lambda: sample(a.tokens)  # noqa: E731
        else:
            make = lambda name=name: functools.partial(mlp_setup(name), a.steps)  # noqa: E731
        r = measure(make, **options)
        print(f"{name:13s} same={r['same']} fused {r['fused']:,}/{r['ran']:,} ({r['pct']:.1f}%) "
              f"compiled {r['compiled']} calls {r['calls']} eager {r['eager_s']:.2f}s "
              f"ae {r['ae_s']:.2f}s ({r['ae_s'] / r['eager_s']:.1f}x)")
        reasons = sorted({x for v in r["reasons"].values() for x in v})
        print(f"{'':13s} fallback reasons: {reasons}")
        if a.report:
            from adaptive_eager.reporting import format_report  # noqa: PLC0415
            print(format_report(r["stats"]))


if __name__ == "__main__":
    main()
