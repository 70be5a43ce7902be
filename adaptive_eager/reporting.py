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

# Formatting is hand-written (a two-column list, indented code and advice): no table
# library would shorten it, and the report must work wherever the package imports.
from __future__ import annotations

import linecache
import re
import sys
from typing import Iterable

from ._logging import log
from ._env import OFF_WORDS, ON_WORDS
from .reasons import ADVICE, ROUTINE_REASONS, SYNC_OPS, advice_for
from .runtime import step_usage
from .runtime.counters import parked_ops_estimate
from .statistics import Stats

# Source patterns for sites whose reason is unknown (e.g. counters from elsewhere).
_SOURCE_HINTS: tuple[tuple[str, str], ...] = (
    (".item()", "item"), ("print(", "repr"), (".tolist()", "tolist"), (".numpy()", "numpy"),
    ("torch.equal", "equal"), (".cpu()", "transfer"), ("if ", "bool"), ("while ", "bool"),
)


_SITE = re.compile(r"^(?P<file>.*):(?P<line>\d+)(?: \((?P<func>.*)\))?$")


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
                         subsequent_indent=" " * len(indent), break_long_words=False,
                         break_on_hyphens=False) or [indent]


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
            if op not in SYNC_OPS]


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
        site = stats.fallback_sites.get(op, "")
        lines.append(f"  {n:>7,}  {op}  [{', '.join(reasons) or 'unknown'}]" + (f"  {site}" if site else ""))
        code = source_text(site) if site else ""
        if code:
            lines.append(f"           > {code}")
        advice = next((a for a in (advice_for(r, fallback=True) for r in reasons) if a), "")
        if advice and advice not in given:  # each piece of advice once
            given.add(advice)
            lines += _wrap(advice, "           advice: ")
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more ops")
    return lines


def compiles_line(s: Stats) -> str:
    """Compiles finished, in flight and failed, with the time of the finished ones."""
    text = f"{_fmt_num(s.regions_compiled)} finished ({s.compile_time_s:.2f} s), " \
           f"{_fmt_num(s.compiles_in_flight)} in flight, {_fmt_num(s.compile_failures)} failed"
    if s.compiles_in_flight:
        text += "  (compiles still running are not timed; their regions ran eagerly)"
    return text


# Note [What the time breakdown measures]
# Wall time (perf_counter_ns), summed over the windows the runtime captured and flushed;
# one pair of clock reads per flush and per region, none per op (Counters.note_run,
# CompiledExecutor.run). Ops passed straight through are not timed: they run at eager
# speed. What each line is:
# - capture: from a window's first recorded op to the start of its flush. It holds the
#   Python cost of recording and the program's own Python between those ops (module
#   calls, the autograd engine, its loop), which eager spends too; the two cannot be told
#   apart without a clock per op, so it is an upper bound on what capturing cost.
# - eager replay, compiled regions: the ops a flush ran eagerly, and the calls of
#   compiled artifacts; runtime: the rest of the flushes (window key, plan lookup, index
#   checks, a region's first call on copies and its check against eager).
# - saving vs eager: for each window that ran compiled regions, its eager run (measured
#   when it last ran all eagerly, before its regions compiled: the minimum of those
#   sightings, WindowHistory.eager_ns) minus its run now; the kernels' saving, capture
#   not subtracted. Negative: compiled ran slower. An estimate: the eager runs were timed
#   early, perhaps under another load, and a replay holds every intermediate of its
#   window (more memory than eager touches), so the report prints both per-window means;
#   the demo measures a real eager run beside it. Measured there (MLP steps, load average
#   3-3.6): 4096 wide, 76 ms a step estimated, 86 ms measured (wall; 62 ms CPU); 2048 wide,
#   13.6 ms estimated, 0 ms measured (wall; 4.3 ms CPU): read it as a bound, not a figure.
# - compile latency: from a compile being queued to its artifact being ready (the
#   compile log's queued/finished events), summed; compiles run beside the program, in
#   a worker process, so this is not time the program waited, but time its windows ran
#   without their compiled regions.
_TIME_ROWS = (
    ("capture", "capture", "first op to flush (recording + the program's Python between ops)"),
    ("eager replay", "eager_replay", "ops run eagerly at flushes"),
    ("compiled regions", "compiled", "calls of compiled regions"),
    ("runtime", "runtime", "the rest of the flushes (keys, plans, checks, first calls)"),
)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def memory_line(s: Stats) -> str:
    """What windows held (Note [Replay frees at last use], Note [A byte budget per window]).

    Example::

        >>> memory_line(Stats(replay_peak_bytes=3 << 20, window_peak_bytes=1 << 20))
        'a replay held at most 3.0 MiB at once (from the specs); a window kept at most 1.0 MiB the program had dropped'
    """
    text = f"a replay held at most {_mib(s.replay_peak_bytes)} at once (from the specs)"
    if s.window_peak_bytes:
        text += f"; a window kept at most {_mib(s.window_peak_bytes)} the program had dropped"
    n = s.flushes.get("window_bytes", 0)
    if n:
        text += f" ({_fmt_num(n)} windows flushed at window_bytes)"
    return text


def _plural(n: int, word: str) -> str:
    return f"{_fmt_num(n)} {word}" + ("" if n == 1 else "s")


def _secs(x: float) -> str:
    return f"{x:8.2f} s"


def time_verdict(s: Stats) -> str:
    """One line: why the captured windows did (or did not) run faster than eager."""
    t = s.time_s
    if not s.windows:
        return "nothing was captured"
    if not s.compiled_calls:
        if s.compiles_in_flight:
            ready = (f"; a compile here took {s.compile_latency_max_s:.1f} s from queued to ready"
                     if s.regions_compiled else "")
            return (f"no compiled region ran: {_plural(s.compiles_in_flight, 'compile')} still in flight "
                    f"at the end, their windows ran eagerly{ready}")
        if not s.regions_compiled and not s.regions_from_disk:
            if s.compile_failures:
                return "no compiled region ran: every compile failed (see the fallbacks below)"
            return ("no region was compiled: no window recurred with a fusible region worth "
                    "its capture (see the flush reasons and fallbacks below)")
        if s.demotions or s.cache_evictions:
            return "no compiled region ran: the compiled ones were demoted or evicted"
        return ("no compiled region ran: the windows whose regions compiled did not recur "
                "after compiling (see ae_recompiles for what changed between them)")
    if t["saved_vs_eager"] <= 0:
        return "compiled regions ran no faster than their windows did eagerly"
    if t["saved_vs_eager"] < t["capture"]:
        return (f"fusion saved about {t['saved_vs_eager']:.2f} s of kernel time; capturing took up "
                f"to {t['capture']:.2f} s (an upper bound: it holds the program's own Python)")
    return (f"fusion saved about {t['saved_vs_eager']:.2f} s of kernel time, more than capturing "
            f"took ({t['capture']:.2f} s at most)")


def format_time(s: Stats) -> list[str]:
    """The report's time breakdown (Note [What the time breakdown measures])."""
    t = s.time_s
    out = [f"Where the time went (wall time of {_fmt_num(s.windows)} captured windows; ops passed "
           "through are not timed)"]
    for label, key, what in _TIME_ROWS:
        if key == "compiled":
            what = f"{_fmt_num(s.compiled_calls)} compiled calls"
        out.append(f"  {label:<17}{_secs(t[key])}  {what}")
    if s.regions_compiled:
        out.append(f"  {'compile latency':<17}{_secs(s.compile_latency_s)}  queued -> ready, "
                   f"{_plural(s.regions_compiled, 'compile')} (longest {s.compile_latency_max_s:.1f} s), "
                   "beside the program")
    if s.compile_paused_s:
        out += _wrap(f"the compile worker was held stopped for {s.compile_paused_s:.1f} s of its "
                     "compiles, so the program's threads kept the cores (a compile lands later, "
                     "the program's steps slow less)", f"  {'worker paused':<17}")
    if s.compared_windows:
        n = s.compared_windows
        out += _wrap(f"estimated on {_plural(n, 'window')} that ran compiled regions: "
                     f"{s.compared_eager_ns / n / 1e6:.1f} ms each eagerly (measured before they "
                     f"compiled), {s.compared_run_ns / n / 1e6:.1f} ms now",
                     f"  {'saving vs eager':<17}{_secs(t['saved_vs_eager'])}  ")
    out += _wrap(time_verdict(s), f"  {'in short':<17}")
    return out


def _when(steps: int, reads: int) -> str:
    return f"after {_plural(steps, 'step')}, {_plural(reads, 'read')}"


def ops_row(s: Stats) -> str:
    """Every op of the run: captured, passed through, and (estimated) run while parked
    (Note [Counting while passing through], runtime/counters.py)."""
    text = f"{_fmt_num(s.ops_captured)}  (passed through: {_fmt_num(s.ops_passthrough)}"
    parked, how = parked_ops_estimate(s)
    if parked:
        text += f"; while parked: ~{_fmt_num(parked)}, {how}"
    elif s.reads_parked or s.optimizer_steps_parked:
        text += f"; while parked: not estimated, {how}"
    return text + ")"


def format_phases(s: Stats, limit: int = 12) -> list[str]:
    """What the runtime did over the run, phase by phase: captured, measuring, passed
    through, parked, with the optimizer steps and reads seen when each began and why.

    Example::

        >>> s = Stats(reads=40, reads_parked=30, optimizer_steps=40, optimizer_steps_parked=30,
        ...           phases={0: ("captured", 1, 0, 0, 0, "the warm-up ended"),
        ...                   1: ("parked", 10, 10, 300, 0, "windows did not pay")},
        ...           phase_changes=2)
        >>> print("\\n".join(format_phases(s)))
        What the runtime did (2 phase changes; 40 optimizer steps and 40 reads seen, 30 and 30 of them while parked)
          after 1 step, 0 reads           captured        the warm-up ended
          after 10 steps, 10 reads        parked          windows did not pay
          at the end                      parked          (ops then ran straight through, uncounted)
    """
    out = [f"What the runtime did ({_plural(s.phase_changes, 'phase change')}; "
           f"{_plural(s.optimizer_steps, 'optimizer step')} and {_plural(s.reads, 'read')} seen, "
           f"{_fmt_num(s.optimizer_steps_parked)} and {_fmt_num(s.reads_parked)} of them while parked)"]
    phases = [s.phases[k] for k in sorted(s.phases)]
    if not phases:
        out.append("  captured throughout" if s.ops_captured else "  no phase recorded")
        return out
    shown = phases if len(phases) <= limit else phases[:limit // 2] + phases[-(limit // 2):]
    for i, (phase, steps, reads, *_rest, why) in enumerate(shown):
        if len(phases) > limit and i == limit // 2:
            out.append(f"  ... {_fmt_num(len(phases) - limit)} more changes ...")
        out += _wrap(why, f"  {_when(steps, reads):<31} {phase:<15} ")
    if s.phase_changes > len(phases):
        out.append(f"  ... and {_fmt_num(s.phase_changes - len(phases))} later changes, not kept")
    last = phases[-1][0]
    tail = {"parked": "(ops then ran straight through, uncounted)",
            "passed through": "(ops passed through, counted)",
            "measuring": "(measuring what ops cost)",
            "captured": "(capturing)"}.get(last, "")
    if s.phase_changes == len(phases):
        out.append(f"  {'at the end':<31} {last:<15} {tail}".rstrip())
    return out


def format_optimizer_steps(s: Stats) -> list[str]:
    """One line per optimizer class: its signatures, compiles, compiled steps and why the
    other steps ran eagerly (Note [The optimizer step as one compiled unit]).

    Example::

        >>> s = Stats(optimizer_steps_compiled=297, optimizer_step_kinds={
        ...     "AdamW|signatures": 1, "AdamW|compiles": 1, "AdamW|compiled steps": 297,
        ...     "AdamW|eager: state creation (first step)": 1})
        >>> for line in format_optimizer_steps(s): print(line)
        Optimizer steps as one compiled function
          AdamW: 1 signature, 1 compile, 297 steps compiled; eager: 1 state creation (first step)
    """
    by_class: dict[str, dict[str, int]] = {}
    for key, n in s.optimizer_step_kinds.items():
        cls, _, what = str(key).partition("|")
        by_class.setdefault(cls, {})[what] = n
    out = ["Optimizer steps as one compiled function"]
    for cls, kinds in by_class.items():
        eager = [(w[len("eager: "):], n) for w, n in kinds.items() if w.startswith("eager: ")]
        line = (f"  {cls}: {_plural(kinds.get('signatures', 0), 'signature')}, "
                f"{_plural(kinds.get('compiles', 0), 'compile')}, "
                f"{_fmt_num(kinds.get('compiled steps', 0))} steps compiled")
        if kinds.get("loads from disk"):  # Note [Compiled steps in the persistent cache]
            line += f", {_plural(kinds['loads from disk'], 'trace')} loaded from the disk cache"
        if eager:
            line += "; eager: " + ", ".join(f"{_fmt_num(n)} {w}" for w, n in
                                            sorted(eager, key=lambda x: -x[1]))
        out.append(line)
    return out


def format_report(stats: Stats, title: str = "adaptive_eager report") -> str:
    """The whole report as text (see the module docstring)."""
    s = stats
    rows: list[tuple[str, str]] = [
        ("ops captured", ops_row(s)),
        ("windows flushed", _fmt_num(s.windows or s.total_flushes)),
        ("ops fused / eager", f"{_fmt_num(s.ops_fused)} / {_fmt_num(s.ops_eager)}  "
                              f"({_pct(s.fused_share)} fused)"),
        ("regions compiled", f"{_fmt_num(s.regions_compiled)}  (demoted {s.demotions})"),
        ("compiles", compiles_line(s)),
        ("compiled calls", _fmt_num(s.compiled_calls)),
        ("cache", f"hits {_fmt_num(s.cache_hits)}, misses {_fmt_num(s.cache_misses)}, "
                  f"evictions {_fmt_num(s.cache_evictions)}  (hit rate {_pct(s.cache_hit_rate)})"),
    ]
    if s.device:
        rows.insert(0, ("device", s.device))
    if s.regions_from_disk:
        rows.insert(4, ("regions from disk", f"{_fmt_num(s.regions_from_disk)}  (loaded from the "
                        f"compiled-region cache in {s.disk_load_time_s:.2f} s, not compiled)"))
    if s.fast_ops or s.trace_mismatches:
        # Note [Recurring windows are matched, not recorded] (dispatch/trace.py)
        share = _pct(s.fast_ops / s.ops_captured) if s.ops_captured else "-"
        text = f"{_fmt_num(s.fast_ops)} ops matched recurring windows ({share} of captured)"
        if s.trace_mismatches:
            site, n = next(iter(s.trace_mismatches.items()))
            text += f"; {_fmt_num(sum(s.trace_mismatches.values()))} divergences, most at {site} ({n})"
        rows.insert(1, ("fast path", text))
    if s.replay_peak_bytes or s.window_peak_bytes:
        rows.append(("memory", memory_line(s)))
    if s.optimizer_steps_foreach or s.optimizer_steps_foreach_kept:
        # Note [Optimizer steps at the foreach level], [The foreach switch never raises the
        # peak] (dispatch/optim.py)
        text = (f"{_fmt_num(s.optimizer_steps_foreach)} run at the foreach level (torch.optim's "
                "multi-tensor path, equal results)")
        if s.optimizer_steps_foreach_kept:
            text += (f"; {_fmt_num(s.optimizer_steps_foreach_kept)} left single-tensor: its lists "
                     "could have raised the process's peak memory")
        rows.append(("optimizer steps", text))
    faults = step_usage.report_line(s.steps_sampled, s.step_faults, s.step_system_s, s.step_wall_s)
    if faults:  # Note [Page faults between optimizer steps] (runtime/step_usage.py)
        rows.append(("page faults", faults))
    waiting = step_usage.waiting_line(s.steps_sampled, s.step_wall_s, s.steps_waiting,
                                      s.step_waiting_wall_s)
    if waiting:  # what waiting for a compile cost the program's steps
        rows.append(("while compiling", waiting))
    if s.optimizer_step_kinds:
        # Note [The optimizer step as one compiled unit] (dispatch/optim_compile.py)
        rows.append(("optimizer compiled", f"{_fmt_num(s.optimizer_steps_compiled)} steps ran as one "
                                           "compiled function (see below)"))
    if s.warmup_ended:
        # Note [The first iteration runs eagerly]
        if s.ops_captured:
            rows.insert(0, ("capture started", f"after eager warm-up, at {s.warmup_ended}"))
        else:
            rows.insert(0, ("warm-up ended", f"after eager warm-up, at {s.warmup_ended}; "
                                             "nothing was captured (see the phases below)"))
    out = [title, "=" * len(title)]
    out += [f"{k:<18} {v}" for k, v in rows]
    if s.optimizer_step_kinds:
        out += ["", *format_optimizer_steps(s)]
    out += ["", *format_phases(s)]
    out += ["", *format_time(s)]
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
        if dest.lower() in ON_WORDS or dest.lower() == "stderr":
            sys.stderr.write(text)
            sys.stderr.flush()
        elif dest.lower() == "stdout":
            sys.stdout.write(text)
            sys.stdout.flush()
        elif dest.lower() not in OFF_WORDS:
            with open(dest, "w") as f:
                f.write(text)
    except Exception as e:  # a report must never break the program's exit
        log.warning("adaptive_eager: could not write the report to %r: %s", destination, e)


def wants_json(destination: str) -> bool:
    """Whether a report destination is a JSON file (its name ends in ``.json``)."""
    return destination.strip().lower().endswith(".json")


def emit_report(stats: Stats, destination: str, title: str = "adaptive_eager report",
                as_json: bool = False) -> None:
    """Write the report of ``stats`` to ``destination`` (see :func:`write_report`): as
    text, or as ``stats.to_json()`` with ``as_json`` or a ``.json`` path."""
    if as_json or wants_json(destination):
        write_report(stats.to_json(indent=2) + "\n", destination)
    else:
        write_report(format_report(stats, title=title), destination)


def explain_data(stats: Stats) -> dict:
    """What ``adaptive-eager explain --json`` prints: sync sites and fallbacks, each with
    its code line and advice (the same rows as the text)."""
    sites = [{"site": site, "count": n, "reasons": reasons, "code": source_text(site),
              "advice": advice_for(max(reasons, key=reasons.get))}
             for site, n, reasons in problem_sites(stats)]
    ops = [{"op": op, "count": n, "reasons": list(reasons),
            "site": stats.fallback_sites.get(op, ""),
            "code": source_text(stats.fallback_sites.get(op, "")),
            "advice": next((a for a in (advice_for(r, fallback=True) for r in reasons) if a), "")}
           for op, n, reasons in fallbacks(stats)]
    return {"ops_captured": stats.ops_captured, "total_flushes": stats.total_flushes,
            "sync_sites": sites, "fallbacks": ops}


def explain_lines(stats: Stats) -> Iterable[str]:
    """The ``adaptive-eager explain`` text: only what to change, with source lines."""
    sites = format_sites(stats, limit=50)
    yield "Sync sites (each line forced the runtime to stop deferring and run what it had)"
    yield from sites or ["  none worth changing"]
    yield ""
    yield "Fallback ops (could not be captured or fused; they ran eagerly)"
    yield from format_fallbacks(stats, limit=50) or ["  none"]


__all__ = ["format_report", "write_report", "emit_report", "explain_data", "wants_json", "advice_for", "source_text", "problem_sites",
           "fallbacks", "explain_lines", "compiles_line", "format_time", "time_verdict", "ADVICE"]
