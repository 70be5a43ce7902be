"""The policy's measure of what ops cost, before capture starts: its Notes and bounds.

``DeferPolicy`` (runtime/adapt.py) runs the measure; the bounds are read there through
its own module names (tests set them on ``runtime.adapt``).

Example::

    >>> from adaptive_eager.runtime.measure import MEASURE_NS_PER_OP, LAUNCH_MEASURE_NS_PER_OP
    >>> MEASURE_NS_PER_OP == 2 * LAUNCH_MEASURE_NS_PER_OP
    True
"""

from __future__ import annotations

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


__all__ = ["MEASURE_OPS", "SEED_OPS", "MEASURE_MAX_NS", "EMPTY_MEASURES", "MEASURE_NS_PER_OP",
           "LAUNCH_MEASURE_NS_PER_OP"]
