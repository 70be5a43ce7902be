"""How busy an asynchronous device is: the probe behind Note [Occupancy gates capture]
(runtime/adapt.py).

On an accelerator that enqueues launches (CUDA, Trainium, the emulated ``neuron`` device
with asynchronous launches) the host runs ahead of the device until it reads a value,
and then waits for the device to catch up. :func:`backlog_probe` returns a function that
says how long that wait is *now* (the device's lead over the host, in ns); the policy
asks it where each read begins while it measures and compares the sum with the
measure's wall time. It is None where there is nothing to measure: the CPU, a
synchronous emulator (its launches busy-wait on the host: Note [Launch-bound devices pay
sooner]), CUDA absent.

:func:`device_clock` returns a second function, where the device can say it cheaply: the
device time of every launch issued so far (ns, growing). Read before and after a span of
ops, it says what the device's queue spends on them, which fusion saves (Note [Fusion
saves device time]).

Example::

    >>> backlog_probe("cpu") is None, device_clock("cpu") is None
    (True, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .verdicts import CAPTURE_NS_PER_OP


# Note [Launch-bound devices pay sooner]
# On an accelerator every eager op is a kernel launch with a fixed host cost (Trainium,
# CUDA; the emulated neuron device busy-waits its modelled latency), and a fused region
# is one launch for all its ops: fusion saves most of what an op costs there, where on
# the CPU it saves only memory traffic. So on a device other than the CPU, ops twice a
# capture's worth are enough (LAUNCH_MEASURE_NS_PER_OP, runtime/measure.py). Measured on
# the README's emulated neuron example (AdamW MLP, 20 µs launches): 56-74 µs an op, which
# the CPU's threshold (60 µs) parked once in three runs, where fused it makes 6 launches a
# step instead of 48.

# Note [Occupancy gates capture]
# On an asynchronous device (CUDA, Trainium, the emulator with asynchronous launches) the
# host enqueues a launch and runs ahead; where it reads a value it waits for the device.
# While the device is the bottleneck (the host waits at its reads), host time spent
# capturing comes out of that wait: capture is free, and what fusion saves (launches,
# device time) is what the program waits for. While the host is the bottleneck, capture
# must pay for itself from host time: the CPU rule, at a device's rate (a fused region
# replaces the ops' launches, whose host cost is most of an eager op's there:
# LAUNCH_MEASURE_NS_PER_OP; until 2026-12-02 the CPU's own MEASURE_NS_PER_OP, which
# parked the neuron-sim row at 50 µs launches: 45 µs an op, 1.01x eager, where fused it
# runs 2 launches an iteration instead of 61). So a measure on
# such a device also sums, where each read begins, the device's backlog (how long that
# read will wait: runtime/occupancy.py; the emulator's clock, CUDA's events) and compares
# the sum with the host's busy time (its thread's CPU time, which other processes on a
# loaded machine do not inflate, as wall time would): waits of DEVICE_BOUND_SHARE of
# waits plus busy time or more are device-bound. Where the device has a clock (the
# emulator's: runtime/occupancy.py), the measure reads the device time of the launches
# it saw instead, and capture is free where the device's time exceeds the host's by
# enough (Note [Fusion saves device time]): the waits alone said "host-bound" of a loop
# whose device was busier than its host (0.5 ms waited against 5 ms busy, 6.1 ms of
# device time). The report's phase names the regime and the figures (runtime/occupancy.py,
# Occupancy). Measured: see README (neuron-sim).


def backlog_probe(device_type: str) -> Callable[[], int] | None:
    """A function returning the device's backlog in ns (how long a read would wait
    now), for ``device_type``'s asynchronous device, or None."""
    if device_type == "neuron":
        return _neuron_backlog
    if device_type == "cuda":
        return _cuda_backlog if _cuda_ready() else None
    return None


# Note [Fusion saves device time]
# On an asynchronous device an eager op costs the program twice over: its host time (the
# program's Python, dispatch, the enqueue) and its launch's device time (what the queue
# spends on it), and the two overlap: a span of ops takes about the larger of the two. A
# fused region is one launch for all its ops, so fusion saves the launches' device time
# (launches saved x launch cost) whatever the host spends, and capture costs host time,
# which is free while the host would wait for the device anyway. So what a span of ops
# costs eagerly, for every rule that weighs capture against what fusion saves (the
# policy's measure, a window's eager time, the judge of a compiled window), is
# ``span_cost(host, device)``: the larger of the two; on the CPU (no device clock) its
# host time, as before. The policy's measure compares that cost per op with the CPU's
# threshold (MEASURE_NS_PER_OP, four captures' worth), and captures anyway where the
# device leads the host by enough for capture to be free (DEVICE_LEAD_NS_PER_OP). Measured (python -m benchmarks --workloads neuron-sim, 100 µs
# launches, 1 thread, load 8-10 on the 2-core box): eagerly 61 launches an iteration, 6.1
# ms of device time against 4-5 ms of host CPU time; the host waited only 0.5 ms at its
# read, so the waits alone (Note [Occupancy gates capture]) called the loop host-bound
# though the device was busier than the host.


def device_clock(device_type: str) -> Callable[[], int] | None:
    """A function returning the device time (ns) of every launch issued so far on
    ``device_type``'s asynchronous device, or None where it cannot be read without a
    sync (the CPU, CUDA: its events need one; the policy falls back to the backlog there).

    Example::

        >>> device_clock("cuda") is None
        True
    """
    if device_type == "neuron":
        return _neuron_device_time
    return None


def span_cost(host_ns: int, device_ns: int) -> int:
    """What a span of ops costs the program: its host time and its launches' device time
    overlap, so the larger of the two (Note [Fusion saves device time]).

    Example::

        >>> span_cost(4_000_000, 6_100_000), span_cost(4_000_000, 0)
        (6100000, 4000000)
    """
    return host_ns if device_ns <= host_ns else device_ns


# Note [Occupancy gates capture] (above) without a device clock: waits of this
# share of waits plus busy time or more are device-bound.
DEVICE_BOUND_SHARE = 0.25
# Note [Fusion saves device time]: with a device clock, a measure captures where the
# device's time per op exceeds the host's by two captures' worth or more (the margin of
# Note [Launch-bound devices pay sooner]): fusing then takes the device out of the way,
# and the program, which waited for it, pays capture out of that wait. Fused, a span costs
# the host at most its eager host time plus a capture per op (the emulator's own
# fallback, skipped by a fused region, makes it less), so capture pays while
# ``device - host >= CAPTURE_NS_PER_OP`` per op; twice that leaves a margin for the
# estimate. Measured on the neuron-sim row (MLP forward, 68 ops, 1 thread, load 8-10):
# host 66-76 µs an op; device 18, 45 and 90 µs an op at 20, 50 and 100 µs launches.
DEVICE_LEAD_NS_PER_OP = 2 * CAPTURE_NS_PER_OP


@dataclass(frozen=True)
class Occupancy:
    """What a measure saw of an asynchronous device over ``ops`` ops: the host's waits at
    its reads (``waited_ns``, from the backlog), its busy time (``busy_ns``, its thread's
    CPU time) and the device time of their launches (``device_ns``; None without a
    device clock). It says which regime held and whether capture is free.

    Example::

        >>> o = Occupancy(waited_ns=500_000, busy_ns=5_000_000, device_ns=6_100_000, ops=68)
        >>> o.device_bound, o.capture_is_free
        (True, False)
        >>> Occupancy(0, 1_000_000, 6_100_000, 68).capture_is_free
        True
    """

    waited_ns: int
    busy_ns: int
    device_ns: int | None
    ops: int

    @property
    def device_bound(self) -> bool:
        """Whether the device was the bottleneck: its launches took longer than the host
        was busy (with a device clock), else the host waited DEVICE_BOUND_SHARE or more."""
        if self.device_ns is not None:
            return self.device_ns > self.busy_ns
        return self.waited_ns >= DEVICE_BOUND_SHARE * max(self.waited_ns + self.busy_ns, 1)

    @property
    def capture_is_free(self) -> bool:
        """Whether capture comes out of the host's wait for the device (Note [Fusion
        saves device time]; without a device clock, whether it was device-bound)."""
        if self.device_ns is None:
            return self.device_bound
        return self.device_ns - self.busy_ns >= DEVICE_LEAD_NS_PER_OP * max(self.ops, 1)

    def describe(self) -> str:
        """The report's words: the regime and its figures."""
        figures = (f"the host waited {self.waited_ns / 1e6:.1f} ms at its reads, "
                   f"busy {self.busy_ns / 1e6:.1f} ms")
        if self.device_ns is not None:
            figures += f", its launches took {self.device_ns / 1e6:.1f} ms of device time"
        if self.capture_is_free:
            return f"device-bound ({figures}: capture is free); "
        if self.device_bound:
            return (f"device-bound ({figures}: too close to the host's for capture to be "
                    f"free: it must pay from the device time fusion saves); ")
        return f"host-bound ({figures}: capture must pay from host time); "


def _neuron_device_time() -> int:
    from .. import neuron_sim  # noqa: PLC0415 - pure Python, cheap

    return neuron_sim.device_time_ns()


def _neuron_backlog() -> int:
    from .. import neuron_sim  # noqa: PLC0415 - pure Python, cheap

    return neuron_sim.device_backlog_ns() if neuron_sim.async_launch() else 0


def _cuda_ready() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver means no probe, not a crash
        return False


def _cuda_backlog() -> int:
    """CUDA's backlog: an event recorded now on the current stream, and the host time
    until it completes (the read that follows would wait that long anyway; asked only
    while measuring, at reads). Untested here: no GPU on the development machine."""
    try:
        event = torch.cuda.Event()
        event.record()
        start = time.perf_counter_ns()
        event.synchronize()
        return time.perf_counter_ns() - start
    except Exception:  # noqa: BLE001 - no probe rather than a failed read
        return 0


__all__ = ["DEVICE_BOUND_SHARE", "DEVICE_LEAD_NS_PER_OP", "Occupancy", "backlog_probe", "device_clock",
           "span_cost"]
