"""Device-memory counters of the emulated device, like CUDA's caching-allocator stats.

Every neuron storage is made by retargeting a CPU tensor's memory (``_kernels.from_cpu``),
so that is where an allocation is counted; it is uncounted when the storage dies (a
``weakref.finalize`` on the storage, whose Python object lives exactly as long as the
storage, views and all). A storage over memory already counted (a result aliasing its
input) is not counted twice. ``memory_allocated()`` is the bytes of live neuron storages,
``max_memory_allocated()`` the most since ``reset_peak_memory_stats()``, as
``torch.cuda`` has them, so tests measure device memory rather than the process's.

Example::

    >>> import torch
    >>> from adaptive_eager import neuron_sim
    >>> neuron_sim.enable()
    >>> before = torch.neuron.memory_allocated()
    >>> x = torch.ones(1024, device="neuron")
    >>> torch.neuron.memory_allocated() - before
    4096
    >>> del x
    >>> torch.neuron.memory_allocated() - before
    0
"""

from __future__ import annotations

import threading
import weakref

import torch

_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage
_LOCK = threading.Lock()
_LIVE: dict[int, object] = {}  # storage data_ptr -> the token of its count
_COUNTS = {"allocated": 0, "peak": 0}


def track(t: torch.Tensor) -> torch.Tensor:
    """Count the storage of neuron tensor ``t`` until it dies (once per storage); ``t``."""
    # TensorBase's, not torch.Tensor's: the runtime's read wrappers (dispatch/observe.py)
    # would count the storage as exported, and ops on it would never be deferred.
    st = _UNTYPED_STORAGE(t)
    n = st.nbytes()
    ptr = st.data_ptr()
    if n == 0:
        return t
    with _LOCK:
        if ptr in _LIVE:
            return t
        token = object()
        _LIVE[ptr] = token
        now = _COUNTS["allocated"] = _COUNTS["allocated"] + n
        if now > _COUNTS["peak"]:
            _COUNTS["peak"] = now
    weakref.finalize(st, _release, ptr, n, token)
    return t


def _release(ptr: int, n: int, token: object) -> None:
    with _LOCK:
        if _LIVE.get(ptr) is token:
            del _LIVE[ptr]
            _COUNTS["allocated"] -= n


def memory_allocated(device: object = None) -> int:
    """Bytes held by live neuron storages."""
    return _COUNTS["allocated"]


def max_memory_allocated(device: object = None) -> int:
    """The most bytes held at once since the last :func:`reset_peak_memory_stats`."""
    return _COUNTS["peak"]


def reset_peak_memory_stats(device: object = None) -> None:
    """Start the peak from what is held now."""
    with _LOCK:
        _COUNTS["peak"] = _COUNTS["allocated"]


__all__ = ["track", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"]
