"""Adaptive pass-through: tell the mode when deferring buys nothing.

Deferring costs a few µs per op; it pays only when windows contain regions worth
compiling. :class:`DeferPolicy` watches every flushed window (fed by the executor) and
answers :meth:`should_defer` in O(1) for the mode.

Protocol for the mode (the dispatch owner wires it):

* ``executor.should_defer()`` before opening a new window (recorder empty): False means
  "run this op straight through". While it answers False, it answers True once every
  ``probe_every`` calls, so a window is captured now and then and judged again.
* the executor calls ``note_window(n_ops, worth)`` after each flush itself.

Example::

    >>> p = DeferPolicy(patience=2, probe_every=3)
    >>> p.note_window(50, False); p.note_window(50, False)
    >>> [p.should_defer() for _ in range(4)]
    [False, False, True, False]
    >>> p.note_window(50, True); p.should_defer()
    True
    >>> w = DeferPolicy(warmup=True)     # the first iteration runs eagerly
    >>> w.should_defer(), w.end_warmup(), w.should_defer()
    (False, True, True)
"""

from __future__ import annotations

from typing import Callable


# Note [Capture must cost less than the work]
# Fusion pays back at most the window's eager time, while capturing costs about
# CAPTURE_NS_PER_OP per op in Python (measured: ~15-20 µs/op on this 2-core CPU,
# benchmarks/README.md). A window whose ops run faster eagerly than that (hidden size
# 32, many tiny ops) cannot win however well it fuses: it counts as not worth
# deferring, whatever the partitioner thinks of its regions. Once a window recurs, the
# executor also measures it: the wall time from its first captured op to the end of its
# run must be below its eager time, or it does not count as worth it. (That span also
# holds the program's own Python between ops, which eager spends too: the test errs
# towards passing through.)
CAPTURE_NS_PER_OP = 15_000

# How many novel windows one "reshaped" novel window counts for (DeferPolicy.note_window):
# with novel_patience 48, a first sighting and two reshaped ones stop deferral.
RESHAPED_WEIGHT = 24


def pays_for_capture(eager_ns: float, n_ops: int) -> bool:
    """Whether a window whose eager run took ``eager_ns`` is worth capturing."""
    return eager_ns >= n_ops * CAPTURE_NS_PER_OP


class DeferPolicy:
    """Stops deferral after ``patience`` windows in a row with nothing worth compiling.

    ``enabled=False`` (option ``adaptive_passthrough``) always defers.
    """

    def __init__(self, enabled: bool = True, patience: int = 8, probe_every: int = 20_000,
                 novel_patience: int = 48, in_flight: Callable[[], int] | None = None,
                 on_wait: Callable[[bool], None] | None = None, warmup: bool = False):
        self.enabled = enabled
        # Note [The first iteration runs eagerly]
        # Capturing a window the first time costs its ops' Python capture (15-90 µs each)
        # plus cold metadata kernels, and buys nothing yet: a region compiles on a later
        # sighting. So a warming policy starts out passing ops straight through, and
        # capture starts where the program's iterations begin: its first read of a value
        # (``loss.item()``, print, in the program's own code: torch's reads, like AdamW's
        # of its step count, do not count; the owner calls end_warmup) or the end of its
        # first optimizer step (a safe point). A program that does neither starts capturing
        # at the first probe (``probe_every`` calls). Its first iteration then costs what
        # eager's does, with no capture and no compile.
        self.warming = enabled and warmup
        self._in_flight = in_flight
        self._on_wait = on_wait  # told when a compile wait starts (True) and ends (False)
        self._waiting = False
        self.patience = patience
        self.probe_every = probe_every
        self.novel_patience = novel_patience
        self._novel_streak = 0
        self._streak = 0
        self._defer = not self.warming
        self._calls = 0

    def end_warmup(self) -> bool:
        """Start capturing (Note [The first iteration runs eagerly]); True if warming."""
        if not self.warming:
            return False
        self.warming = False
        self._defer = True
        self._calls = 0
        return True

    def note_window(self, n_ops: int, worth: bool, novel: bool = False,
                    pending: bool = False, reshaped: bool = False) -> None:
        """Record one flushed window: ``worth`` when it held a region worth compiling;
        ``novel`` for a window never seen before (its worth is unknown yet).

        A training step can span many windows, all novel on the first iteration, so
        novel windows stop deferral only after a much longer run of them
        (``novel_patience``): a program whose windows never recur (a new shape every
        step) gains nothing from capture.

        ``pending``: the window's regions are still compiling. Deferral stops until no
        compile is in flight (``in_flight() == 0``), then resumes to judge the window
        with its compiled regions (Note [Waiting for compiles runs eagerly]).
        """
        if pending:
            if self.enabled and self._in_flight is not None:
                if not self._waiting and self._on_wait is not None:
                    self._on_wait(True)
                self._waiting = True
                self._defer = False
            return
        if novel:
            if n_ops >= 4:
                # ``reshaped``: the same ops as a window seen before, on other shapes (a
                # sequence length that changes every step). Such windows will not recur
                # either, and capturing each costs its ops' metadata kernels afresh
                # (~0.5 ms per op for torch's Python ones), so they count RESHAPED_WEIGHT-
                # fold: the second reshaped window in a row passes through (measured: a
                # GPT forward with a new length each step costs 3-4x eager to capture).
                self._novel_streak += RESHAPED_WEIGHT if reshaped else 1
                if self.enabled and self._novel_streak >= self.novel_patience:
                    self._defer = False
            return
        self._novel_streak = 0
        if worth:
            self._streak = 0
            self._defer = True
        elif n_ops >= 4:  # one or two ops say nothing about the program
            self._streak += 1
            if self.enabled and self._streak >= self.patience:
                self._defer = False

    @property
    def reason(self) -> str:
        """Why ops pass straight through now (for logs), or ``""`` while deferring."""
        if self._defer:
            return ""
        if self.warming:
            return "warm-up: the first iteration runs eagerly"
        if self._waiting:
            return "waiting for compiles in flight"
        if self._novel_streak >= self.novel_patience:
            return f"{self._novel_streak} windows in a row never seen before (they do not recur)"
        return f"{self._streak} windows in a row held nothing worth compiling"

    def should_defer(self, weight: int = 1) -> bool:
        """O(1). ``weight``: how many calls this one stands for (a safe point at the end
        of an optimizer step stands for a step's worth of torch calls)."""
        if self._defer:
            return True
        if self._waiting and self._in_flight() == 0:  # type: ignore[misc]
            self._waiting = False
            self._defer = True
            if self._on_wait is not None:
                self._on_wait(False)
            return True
        self._calls += weight
        if self._calls >= self.probe_every:
            self._calls = 0
            if self.warming:
                self.end_warmup()
            return True
        return False


__all__ = ["DeferPolicy", "CAPTURE_NS_PER_OP", "pays_for_capture"]
