"""The verdicts' side of the deferral policy: what a run of flushed windows says.

:class:`Tally` holds the streaks and sums :class:`~.adapt.DeferPolicy` decides from when
it is fed a :class:`Verdict` (windows in a row with nothing worth compiling, novel and
reshaped windows in a row, the eager and capture time of windows that cannot pay) and
answers whether the window was worth capturing and, when deferral should stop, why.
The phase itself is the policy's (runtime/adapt.py).

Example::

    >>> t = Tally()
    >>> t.weigh(Verdict(50), enabled=True, patience=2, novel_patience=48)
    (False, None)
    >>> t.weigh(Verdict(50), enabled=True, patience=2, novel_patience=48)
    (False, '2 windows in a row held nothing worth compiling')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one flushed window says about deferring (weighed by ``adapt.DeferPolicy``).

    ``ops``: its size; ``worth``: it held a region that is (or may become) compiled and
    pays for its capture; ``novel``: a first sighting (worth unknown yet); ``reshaped``: a
    first sighting of ops seen lately on other shapes; ``pending``: its regions are
    compiling (Note [Waiting for compiles runs eagerly]); ``eager_ns`` / ``capture_ns``:
    its eager run and its capture (first op to flush) when it was replayed eagerly and
    timed (Note [Windows that cannot pay stop deferral], runtime/verdicts.py); ``grew``: a
    reshaped window whose values are each at least as large as last time (a growing
    sequence, Note [Growing windows stay eager under forced capture]).
    """

    ops: int
    worth: bool = False
    novel: bool = False
    reshaped: bool = False
    pending: bool = False
    eager_ns: int | None = None
    capture_ns: int | None = None
    grew: bool = False


# Note [Capture must cost less than the work]
# Fusion pays back at most the window's eager time, while capturing costs about
# CAPTURE_NS_PER_OP per op in Python (measured: ~15-20 µs/op on this 2-core CPU,
# benchmarks/README.md). A window whose ops run faster eagerly than that (hidden size
# 32, many tiny ops) cannot win however well it fuses: it counts as not worth
# deferring, whatever the partitioner thinks of its regions. Once a window recurs, the
# executor also measures it: the wall time from its first captured op to the end of its
# run must be below its eager time, or it does not count as worth it. (That span also
# holds the program's own Python between ops, which eager spends too: the test errs
# towards passing through.) It lives here, with Verdict, so that the policy imports
# neither the executor nor the window log (Note [The window is built at the first
# capture], dispatch/mode.py).
CAPTURE_NS_PER_OP = 15_000

# How many novel windows one "reshaped" novel window counts for (Tally.weigh):
# with novel_patience 48, a first sighting and two reshaped ones stop deferral.
RESHAPED_WEIGHT = 24

# Note [Growing windows stay eager under forced capture]
# A window that comes back with new shapes every time (nanoGPT's sampling loop: the
# sequence grows a token a step) never recurs, so nothing compiles for it (Note [First
# sightings are not planned]), and capturing it costs each op's metadata kernels afresh.
# With capture forced (adaptive_passthrough off) nothing stopped that: issue 26 measured
# 120 sampled tokens at 10.5x eager with 0 regions compiled (190x before first sightings
# were left unplanned, one compile per length). Of bucketing (pads: results differ from
# eager's), dynamic shapes (a symbolic capture, not built) and staying eager, the policy
# stays eager: at a window that came back grown (the same ops, every value at least as
# large as last time: Verdict.grew) right after another novel window, or after
# RESHAPED_STREAK windows in a row with new shapes, it stops deferring even under forced
# capture, the report's phase says so, and a probe captures again later (a window that
# stopped growing recurs and compiles). One larger batch among recurring windows is not
# growth, nor are an epoch's shorter last batch and an evaluation's (word_language_model
# parked under forced capture when two reshaped windows in a row were enough).
# Default options already passed such windows through after two (RESHAPED_WEIGHT); this
# only adds the forced case. Measured with ``python -m benchmarks.data_patterns sample
# --reps 7`` (120 tokens, the model made before the block): 2 windows captured, 0 regions
# compiled; the times are in the README's Limitations.
RESHAPED_STREAK = 8
GROWING_REASON = ("staying eager: a window came back grown (a growing sequence); nothing "
                  "compiles for such windows (no dynamic shapes)")
RESHAPED_REASON = ("staying eager: {n} windows in a row came back with new shapes; nothing "
                   "compiles for such windows (no dynamic shapes)")


# Note [Windows that cannot pay stop deferral]
# A window replayed eagerly and timed (a first sighting, or one whose capture cannot pay)
# tells at once whether capturing it can ever pay: fusing it can save at most its eager
# run, and its capture (first op to flush) cost more than that. Counting such windows one
# by one (patience 8 for planned windows, 48 for novel ones) let a small program spend
# most of its time capturing before it passed through: measured at 64f5bd7 (CPU time, 1
# thread), a regression with a manual update 1.4x eager over 200 steps (10 windows of 21
# ops, each ~25x dearer to capture than to run), LBFGS with a closure 3.2x (62 novel
# windows, 10,694 ops), a tiny nanoGPT 3.5x (771 windows). So the policy also sums, over
# the timed windows since the last one worth compiling, their eager runs and their
# captures, and stops deferring once CANNOT_PAY_EVIDENCE_NS of capture has been spent and
# the eager runs add up to less than CANNOT_PAY_SHARE of it: even capture at that share
# of today's cost would not break even. The bound on what that costs a program is the
# evidence itself (a few ms), plus the probes (Note [Probes are paid for]).
CANNOT_PAY_EVIDENCE_NS = 3_000_000
CANNOT_PAY_SHARE = 0.5

# Note [Small windows count in part]
# A window of one to three ops says little about a program (a read between two parts of
# a big window), so it used not to count towards ``patience`` at all. But a program can
# be made of nothing else: a training loop whose optimizer step is compiled on its own
# (dispatch/optim_compile.py) and whose only other ops are a probe read, two selects and
# an ``.item()``, captured every iteration for ever: SGD-momentum over 100 tensors, each
# read 351 µs captured against 9 µs eagerly (its 3.2 ms step: 11% of the program). So
# small windows count in part: every SMALL_WINDOW_OPS of their ops, in windows with
# nothing worth compiling, count as one window in the streak; a window worth compiling
# resets both. One or two small windows between big ones that are worth compiling never
# reach ``patience``.
SMALL_WINDOW_OPS = 4


class Tally:
    """The streaks and sums of the verdicts seen so far (mutable; one per policy)."""

    def __init__(self) -> None:
        self.streak = 0  # windows in a row with nothing worth compiling
        self.small_ops = 0  # Note [Small windows count in part]: their ops not yet counted
        self.novel_streak = 0  # novel windows in a row, reshaped ones RESHAPED_WEIGHT-fold
        self.reshaped_streak = 0  # Note [Growing windows stay eager under forced capture]
        self.novel_run = 0  # novel windows in a row (of 4 ops or more)
        self.spent_eager = 0  # Note [Windows that cannot pay stop deferral]
        self.spent_capture = 0
        self.spent_windows = 0

    def weigh(self, verdict: Verdict, enabled: bool, patience: int,
              novel_patience: int) -> tuple[bool, str | None]:
        """(the window was worth capturing, why deferral stops or None).

        A training step can span many windows, all novel on the first iteration, so
        novel windows stop deferral only after a much longer run of them
        (``novel_patience``): a program whose windows never recur (a new shape every
        step) gains nothing from capture. ``enabled=False`` (capture forced) stops only
        for growing windows.
        """
        n_ops = verdict.ops
        if verdict.worth:
            self.spent_eager = self.spent_capture = self.spent_windows = 0
        elif verdict.eager_ns is not None and verdict.capture_ns is not None and n_ops >= 4:
            self.spent_eager += verdict.eager_ns
            self.spent_capture += verdict.capture_ns
            self.spent_windows += 1
            if enabled and self.spent_windows >= 2 and \
                    self.spent_capture >= CANNOT_PAY_EVIDENCE_NS and \
                    self.spent_eager < CANNOT_PAY_SHARE * self.spent_capture:
                why = (f"windows did not pay for their capture: they ran in "
                       f"{self.spent_eager / 1e6:.1f} ms eagerly and took "
                       f"{self.spent_capture / 1e6:.1f} ms to capture")
                self.spent_eager = self.spent_capture = self.spent_windows = 0
                return False, why
        if verdict.novel:
            return False, self._novel(verdict, enabled, novel_patience)
        self.novel_streak = self.reshaped_streak = self.novel_run = 0
        if verdict.worth:
            self.streak = self.small_ops = 0
            return True, None
        if n_ops >= SMALL_WINDOW_OPS:
            self.streak += 1
        else:  # Note [Small windows count in part]
            self.small_ops += n_ops
            if self.small_ops < SMALL_WINDOW_OPS:
                return False, None
            self.small_ops -= SMALL_WINDOW_OPS
            self.streak += 1
        if enabled and self.streak >= patience:
            return False, f"{self.streak} windows in a row held nothing worth compiling"
        return False, None

    def _novel(self, verdict: Verdict, enabled: bool, novel_patience: int) -> str | None:
        if verdict.ops < 4:
            return None
        # ``reshaped``: the same ops as a window seen before, on other shapes (a sequence
        # length that changes every step). Such windows will not recur either, and
        # capturing each costs its ops' metadata kernels afresh (~0.5 ms per op for
        # torch's Python ones), so they count RESHAPED_WEIGHT-fold: the second reshaped
        # window in a row passes through (measured: a GPT forward with a new length each
        # step costs 3-4x eager to capture).
        self.novel_streak += RESHAPED_WEIGHT if verdict.reshaped else 1
        self.reshaped_streak = self.reshaped_streak + 1 if verdict.reshaped else 0
        self.novel_run += 1
        if enabled and self.novel_streak >= novel_patience:
            return f"{self.novel_streak} windows in a row never seen before (they do not recur)"
        if not enabled and ((verdict.grew and self.novel_run >= 2) or
                            self.reshaped_streak >= RESHAPED_STREAK):
            # Note [Growing windows stay eager under forced capture]
            return (GROWING_REASON if verdict.grew else RESHAPED_REASON).format(n=self.reshaped_streak)
        return None


__all__ = ["RESHAPED_WEIGHT", "RESHAPED_STREAK", "GROWING_REASON", "RESHAPED_REASON",
           "CANNOT_PAY_EVIDENCE_NS", "CANNOT_PAY_SHARE", "Tally"]
