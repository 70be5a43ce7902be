"""What the step compiler records (dispatch/optim_compile.py): one trace of a signature
(:class:`_Entry`), why a step ran eagerly (:class:`Why`, the report's words), and what a
step that waits for its own compile returns (``_WAITS``).

Example::

    >>> Why.CHEAP
    'cheaper so far than a compile (optimizer_step_after_ms)'
"""

from __future__ import annotations

from typing import Any

from ..runtime.cache import RegionEntry
from ..runtime.optim_graph import StepProgram

MAX_PROGRAMS = 4        # traces per signature (guards that fail: another branch of torch's code)


# What StepCompiler._step returns for a step that runs eagerly while its own compile is
# not worth it yet or not ready (Note [A step waiting for its compile is not captured]).
_WAITS = "waits"


class Why:
    """Why a step ran eagerly (the report's words)."""

    CLOSURE = "a closure (LBFGS-style step)"
    SUBCLASS = "a subclass of a torch.optim class (it may override step)"
    CLASS = "class not supported"
    OPTION = "group option"            # + the option: fused, differentiable, capturable, foreach=False
    STATE = "state creation (first step)"
    CHEAP = "cheaper so far than a compile (optimizer_step_after_ms)"
    COMPILING = "compile not ready"
    MODES = "another dispatch mode is active"
    TOO_MANY = f"more than {MAX_PROGRAMS} traces of one signature"
    STEPS = "step counters not exact integers"
    VERIFYING = "checking the first compiled call against eager"
    FAILED = "eager-only"               # + the entry's reason


class _Entry:
    """One trace of a signature: its program and the compile service's entry."""

    __slots__ = ("program", "region", "reason", "cls", "build", "verdict")

    def __init__(self, cls: str, program: StepProgram | None, region: RegionEntry | None,
                 reason: str = ""):
        self.cls, self.program, self.region, self.reason = cls, program, region, reason
        self.build: tuple | None = None  # (example inputs, kernel threads, exact) while a load may need a compile
        self.verdict: Any = None  # the first compiled call's check, beside the program (a Future)


def _note(counters: Any, cls: str, what: str) -> None:
    with counters.lock:
        counters.optimizer_step_kinds[f"{cls}|{what}"] += 1


__all__ = ["MAX_PROGRAMS", "Why"]
