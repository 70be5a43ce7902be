"""Storages the program has handed to readers and writers outside the dispatcher.

Note [Exported memory]
A numpy array from ``t.numpy()``, a DLPack capsule, a raw ``data_ptr()``, a storage
object, or shared memory (``share_memory_()``) reads and writes a tensor's memory
without dispatching an op, so a deferred write to that memory would be missed by a
read through the alias (``arr = w.numpy(); w.add_(1); arr[0]``), and a deferred read
would see a write made through it (``arr[:] = 0``) too early. Such a storage is
remembered here at export time (the observers that flush before those calls see it
happen), and every op that touches it runs at once instead of being recorded
(recorder ``_input_vid`` raises :class:`Exported`; the window is flushed first when it
touches the op's other tensors). The check costs a dict lookup when a real tensor
first enters a window, nothing per op.

How long a storage stays exported:
- numpy: while the array (or a view of it) lives: numpy's base chain holds the tensor
  object ``numpy()`` made for it, which is what is watched. The wrappers note a
  ``numpy()``/``__array__`` of the program's in any thread, in a block or not, once the
  process's first block installed them; earlier ones are found as below.
- storage objects: while the Python storage object lives.
- data_ptr, DLPack, shared memory: until the storage is freed (an address or a
  capsule can outlive every Python object we could watch). A c10 weak reference
  (``StorageWeakRef``) tells when; it also keeps the address from being reused by
  another storage meanwhile.
Entries whose storage died are dropped as they are met, and all of them when the
registry doubles in size, so it stays bounded by what is alive. An entry whose watched
object died stays while its storage lives, as "known, no longer exported" (below).

Note [Memory exported before the runtime]
An export made before the wrappers were installed (``arr = w.numpy()`` before the
process's first block, or before ``import adaptive_eager``), or by C++ with no Python
call, is seen by no wrapper. The storage tells on it: ``numpy()`` clears the storage's
``resizable`` flag (torch/csrc/utils/tensor_numpy.cpp, so that numpy's pointer stays
valid), and memory torch did not allocate itself is never resizable either
(``from_numpy``, ``as_tensor``/``frombuffer`` of a buffer, ``from_dlpack``: each aliases
memory the program still holds). So a CPU storage that is not resizable and that the
registry does not know is taken as exported until it is freed (:func:`exported_input`,
called where a real tensor first enters a window). Shared memory is left out: a
DataLoader worker's batch arrives in a storage that is shared and not resizable, and
memory shared across processes is only known as exported where this process shared it
(``share_memory_()``, as before: other processes see deferred writes from the next sync). Known storages are answered by their
entry, which is why an entry whose array died stays ("no longer exported", not "unknown":
the flag never comes back). Rejected: wrapping ``numpy()`` at ``import adaptive_eager``
(``import torch`` imports the package through its autoload entry point, so every torch
program would run our wrappers, and exports before the import would still be missed);
finding live arrays by a heap walk (ndarrays are not tracked by ``gc``).
Costs, measured on the loaded 2-core machine: ~0.25 µs per real tensor the first time it
enters a window (``untyped_storage().resizable()``; 200 in-place adds of 200 parameters
per window, fast path: 10.0 -> 10.3 µs per op), nothing per op after (python -m
benchmarks.overhead, one real input: fast path 10.2 -> 9.9 µs per op, noise). False positives: storages of ``torch.load`` (read from the archive without an
allocator) are not resizable either, so a tensor loaded and used as it is
(``load_state_dict(..., assign=True)``) has its ops run eagerly; ``load_state_dict``'s
default copies into the module's own (resizable) parameters and keeps fusion.

Example::

    >>> import torch
    >>> t = torch.zeros(2)
    >>> export(t)
    >>> is_exported(torch._C._storage_id(t))
    True
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .meta import MetaFailure
from ..reasons import R

# storage id -> (weak reference to the storage, weak reference to the object whose
# life keeps it exported, or None: until the storage is freed). A process-wide
# registry: memory is shared by every thread. An entry whose watched object died means
# "known, not exported now" (Note [Memory exported before the runtime]).
_EXPORTED: dict[int, tuple[StorageWeakRef, Any]] = {}
_LOCK = threading.Lock()
_PRUNE_AT = [1024]


class Exported(MetaFailure):
    """The op touches exported memory: it runs now, for real (Note [Exported memory])."""

    marks_op = False
    reason = R.EXPORTED_MEMORY


# The C method: torch.Tensor's is a read wrapper (observe.py) once installed.
_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage


def _storage_of(t: torch.Tensor) -> Any:
    try:
        with torch._C.DisableTorchFunction():  # not an export of its own (ObserveMode)
            return _UNTYPED_STORAGE(t)
    except Exception:  # noqa: BLE001 - sparse, storage-less or foreign tensors
        return None


def export(t: torch.Tensor, keeper: Any = None) -> None:
    """Remember ``t``'s storage as exported, while ``keeper`` lives (None: until freed).

    Call with capture suspended (``t.untyped_storage()`` of a handle would flush).
    """
    if isinstance(t, torch.Tensor) and t.device.type != "meta":
        export_storage(_storage_of(t), keeper)


def export_storage(storage: Any, keeper: Any = None) -> None:
    """:func:`export` for a storage object (untyped or typed)."""
    storage = getattr(storage, "_untyped_storage", storage)
    if not isinstance(storage, torch.UntypedStorage) or storage.device.type == "meta" \
            or storage.nbytes() == 0:
        return
    sid = storage._cdata
    ref = StorageWeakRef(storage)
    watch = None
    if keeper is not None:
        try:
            watch = weakref.ref(keeper)
        except TypeError:
            watch = None  # not weakly referenceable: exported until the storage is freed
    with _LOCK:
        old = _EXPORTED.get(sid)
        if old is not None and _alive(old):
            if old[1] is None:
                return  # already exported for the storage's whole life
            if watch is None or old[1]() is not keeper:
                watch = None  # two objects to watch: exported until the storage is freed
        _EXPORTED[sid] = (ref, watch)
        if len(_EXPORTED) > _PRUNE_AT[0]:
            for k in [k for k, v in _EXPORTED.items() if v[0].expired()]:
                del _EXPORTED[k]
            _PRUNE_AT[0] = max(1024, 2 * len(_EXPORTED))


def _alive(entry: tuple[StorageWeakRef, Any]) -> bool:
    ref, watch = entry
    if ref.expired():
        return False
    return watch is None or watch() is not None


def _known(sid: int) -> bool | None:
    """Whether the registry's storage ``sid`` is exported now; None: not known."""
    entry = _EXPORTED.get(sid)
    if entry is None:
        return None
    if not entry[0].expired():
        return entry[1] is None or entry[1]() is not None
    with _LOCK:  # the storage died: a later one may get its id
        if _EXPORTED.get(sid) is entry:
            del _EXPORTED[sid]
    return None


def is_exported(sid: int) -> bool:
    """Whether the storage with this id (``torch._C._storage_id``) is known as exported now."""
    return bool(_known(sid))


def exported_input(t: torch.Tensor, sid: int) -> bool:
    """Whether real tensor ``t`` (storage id ``sid``) is in exported memory now, counting
    exports no wrapper saw (Note [Memory exported before the runtime]).

    >>> import numpy as np
    >>> w = torch.zeros(2)
    >>> exported_input(w, torch._C._storage_id(w))
    False
    >>> arr = np.asarray(w.numpy())      # as if made before the runtime existed
    >>> exported_input(w, torch._C._storage_id(w))
    True
    """
    known = _known(sid)
    if known is not None:
        return known
    if t.is_cpu:
        storage = _UNTYPED_STORAGE(t)
        if not storage.resizable() and storage.nbytes() and not storage.is_shared():
            export_storage(storage)  # until freed: nothing tells when its alias dies
            return True
    return False


def before_export(t: Any) -> None:
    """Call before a read that exports ``t`` (``numpy()``): an unknown export made
    earlier must not be taken for this one, whose end is watched."""
    if isinstance(t, torch.Tensor) and t.device.type != "meta":
        try:
            sid = torch._C._storage_id(t)
        except Exception:  # noqa: BLE001 - sparse, storage-less or foreign tensors
            return
        exported_input(t, sid)


def export_array(arr: Any) -> Any:
    """Remember the tensor behind numpy array ``arr`` while the array lives; returns ``arr``."""
    keeper = arr
    while keeper is not None and not isinstance(keeper, torch.Tensor):
        keeper = getattr(keeper, "base", None)
    if keeper is not None:
        export(keeper, keeper)
    return arr


# What each exposing read leaves exported (the tensor read, the read's result):
# numpy arrays while they live, storage objects while they live, the rest for good.
def note_export(name: str, tensor: Any, out: Any) -> None:
    """Remember what an exposing read (``numpy``, ``data_ptr``, ...) of ``tensor`` exported."""
    if name in ("numpy", "__array__"):
        export_array(out)
    elif name in ("untyped_storage", "storage", "_typed_storage"):
        export(tensor, out)
    elif name in ("data_ptr", "__dlpack__", "share_memory_"):
        export(tensor)


def clear() -> None:
    """Forget every export (tests)."""
    with _LOCK:
        _EXPORTED.clear()


__all__ = ["Exported", "export", "export_storage", "export_array", "is_exported", "exported_input",
           "before_export", "note_export", "clear"]
