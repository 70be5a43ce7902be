"""Memory budgets: how many bytes a window may keep alive beyond what eager holds.

Note [A byte budget per window]
Deferring an op keeps its real inputs alive until its window runs. Most are alive in eager
too (parameters, the batch, activations autograd saved), but some are not: a value the
program dropped after the op that reads it (a backward pass releases each saved
activation once its node ran; ``x = x * a + b`` drops the old ``x``). Eager frees those
at once; a window holds them until it runs (and its run frees each at its last use, Note
[Replay frees at last use], fusion/liveness.py). So a window is flushed (reason
``window_bytes``) once the bytes it holds that only it references exceed the budget
(option ``window_bytes``; auto: 256 MiB on the CPU, 2% of an accelerator's memory), as
well as at ``window_size`` ops. "Only it references" is read from the Python reference
counts of its real inputs, every 16 recorded ops (~1 µs for a window of 50 inputs): a
tensor C++ alone keeps (autograd's saved variables) counts as dropped, so the estimate
errs towards flushing early. A quarter of the budget bounds what a compiled region's
checked first call may copy (Note [The first compiled call runs on copies],
runtime/compiled.py).

Example::

    >>> from adaptive_eager import config
    >>> window_budget(config.resolve(window_bytes="64MiB"))
    67108864
    >>> window_budget(config.resolve()) == 256 << 20   # auto, on the CPU
    True
"""

from __future__ import annotations

from typing import Any

CPU_BUDGET = 256 << 20
ACCELERATOR_SHARE = 0.02


def window_budget(options: Any) -> int:
    """The bytes a window may hold that the program dropped (Note [A byte budget per window])."""
    if options.window_bytes:
        return int(options.window_bytes)
    device = options.device
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            return max(CPU_BUDGET // 4, int(total * ACCELERATOR_SHARE))
    return CPU_BUDGET


def resident_bytes() -> tuple[int, int] | None:
    """The process's resident set now and its peak so far (``VmRSS``, ``VmHWM``: Linux),
    in bytes; None where the platform cannot tell. One read of ``/proc/self/status``
    (~30 µs).

    >>> got = resident_bytes()
    >>> got is None or 0 < got[0] <= got[1]
    True
    """
    try:
        with open("/proc/self/status", "rb") as f:
            data = f.read()
        now = data.index(b"VmRSS:")
        peak = data.index(b"VmHWM:")
        return (int(data[now + 6:data.index(b"kB", now)]) << 10,
                int(data[peak + 6:data.index(b"kB", peak)]) << 10)
    except (OSError, ValueError):
        return None


__all__ = ["window_budget", "resident_bytes", "CPU_BUDGET", "ACCELERATOR_SHARE"]
