"""The optimizer steps a measure leaves out (Note [Steps compiled on their own are not
measured]): their CPU time and ops, for the deferral policy (runtime/adapt.py).

Example::

    >>> o = OwnedSteps()
    >>> m = o.mark(passed=10, unfusible_ns=0, measure_ns=0)
    >>> o.close(m, timing=True, passed=13, unfusible_ns=0, measure_ns=0, measure_ops=0)
    >>> o.ops, o.ns > 0, o.open
    (3, True, None)
"""

from __future__ import annotations

import time

# The time a measure may run on over MEASURE_MAX_NS (runtime/measure.py), for the optimizer
# steps it left out (90 ms: nine measures' worth).
OWNED_MAX_NS = 90_000_000

# Note [Steps compiled on their own are not measured]
# A candidate optimizer's step is the step compiler's (dispatch/optim_compile.py): it
# runs as one compiled function once it has cost enough, whatever capture decides,
# so capture can gain nothing from its ops. A measure that counted them judged the
# program by its optimizer: SGD-momentum over 100 tensors, whose program between
# steps is a probe read (two selects and an .item()), measured "5531 µs an op" over
# its step's foreach ops and captured, and every read then cost a two-op window's
# capture and flush (351 µs against 9 µs eagerly; the step itself 3.2 ms). So the
# mechanism marks such a step's start (:meth:`step_mark`) and hands the mark back at
# its end (:meth:`step_owned`); while timing, the step's CPU time (less the ops that
# cannot fuse inside it, already left out) and its ops are left out of the measure,
# and its time does not count against the measure's MEASURE_MAX_NS either (up to
# OWNED_MAX_NS more): a debugging backend compiles the step inside it, and AdamW
# reads its step counters there, and a measure that ran out of time inside a step had
# seen none of the program's other ops (a tiny MLP parked "over 0 ops"). A step that
# began before the timing did counts from the timing's start; one still open at a
# safe point counts up to it (the first compiled call's check reads inside it). That
# holds when the timing starts inside the step: AdamW's counter reads are safe points
# where the measure's settling span can end, and its timing then began with the step
# forgotten: on a slower VM (settling past MEASURE_MAX_NS at the second step) the
# step's eager run and compile (~10 ms) were the whole measure, which judged "10127 µs
# each (measured over 0 ops)" and parked a training loop (tests/test_warmup.py).


class OwnedSteps:
    """CPU time (``ns``) and ops (``ops``) of the steps left out of the current measure,
    and the mark of the step open now (``open``), if any."""

    def __init__(self) -> None:
        self.ns = 0
        self.ops = 0
        self.open: tuple | None = None

    def reset(self, keep_open: bool = False) -> None:
        """A new measure's timing starts; ``keep_open``: a step open now stays open (the
        timing starts inside it, :meth:`close` counts it from there)."""
        self.ns = self.ops = 0
        if not keep_open:
            self.open = None

    def mark(self, passed: int, unfusible_ns: int, measure_ns: int) -> tuple:
        """A step starts (or an open one is counted up to now): its mark."""
        self.open = (time.thread_time_ns(), passed, unfusible_ns, measure_ns)
        return self.open

    def close(self, mark: tuple | None, timing: bool, passed: int, unfusible_ns: int,
              measure_ns: int, measure_ops: int) -> None:
        """The step of ``mark`` ends (or is counted so far): its time, less the ops that
        cannot fuse inside it (already left out), and its ops, while ``timing``."""
        if self.open is not None:  # ``mark``, or its newer mark (counted up to it)
            mark, self.open = self.open, None
        if mark is None or not timing:
            return
        t0, passed0, unfusible0, measure0 = mark
        if measure0 != measure_ns:  # the timing (re)started inside the step
            t0, passed0, unfusible0 = measure_ns, measure_ops, 0
        self.ns += max(0, time.thread_time_ns() - t0 - (unfusible_ns - unfusible0))
        self.ops += max(0, passed - passed0)


__all__ = ["OWNED_MAX_NS", "OwnedSteps"]
