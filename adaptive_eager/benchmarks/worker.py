"""Runs ONE (workload, mode) in this process and writes a JSON result.

Started by :mod:`benchmarks.run` as ``python -m benchmarks.worker ...``, one
fresh process per (workload, mode), so compile caches, lazy initialisation
and first-iteration costs are those of a fresh program.

Timing: ``torch.set_num_threads(threads)``; ``warmup`` untimed-for-steady-state
iterations (the very first one is reported as ``first_iter_s``); then
``iters`` timed iterations, each timed on its own with ``perf_counter``. Every
iteration ends with a value observed by Python (``step()`` returns
``loss.item()`` or similar); in adaptive mode it also ends with ``ae.sync()``
so deferred work is inside the iteration that issued it. The steady-state
figure is the median per-iteration time; the spread is reported as
quartiles/p10/p90/min/max. Workloads with ``metric == "total"`` (varying
shapes) run no warmup and report the total of all steps.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

from adaptive_eager.benchmarks import memory as _memory  # /proc peak helpers (no torch import)


def percentile(xs: List[float], q: float) -> float:
    """Linear interpolation between closest ranks (``statistics.quantiles``' inclusive
    method), for ``q`` in [0, 1]; nan for no data."""
    if not xs:
        return float("nan")
    if len(xs) == 1 or q <= 0 or q >= 1:
        return min(xs) if q <= 0 else max(xs) if q >= 1 else xs[0]
    # 100 cut points would be exact for whole percents; q here is always a whole percent.
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]


def summarize_times(times: List[float]) -> Dict[str, Any]:
    med = statistics.median(times) if times else float("nan")
    p25, p75 = percentile(times, 0.25), percentile(times, 0.75)
    return {
        "n": len(times),
        "median_s": med,
        "mean_s": statistics.fmean(times) if times else None,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "p10_s": percentile(times, 0.10),
        "p25_s": p25,
        "p75_s": p75,
        "p90_s": percentile(times, 0.90),
        "total_s": sum(times),
        # half the interquartile range, relative to the median
        "spread_rel": (p75 - p25) / 2 / med if times and med > 0 else None,
    }


def _loadavg() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _rss_mb() -> Optional[float]:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    except Exception:
        return None


# Iterations in a row with no compile in flight before the timed loop starts.
SETTLE_QUIET = 5


def _threshold_steps(stats: Dict[str, Any]) -> int:
    """Optimizer steps run eagerly so far because their compile has not paid yet."""
    from adaptive_eager.dispatch.optim_records import Why  # noqa: PLC0415

    kinds = stats.get("optimizer_step_kinds") or {}
    return sum(n for k, n in kinds.items() if k.endswith(Why.CHEAP))


def _timed_loop(one: Callable[[], float], n_warm: int, n_iters: int, api: Any, settle_s: float,
                wl: Any) -> tuple:
    """Warm-up, settling (adaptive: until no compile has been in flight for SETTLE_QUIET
    iterations, at most ``settle_s``), then the timed iterations; returns (warm-up times,
    settling iterations, timed times, stats before, stats after)."""
    warm_times: List[float] = []
    extra_warm = 0
    for _ in range(n_warm):
        warm_times.append(one())
    before = None
    if api is not None:
        # Let background compiles started during warmup land, so the timed
        # loop measures the steady state (bounded by settle_s).
        # A compile can also start a few iterations after warmup (a window is
        # compiled on a later sighting than its first, or after the one before it
        # lands), so settle until none has been in flight for SETTLE_QUIET
        # consecutive iterations.
        # An optimizer step whose compile waits for its cost threshold (Note [A step
        # compiles once it has cost enough]) starts it later still: the GPT row's AdamW
        # (~23 steps) began compiling in the timed loop (309 ms +-58% against 184 ms
        # eager), so settling also waits while steps still run eagerly for that reason.
        deadline = time.perf_counter() + settle_s
        if n_warm:
            quiet = 0
            waited = _threshold_steps(api.stats())
            while quiet < SETTLE_QUIET and time.perf_counter() < deadline:
                stats = api.stats()
                now = _threshold_steps(stats)
                if (stats.get("compiles_in_flight") or 0) > 0 or now > waited:
                    quiet = 0
                else:
                    quiet += 1
                waited = now
                warm_times.append(one())
                extra_warm += 1
        before = api.stats()
    if wl.on_timed_start:
        wl.on_timed_start()
    gc.collect()
    times = [one() for _ in range(n_iters)]
    after = api.stats() if api is not None else None
    return warm_times, extra_warm, times, before, after


def _record(res: Dict[str, Any], wl: Any, api: Any, mode: str, adaptive_options: Any, n_warm: int,
            extra_warm: int, warm_times: List[float], times: List[float], before: Any, after: Any,
            rss_start: Any) -> None:
    """The run's figures into ``res`` (times, peak memory, the adaptive run's stats)."""
    from adaptive_eager.benchmarks.adaptive_api import derive, diff_stats

    all_times = warm_times + times
    peak = _peak_rss()
    if rss_start is not None and peak is not None:
        res["peak_mib"] = (peak - rss_start) / 1024  # peak resident set above the run's start
    res["first_iter_s"] = all_times[0] if all_times else None
    res["warmup"] = n_warm
    res["warmup_extra"] = extra_warm
    res["warmup_times_s"] = warm_times
    res["times_s"] = times
    res.update(summarize_times(times))
    res["time_s"] = res["total_s"] if wl.metric == "total" else res["median_s"]
    res["time_stat"] = "total" if wl.metric == "total" else "median"
    if api is not None:
        res["adaptive_options"] = adaptive_options or {}
        res["stats_total"] = after
        res["stats_timed"] = diff_stats(after, before)
        res["derived_total"] = derive(after, len(all_times))
        res["derived_timed"] = derive(res["stats_timed"], len(times))
    if mode == "compile":
        try:
            from torch._dynamo.utils import counters
            res["dynamo"] = {"unique_graphs": counters["stats"].get("unique_graphs", 0),
                             "calls_captured": counters["stats"].get("calls_captured", 0)}
        except Exception:
            pass
    if wl.extra:
        try:
            res["extra"] = wl.extra()
        except Exception as e:
            res["extra"] = {"error": f"{type(e).__name__}: {e}"}
    if wl.teardown:
        wl.teardown()
    res["peak_rss_mb"] = _rss_mb()


def run_one(workload: str, mode: str, *, iters: Optional[int] = None, warmup: Optional[int] = None,
            threads: int = 2, seed: int = 0, quick: bool = False,
            adaptive_options: Optional[Dict[str, Any]] = None, settle_s: float = 60.0,
            workload_options: Optional[Dict[str, Any]] = None, device: str = "cpu") -> Dict[str, Any]:
    from adaptive_eager.benchmarks import workloads as W
    from adaptive_eager.benchmarks.adaptive_api import AdaptiveAPI, Unavailable as ApiUnavailable

    t_start = time.perf_counter()
    load_start = _loadavg()
    import torch
    torch.set_num_threads(threads)
    t_import = time.perf_counter() - t_start

    spec = W.get(workload)
    res: Dict[str, Any] = {"workload": workload, "mode": mode, "status": "ok", "message": None,
                           "threads": torch.get_num_threads(), "quick": quick, "seed": seed,
                           "torch_import_s": t_import}
    if mode not in spec.modes:
        res.update(status="skipped", message=f"mode {mode!r} not run for {workload}")
        return res
    n_iters = iters if iters is not None else (spec.quick_iters if quick else spec.iters)
    n_warm = warmup if warmup is not None else (spec.quick_warmup if quick else spec.warmup)

    api = None
    if mode == "adaptive":
        try:
            api = AdaptiveAPI()
        except ApiUnavailable as e:
            res.update(status="unavailable", message=str(e))
            return res
    compile_fn = (lambda fn, **kw: torch.compile(fn, **kw)) if mode == "compile" else (lambda fn, **kw: fn)
    ctx = W.Context(seed=seed, quick=quick, mode=mode, compile=compile_fn, device=device,
                    options=dict(workload_options or {}))

    t0 = time.perf_counter()
    try:
        wl = spec.build(ctx)
    except W.Unavailable as e:
        res.update(status="skipped", message=str(e))
        return res
    res["build_s"] = time.perf_counter() - t0
    res["size"] = wl.size
    res["metric"] = wl.metric
    if wl.metric == "total":
        n_warm = 0

    sync = api.sync if api is not None else (lambda: None)
    step = wl.step
    rss_start = _reset_peak_rss()  # Note: the peak row (benchmarks/memory.py has the method)

    def one() -> float:
        t = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - t

    try:
        if api is not None:
            err = api.reset_stats()
            if err:
                res.setdefault("warnings", []).append(err)
            t_enter = time.perf_counter()
            # The adaptive run defers the device the workload runs on, unless the workload
            # says otherwise (neuron-sim); named, so device="auto" never picks another.
            on_device = {"device": device}
            ctx = api.context(**{**on_device, **wl.adaptive_defaults, **(adaptive_options or {})})
            with ctx:
                # One-time set-up at the first session (with capture from the first op
                # it imports torch._dynamo: Note [Import Dynamo before capture]),
                # reported apart from the first iteration.
                res["enter_s"] = time.perf_counter() - t_enter
                warm_times, extra_warm, times, before, after = _timed_loop(one, n_warm, n_iters, api, settle_s, wl)
                api.sync()
        else:
            warm_times, extra_warm, times, before, after = _timed_loop(one, n_warm, n_iters, api, settle_s, wl)
    except Exception as e:
        res.update(status="error", message=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc(limit=20))
        return res

    _record(res, wl, api, mode, adaptive_options, n_warm, extra_warm, warm_times, times,
            before, after, rss_start)
    res["loadavg_start"], res["loadavg_end"] = load_start, _loadavg()
    return res


def _kv(s: str) -> Dict[str, Any]:
    """'a=1,b=x,c=true' -> {'a': 1, 'b': 'x', 'c': True} (JSON values where they parse)."""
    out: Dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in (s or "").split(","))):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = json.loads(v)
        except ValueError:
            out[k.strip()] = v
    return out


def _reset_peak_rss() -> Optional[int]:
    """Reset the peak resident set (Linux) and return the current one, in KiB (None
    where it cannot be reset)."""
    try:
        _memory.reset_peak()
        return _memory.status_kib("VmRSS")
    except (OSError, RuntimeError):
        return None


def _peak_rss() -> Optional[int]:
    try:
        return _memory.status_kib("VmHWM")
    except (OSError, RuntimeError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    p.add_argument("--workload", required=True)
    p.add_argument("--mode", required=True, choices=("eager", "adaptive", "compile"))
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--iters", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--settle", type=float, default=60.0)
    p.add_argument("--adaptive-options", default="")
    p.add_argument("--workload-options", default="")
    p.add_argument("--device", default="cpu", help="device the workloads run on (cpu, cuda)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        res = run_one(a.workload, a.mode, iters=a.iters, warmup=a.warmup, threads=a.threads,
                      seed=a.seed, quick=a.quick, adaptive_options=_kv(a.adaptive_options),
                      settle_s=a.settle, workload_options=_kv(a.workload_options), device=a.device)
    except Exception as e:
        res = {"workload": a.workload, "mode": a.mode, "status": "error",
               "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=20)}
    res["process_s"] = time.perf_counter() - t0
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=repr)
    sys.stdout.flush()
    # Skip interpreter teardown (background compile threads/pools of the runtime
    # under test must not hang or slow the suite).
    os._exit(0)


if __name__ == "__main__":
    main()
