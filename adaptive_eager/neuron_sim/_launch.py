"""Kernel-launch model of the emulated device: a launch counter, a latency, a device clock.

On a real accelerator every eager op is one kernel launch, and a fused region is one
launch for many ops. The emulator models that: each kernel the `neuron` fallback runs
calls `record_launch()`, which counts one launch and charges the configured latency.
Inside `single_launch()` kernels are free; the context itself is one launch.

# Note [Asynchronous launches]
Accelerators enqueue a launch and return: the host runs ahead of the device until
something needs data on the host. The emulator models that by default
(`set_async_launch(True)`): a launch advances a *device clock* by the latency (it
starts when the device is free, i.e. at max(now, the clock)) and returns at once;
`wait_for_device()` -- called by a copy to the host, `.item()`, `tolist()`, printing
(all go through `_to_copy`/`_copy_from`/`_local_scalar_dense`), ops whose output shape
depends on the data (`nonzero`, `masked_select`, ...) and `torch.neuron.synchronize()`
-- waits until the clock has passed. The kernels themselves still run at once, in
program order, on the host, so values never change; only *when* the host may go on
does. As on CUDA, at most `MAX_QUEUE_DEPTH` launches may be outstanding; one more
waits for the oldest to finish. `set_async_launch(False)` restores the synchronous
model (every launch busy-waits its latency on the host), which tests that measure a
launch's host cost use.

# Note [Launch registry]
The counter, the latency and the device clock are process-global on purpose: they
describe the one simulated device, which all threads share (the autograd engine runs
backward kernels on its own device thread). They live in the `_REGISTRY` object below
and nowhere else. Whether a thread is inside `single_launch()` is thread-local, so a
fused region on one thread does not make another thread's kernels free.

This module imports nothing from torch, so it is cheap to import.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator

__all__ = [
    "launch_count",
    "reset_launch_count",
    "set_launch_latency_us",
    "launch_latency_us",
    "single_launch",
    "record_launch",
    "set_async_launch",
    "async_launch",
    "queue_depth",
    "device_backlog_ns",
    "device_time_ns",
    "wait_for_device",
    "MAX_QUEUE_DEPTH",
]

# CUDA's launch queue holds about 1024 kernels before a launch blocks the host.
MAX_QUEUE_DEPTH = 1024


class _LaunchRegistry:
    """The explicit, documented module-level state (see Note [Launch registry])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.latency_ns = 0
        self.async_launch = True  # Note [Asynchronous launches]
        self.device_free_ns = 0  # perf_counter_ns() at which the last launch finishes
        self.device_time_ns = 0  # device time of every asynchronous launch issued so far
        self.pending: deque[int] = deque()  # finish times of launches not yet done
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


def _wait_until(deadline_ns: int) -> None:
    # Sleep through the bulk of a long wait (the host is idle while it waits for the
    # device), then spin for precision: time.sleep() overshoots by up to a tick.
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining <= 0:
        return
    if remaining > 2_000_000:
        time.sleep((remaining - 1_000_000) / 1e9)
    while time.perf_counter_ns() < deadline_ns:
        pass


def _drop_done(now_ns: int) -> None:
    pending = _REGISTRY.pending
    while pending and pending[0] <= now_ns:
        pending.popleft()


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
    latency = _REGISTRY.latency_ns
    if not (latency and _REGISTRY.async_launch):
        with _REGISTRY.lock:
            _REGISTRY.count += 1
        if latency:
            _busy_wait(latency)
        return
    with _REGISTRY.lock:
        _REGISTRY.count += 1
        now = time.perf_counter_ns()
        _drop_done(now)
        oldest = _REGISTRY.pending[0] if len(_REGISTRY.pending) >= MAX_QUEUE_DEPTH else None
        finish = max(now, _REGISTRY.device_free_ns) + latency
        _REGISTRY.device_free_ns = finish
        _REGISTRY.device_time_ns += latency
        _REGISTRY.pending.append(finish)
    if oldest is not None:  # the queue is full: wait for a slot, as a CUDA launch does
        _wait_until(oldest)


def wait_for_device() -> None:
    """Block the host until every launch issued so far has finished on the device.

    What a read of device data on the host does (Note [Asynchronous launches]); a
    no-op in the synchronous model, where launches finish before they return.

    Example::

        >>> set_async_launch(True); set_launch_latency_us(100)
        >>> for _ in range(10):
        ...     record_launch()
        >>> queue_depth() > 0
        True
        >>> wait_for_device(); queue_depth()
        0
        >>> set_launch_latency_us(0)
    """
    with _REGISTRY.lock:
        deadline = _REGISTRY.device_free_ns
    _wait_until(deadline)
    with _REGISTRY.lock:
        _drop_done(time.perf_counter_ns())


def queue_depth() -> int:
    """Launches issued and not yet finished on the device (0 in the synchronous model).

    Example::

        >>> set_async_launch(True); set_launch_latency_us(1000)
        >>> record_launch(); record_launch()
        >>> queue_depth()
        2
        >>> wait_for_device(); set_launch_latency_us(0)
    """
    with _REGISTRY.lock:
        _drop_done(time.perf_counter_ns())
        return len(_REGISTRY.pending)


def device_backlog_ns() -> int:
    """How long the host would wait now for every launch issued so far: the device
    clock's lead over the host clock, in ns (0 in the synchronous model, and when idle).

    Example::

        >>> set_async_launch(True); set_launch_latency_us(1000)
        >>> record_launch(); device_backlog_ns() > 0
        True
        >>> wait_for_device(); device_backlog_ns(); set_launch_latency_us(0)
        0
    """
    return max(0, _REGISTRY.device_free_ns - time.perf_counter_ns())


def device_time_ns() -> int:
    """Device time of every asynchronous launch issued so far, in ns (launches x their
    latency; it only grows): what the device's queue spends on them, whether or not the
    host waited for it. Synchronous launches add nothing (the host paid them).

    The runtime reads it before and after a span of ops to weigh what fusing them would
    save the device (Note [Fusion saves device time], runtime/occupancy.py).

    Example::

        >>> set_async_launch(True); set_launch_latency_us(100)
        >>> before = device_time_ns(); record_launch(); record_launch()
        >>> device_time_ns() - before
        200000
        >>> wait_for_device(); set_launch_latency_us(0)
    """
    return _REGISTRY.device_time_ns


def set_async_launch(enabled: bool) -> None:
    """Choose the launch model: asynchronous (the default) or synchronous.

    Asynchronous: a launch enqueues and returns; the host waits only where it reads
    device data. Synchronous: every launch busy-waits its latency on the host. Switching
    first waits for the launches already queued, so no launch straddles the models.

    Example::

        >>> set_async_launch(False); async_launch()
        False
        >>> set_async_launch(True)
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_async_launch expects a bool, got {enabled!r}")
    wait_for_device()
    _REGISTRY.async_launch = enabled


def async_launch() -> bool:
    """Whether launches are asynchronous (Note [Asynchronous launches]).

    Example::

        >>> async_launch()
        True
    """
    return _REGISTRY.async_launch


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
    """Make every kernel launch on the emulated device take `latency_us` µs.

    Asynchronous launches occupy the device that long; synchronous ones busy-wait it
    on the host (Note [Asynchronous launches]). 0 (the default) turns the latency off.

    Example::

        >>> set_launch_latency_us(20.0)   # model a 20 µs launch overhead
    """
    if not latency_us >= 0:  # also refuses NaN
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
    """Run a block as ONE kernel launch: one count and one latency, charged on entry.

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
