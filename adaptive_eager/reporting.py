"""The report: statistics as a readable table, with what to change in the program.

:func:`format_report` turns a :class:`~adaptive_eager.statistics.Stats` into text: the
headline counters, flushes by reason, the source lines that forced the most syncs
(each with its code and advice) and the ops that fell back to eager (with why).
``adaptive_eager.report()`` formats the current statistics; ``ADAPTIVE_EAGER_REPORT``
(the ``report`` option) prints it at process exit.

Example::

    >>> from adaptive_eager.statistics import Stats
    >>> text = format_report(Stats(ops_captured=10, flushes={"item": 10},
    ...     sync_sites={"train.py:12 (main)": 10},
    ...     sync_site_reasons={"train.py:12 (main)": {"item": 10}}))
    >>> "keep the value as a tensor" in text
    True
"""

from __future__ import annotations

import linecache
import re
import sys
from typing import Iterable

from ._logging import log
from .statistics import ROUTINE_REASONS, Stats

# Reason (as recorded by the mode) -> what to change. Keys are the flush reasons of
# dispatch/mode.py, dispatch/observe.py and dispatch/lazy.py, with any "observe:" prefix removed.
ADVICE: dict[str, str] = {
    "item": ".item() in a loop: keep the value as a tensor (accumulate with +=) "
            "or read it every N steps",
    "bool": "Python branches on a tensor (if/while/and/or): use torch.where, or check every N steps",
    "equal": "torch.equal returns a Python bool: use (a == b).all() and keep it a tensor",
    "repr": "printing a tensor: print every N steps, or after the loop",
    "format": "formatting a tensor into a string: log every N steps, or after the loop",
    "numpy": "reading values into NumPy: do it every N steps, or after the loop",
    "array": "reading values into NumPy: do it every N steps, or after the loop",
    "tolist": ".tolist() reads values into Python: do it every N steps, or after the loop",
    "data_ptr": "raw memory access (data_ptr) needs the real tensor: move it out of the hot loop",
    "dlpack": "DLPack export needs the real tensor: export outside the hot loop",
    "storage": "storage access needs the real tensor: move it out of the hot loop",
    "untyped_storage": "storage access needs the real tensor: move it out of the hot loop",
    "pickle": "saving/pickling tensors (torch.save): checkpoint every N steps",
    "reduce_ex": "saving/pickling tensors (torch.save): checkpoint every N steps",
    "deepcopy": "copy.deepcopy of tensors: copy outside the hot loop",
    "transfer": "device transfer (.to/.cpu/.cuda): move data once before the loop, or every N steps",
    "data_dependent": "the output's shape depends on the values (nonzero, masked_select, unique, "
                      "boolean-mask indexing): use fixed-shape forms (torch.where, masked_fill, "
                      "multiplying by a mask)",
    "no_meta_kernel": "the op has no meta kernel, so its output shape is unknown until it runs: "
                      "register one (torch.library.register_fake) or keep the op out of the hot loop",
    "metadata_mutation": "in-place change of a tensor's shape (resize_, set_): allocate the final "
                         "shape instead",
    "non_tensor_output": "the op returns a Python value, which needs real data: keep it out of "
                         "the hot loop",
    "collective": "collective communication syncs by design",
    "random": "a random op reads pending values (e.g. bernoulli(p) of a computed p): draw "
              "torch.rand_like(p) and compare instead",
    "resize": "an op's output shape differed from the prediction; please report it",
    "sync": "an op needed real values here; look at the line for a read into Python",
    "window_full": "routine: the window reached window_size ops (raise ADAPTIVE_EAGER_WINDOW_SIZE "
                   "if regions are cut too often)",
    "exit": "routine: end of an adaptive_eager block",
    "optimizer_step": "routine: an optimizer step ends its window, so windows line up with "
                      "iterations and recur",
    "torch.compile": "a torch.compile'd function needs its inputs: pending work runs first",
    "explicit_sync": "adaptive_eager.sync() was called: drop it if nothing needs it",
    "nested_enter": "a nested block with other options: use the same options to share one window",
}

# Fallback reasons (fusion/policy.py, fusion/partition.py, runtime/compiler.py) where
# they differ from, or are missing in, the flush reasons above.
FALLBACK_ADVICE: dict[str, str] = {
    "random": "random ops run eagerly (in program order, for eager's exact numbers); "
              "nothing to change",
    "opaque": "not an ATen op the compiler understands (a custom or Python op): it runs "
              "eagerly; move it out of the hot loop if it splits a region",
    "unsupported_by_backend": "the compile backend cannot run this op: try another backend "
                              "(--backend or ADAPTIVE_EAGER_BACKEND)",
    "aliased_inputs": "the region updates views of one tensor in place (e.g. optimizer steps, "
                      "slices written in place); it replays eagerly, results unchanged",
    "factory": "creates a tensor from nothing (arange, zeros): it runs just before its "
               "region, which takes it as an input (Note [Factories outside Inductor "
               "regions]); nothing to change",
    "compile timed out after": "compiling took longer than compile_timeout_s; the region runs "
                               "eagerly (raise ADAPTIVE_EAGER_COMPILE_TIMEOUT_S)",
}
_REGION_ADVICE = ("a compiled region failed, mismatched eager or lost to it, and runs eagerly "
                  "from now on (ADAPTIVE_EAGER_LOG=debug says why); results are unchanged")

# Source patterns for sites whose reason is unknown (e.g. counters from elsewhere).
_SOURCE_HINTS: tuple[tuple[str, str], ...] = (
    (".item()", "item"), ("print(", "repr"), (".tolist()", "tolist"), (".numpy()", "numpy"),
    ("torch.equal", "equal"), (".cpu()", "transfer"), ("if ", "bool"), ("while ", "bool"),
)

# Ops that *are* syncs (reported under sync sites), not failures to fuse.
_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal"})

_SITE = re.compile(r"^(?P<file>.*):(?P<line>\d+)(?: \((?P<func>.*)\))?$")


def advice_for(reason: str, fallback: bool = False) -> str:
    """What to change for a flush (or, with ``fallback``, a fallback) ``reason``; ``""`` if unknown."""
    key = reason.split(":", 1)[1] if reason.startswith("observe:") else reason
    if fallback and key in FALLBACK_ADVICE:
        return FALLBACK_ADVICE[key]
    return ADVICE.get(key.strip("_"), ADVICE.get(key, ""))


def source_text(site: str) -> str:
    """The code at ``"file:line (func)"``, stripped, or ``""``."""
    m = _SITE.match(site)
    if not m:
        return ""
    return linecache.getline(m.group("file"), int(m.group("line"))).strip()


def _guess_reason(code: str) -> str:
    for pattern, reason in _SOURCE_HINTS:
        if pattern in code:
            return reason
    return ""


def _fmt_num(x: float | int) -> str:
    return f"{x:,.2f}" if isinstance(x, float) else f"{x:,}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _wrap(text: str, indent: str, width: int = 96) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=indent,
                         subsequent_indent=" " * len(indent)) or [indent]


def problem_sites(stats: Stats) -> list[tuple[str, int, dict[str, int]]]:
    """``(site, count, {reason: count})`` for the sync sites worth changing, worst first.

    Sites whose every flush was routine (end of a block, a full window) are left out.
    """
    out = []
    for site, n in stats.sync_sites.items():
        reasons = stats.sync_site_reasons.get(site)
        if reasons is None:
            guess = _guess_reason(source_text(site))
            reasons = {guess: n} if guess else {"sync": n}
        bad = {r: c for r, c in reasons.items() if r not in ROUTINE_REASONS}
        if bad:
            out.append((site, sum(bad.values()), bad))
    out.sort(key=lambda t: -t[1])
    return out


def fallbacks(stats: Stats) -> list[tuple[str, int, tuple[str, ...]]]:
    """``(op, count, reasons)`` for ops that could not be fused, most frequent first."""
    return [(op, n, stats.fallback_reasons.get(op, ())) for op, n in stats.fallback_ops.items()
            if op not in _SYNC_OPS]


def format_sites(stats: Stats, limit: int = 10) -> list[str]:
    lines = []
    sites = problem_sites(stats)
    for site, n, reasons in sites[:limit]:
        why = ", ".join(f"{r} x{c}" if len(reasons) > 1 else r for r, c in reasons.items())
        lines.append(f"  {n:>7,}  {site}  [{why}]")
        code = source_text(site)
        if code:
            lines.append(f"           > {code}")
        top = max(reasons, key=reasons.get)
        advice = advice_for(top) or advice_for(_guess_reason(code))
        if advice:
            lines += _wrap(advice, "           advice: ")
    if len(sites) > limit:
        lines.append(f"  ... {len(sites) - limit} more lines")
    return lines


def format_fallbacks(stats: Stats, limit: int = 15) -> list[str]:
    lines = []
    given: set[str] = set()
    rows = fallbacks(stats)
    for op, n, reasons in rows[:limit]:
        lines.append(f"  {n:>7,}  {op}  [{', '.join(reasons) or 'unknown'}]")
        advice = _REGION_ADVICE if op == "region" else \
            next((a for a in (advice_for(r, fallback=True) for r in reasons) if a), "")
        if advice and advice not in given:  # each piece of advice once
            given.add(advice)
            lines += _wrap(advice, "           advice: ")
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more ops")
    return lines


def format_report(stats: Stats, title: str = "adaptive_eager report") -> str:
    """The whole report as text (see the module docstring)."""
    s = stats
    rows: list[tuple[str, str]] = [
        ("ops captured", f"{_fmt_num(s.ops_captured)}  (passed through: {_fmt_num(s.ops_passthrough)})"),
        ("windows flushed", _fmt_num(s.windows or s.total_flushes)),
        ("ops fused / eager", f"{_fmt_num(s.ops_fused)} / {_fmt_num(s.ops_eager)}  "
                              f"({_pct(s.fused_share)} fused)"),
        ("regions compiled", f"{_fmt_num(s.regions_compiled)}  (failures {s.compile_failures}, "
                             f"demoted {s.demotions}, in flight {s.compiles_in_flight})"),
        ("compiled calls", _fmt_num(s.compiled_calls)),
        ("cache", f"hits {_fmt_num(s.cache_hits)}, misses {_fmt_num(s.cache_misses)}, "
                  f"evictions {_fmt_num(s.cache_evictions)}  (hit rate {_pct(s.cache_hit_rate)})"),
        ("compile time", f"{s.compile_time_s:.2f} s"),
    ]
    if s.warmup_ended:
        # Note [The first iteration runs eagerly]
        rows.insert(0, ("capture started", f"after eager warm-up, at {s.warmup_ended}"))
    out = [title, "=" * len(title)]
    out += [f"{k:<18} {v}" for k, v in rows]
    out += ["", f"Flushes by reason ({_fmt_num(s.total_flushes)} total)"]
    if s.flushes:
        out += [f"  {n:>7,}  {r}" for r, n in s.flushes.items()]
    else:
        out.append("  none")
    out += ["", "Top sync sites (the lines that forced a flush, and what to change)"]
    out += format_sites(s) or ["  none: nothing but routine flushes (block exits, full windows)"]
    out += ["", "Fallback ops (ran eagerly, outside compiled regions)"]
    out += format_fallbacks(s) or ["  none"]
    return "\n".join(out) + "\n"


def write_report(text: str, destination: str) -> None:
    """Write ``text`` to ``destination``: ``1``/``stderr``, ``stdout``, or a file path."""
    dest = destination.strip()
    try:
        if dest.lower() in ("1", "true", "yes", "on", "stderr"):
            sys.stderr.write(text)
            sys.stderr.flush()
        elif dest.lower() == "stdout":
            sys.stdout.write(text)
            sys.stdout.flush()
        elif dest.lower() not in ("", "0", "false", "no", "off"):
            with open(dest, "w") as f:
                f.write(text)
    except Exception as e:  # a report must never break the program's exit
        log.warning("adaptive_eager: could not write the report to %r: %s", destination, e)


def explain_lines(stats: Stats) -> Iterable[str]:
    """The ``adaptive-eager explain`` text: only what to change, with source lines."""
    sites = format_sites(stats, limit=50)
    yield "Sync sites (each line forced the runtime to stop deferring and run what it had)"
    yield from sites or ["  none worth changing"]
    yield ""
    yield "Fallback ops (could not be captured or fused; they ran eagerly)"
    yield from format_fallbacks(stats, limit=50) or ["  none"]


__all__ = ["format_report", "write_report", "advice_for", "source_text", "problem_sites",
           "fallbacks", "explain_lines", "ADVICE"]
