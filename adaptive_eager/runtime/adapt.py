"""Adaptation: when capturing pays, and what to do with each window. One owner, two files.

Everything that decides whether the runtime keeps deferring lives here and in :mod:`.windows`:

* :class:`DeferPolicy` (this module), the session's pass-through policy: one
  :class:`~.phases.Phase` moved by one transition function (``feed``) fed immutable events
  (runtime/phases.py: a :class:`Verdict` per flushed window, safe points, the reads and
  steps it counts spans by, parks); asked in O(1) before every new window whether to
  defer at all, and at safe points whether a parked mode should come back (measuring
  before it captures);
* the per-window half (:mod:`.windows`): ``WindowLog``/``WindowHistory`` (one history per
  window key), ``route`` and ``judge`` (what a flush does with a window, and its verdict),
  ``transition`` (a compiled region's states).

Mechanisms ask through these names only: the executor (runtime/compiled.py), the compile
service (runtime/compiler.py), the mode and parking (dispatch/). "When to stop deferring"
is this file; what a window is worth, runtime/windows.py.

Example::

    >>> p = DeferPolicy(patience=2, probe_every=3)
    >>> p.note(Verdict(50)); p.note(Verdict(50))
    >>> [p.should_defer() for _ in range(3)]     # the third is a probe
    [False, False, True]
    >>> p.should_defer()                         # its window is open until its verdict
    True
    >>> p.note(Verdict(50, worth=True)); p.should_defer()
    True
    >>> w = DeferPolicy(warmup=True)     # the first iteration runs eagerly
    >>> w.should_defer(), w.end_warmup(), w.should_defer()
    (False, True, True)
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..fusion.policy import fusible
from .owned_steps import OWNED_MAX_NS, OwnedSteps
from .occupancy import DEVICE_BOUND_SHARE, Occupancy, backlog_probe, device_clock
from .verdicts import (CANNOT_PAY_EVIDENCE_NS, CANNOT_PAY_SHARE, GROWING_REASON,
                       RESHAPED_REASON, RESHAPED_STREAK, RESHAPED_WEIGHT, Tally, Verdict)
from .measure import (EMPTY_MEASURES, LAUNCH_MEASURE_NS_PER_OP, MEASURE_MAX_NS, MEASURE_NS_PER_OP,
                      MEASURE_OPS, SEED_OPS, Reading, decide)
from .phases import (ACT_CAPTURE, ACT_PARK, ACT_STAY, ACT_UNPARK, ALLOWED, AT_BLOCK, AT_CALL, AT_MODULE,
                     AT_READ, AT_STEP, Act, At, Moved, Phase, SafePoint, Seen, WarmupEnded)

# -- the session's pass-through policy ------------------------------------------------------
# Note [Probes are paid for]
# While passing through, the policy captures a window now and then (a probe) to notice
# a change (a window that grew, a capture that got cheaper). A probe that finds nothing
# costs its capture, so probes are spaced by time as well as by safe points: after a
# capture phase of C ns (unpark to park), the next probe waits for C / PROBE_SHARE ns of
# passing through, which keeps failed probes under PROBE_SHARE of a program's time.
PROBE_SHARE = 0.05

# The measure's Notes and bounds: runtime/measure.py (Note [Measure before capturing]).

# Note [Timing decides speed, never values] (runtime/windows.py) covers every threshold here.

# Why deferral stops or restarts (the report's phases; DeferPolicy.reason / why_deferring).
WARMUP_REASON = "warm-up: the first iteration runs eagerly"
WAITING_REASON = "waiting for compiles in flight"


# Enum members as module constants: ``Phase.X`` is a class-attribute lookup through
# EnumType (~0.2 µs in Python 3.11), and the hot paths below ask several per call.
_CAPTURING = Phase.CAPTURING
_MEASURING = Phase.MEASURING
_OFF = Phase.OFF
_PASSING = Phase.PASSING
_PROBING = Phase.PROBING
_SEEDING = Phase.SEEDING
_SETTLING = Phase.SETTLING
_WAITING = Phase.WAITING
_WARMING = Phase.WARMING

# Safe points count for this many torch calls towards a passing policy's probes: the end
# of an optimizer step (or a block's entry) stands for a step's worth, a read for a few
# more than a module call (torch's own reads, an optimizer's step counters, are reads too).
SAFE_POINT_WEIGHT = 100
READ_WEIGHT = 10
MODULE_CALL_WEIGHT = 8


def _weight(at: At) -> int:
    if at is AT_STEP or at is AT_BLOCK:
        return SAFE_POINT_WEIGHT
    return MODULE_CALL_WEIGHT if at is AT_MODULE else READ_WEIGHT


class DeferPolicy:
    """The session's deferral policy: one :class:`~.phases.Phase`, moved by one transition
    function (:meth:`feed`) fed immutable events, with the counters it decides from.

    It stops deferral after ``patience`` windows in a row with nothing worth compiling, or
    once timed windows show their capture cannot pay (Note [Windows that cannot pay stop
    deferral]), or once a measure shows ops too cheap to capture (Note [Measure before
    capturing]; ``measure=True``, as sessions run). ``enabled=False`` (option
    ``adaptive_passthrough``) always defers, but for growing windows. The mode asks
    :meth:`should_defer` before opening a window (O(1), on every torch call), the
    mechanism (dispatch/parking.py) feeds it safe points and gets an :class:`~.phases.Act`
    back, and each flushed window's :class:`Verdict` is fed to it (:meth:`note`). While
    passing through it probes once every ``probe_every`` calls' worth (Note [Probes are
    paid for]). Its own counters (ops passed through while measuring, whole spans) are
    its own: ``reset_stats()`` does not touch them.

    Example::

        >>> p = DeferPolicy(warmup=True)
        >>> p.phase, p.feed(WarmupEnded("a read")), p.phase
        (<Phase.WARMING: 'warming'>, True, <Phase.CAPTURING: 'capturing'>)
    """

    def __init__(self, enabled: bool = True, patience: int = 8, probe_every: int = 20_000,
                 novel_patience: int = 48, in_flight: Callable[[], int] | None = None,
                 landed: Callable[[], int] | None = None,
                 warmup: bool = False, measure: bool = False, launch_bound: bool = False,
                 backlog: Callable[[], int] | None = None,
                 device_time: Callable[[], int] | None = None):
        self.enabled = enabled
        # Note [The first iteration runs eagerly]
        # Capturing a window the first time costs its ops' Python capture (15-90 µs each)
        # plus cold metadata kernels, and buys nothing yet: a region compiles on a later
        # sighting. So a warming policy starts out passing ops straight through, and
        # capture starts where the program's iterations begin: its first read of a value
        # (``loss.item()``, print, in the program's own code: torch's reads, like AdamW's
        # of its step count, do not count; the owner feeds WarmupEnded) or the end of its
        # first optimizer step (a safe point), each at its second sighting (Note [The first
        # iteration ends where a boundary recurs]). A program that does neither starts capturing
        # at the first probe (``probe_every`` calls' worth of safe points). Its first
        # iteration then costs what eager's does, with no capture and no compile.
        self.phase = _WARMING if enabled and warmup else _CAPTURING
        self._boundaries: set = set()  # Note [The first iteration ends where a boundary recurs]
        self._in_flight = in_flight  # a gauge (compiles in flight), not a statistic
        self._landed = landed  # a gauge: compiles and disk loads ended so far
        self._landed_at = 0  # its reading when the wait began (Note [A region landing ends the wait])
        self.patience = patience
        self.probe_every = probe_every
        self.novel_patience = novel_patience
        self.measure = measure  # Note [Measure before capturing]
        self.launch_bound = launch_bound  # Note [Launch-bound devices pay sooner]
        # Note [Occupancy gates capture]: the asynchronous device's backlog (ns) where a
        # read begins, or None; the waits summed over a measure
        self.backlog = backlog
        self._waited_ns = 0
        # Note [Fusion saves device time] (runtime/occupancy.py): the device's clock, or
        # None; its reading where the timing began
        self.device_time = device_time
        self._device_ns = 0
        self.tally = Tally()  # the verdicts' streaks and sums (runtime/verdicts.py)
        # -- why: the last move's (why_deferring) and the last stop's (reason)
        self._why = "capture from the block's first op" if self.phase is _CAPTURING else ""
        self._stopped = ""
        # -- probes (Note [Probes are paid for]): calls' worth since the last one, and the
        # last capture phase's length (unparked to parked)
        self._calls = 0
        self._parked_ns: int | None = None
        self._unparked_ns: int | None = None
        self._phase_ns = 0
        # -- its own counters (Note [Counting while passing through]): ops passed through
        # on the stack (the mode adds to ``passed``), whole spans on the stack
        # (read to read, step's end to step's end) and whether a step was ever seen
        self.passed = 0
        self._spans = [0, 0]  # [reads, steps]
        self._open = [False, False]  # a span of that kind started on the stack
        self._stepped = False
        # -- the measure under way (Note [Measure before capturing])
        self._measure_ns = 0
        self._measure_end_ns = 0
        self._measure_ops = 0
        self._measure_spans = 0
        self._empty_measures = 0  # Note [A measure that saw no op judges nothing]
        self._first_per_op: float | None = None  # Note [Noise only adds: capture is measured twice]
        self._decided = ""  # why capture was decided (SEEDING), the next CAPTURING's why
        # Note [Only fusible ops pay for capture]: CPU time inside ops that cannot fuse
        # while timing (the mode adds to it), and which ops can (memo by overload)
        self.unfusible_ns = 0
        self._fusible: dict[Any, bool] = {}
        # Note [Steps compiled on their own are not measured]: CPU time and ops inside
        # optimizer steps the step compiler owns, while timing
        self.owned = OwnedSteps()
        # Hot-path copy of "phase is SETTLING or MEASURING": the mode times ops that
        # cannot fuse.
        self.timing = False
        self._seeds_left = 0
        # Hot-path copy of "phase is SEEDING with seeds left": read on every op passed
        # through (Note [Seeding the memo from real runs], dispatch/meta.py).
        self.seeding = False
        # Called when deferral stops (the mechanism's cue: dispatch/parking.py).
        self.on_stop: Callable[[], None] | None = None

    @classmethod
    def for_options(cls, options: Any, counters: Any) -> "DeferPolicy":
        """The policy a session with ``options`` runs under (its compiles counted in
        ``counters``)."""
        return cls(options.adaptive_passthrough, warmup=options.warmup,
                   in_flight=lambda: counters.compiles_in_flight,
                   landed=lambda: counters.regions_landed, measure=True,
                   launch_bound=torch.device(options.device).type != "cpu",
                   backlog=backlog_probe(torch.device(options.device).type),
                   device_time=device_clock(torch.device(options.device).type))

    @classmethod
    def never(cls) -> "DeferPolicy":
        """A policy that never defers nor probes (a block closed from another thread)."""
        p = cls()
        p.phase, p._why = _OFF, ""
        return p

    # -- the one transition function ------------------------------------------------------
    def feed(self, event: Any) -> Any:
        """Take one event; returns the answer for it: an :class:`~.phases.Act` for a
        :class:`~.phases.SafePoint`, whether the warm-up ended for
        :class:`~.phases.WarmupEnded`, else None.

        Example::

            >>> p = DeferPolicy(patience=1)
            >>> p.feed(Verdict(50)); p.phase
            <Phase.PASSING: 'passing'>
            >>> p.feed(SafePoint(At.READ, parked=False))
            <Act.PARK: 'park'>
        """
        kind = type(event)
        if kind is SafePoint:
            return self.at_safe_point(*event)
        if kind is Seen:
            self.seen(*event)
        elif kind is Moved:
            self._moved(event)
        elif kind is Verdict:
            self.note(event)
        elif kind is WarmupEnded:
            return self.end_warmup(event.boundary)
        else:
            raise TypeError(f"DeferPolicy.feed: not an event: {event!r}")
        return None

    def _move(self, to: Phase, why: str | None = None) -> bool:
        """The one place the phase changes (only where ALLOWED says); True if it moved."""
        if to is not self.phase and to not in ALLOWED[self.phase]:
            return False
        self.phase = to
        self.seeding = to is _SEEDING and self._seeds_left > 0
        self.timing = to is _MEASURING or to is _SETTLING
        if why is not None:
            self._why = why
        return True

    # -- safe points ----------------------------------------------------------------------
    def at_safe_point(self, at: At, parked: bool, pending: bool = False,
                      in_step: bool = False) -> Act:
        """``feed(SafePoint(...))`` without making the event (the hot path: every read
        of a parked program comes here)."""
        if parked:
            if in_step and (at is AT_READ or at is AT_CALL):
                return ACT_STAY  # Note [Probes come between optimizer steps] (parking.py)
            return ACT_UNPARK if self.on_stack(_weight(at)) else ACT_STAY
        if pending:
            return ACT_STAY
        measuring = self.measuring
        weight = _weight(at) if at is AT_BLOCK else 0
        if not self.on_stack(weight):
            return ACT_PARK
        if measuring and not self.measuring:
            return ACT_CAPTURE
        return ACT_STAY

    def parked_tick(self, at: At = AT_READ) -> bool:
        """Parked, at ``at``: True, its calls' worth counted, where :meth:`at_safe_point`
        would stay put; False: ask it (Note [A parked read costs a counter], parking.py;
        tests/test_parked_reads.py)."""
        if self.phase is not _PASSING:
            return self.phase is _OFF  # off: never a probe; else the general path decides
        calls = self._calls + _weight(at)
        if calls >= self.probe_every:  # a probe may be due: should_defer decides
            return False
        self._calls = calls
        return True

    def on_stack(self, weight: int = 1) -> bool:
        """At a safe point: whether the mode should be on the dispatch-mode stack now
        (capturing, measuring, or a probe due). Ends a measure that has seen enough
        (Note [Measure before capturing])."""
        p = self.phase
        if p is not _SETTLING and p is not _MEASURING and p is not _SEEDING:
            return self.should_defer(weight) or self.measuring  # a probe measures first
        now = time.thread_time_ns()
        in_time = now < self._measure_end_ns
        spans = self._span_count()
        if self.phase is _SEEDING:  # the seeding span after a decision to capture
            if not (in_time and spans == self._measure_spans):
                self._move(_CAPTURING, self._decided)
            return True
        ops = self.passed - self._measure_ops
        if self.phase is _SETTLING:
            if in_time and spans == self._measure_spans:
                return True
            # Note [The first span settles]: time from here, one whole span later (or,
            # a span longer than the measure's time, from here on: Note [Only fusible
            # ops pay for capture])
            self._move(_MEASURING)
            self._start_timing(keep_open=True)
            self._measure_ops, self._measure_spans = self.passed, spans
            if not in_time:
                self._measure_end_ns = self._measure_ns + MEASURE_MAX_NS
            return True
        # Note [Steps compiled on their own are not measured]: nor their ops (a step still
        # open counts so far: a read inside it, e.g. the first compiled call's check)
        if self.owned.open is not None:
            self.step_owned(self.owned.open)
            self.step_mark()
        ops -= self.owned.ops
        # their time is not the measure's either: a step's compile (the debugging
        # backends compile in the step) or its 29 counter reads must not end the
        # measure with nothing else seen (bounded: OWNED_MAX_NS more at most)
        in_time = now < self._measure_end_ns + min(self.owned.ns, OWNED_MAX_NS)
        if in_time and (ops < MEASURE_OPS or spans == self._measure_spans):
            return True
        if ops <= 0 and self._empty_measures < EMPTY_MEASURES:
            # Note [A measure that saw no op judges nothing]
            self._empty_measures += 1
            self._time_again(spans)
            return True
        regime, free, device_ns = self._regime(ops)
        host = now - self._measure_ns - self.unfusible_ns - self.owned.ns
        d = decide(Reading(ops, host, device_ns, self.unfusible_ns, self.owned.ns, regime, free,
                           self._first_per_op, self._threshold()))
        if d.act == "again":  # Note [Noise only adds: capture is measured twice]
            self._first_per_op = d.per_op
            self._time_again(spans)
            return True
        if d.act == "capture":
            # Note [Seeding the memo from real runs] (dispatch/meta.py): one more span
            # passes through, seeding (a plain attribute: asked on passed-through ops)
            self._decided = d.why
            self._seeds_left = SEED_OPS
            self._measure_spans = spans
            self._measure_end_ns = now + MEASURE_MAX_NS
            self._move(_SEEDING)
            return True
        self._stop(d.why)
        return False

    def _time_again(self, spans: int) -> None:
        """A new measure from here, for MEASURE_MAX_NS at most (the last one judged nothing,
        or must be confirmed); a step open now stays left out."""
        self._start_timing(keep_open=True)
        self._measure_ops, self._measure_spans = self.passed, spans
        self._measure_end_ns = self._measure_ns + MEASURE_MAX_NS

    def _start_timing(self, keep_open: bool = False) -> None:
        self._measure_ns = time.thread_time_ns()
        self.unfusible_ns = self._waited_ns = 0
        self.owned.reset(keep_open)
        self._device_ns = self.device_time() if self.device_time is not None else 0

    # Note [Steps compiled on their own are not measured] (runtime/owned_steps.py)
    def step_mark(self) -> tuple | None:
        """At a candidate optimizer step's start: a mark for :meth:`step_owned`, or None
        when no measure is timing."""
        if not self.timing:
            return None
        return self.owned.mark(self.passed, self.unfusible_ns, self._measure_ns)

    def step_owned(self, mark: tuple | None) -> None:
        """At the step's end: leave its time and ops out of the measure."""
        self.owned.close(mark, self.timing, self.passed, self.unfusible_ns, self._measure_ns,
                         self._measure_ops)

    def seen(self, read: bool, parked: bool) -> None:
        """``feed(Seen(read, parked))`` without making the event (the hot path)."""
        if parked:  # no span runs through a park
            if not read:
                self._stepped = True
            return
        if read and self.timing and self.backlog is not None:
            self._waited_ns += self.backlog()  # Note [Occupancy gates capture]
        k = 0 if read else 1
        if not read:
            self._stepped = True
        if self._open[k]:
            self._spans[k] += 1
        self._open[k] = True

    def _span_count(self) -> int:
        return self._spans[1] if self._stepped else self._spans[0]

    def _moved(self, ev: Moved) -> None:
        if ev.parked:  # Note [Probes are paid for]
            if self._unparked_ns is not None:
                self._phase_ns = ev.now_ns - self._unparked_ns
            self._parked_ns = ev.now_ns
            self._open = [False, False]
        else:
            self._unparked_ns = ev.now_ns
            self._parked_ns = None
            if ev.read is not None:
                self._open[0 if ev.read else 1] = True

    def _threshold(self) -> float:
        """The cost per op (host or device: Note [Fusion saves device time]) above which
        capture pays: on a device, whose launches a fused region replaces with one, two
        captures' worth (Note [Launch-bound devices pay sooner]); else the CPU's four."""
        return LAUNCH_MEASURE_NS_PER_OP if self.launch_bound else MEASURE_NS_PER_OP

    def _regime(self, ops: int) -> tuple[str, bool, int]:
        """(the report's words on the device's occupancy over the measure's ``ops`` ops,
        whether capture is free there, the device time of their launches (0 unknown));
        ``("", False, 0)`` without a backlog probe."""
        if self.backlog is None:
            return "", False, 0
        device = self.device_time() - self._device_ns if self.device_time is not None else None
        seen = Occupancy(self._waited_ns, time.thread_time_ns() - self._measure_ns, device, ops)
        return seen.describe(), seen.capture_is_free, device or 0

    def fusible(self, func: Any) -> bool:
        """Whether ``func`` can fuse (fusion.policy.fusible, memoized per overload)."""
        known = self._fusible.get(func)
        if known is None:
            known = self._fusible[func] = fusible(func)
        return known

    def seeded(self) -> None:
        """The mode seeded the memo from one op (Note [Seeding the memo from real runs])."""
        self._seeds_left -= 1
        if self._seeds_left <= 0:
            self.seeding = False

    # -- warm-up, measures, stops ----------------------------------------------------------
    # Note [The first iteration ends where a boundary recurs]
    # The warm-up ended at the program's first read or the end of its first optimizer step,
    # taken as the end of its first iteration. In a program with two optimizers (a GAN: the
    # discriminator's step, then the generator's) or a read in the middle of its iteration
    # (regression's ``loss = output.item()`` before its backward), that is the middle of the
    # first iteration, and the rest of it was measured (every op timed on the stack, ~20 µs
    # an op against ~3 eagerly): a one-iteration run of the GAN pattern cost 1.8x eager's,
    # regression's 1.9x (``python -m benchmarks.patterns``, ``first``). An iteration ends
    # where it begins again: so the warm-up ends at the second sighting of one boundary, the
    # same optimizer's step ending again or a read at the same line of the program again;
    # the first sighting of each is only noted. A program that runs its loop once runs it
    # all eagerly; one that loops runs its first iteration and the start of its second (up
    # to the recurring boundary) eagerly, then measures. An optimizer is known by a weak
    # reference to it, not its id: this policy outlives blocks, and a later block's new
    # optimizer born at a freed one's address read as its second sighting.
    def end_warmup(self, boundary: Any = None) -> bool:
        """Start capturing (Note [The first iteration runs eagerly]) at the second sighting
        of ``boundary`` (any sighting when None); True if the warm-up ended now."""
        if self.phase is not _WARMING:
            return False
        if boundary is not None and boundary not in self._boundaries:
            self._boundaries.add(boundary)
            return False
        self._calls = 0
        self._capture_or_measure("the warm-up ended")
        return True

    def _capture_or_measure(self, why: str) -> None:
        if not self.measure or not self.enabled:
            self._move(_CAPTURING, why)
            return
        self._start_timing()
        self._empty_measures = 0
        self._first_per_op = None
        self._measure_end_ns = self._measure_ns + MEASURE_MAX_NS  # settling included
        self._measure_ops = self.passed
        self._measure_spans = self._span_count()
        self._move(_SETTLING, f"{why}: measuring what ops cost")

    def _stop(self, why: str | None, to: Phase = _PASSING) -> None:
        """Deferral stops (``why``: the reason it gives while passing through)."""
        if why is not None:
            self._stopped = why
        if self._move(to) and self.on_stop is not None:
            self.on_stop()

    def note(self, verdict: Verdict) -> None:
        """Record one flushed window's verdict.

        A training step can span many windows, all novel on the first iteration, so
        novel windows stop deferral only after a much longer run of them
        (``novel_patience``): a program whose windows never recur (a new shape every
        step) gains nothing from capture.

        ``pending``: the window's regions are still compiling. Deferral stops until no
        compile is in flight (``in_flight() == 0``), then resumes to judge the window
        with its compiled regions (Note [Waiting for compiles runs eagerly]).
        """
        if self.phase is _PROBING:  # the probe's window: its verdict decides
            self._move(_PASSING)
        if verdict.pending:
            if self.enabled and self._in_flight is not None:
                self._landed_at = self._landed() if self._landed is not None else 0
                self._stop(None, _WAITING)
            return
        worth, stop = self.tally.weigh(verdict, self.enabled, self.patience, self.novel_patience)
        if stop is not None:
            self._stop(stop)
        elif worth and self.phase is not _CAPTURING:
            self._move(_CAPTURING, "a window is worth compiling")

    # -- what it says -----------------------------------------------------------------------
    @property
    def warming(self) -> bool:
        """Whether the first iteration is still running (_WARMING)."""
        return self.phase is _WARMING

    @property
    def measuring(self) -> bool:
        """Whether a measure is under way (settling, timing or seeding)."""
        p = self.phase  # identity tests: ``in`` a tuple of members costs ~0.2 µs
        return p is _SETTLING or p is _MEASURING or p is _SEEDING

    @property
    def reason(self) -> str:
        """Why ops pass straight through now (for logs and the report), or ``""``."""
        p = self.phase
        if p is _CAPTURING:
            return ""
        if p is _WARMING:
            return WARMUP_REASON
        if p is _WAITING:
            return WAITING_REASON
        return self._stopped or f"{self.tally.streak} windows in a row held nothing worth compiling"

    @property
    def why_deferring(self) -> str:
        """Why the policy defers (or captures a probe) now, for the report's phases."""
        return self._why

    # Note [A region landing ends the wait]
    # A window whose regions are compiling sends the policy waiting (Note [Waiting for
    # compiles runs eagerly]): ops pass straight through until no compile is in flight.
    # Other regions may be ready long before the last compile ends: the kept demo's
    # second run loaded its step's regions from the disk cache in its first seconds but
    # also compiled one more (a window the first run had cut differently, 8.6 s), and
    # passed 85 steps (~20 s) through, its loaded regions unused, until that compile
    # ended. So any compile or disk load that ends (``landed``, a count the compile
    # service keeps) ends the wait too: the next window is captured and judged; if its
    # regions are still compiling it waits again (one window's capture per landing).
    def should_defer(self, weight: int = 1) -> bool:
        """O(1): whether to open a window (the hot path of feeding a call's worth of
        ticks). ``weight``: how many calls this one stands for (a safe point at the end
        of an optimizer step stands for a step's worth of torch calls)."""
        p = self.phase
        if p is _CAPTURING or p is _PROBING:
            return True
        if p is _WAITING:
            # Note [Waiting for compiles runs eagerly]: compiles landing end the wait
            # (no probe meanwhile: the wait ends by itself, compile_timeout_s at most)
            if self._in_flight() == 0:  # type: ignore[misc]
                self._move(_CAPTURING, "compiles finished")
                return True
            if self._landed is not None and self._landed() != self._landed_at:
                # Note [A region landing ends the wait]
                self._move(_CAPTURING, "a region is ready")
                return True
            return False
        if p is not _PASSING and p is not _WARMING:
            return False  # measuring, seeding, off
        self._calls += weight
        if self._calls < self.probe_every:
            return False
        if self._parked_ns is not None and self._phase_ns:
            # Note [Probes are paid for]: not before the last phase is paid for
            if time.perf_counter_ns() < self._parked_ns + self._phase_ns / PROBE_SHARE:
                self._calls = self.probe_every // 2  # look at the clock again later
                return False
        self._calls = 0
        if p is _WARMING:
            self._capture_or_measure("a probe ended the warm-up")
            return self.phase is _CAPTURING
        if self.measure:
            self._capture_or_measure("a probe")
            return False
        self._move(_PROBING, "a probe")
        return True


__all__ = [
    "RESHAPED_WEIGHT", "RESHAPED_STREAK", "GROWING_REASON", "RESHAPED_REASON", "CANNOT_PAY_EVIDENCE_NS", "CANNOT_PAY_SHARE", "PROBE_SHARE", "MEASURE_OPS",
    "SEED_OPS", "MEASURE_MAX_NS", "EMPTY_MEASURES", "MEASURE_NS_PER_OP", "LAUNCH_MEASURE_NS_PER_OP", "DEVICE_BOUND_SHARE", "WARMUP_REASON",
    "WAITING_REASON", "SAFE_POINT_WEIGHT", "READ_WEIGHT", "MODULE_CALL_WEIGHT", "DeferPolicy", "Verdict",
    "Phase", "Act", "At", "SafePoint", "Seen", "Moved", "WarmupEnded",
]
