"""Statistics: a frozen snapshot of what the runtime did, for programs and for people.

:func:`snapshot` copies the process-wide :class:`~adaptive_eager.runtime.Counters`
into a :class:`Stats` (a frozen dataclass, safe to keep, compare and serialize);
``adaptive_eager.stats()`` is the public entry point and ``adaptive_eager.report()``
formats one for people.

Example::

    >>> import torch, adaptive_eager as ae
    >>> ae.reset_stats()
    >>> with ae.adaptive_eager(backend="eager"):
    ...     total = (torch.ones(4) * 2).sum().item()
    >>> s = ae.stats()
    >>> s.ops_captured >= 2, s.flushes["item"]
    (True, 1)
    >>> import json; json.loads(s.to_json())["flushes"]["item"]
    1
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import field
from typing import Any, Mapping

from .reasons import ROUTINE_REASONS
from .runtime.counters import Counters, parked_ops_estimate


# Note [Stats are derived from Counters]
# Every statistic is declared once, as a field of runtime.Counters (mutable, cheap to
# increment on the hot path). Stats, the frozen snapshot, has the same fields, made from
# Counters' own (counters become plain dicts, ordered most frequent first), minus
# Counters' bookkeeping (_INTERNAL), plus what the snapshot derives (fallback_reasons)
# and ``extra`` (counters of subclasses). A new counter is a new Stats field at once.
_INTERNAL = {"lock", "sources_wanted", "mark_step", "mark_read", "regions_landed"}  # Counters' bookkeeping, not statistics
_DERIVED = (  # fields only the snapshot has: (name, type, default factory)
    ("fallback_reasons", "dict[str, tuple[str, ...]]", dict),
    ("extra", "dict[str, Any]", dict),
)


def _stats_fields() -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(Counters):
        if f.name in _INTERNAL:
            continue
        if f.default_factory is not dataclasses.MISSING:  # a Counter or dict: a dict here
            out.append((f.name, "dict", field(default_factory=dict)))
        else:
            out.append((f.name, f.type, field(default=f.default)))
    out += [(name, typ, field(default_factory=factory)) for name, typ, factory in _DERIVED]
    return out


class _StatsMethods:
    """What the runtime did since the last ``reset_stats()`` (all threads, all sessions).

    A frozen dataclass with one field per counter of ``runtime.Counters`` (Note [Stats
    are derived from Counters]). Mappings are plain dicts, ordered most frequent first.
    ``fallback_ops`` counts ops that ran outside any compiled region, by op name
    (``aten::nonzero``); ``fallback_reasons`` says why (e.g. ``data_dependent``: the
    output's shape depends on the values) and ``fallback_sites`` where: the program's
    line that issued it, found the first time the op fell back (a sync) or the next time
    it was recorded.

    Example::

        >>> Stats().cache_hit_rate is None
        True
    """

    @property
    def total_flushes(self) -> int:
        return sum(self.flushes.values())

    @property
    def cache_hit_rate(self) -> float | None:
        looked_up = self.cache_hits + self.cache_misses
        return self.cache_hits / looked_up if looked_up else None

    @property
    def fused_share(self) -> float | None:
        """Share of executed ops that ran inside compiled regions."""
        ran = self.ops_fused + self.ops_eager
        return self.ops_fused / ran if ran else None

    @property
    def time_s(self) -> dict[str, float]:
        """Where the time went, in seconds (Note [What the time breakdown measures],
        reporting.py): ``capture``, ``eager_replay``, ``compiled``, ``runtime`` (the rest
        of the flushes), ``saved_vs_eager`` (an estimate) and ``compile_latency``.

        Example::

            >>> Stats(flush_ns=3_000_000, eager_replay_ns=1_000_000).time_s["runtime"]
            0.002
        """
        rest = self.flush_ns - self.eager_replay_ns - self.compiled_region_ns
        return {"capture": self.capture_ns / 1e9, "eager_replay": self.eager_replay_ns / 1e9,
                "compiled": self.compiled_region_ns / 1e9, "runtime": max(rest, 0) / 1e9,
                "saved_vs_eager": (self.compared_eager_ns - self.compared_run_ns) / 1e9,
                "compile_latency": self.compile_latency_s}

    @property
    def ops_parked_estimate(self) -> int | None:
        """Ops run while the mode was parked (off the stack, uncounted), estimated; None
        when there is nothing to estimate from (Note [Counting while passing through],
        runtime/counters.py). :attr:`ops_parked_estimate_how` says how.

        Example::

            >>> s = Stats(optimizer_steps=14, optimizer_steps_parked=10, span_steps=3,
            ...           span_step_ops=300)
            >>> s.ops_parked_estimate, s.ops_parked_estimate_how
            (1000, 'estimated: 10 optimizer steps while parked x 100 ops per step, measured on the stack')
        """
        return parked_ops_estimate(self)[0]  # type: ignore[arg-type]

    @property
    def ops_parked_estimate_how(self) -> str:
        """How :attr:`ops_parked_estimate` was estimated, or why it was not."""
        return parked_ops_estimate(self)[1]  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (tuples become lists), with the derived figures
        (``total_flushes``, ``time_s``, ``ops_parked_estimate`` and how it was estimated)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["total_flushes"] = self.total_flushes
        out["time_s"] = self.time_s
        out["ops_parked_estimate"] = self.ops_parked_estimate
        out["ops_parked_estimate_how"] = self.ops_parked_estimate_how
        return out

    def to_json(self, indent: int | None = None) -> str:
        """The snapshot as a JSON object string.

        Example::

            >>> import json
            >>> json.loads(Stats(ops_captured=3).to_json())["ops_captured"]
            3
        """
        return json.dumps(self.as_dict(), indent=indent, sort_keys=False)


Stats = dataclasses.make_dataclass("Stats", _stats_fields(), bases=(_StatsMethods,), frozen=True,
                                   namespace={"__module__": __name__,
                                              "__doc__": _StatsMethods.__doc__})


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _ranked(counter: Mapping[Any, int]) -> dict:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def _copy(value: Any) -> Any:
    # Other threads may increment while we copy; dict() of a dict being resized
    # raises RuntimeError, so retry a few times (increments are rare and short).
    for _ in range(100):
        try:
            return dict(value) if isinstance(value, Mapping) else value
        except RuntimeError:
            continue
    return {}


_KNOWN = {f.name for f in dataclasses.fields(Stats)} - {name for name, _, _ in _DERIVED}


def snapshot(counters: Counters) -> Stats:
    """A frozen :class:`Stats` from live ``counters``."""
    with counters.lock:
        raw = {name: _copy(getattr(counters, name)) for name in counters.__dataclass_fields__
               if name not in _INTERNAL}
        site_reasons = raw.pop("sync_site_reasons", {})
    fallback_counts: Counter = Counter()
    reasons: dict[str, list[str]] = {}
    for key, n in raw.pop("fallback_ops", {}).items():
        op, reason = key.op, key.reason  # reasons.Fallback
        fallback_counts[op] += n
        if reason and reason not in reasons.setdefault(op, []):
            reasons[op].append(reason)
    by_site: dict[str, Counter] = {}
    for (site, reason), n in site_reasons.items():
        by_site.setdefault(site, Counter())[reason] += n
    values: dict[str, Any] = {
        "flushes": _ranked(raw.pop("flushes", {})),
        "sync_sites": _ranked(raw.pop("sync_sites", {})),
        "sync_site_reasons": {site: _ranked(c) for site, c in by_site.items()},
        "fallback_ops": _ranked(fallback_counts),
        "fallback_reasons": {op: tuple(r) for op, r in reasons.items()},
    }
    extra = {}
    for name, value in raw.items():
        if name in _KNOWN:
            values[name] = value
        elif isinstance(value, (int, float, str, bool, Mapping)):
            extra[name] = _plain(value)
    values["extra"] = extra
    return Stats(**values)


__all__ = ["Stats", "snapshot", "ROUTINE_REASONS"]
