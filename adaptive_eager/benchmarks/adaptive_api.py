"""Thin, defensive access to the adaptive_eager public API.

The runtime is written concurrently with this suite. Everything here degrades
to "unavailable" (an :class:`Unavailable` with the reason) instead of raising,
and every stats field is read on its own, so a missing or renamed field shows
as ``None`` rather than losing the run.

API used (see DESIGN.md): ``ae.adaptive_eager(**options)`` (context manager),
``ae.sync()``, ``ae.reset_stats()``, ``ae.stats()`` (frozen dataclass) and
``ae.stats().to_json()``.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Dict, Optional

# Fields read from ae.stats(). Missing ones are reported as None.
STATS_FIELDS = (
    "ops_captured",
    "flushes",              # dict reason -> count
    "regions_compiled",
    "compiled_calls",
    "ops_fused",
    "ops_eager",
    "cache_hits",
    "cache_misses",
    "cache_evictions",
    "compile_time_s",
    "compiles_in_flight",
    "optimizer_step_kinds",  # dict "Class|what" -> count (what: "compiled steps", "eager: ...")
)


class Unavailable(Exception):
    pass


class AdaptiveAPI:
    def __init__(self):
        try:
            import adaptive_eager as ae
        except Exception as e:
            raise Unavailable(f"import adaptive_eager failed ({type(e).__name__}: {e})")
        missing = [n for n in ("adaptive_eager", "sync") if not callable(getattr(ae, n, None))]
        if missing:
            raise Unavailable("adaptive_eager has no " + ", ".join(f"{n}()" for n in missing)
                              + " yet")
        self.ae = ae

    def context(self, **options):
        return self.ae.adaptive_eager(**options)

    def sync(self) -> None:
        self.ae.sync()

    def reset_stats(self) -> Optional[str]:
        try:
            self.ae.reset_stats()
            return None
        except Exception as e:
            return f"reset_stats: {type(e).__name__}: {e}"

    def stats(self) -> Dict[str, Any]:
        return read_stats(self.ae)


def _plain(v):
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    try:
        return float(v)
    except Exception:
        return repr(v)


def read_stats(ae) -> Dict[str, Any]:
    """{field: value or None} for STATS_FIELDS, plus "raw" (to_json) and "errors"."""
    out: Dict[str, Any] = {f: None for f in STATS_FIELDS}
    errors = []
    try:
        s = ae.stats()
    except Exception as e:
        out["errors"] = [f"stats(): {type(e).__name__}: {e}"]
        return out
    for f in STATS_FIELDS:
        try:
            out[f] = _plain(getattr(s, f))
        except Exception as e:
            errors.append(f"{f}: {type(e).__name__}")
    raw = None
    try:
        j = s.to_json()
        raw = json.loads(j) if isinstance(j, (str, bytes)) else _plain(j)
    except Exception as e:
        errors.append(f"to_json(): {type(e).__name__}: {e}")
        if dataclasses.is_dataclass(s):
            try:
                raw = _plain(dataclasses.asdict(s))
            except Exception:
                pass
    out["raw"] = raw
    if errors:
        out["errors"] = errors
    return out


def _num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def diff_stats(after: Dict[str, Any], before: Dict[str, Any]) -> Dict[str, Any]:
    """after - before for counters (numbers and dicts of numbers); gauges kept as 'after'."""
    out: Dict[str, Any] = {}
    for f in STATS_FIELDS:
        a, b = after.get(f), before.get(f)
        if f == "compiles_in_flight":
            out[f] = a
        elif _num(a) and _num(b):
            out[f] = a - b
        elif isinstance(a, dict) and isinstance(b, dict):
            out[f] = {k: (v - b.get(k, 0)) if _num(v) and _num(b.get(k, 0)) else v
                      for k, v in a.items() if not (_num(v) and v == b.get(k, 0))}
        else:
            out[f] = None
    return out


def derive(s: Dict[str, Any], iters: Optional[int] = None) -> Dict[str, Any]:
    """compiles, cache hit rate, fused share, flushes — None where the inputs are missing."""
    def g(k):
        v = s.get(k)
        return v if _num(v) else None

    hits, misses = g("cache_hits"), g("cache_misses")
    captured, fused, eager = g("ops_captured"), g("ops_fused"), g("ops_eager")
    flushes = s.get("flushes")
    n_flush = sum(v for v in flushes.values() if _num(v)) if isinstance(flushes, dict) else None
    if captured:
        fused_share = fused / captured if fused is not None else None
    elif fused is not None and eager is not None and fused + eager > 0:
        fused_share = fused / (fused + eager)
    else:
        fused_share = None
    # A compiled optimizer step runs none of its ops through the mode: ops_fused does not
    # count it, so the rows say separately which share of the steps ran compiled.
    kinds = s.get("optimizer_step_kinds")
    steps = compiled_steps = 0
    for key, n in (kinds.items() if isinstance(kinds, dict) else ()):
        what = key.partition("|")[2]
        if _num(n) and (what == "compiled steps" or what.startswith("eager: ")):
            steps += n
            compiled_steps += n if what == "compiled steps" else 0
    d = {
        "optimizer_steps_compiled_share": compiled_steps / steps if steps else None,
        "compiles": g("regions_compiled"),
        "cache_hit_rate": hits / (hits + misses) if hits is not None and misses is not None
                          and hits + misses > 0 else None,
        "fused_share": fused_share,
        "flushes_total": n_flush,
        "compile_time_s": g("compile_time_s"),
    }
    if iters:
        d["ops_captured_per_iter"] = captured / iters if captured is not None else None
        d["flushes_per_iter"] = n_flush / iters if n_flush is not None else None
    return d
