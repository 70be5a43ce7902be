"""The policy's measure of what ops cost, before capture starts: its Notes, bounds and verdict.

``DeferPolicy`` (runtime/adapt.py) runs the measure (its clocks, spans and moves); the
bounds are read there through its own module names (tests set them on ``runtime.adapt``);
:func:`decide` turns a finished measure's :class:`Reading` into its :class:`Decision`.

Example::

    >>> from adaptive_eager.runtime.measure import MEASURE_NS_PER_OP, LAUNCH_MEASURE_NS_PER_OP
    >>> MEASURE_NS_PER_OP == 2 * LAUNCH_MEASURE_NS_PER_OP
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from .occupancy import span_cost
from .verdicts import CAPTURE_NS_PER_OP

# Note [Measure before capturing]
# Capturing the first windows of a session costs far more than their ops (cold metadata
# kernels: torch's Python refs and decompositions run ~0.5 ms per new op; measured on
# the regression pattern: 31 ops captured in 14 ms, a third of the program's 40 ms), and
# whether capture can pay is plain from the ops' own cost: fusing saves at most what
# the ops take, and capturing one costs CAPTURE_NS_PER_OP or more. So where capture
# would start (the warm-up's end, a probe) the policy first measures: the mode goes
# back on the stack passing ops through (counted; ~8 µs each) until MEASURE_OPS ops and
# one whole span (an optimizer step's end to the next in a program that steps an
# optimizer, else a read to the next: an iteration, whose op count estimates what a
# parked mode runs, Note [Counting while passing through] in runtime/counters.py) have
# passed, or MEASURE_MAX_NS of CPU time in all, settling included (an LBFGS step is
# ~20,000 ops, each ~3x dearer passed through on the stack than run parked),
# and at the next safe point it compares the time per op
# (the ops, the program's Python between them, the pass-through) with
# MEASURE_NS_PER_OP (the thread's CPU time, which other processes on a loaded machine do
# not inflate, and which a device's busy-waits and launches are part of): below it
# (tiny ops, a small model's training step) the mode parks
# without capturing anything; above it, capture starts and windows are judged as
# before. Measuring costs one pass-through of MEASURE_OPS ops or more (~0.3 ms; a backward
# pass with no safe point inside can be thousands). Measured per op
# at 64f5bd7 on this 2-core CPU (1 thread): regression 11 µs, tiny MLP 12 µs, nanoGPT
# tiny 17 µs, word_language_model LSTM 29 µs; the GPT benchmark step (d=256) 600 µs, the
# pointwise block 3 ms, the emulated neuron MLP (20 µs launches) 87 µs. The threshold is
# four captures' worth: the time per op holds the pass-through (~8 µs) and the program's
# Python, and a first sighting costs far more than CAPTURE_NS_PER_OP (its metadata
# kernels: torch's meta functions for addmm, gelu and the like are Python
# decompositions, 0.1-1 ms an op, paid once per shape). At three (45 µs) the loss_print
# pattern (26 µs an op eagerly, timed at 39-50 µs) flipped between parking and capturing
# three cold windows (15-30 ms on a 74 ms program) from one run to the next.

# Note [The first span settles]
# The first span on the stack after the warm-up is not timed: the first time a Python
# dispatch mode sees an op, torch itself builds per-op state (its dispatch-rule registry
# and effect tables, ~50-100 µs an op), and the runtime its op tables; the warm-up ran
# parked, so none of that was paid yet. Measured on the loss_print pattern (SGD training
# of a 3-layer MLP, ~26 µs per op eagerly): the first span after the warm-up timed
# 85-125 µs per op in fresh processes (so capture started, and three cold windows cost
# 15-30 ms against a 74 ms program), the second 38-47 µs. So a measure waits for one
# whole span to pass (counted, not timed) and times the next; MEASURE_MAX_NS bounds both.
MEASURE_OPS = 32
# Seeding costs ~8 µs an op (its key and specs), so a seeding span seeds this many ops
# at most (~2 ms): a backward pass of 3,400 ops with no safe point inside (LBFGS on an
# LSTMCell sequence) would otherwise seed all of them, 27 ms on a 165 ms program.
SEED_OPS = 256
MEASURE_MAX_NS = 10_000_000

# Note [A measure that saw no op judges nothing]
# A measure whose time ran out before any op of the program's own passed (all of it
# inside optimizer steps left out, Note [Steps compiled on their own are not measured],
# past their OWNED_MAX_NS allowance, or safe points with nothing between them) has no
# figure: its "time per op" was the whole time over one op, and it parked a training
# loop as "10127 µs each (measured over 0 ops passed through): less than capturing one
# costs", which is neither measured nor true. So it starts its timing again, up to
# EMPTY_MEASURES times; a program that still shows no op of its own between those steps
# has nothing to capture, and the policy parks saying so.
EMPTY_MEASURES = 3

# Note [Noise only adds: capture is measured twice]
# Whatever else runs on the machine can only make a measure read dearer (another process
# on the sibling core, a page-fault storm, a collection of the garbage collector inside
# the span), never cheaper. So a measure below the threshold parks at once, and one above
# it is taken again, the next span alike, and the lesser of the two decides. Measured on
# the loss_print pattern (a 3-layer MLP's SGD training, 33-35 µs an op alone on the
# 2-core VM of 2026-12-02): in one test-suite run it read 64 µs with every kind of op
# twice as dear (its matmuls too: 2.2 ms against 1.1-1.4 ms), captured, and ended
# capturing. A program whose ops are dear reads dear twice and captures one measure
# later (MEASURE_OPS more ops passed through and a span, ~0.3 ms on the patterns).
MEASURE_NS_PER_OP = 4 * CAPTURE_NS_PER_OP
# Note [Launch-bound devices pay sooner] (runtime/occupancy.py)
LAUNCH_MEASURE_NS_PER_OP = 2 * CAPTURE_NS_PER_OP
# Note [Occupancy gates capture]: runtime/occupancy.py.

# Note [Only fusible ops pay for capture]
# Fusion can only save time inside ops that fuse (fusion.policy.fusible: pointwise,
# reductions, views); a matmul or an opaque kernel (an LSTM's aten::mkldnn_rnn_layer) runs
# as fast alone. So while measuring, the mode times each op that cannot fuse, and the
# time per op is (the measure's CPU time less those ops') over all ops passed through
# (each would be captured). A span longer than MEASURE_MAX_NS used to be judged on its
# untimed settling part (cold per-op state included: Note [The first span settles]);
# now timing starts there, for MEASURE_MAX_NS more at most. Measured (1 thread, loaded
# 2-core machine, tests/test_phases.py): an LSTM LM (hidden 128, 20 steps) took 59 µs an
# op whole and captured in one run of two (120 ops, then "windows did not pay"); with its
# rnn and matmul kernels left out (0.8-1.9 ms a measure), 29-50 µs: it parks, capturing
# nothing. A 384x384 matmul among 5 tiny pointwise ops: captured before, parks now. Not
# covered: a composite op's own C++ between the ops it dispatches (hidden 256: 96 µs).


@dataclass(frozen=True)
class Reading:
    """What one finished measure saw (``DeferPolicy.on_stack`` reads it off its clocks).

    ``ops``: ops passed through, those of steps compiled on their own left out;
    ``host_ns``: the measure's CPU time less ops that cannot fuse and those steps;
    ``device_ns``: its launches' device time (0 unknown); ``unfusible_ns`` / ``owned_ns``:
    what was left out, for the words; ``regime``: the device occupancy's words, and
    ``free`` whether capture is free there (Note [Occupancy gates capture]);
    ``first_per_op``: the first measure's figure when this one confirms it;
    ``threshold``: the cost per op above which capture pays."""

    ops: int
    host_ns: int
    device_ns: int
    unfusible_ns: int
    owned_ns: int
    regime: str
    free: bool
    first_per_op: float | None
    threshold: float


@dataclass(frozen=True)
class Decision:
    """A measure's outcome: ``act`` "capture", "again" (confirm a figure that would capture:
    Note [Noise only adds: capture is measured twice]) or "stop"; ``per_op``: the figure;
    ``why``: the report's words (empty for "again")."""

    act: str
    per_op: float
    why: str = ""


def decide(r: Reading) -> Decision:
    """Whether capture pays, from a finished measure (Note [Measure before capturing]).

    Example::

        >>> cheap = Reading(40, 400_000, 0, 0, 0, "", False, None, 60_000.0)
        >>> decide(cheap).act, decide(cheap).why
        ('stop', 'ops took 10.0 µs each (measured over 40 ops passed through): less than capturing one costs, so capture cannot pay')
        >>> dear = Reading(40, 4_000_000, 0, 0, 0, "", False, None, 60_000.0)
        >>> decide(dear).act, decide(Reading(**{**dear.__dict__, "first_per_op": 90_000.0})).act
        ('again', 'capture')
    """
    # Note [Only fusible ops pay for capture]: time inside ops that cannot fuse is left out
    # Note [Fusion saves device time] (occupancy.py): the larger of host and device time
    per_op = span_cost(r.host_ns, r.device_ns) / max(r.ops, 1)
    apart = f"; {r.unfusible_ns / 1e6:.1f} ms in ops that cannot fuse left out" if r.unfusible_ns else ""
    if r.owned_ns:
        apart += f"; {r.owned_ns / 1e6:.1f} ms in optimizer steps compiled on their own left out"
    if r.device_ns > r.host_ns:
        apart += "; the device's time, the larger"
    # Note [Noise only adds: capture is measured twice]
    if r.first_per_op is not None:
        per_op = min(per_op, r.first_per_op)
        apart += f"; the lesser of two measures, {r.first_per_op / 1e3:.0f} µs first"
    elif r.ops and not r.free and per_op >= r.threshold:
        return Decision("again", per_op)
    if r.free or (r.ops and per_op >= r.threshold):
        return Decision("capture", per_op, f"{r.regime}ops took {per_op / 1e3:.0f} µs each "
                                           f"(over {r.ops} ops{apart}): worth capturing")
    if r.ops <= 0:
        return Decision("stop", per_op, f"no op passed through in {EMPTY_MEASURES + 1} measures but "
                                        f"inside optimizer steps compiled on their own{apart}: nothing to capture")
    return Decision("stop", per_op, f"{r.regime}ops took {per_op / 1e3:.1f} µs each (measured over {r.ops} "
                                    f"ops passed through{apart}): less than capturing one costs, so capture cannot pay")


__all__ = ["MEASURE_OPS", "SEED_OPS", "MEASURE_MAX_NS", "EMPTY_MEASURES", "MEASURE_NS_PER_OP",
           "LAUNCH_MEASURE_NS_PER_OP", "Reading", "Decision", "decide"]
