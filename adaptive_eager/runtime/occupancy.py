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

Example::

    >>> backlog_probe("cpu") is None
    True
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def backlog_probe(device_type: str) -> Callable[[], int] | None:
    """A function returning the device's backlog in ns (how long a read would wait
    now), for ``device_type``'s asynchronous device, or None."""
    if device_type == "neuron":
        return _neuron_backlog
    if device_type == "cuda":
        return _cuda_backlog if _cuda_ready() else None
    return None


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


__all__ = ["backlog_probe"]
