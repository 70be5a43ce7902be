"""Counters: what the runtime did, kept in one place the statistics API grows from.

A :class:`Counters` object is owned by one runtime session (a mode and its
executor); it is mutable on purpose (cheap increments on the hot path) and
snapshotted into the frozen ``adaptive_eager.stats()`` dataclass.

Example::

    >>> c = Counters()
    >>> c.note_flush("item", "train.py:12")
    >>> c.flushes["item"], c.sync_sites["train.py:12"]
    (1, 1)
    >>> c.note_phase("parked", "8 windows in a row held nothing worth compiling")
    >>> c.phases[0][:2]
    ('parked', 0)
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from ..reasons import Fallback


# Phase changes kept in full (Note [Every cache is bounded], session.py); later ones are
# only counted.
MAX_PHASES = 64


# Note [Counting while passing through]
# Ops the mode captures, or passes through while on the stack, are counted exactly. A
# parked mode is off every mode stack (Note [Parking the mode]), so its ops run with no
# Python between them and cannot be counted without a per-op cost (a Python round trip
# per op is the very cost parking removes); what it does see are its safe points: every
# Python-level read of a tensor (the read wrappers of observe.py) and every optimizer
# step, counted exactly in every phase (reads_parked, optimizer_steps_parked). The ops
# run while parked are estimated from those (parked_ops_estimate) and the report says
# so: in a program that steps an optimizer, optimizer steps parked times the ops of the
# step-to-step spans measured while on the stack (span_step_ops / span_steps: only
# spans with the mode on the stack from one step's end to the next, so a span is a
# whole iteration, not the few ops between a step and the read after it). Measured on
# the real-program patterns (benchmarks/workloads/patterns.py), the counts then came to
# 0.72x and 0.83x the real ones (loss_print, gan). Reads are no basis: the ops
# between them vary too much (nanoGPT reads 100 times a step, LBFGS twice a closure
# with 14 and 3,400 ops between; read-based estimates were 0.05x-3.8x the real count),
# so a program that parks without optimizer steps, or before a whole step ran on the
# stack, gets no estimate, and the report says so. Windows and sync sites exist only
# while capturing, so their counts are exact.
def parked_ops_estimate(c: "Counters") -> tuple[int | None, str]:
    """(estimated ops run while parked, how it was estimated) from counters or a Stats;
    ``(None, why)`` when there is nothing to estimate from.

    Example::

        >>> c = Counters(ops_captured=400, optimizer_steps=14, optimizer_steps_parked=10,
        ...              span_steps=3, span_step_ops=300)
        >>> parked_ops_estimate(c)[0]
        1000
    """
    steps, reads = c.optimizer_steps_parked, c.reads_parked
    if steps == 0 and reads == 0:
        return 0, "no safe point was passed while parked"
    if c.optimizer_steps:  # a training loop: its iterations are its steps
        if steps and c.span_steps:
            per = c.span_step_ops / c.span_steps
            return round(steps * per), (f"estimated: {steps:,} optimizer steps while parked "
                                        f"x {per:,.0f} ops per step, measured on the stack")
        if not steps:
            return None, (f"{reads:,} reads while parked inside optimizer steps' spans; "
                          "no step ended while parked")
        return None, (f"{steps:,} optimizer steps while parked; no whole step ran on the "
                      "stack to estimate from")
    return None, (f"{reads:,} reads while parked, and no optimizer step: reads say too "
                  "little about the ops between them to estimate from")


@dataclass
class Counters:
    ops_captured: int = 0          # ops recorded into windows
    ops_passthrough: int = 0       # target-device ops run straight through (not deferred)
    ops_executed: int = 0          # recorded ops run by an executor (eager or compiled)
    ops_fused: int = 0             # of those, ops run inside compiled regions
    ops_eager: int = 0             # of those, ops replayed eagerly
    windows: int = 0               # windows flushed
    flushes: Counter = field(default_factory=Counter)       # reason -> count
    sync_sites: Counter = field(default_factory=Counter)    # user source line -> count
    sync_site_reasons: Counter = field(default_factory=Counter)  # (line, reason) -> count
    fallback_ops: Counter = field(default_factory=Counter)  # reasons.Fallback(op, reason) -> count
    fallback_sites: dict = field(default_factory=dict)     # op -> the user's line first seen
    sources_wanted: dict = field(default_factory=dict)     # op target -> op, for the mode
    regions_compiled: int = 0
    regions_from_disk: int = 0     # regions loaded from the disk cache instead of compiled
    disk_load_time_s: float = 0.0  # time spent reading and loading them (service thread)
    compiled_calls: int = 0
    compile_failures: int = 0
    demotions: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    compile_time_s: float = 0.0
    compiles_in_flight: int = 0
    # compiles and disk loads that ended (any outcome) since the process began: a gauge the
    # waiting policy reads (Note [A region landing ends the wait], runtime/adapt.py), kept
    # by reset()
    regions_landed: int = 0
    meta_hits: int = 0
    meta_misses: int = 0
    optimizer_steps_foreach: int = 0  # torch.optim steps run at the foreach level (dispatch/optim.py)
    # ... left single-tensor: their lists could have raised the process's peak (dispatch/optim.py)
    optimizer_steps_foreach_kept: int = 0
    optimizer_steps_compiled: int = 0  # torch.optim steps run as one compiled function (dispatch/optim_compile.py)
    # "Class|what" -> count: signatures, compiles, compiled steps, "eager: <why>" per class
    optimizer_step_kinds: Counter = field(default_factory=Counter)
    handles_released: int = 0     # bound handles turned into plain tensors (mode.release_handles)
    device: str = ""              # the device deferred, and how it was chosen (Note [device="auto"])
    warmup_ended: str = ""        # why and where capture started (Note [The first iteration runs eagerly])
    # Where the time went (Note [What the time breakdown measures]): wall ns, summed over
    # flushed windows; one perf_counter_ns pair per flush and per region, none per op.
    capture_ns: int = 0           # first recorded op to flush: recording + the program's Python between
    flush_ns: int = 0             # the executors' runs of those windows, of which:
    eager_replay_ns: int = 0      #   ops replayed eagerly
    compiled_region_ns: int = 0   #   calls of compiled regions
    # windows that ran compiled regions: how many, their eager runs (as measured when they
    # last ran all eagerly) and their runs now; the difference is the estimated saving
    compared_windows: int = 0
    compared_eager_ns: int = 0
    compared_run_ns: int = 0
    compile_latency_s: float = 0.0      # queued -> ready, summed over finished compiles
    compile_latency_max_s: float = 0.0  # the longest of them
    compile_latency_first_s: float = 0.0  # the first to finish (the first queued: one worker, in order)
    # of the compiles' time, the worker held stopped so the program kept its cores (Note [The
    # worker runs in slices while the program fills the cores], runtime/worker_pacing.py)
    compile_paused_s: float = 0.0
    # Note [Page faults between optimizer steps] (runtime/step_usage.py): the program
    # thread's usage from one optimizer step end to the next, summed
    steps_sampled: int = 0
    step_faults: int = 0
    step_system_s: float = 0.0
    step_wall_s: float = 0.0
    # of those, the steps that ended with a compile in flight, and their wall time (the
    # report's "while compiling" line: what waiting for a compile cost)
    steps_waiting: int = 0
    step_waiting_wall_s: float = 0.0
    # Note [Counting while passing through]: what happens while the mode is parked (off
    # the dispatch-mode stack, no Python between ops) is seen only at safe points.
    reads: int = 0                # Python-level reads of tensors seen (observe.py), in any phase
    reads_parked: int = 0         # of those, while the mode was parked
    optimizer_steps: int = 0      # torch.optim steps ended in a block (dispatch/parking.py)
    optimizer_steps_parked: int = 0  # of those, while the mode was parked
    # n -> (phase, optimizer steps, reads, ops captured, ops passed through, why): each
    # change of phase ("captured", "passed through", "parked", "warm-up ended"), the
    # first MAX_PHASES of them; phase_changes counts them all.
    phases: dict = field(default_factory=dict)
    phase_changes: int = 0
    # Spans measured on the stack, for parked_ops_estimate: ops from one optimizer step's
    # end (or read) to the next, how many such spans; marks: the op count at the last one
    # (-1: none since the mode last parked).
    span_step_ops: int = 0
    span_steps: int = 0
    span_read_ops: int = 0
    span_reads: int = 0
    mark_step: int = -1
    mark_read: int = -1
    # Memory (Note [Replay frees at last use], fusion/liveness.py; Note [A byte budget per
    # window], dispatch/recorder.py): the most bytes a window's replay held at once
    # (estimated from its specs, freeing at last use), the most bytes of real tensors a
    # window kept alive that the program had dropped, and windows flushed for that.
    replay_peak_bytes: int = 0
    window_peak_bytes: int = 0
    fast_ops: int = 0             # of ops_captured, those matched against a recurring window's trace
    trace_mismatches: Counter = field(default_factory=Counter)  # "op at line" -> windows that diverged there
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note_flush(self, reason: str, site: str | None) -> None:
        self.flushes[reason] += 1
        if site is not None:
            self.sync_sites[site] += 1
            self.sync_site_reasons[(site, reason)] += 1

    def note_fallback(self, op: str, reason: str, site: str | None = None,
                      target: object = None) -> None:
        """Count a fallback of ``op``; ``site``: the program's line, if known here. Without
        one, ``target`` (the op) asks the mode for the line of its next recording."""
        self.fallback_ops[Fallback(op, reason)] += 1
        if op not in self.fallback_sites:
            if site is not None:
                self.fallback_sites[op] = site
            elif target is not None:
                self.sources_wanted[target] = op

    def note_run(self, opened_ns: int, start_ns: int, end_ns: int,
                 eager_ns: int | None = None) -> None:
        """Time one executor run of a window (Note [What the time breakdown measures]):
        it ran from ``start_ns`` to ``end_ns``, its first op was recorded at ``opened_ns``
        (0: unknown); ``eager_ns``: the window's measured eager run, when compiled regions
        ran in it this time (the saving estimate)."""
        ran = end_ns - start_ns
        self.flush_ns += ran
        if opened_ns:
            self.capture_ns += start_ns - opened_ns
        if eager_ns is not None:
            self.compared_windows += 1
            self.compared_eager_ns += eager_ns
            self.compared_run_ns += ran

    def note_replay_bytes(self, n: int) -> None:
        """A replay held at most ``n`` bytes at once."""
        if n > self.replay_peak_bytes:
            self.replay_peak_bytes = n

    def note_phase(self, phase: str, why: str) -> None:
        """The runtime's phase changed (Note [Counting while passing through])."""
        n = self.phase_changes
        self.phase_changes = n + 1
        if n < MAX_PHASES:
            self.phases[n] = (phase, self.optimizer_steps, self.reads, self.ops_captured,
                              self.ops_passthrough, why)

    def safe_point_seen(self, read: bool, parked: bool) -> None:
        """A read (``read``) or an optimizer step's end was seen (Note [Counting while
        passing through]); ``parked``: the mode was off the stack."""
        if read:
            self.reads += 1
        else:
            self.optimizer_steps += 1
        if parked:  # no span runs through a park (end_spans)
            if read:
                self.reads_parked += 1
            else:
                self.optimizer_steps_parked += 1
            return
        now = self.ops_captured + self.ops_passthrough
        if read:
            if self.mark_read >= 0:
                self.span_read_ops += now - self.mark_read
                self.span_reads += 1
            self.mark_read = now
        else:
            if self.mark_step >= 0:
                self.span_step_ops += now - self.mark_step
                self.span_steps += 1
            self.mark_step = now

    def end_spans(self) -> None:
        """The mode parked: no span runs through it."""
        self.mark_step = self.mark_read = -1

    def start_span(self, read: bool) -> None:
        """The mode came back on the stack at a read (``read``) or an optimizer step's end:
        a span of that kind starts here."""
        now = self.ops_captured + self.ops_passthrough
        if read:
            self.mark_read = now
        else:
            self.mark_step = now

    def reset(self) -> None:
        fresh = Counters()
        for name in self.__dataclass_fields__:
            if name != "lock" and name != "regions_landed":
                setattr(self, name, getattr(fresh, name))


__all__ = ["Counters", "parked_ops_estimate", "MAX_PHASES"]
