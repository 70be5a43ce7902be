"""Summary rows and the text table (pure functions: no torch, unit-tested).

The table is hand-written on purpose: its columns carry ± spreads, footnote marks and
"-" cells aligned by rules of its own, which a table library would need as much code
to express, and it adds no dependency to an install.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

MODES = ("eager", "adaptive", "compile")

STATUS_SHORT = {"unavailable": "unavail", "skipped": "skipped", "error": "ERROR",
                "timeout": "TIMEOUT", "crashed": "CRASHED"}


def fmt_time(s: Optional[float]) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}us"
    if s < 1.0:
        return f"{s * 1e3:.1f}ms" if s < 0.1 else f"{s * 1e3:.0f}ms"
    return f"{s:.2f}s"


def fmt_ratio(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fmt_pct(r: Optional[float]) -> str:
    return "-" if r is None else f"{100 * r:.0f}%"


def _ok(run: Optional[Dict[str, Any]]) -> bool:
    return bool(run) and run.get("status") == "ok" and run.get("time_s") is not None


def summarize(runs: Iterable[Dict[str, Any]], workload_order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """One row per workload from the per-(workload, mode) run results."""
    by_wl: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for r in runs:
        by_wl.setdefault(r["workload"], {})[r["mode"]] = r
    order = [w for w in workload_order if w in by_wl] + [w for w in by_wl if w not in workload_order]
    rows = []
    for w in order:
        m = by_wl[w]
        e, a, c = m.get("eager"), m.get("adaptive"), m.get("compile")
        metric = next((r.get("metric") for r in m.values() if r.get("metric")), "median")
        n = next((r.get("n") for r in m.values() if r.get("n")), None)
        row: Dict[str, Any] = {"workload": w, "metric": metric, "steps": n,
                               "simulated": any((r.get("extra") or {}).get("simulated") for r in m.values())}
        for mode in MODES:
            r = m.get(mode)
            if r is None:
                row[mode] = None
                continue
            row[mode] = {"status": r.get("status"), "time_s": r.get("time_s"), "peak_mib": r.get("peak_mib"),
                         "spread_rel": r.get("spread_rel"), "first_iter_s": r.get("first_iter_s"),
                         "enter_s": r.get("enter_s"), "message": r.get("message")}
            if (r.get("extra") or {}).get("launches_per_iter") is not None:
                for key in ("launches_per_iter", "device_ms_per_iter", "emulator_host_us_per_op"):
                    row[mode][key] = r["extra"].get(key)
        row["speedup_vs_eager"] = (e["time_s"] / a["time_s"]) if _ok(e) and _ok(a) and a["time_s"] > 0 else None
        row["vs_compile"] = (c["time_s"] / a["time_s"]) if _ok(c) and _ok(a) and a["time_s"] > 0 else None
        row["compile_vs_eager"] = (e["time_s"] / c["time_s"]) if _ok(e) and _ok(c) and c["time_s"] > 0 else None
        d = (a or {}).get("derived_total") or {}
        row["adaptive_compiles"] = d.get("compiles")
        row["adaptive_cache_hit_rate"] = d.get("cache_hit_rate")
        row["adaptive_fused_share"] = d.get("fused_share")
        row["adaptive_step_share"] = d.get("optimizer_steps_compiled_share")
        row["adaptive_timed"] = (a or {}).get("derived_timed")
        rows.append(row)
    return rows


def _time_cell(cell: Optional[Dict[str, Any]], spread: bool = True) -> str:
    if cell is None:
        return "-"
    st = cell.get("status")
    if st != "ok":
        return STATUS_SHORT.get(st, str(st))
    t = fmt_time(cell.get("time_s"))
    if spread and cell.get("spread_rel") is not None:
        t += f" ±{100 * cell['spread_rel']:.0f}%"
    return t


def _first_cell(cell: Optional[Dict[str, Any]]) -> str:
    if cell is None or cell.get("status") != "ok":
        return "-"
    return fmt_time(cell.get("first_iter_s"))


def _peak_cell(r: Dict[str, Any]) -> str:
    """Peak resident set above the run's start, eager / adaptive, in MiB (glibc's heap
    keeps freed memory: ``python -m benchmarks.memory`` measures live tensors)."""
    cells = []
    for mode in ("eager", "adaptive"):
        c = r.get(mode) or {}
        cells.append("-" if c.get("peak_mib") is None else f"{c['peak_mib']:.0f}")
    return "/".join(cells)


def _count(x) -> str:
    return "-" if x is None else (f"{x:.0f}" if isinstance(x, float) else str(x))


HEADERS = ("workload", "eager", "adaptive", "compile", "eager/adapt", "compile/adapt",
           "1st eager", "1st adapt", "1st compile", "compiles", "hit rate*", "fused",
           "peak MiB e/a")


def _steady_hit_rate(r: Dict[str, Any]) -> Optional[float]:
    """The cache hit rate over the timed iterations (steady state), else the run's."""
    t = r.get("adaptive_timed") or {}
    if t.get("cache_hit_rate") is not None:
        return t["cache_hit_rate"]
    return None if t else r.get("adaptive_cache_hit_rate")


def _fused_cell(r: Dict[str, Any]) -> str:
    """The share of ops run in compiled regions, and, for a program with an optimizer, the
    share of its steps run as one compiled step (whose ops the first share never counts)."""
    cell = fmt_pct(r.get("adaptive_fused_share"))
    step = r.get("adaptive_step_share")
    return cell if step is None else f"{cell} step {fmt_pct(step)}"


def table_rows(rows: Sequence[Dict[str, Any]]) -> List[List[str]]:
    out = []
    for r in rows:
        name = r["workload"]
        if r.get("metric") == "total":
            name += f" (total {r.get('steps') or '?'} steps)"
        if r.get("simulated"):
            name += " [SIMULATED]"
        out.append([name, _time_cell(r.get("eager")), _time_cell(r.get("adaptive")),
                    _time_cell(r.get("compile")), fmt_ratio(r.get("speedup_vs_eager")),
                    fmt_ratio(r.get("vs_compile")), _first_cell(r.get("eager")),
                    _first_cell(r.get("adaptive")), _first_cell(r.get("compile")),
                    _count(r.get("adaptive_compiles")), fmt_pct(_steady_hit_rate(r)),
                    _fused_cell(r), _peak_cell(r)])
    return out


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Fixed-width table; first column left-aligned, the others right-aligned."""
    body = table_rows(rows)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(HEADERS)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [line(HEADERS), "  ".join("-" * w for w in widths)]
    lines += [line(b) for b in body]
    return "\n".join(lines)


def _device_figures(row: Dict[str, Any], mode: str) -> str:
    """Launches and device time per iteration beside wall time, and what fusion saved
    against eager (Note [Honest figures on the emulator] in workloads/neuron_sim.py)."""
    cell = row[mode]
    text = f"{cell['launches_per_iter']:.1f} launches/iter"
    device_ms = cell.get("device_ms_per_iter")
    if device_ms is None:
        return text
    text += f", device time {device_ms:.2f} ms/iter"
    eager = row.get("eager") or {}
    if mode != "eager" and eager.get("device_ms_per_iter") is not None:
        saved = eager["launches_per_iter"] - cell["launches_per_iter"]
        text += (f" (saved vs eager: {saved:.0f} launches, "
                 f"{eager['device_ms_per_iter'] - device_ms:.2f} ms device time/iter)")
    overhead = cell.get("emulator_host_us_per_op")
    if mode == "eager" and overhead is not None:
        text += (f"; the emulator's own host cost {overhead:.0f} us/op (a Python fallback; "
                 "part of any wall-time gain here is that overhead saved)")
    return text


def format_notes(rows: Sequence[Dict[str, Any]], runs: Iterable[Dict[str, Any]] = ()) -> str:
    """Messages (unavailable/skipped/errors), simulated launch counts, adaptive details."""
    notes = []
    for r in rows:
        for mode in MODES:
            cell = r.get(mode)
            if cell and cell.get("status") != "ok" and cell.get("message"):
                msg = str(cell["message"]).strip().splitlines()[0]
                notes.append(f"  {r['workload']} [{mode}] {cell['status']}: {msg}")
            if cell and cell.get("launches_per_iter") is not None:
                notes.append(f"  {r['workload']} [{mode}] SIMULATED device: " + _device_figures(r, mode))
        t = r.get("adaptive_timed") or {}
        parts = []
        if t.get("ops_captured_per_iter") is not None:
            parts.append(f"{t['ops_captured_per_iter']:.0f} ops captured/iter")
        if t.get("flushes_per_iter") is not None:
            parts.append(f"{t['flushes_per_iter']:.1f} flushes/iter")
        if t.get("compiles") is not None:
            parts.append(f"{t['compiles']} compiles while timed")
        if t.get("fused_share") is not None:
            parts.append(f"fused {100 * t['fused_share']:.0f}%")
        if t.get("optimizer_steps_compiled_share") is not None:
            parts.append(f"optimizer steps compiled {100 * t['optimizer_steps_compiled_share']:.0f}%")
        if r.get("adaptive_cache_hit_rate") is not None:
            parts.append(f"hit rate over the whole run {100 * r['adaptive_cache_hit_rate']:.0f}%")
        enter = (r.get("adaptive") or {}).get("enter_s")
        if enter is not None:
            parts.append(f"context entry {enter:.2f} s (one-time set-up)")
        if parts:
            notes.append(f"  {r['workload']} [adaptive, timed iters] " + ", ".join(parts))
    return "\n".join(notes)
