"""(f) SIMULATED neuron device: a small MLP forward on device "neuron" with an
emulated per-kernel launch latency (default 20 us), eager vs adaptive.

Needs ``adaptive_eager.neuron_sim`` with ``enable(launch_latency_us=...)``,
``launch_count()`` and ``reset_launch_count()``; when it is missing the row is
skipped with a message. Times are from the simulation, not from Trainium.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Context, Unavailable, Workload

LAUNCH_LATENCY_US = 20.0


def _sim():
    try:
        import adaptive_eager.neuron_sim as sim
    except Exception as e:  # ImportError, or the module failing to import
        raise Unavailable(f"adaptive_eager.neuron_sim not available ({type(e).__name__}: {e})")
    for name in ("enable", "launch_count", "reset_launch_count"):
        if not hasattr(sim, name):
            raise Unavailable(f"adaptive_eager.neuron_sim has no {name}()")
    return sim


def mlp(x, weights):
    for i, (w, b, g) in enumerate(weights):
        h = F.linear(x, w, b)
        h = F.gelu(h) * torch.sigmoid(g)
        x = x + h if h.shape == x.shape else h
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return x


def build(ctx: Context) -> Workload:
    sim = _sim()
    latency = float(ctx.options.get("launch_latency_us", LAUNCH_LATENCY_US))
    try:
        sim.enable(launch_latency_us=latency)
    except Exception as e:
        raise Unavailable(f"neuron_sim.enable failed ({type(e).__name__}: {e})")
    dev = "neuron"
    batch, hidden, depth = (4, 32, 2) if ctx.quick else (32, 128, 6)
    gen = torch.Generator().manual_seed(ctx.seed)
    try:
        x = torch.randn(batch, hidden, generator=gen).to(dev)
        weights = [((torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5).to(dev),
                    torch.zeros(hidden).to(dev),
                    torch.randn(hidden, generator=gen).to(dev)) for _ in range(depth)]
    except Exception as e:
        raise Unavailable(f"cannot create tensors on device {dev!r} ({type(e).__name__}: {e})")
    fn = ctx.compile(mlp)
    steps = [0]

    def step() -> float:
        steps[0] += 1
        with torch.no_grad():
            return fn(x, weights)[0, 0].item()

    def on_timed_start():
        steps[0] = 0
        sim.reset_launch_count()

    def extra():
        launches = sim.launch_count()
        return {"simulated": True, "launch_latency_us": latency, "launches": launches,
                "launches_per_iter": launches / steps[0] if steps[0] else None}

    return Workload(step=step, on_timed_start=on_timed_start, extra=extra,
                    adaptive_defaults={"device": dev},
                    size=f"SIMULATED device 'neuron', launch latency {latency:g} us; "
                         f"MLP batch={batch} hidden={hidden} depth={depth}, forward no_grad")
