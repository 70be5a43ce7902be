"""The deferral policy's phases, the events it is fed, and the answers it gives.

:class:`~adaptive_eager.runtime.adapt.DeferPolicy` is one state machine: its state is one
:class:`Phase` (never a combination of flags), it moves only where :data:`ALLOWED` says
(as runtime/windows.py's region states do), and everything it learns arrives as one of
the immutable events below, through ``DeferPolicy.feed``. This module holds the
vocabulary; the decisions (thresholds, Notes) are in runtime/adapt.py.

Example::

    >>> Phase.PASSING in ALLOWED[Phase.CAPTURING], Phase.CAPTURING in ALLOWED[Phase.OFF]
    (True, False)
    >>> SafePoint(At.READ, parked=True).read
    True
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Phase(enum.Enum):
    """Where the policy is. Deferring: CAPTURING and PROBING; on the stack passing ops
    through and timing them: SETTLING, MEASURING, SEEDING; parked or passing through:
    WARMING, WAITING, PASSING, OFF."""

    WARMING = "warming"      # the first iteration runs eagerly (Note [The first iteration runs eagerly])
    SETTLING = "settling"    # measuring: one whole span passes, untimed (Note [The first span settles])
    MEASURING = "measuring"  # measuring: ops pass through, timed (Note [Measure before capturing])
    SEEDING = "seeding"      # capture decided: one more span passes through, seeding the memo
    CAPTURING = "capturing"  # ops are deferred into windows
    PROBING = "probing"      # one probe window is open (no measuring): deferred until its verdict
    WAITING = "waiting"      # compiles in flight: ops run eagerly until none is (Note [Waiting for compiles runs eagerly])
    PASSING = "passing"      # capture does not pay: ops pass straight through, probed now and then
    OFF = "off"              # never defers nor probes (a block closed from another thread)


# The moves the machine allows (DeferPolicy._move is the one place that moves it). A phase
# may also "move" to itself (a stop while passing: its reason is renewed).
ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.WARMING: frozenset({Phase.SETTLING, Phase.CAPTURING}),
    Phase.SETTLING: frozenset({Phase.MEASURING, Phase.SEEDING, Phase.PASSING}),
    Phase.MEASURING: frozenset({Phase.SEEDING, Phase.PASSING}),
    Phase.SEEDING: frozenset({Phase.CAPTURING}),
    Phase.CAPTURING: frozenset({Phase.PASSING, Phase.WAITING}),
    Phase.PROBING: frozenset({Phase.CAPTURING, Phase.PASSING, Phase.WAITING}),
    Phase.WAITING: frozenset({Phase.CAPTURING, Phase.PASSING}),
    Phase.PASSING: frozenset({Phase.SETTLING, Phase.PROBING, Phase.CAPTURING}),
    Phase.OFF: frozenset(),
}
DEFERRING = (Phase.CAPTURING, Phase.PROBING)
MEASURE_PHASES = (Phase.SETTLING, Phase.MEASURING, Phase.SEEDING)


class At(enum.Enum):
    """Which safe point (a point between torch calls) an event comes from."""

    READ = "read"      # a read of a value (.item(), print): a span boundary
    CALL = "call"      # sync(), a Python-level safe point that is not a span boundary
    STEP = "step"      # an optimizer step's end: a span boundary
    MODULE = "module"  # a module call (while some mode measures or passes through)
    BLOCK = "block"    # a block's entry


class SafePoint(NamedTuple):
    """The mechanism is at a safe point: may the mode leave or rejoin the stack?

    ``parked``: the mode is off the stack; ``pending``: ops are deferred (nothing may
    change then); ``in_step``: inside an optimizer step, this thread.
    """

    at: At
    parked: bool
    pending: bool = False
    in_step: bool = False

    @property
    def read(self) -> bool | None:
        """A read (True), an optimizer step's end (False), or neither (None)."""
        return True if self.at is At.READ else False if self.at is At.STEP else None


class Seen(NamedTuple):
    """A read (``read``) or an optimizer step's end was seen; ``parked``: the mode was off
    the stack (the policy counts its own spans: Note [Counting while passing through])."""

    read: bool
    parked: bool


class Moved(NamedTuple):
    """The mechanism parked (``parked``) or unparked the mode at ``now_ns``
    (perf_counter); ``read``: unparked at a read (True) or a step's end (False), where a
    span starts."""

    parked: bool
    now_ns: int
    read: bool | None = None


class WarmupEnded(NamedTuple):
    """A boundary of the program's iterations (a read, an optimizer step's end); ``why``:
    which, for logs (the report's phase names it too); ``boundary``: its identity, the
    warm-up ends at its second sighting (None: at this one)."""

    why: str
    boundary: Any = None


class Act(enum.Enum):
    """The policy's answer at a safe point: what the mechanism does."""

    STAY = "stay"          # nothing changes
    PARK = "park"          # leave the dispatch-mode stack
    UNPARK = "unpark"      # rejoin it (capturing, measuring, or a probe)
    CAPTURE = "capture"    # on the stack: a measure just decided to capture


# Members as module constants for the hot paths (every read of a parked program): an
# ``At.READ`` is a class-attribute lookup through EnumType, ~0.2 µs in Python 3.11.
AT_READ, AT_CALL, AT_STEP, AT_MODULE, AT_BLOCK = At.READ, At.CALL, At.STEP, At.MODULE, At.BLOCK
ACT_STAY, ACT_PARK, ACT_UNPARK, ACT_CAPTURE = Act.STAY, Act.PARK, Act.UNPARK, Act.CAPTURE

__all__ = ["Phase", "ALLOWED", "DEFERRING", "MEASURE_PHASES", "At", "SafePoint", "Seen", "Moved",
           "WarmupEnded", "Act", "AT_READ", "AT_CALL", "AT_STEP", "AT_MODULE", "AT_BLOCK",
           "ACT_STAY", "ACT_PARK", "ACT_UNPARK", "ACT_CAPTURE"]
