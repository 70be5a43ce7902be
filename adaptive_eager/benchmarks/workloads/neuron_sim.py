"""(f) SIMULATED neuron device: a small MLP forward on device "neuron" with an
emulated per-kernel launch latency (default 20 us, asynchronous launches), eager vs
adaptive.

Needs ``adaptive_eager.neuron_sim`` with ``enable(launch_latency_us=...)``,
``launch_count()`` and ``reset_launch_count()``; when it is missing the row is
skipped with a message. Times are from the simulation, not from Trainium.

# Note [Honest figures on the emulator]
An eager op on the emulated device costs the host far more than on a real device: the
emulator's kernels are a Python PrivateUse1 fallback (``measure_host_overhead_us``:
15-67 us per tiny op over CPU eager's 2.6-4.5 us, measured on the 2-core dev box at load
3 and at load 10), where a
real backend dispatches in C++. A fused region skips that fallback as well as the
launches, so part of a wall-time speedup on the emulator is the emulator's own overhead
saved. The row therefore reports, beside wall time, what a real device would also
save: launches per iteration and device time per iteration (launches x latency), and
the measured emulator overhead per op (workload option ``launch_latency_us``,
``async_launch``).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from . import Context, Unavailable, Workload

LAUNCH_LATENCY_US = 20.0


def measure_host_overhead_us(sim, n: int = 400) -> float:
    """The emulator's own host cost of one tiny eager op, in µs: neuron minus cpu.

    Measured with the launch latency off (restored afterwards); the best of 3 runs.
    """
    latency = sim.launch_latency_us()
    sim.set_launch_latency_us(0)
    try:
        per_op = {}
        for dev in ("cpu", "neuron"):
            x = torch.ones(8, device=dev)
            best = float("inf")
            for _ in range(3):
                y = x
                start = time.perf_counter()
                for _ in range(n):
                    y = y + 1
                best = min(best, time.perf_counter() - start)
            per_op[dev] = best / n * 1e6
    finally:
        sim.set_launch_latency_us(latency)
    return per_op["neuron"] - per_op["cpu"]


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
    async_launch = str(ctx.options.get("async_launch", "1")).strip().lower() not in ("0", "false", "no", "off")
    try:
        sim.enable(launch_latency_us=latency, async_launch=async_launch)
    except TypeError:  # an emulator without asynchronous launches
        sim.enable(launch_latency_us=latency)
        async_launch = False
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
    overhead_us = measure_host_overhead_us(sim) if hasattr(sim, "set_launch_latency_us") else None

    def step() -> float:
        steps[0] += 1
        with torch.no_grad():
            return fn(x, weights)[0, 0].item()

    def on_timed_start():
        steps[0] = 0
        sim.reset_launch_count()

    def extra():
        launches = sim.launch_count()
        per_iter = launches / steps[0] if steps[0] else None
        return {"simulated": True, "launch_latency_us": latency, "async_launch": async_launch,
                "launches": launches, "launches_per_iter": per_iter,
                # Note [Honest figures on the emulator]
                "device_ms_per_iter": per_iter * latency / 1e3 if per_iter is not None else None,
                "emulator_host_us_per_op": overhead_us}

    return Workload(step=step, on_timed_start=on_timed_start, extra=extra,
                    adaptive_defaults={"device": dev},
                    size=f"SIMULATED device 'neuron', launch latency {latency:g} us "
                         f"({'asynchronous' if async_launch else 'synchronous'}); "
                         f"MLP batch={batch} hidden={hidden} depth={depth}, forward no_grad")
