"""Kernel-launch model of the emulated device: a launch counter and a launch latency.

On a real accelerator every eager op is one kernel launch with a fixed host-side
cost, and a fused region is one launch for many ops. The emulator models that:
each kernel the `neuron` fallback runs calls `record_launch()`, which counts one
launch and busy-waits the configured latency. Inside `single_launch()` kernels are
free; the context itself is one launch.

# Note [Launch registry]
The counter and the latency are process-global on purpose: they describe the one
simulated device, which all threads share (the autograd engine runs backward
kernels on its own device thread). They live in the `_REGISTRY` object below and
nowhere else. Whether a thread is inside `single_launch()` is thread-local, so a
fused region on one thread does not make another thread's kernels free.

This module imports nothing from torch, so it is cheap to import.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = [
    "launch_count",
    "reset_launch_count",
    "set_launch_latency_us",
    "launch_latency_us",
    "single_launch",
    "record_launch",
]


class _LaunchRegistry:
    """The explicit, documented module-level state (see Note [Launch registry])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.latency_ns = 0
        self.local = threading.local()  # .depth: nesting depth of single_launch()


_REGISTRY = _LaunchRegistry()


def _busy_wait(duration_ns: int) -> None:
    # Busy-wait, not sleep: a launch costs the host CPU, and time.sleep() rounds
    # small durations up to the scheduler tick.
    if duration_ns <= 0:
        return
    deadline = time.perf_counter_ns() + duration_ns
    while time.perf_counter_ns() < deadline:
        pass


def _depth() -> int:
    return getattr(_REGISTRY.local, "depth", 0)


def record_launch() -> None:
    """Account one kernel launch: count it and wait the latency (no-op in a fused region).

    Called by the device's kernels; callers outside the emulator rarely need it.

    Example::

        >>> _ = reset_launch_count(); record_launch(); launch_count()
        1
    """
    if _depth() > 0:
        return
    with _REGISTRY.lock:
        _REGISTRY.count += 1
    if _REGISTRY.latency_ns:
        _busy_wait(_REGISTRY.latency_ns)


def launch_count() -> int:
    """Number of kernel launches on the emulated device since the last reset.

    Example::

        >>> import torch, adaptive_eager.neuron_sim as neuron_sim
        >>> neuron_sim.enable()
        >>> _ = reset_launch_count()
        >>> _ = torch.ones(3, device="neuron") + 1   # fill_ and add: 2 launches
        >>> launch_count()
        2
    """
    return _REGISTRY.count


def reset_launch_count() -> int:
    """Set the launch counter to zero and return the value it had.

    Example::

        >>> _ = reset_launch_count(); record_launch()
        >>> reset_launch_count(), reset_launch_count()
        (1, 0)
    """
    with _REGISTRY.lock:
        previous = _REGISTRY.count
        _REGISTRY.count = 0
    return previous


def set_launch_latency_us(latency_us: float) -> None:
    """Make every kernel launch on the emulated device busy-wait `latency_us` µs.

    0 (the default) turns the simulated latency off.

    Example::

        >>> set_launch_latency_us(20.0)   # model a 20 µs launch overhead
    """
    if latency_us < 0:
        raise ValueError(f"launch latency must be >= 0 µs, got {latency_us}")
    _REGISTRY.latency_ns = int(round(latency_us * 1000.0))


def launch_latency_us() -> float:
    """The simulated per-launch latency in microseconds.

    Example::

        >>> set_launch_latency_us(5); launch_latency_us()
        5.0
    """
    return _REGISTRY.latency_ns / 1000.0


@contextlib.contextmanager
def single_launch() -> Iterator[None]:
    """Run a block as ONE kernel launch: one count and one latency, on entry.

    Kernels run inside the block (on this thread) neither count nor wait. Nested
    blocks are part of the outermost launch. The runtime wraps a compiled region's
    call in it, modelling a fused kernel.

    Example::

        >>> import torch, adaptive_eager.neuron_sim as neuron_sim
        >>> neuron_sim.enable()
        >>> x = torch.ones(4, device="neuron")
        >>> _ = reset_launch_count()
        >>> with single_launch():
        ...     y = (x * 2 + 1).relu()        # three ops, one launch
        >>> launch_count()
        1
    """
    record_launch()
    _REGISTRY.local.depth = _depth() + 1
    try:
        yield
    finally:
        _REGISTRY.local.depth -= 1
