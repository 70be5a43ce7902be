"""Storages the program has handed to readers and writers outside the dispatcher.

Note [Exported memory]
A numpy array from ``t.numpy()``, a DLPack capsule, a raw ``data_ptr()``, a storage
object, or shared memory (``share_memory_()``) reads and writes a tensor's memory
without dispatching an op, so a deferred write to that memory would be missed by a
read through the alias (``arr = w.numpy(); w.add_(1); arr[0]``), and a deferred read
would see a write made through it (``arr[:] = 0``) too early. Such a storage is
remembered here at export time (the observers that flush before those calls see it
happen), and every op that touches it runs at once instead of being recorded
(``WindowBuilder.add_input`` raises :class:`Exported`; the window is flushed first when it
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
call, is seen by no wrapper. The storage tells on it. ``numpy()`` clears the storage's
``resizable`` flag (torch/csrc/utils/tensor_numpy.cpp, so that numpy's pointer stays
valid), and the array's base is a tensor of its own over the same storage, which holds
the storage (its use count) while the array or a view of it lives. So a CPU storage the
registry does not know, not resizable, and held by another tensor than the one entering
the window is taken as exported, for as long as that holds (:func:`exported_input`,
asked where a real tensor first enters a window; a later ``numpy()`` seen by a wrapper
finds it so and exports it until freed). Measured, torch 2.13: a plain tensor's storage
is held by its tensor alone; after ``numpy()``, also by the array's base until the array
dies. Left out, each for a reason:
- not-resizable storages held once: ``torch.load`` reads a checkpoint into storages made
  not resizable, and so do ``from_numpy``, ``frombuffer`` and ``from_dlpack``. Taking all
  of them for exported made a resumed AdamW run (its state loaded with
  ``opt.load_state_dict(torch.load(...))``) run each optimizer op at once: 248 ms a step
  against 147 (capture forced, backend eager, 8 Linear(256) layers). So the aliasing
  constructors are noted by wrappers instead (``from_numpy``, ``frombuffer``: exported
  until freed), from the process's first block on; one called before it is not known.
- shared memory (``is_shared()``): a DataLoader worker's batch arrives shared and not
  resizable; memory shared across processes is exported where this process shared it
  (``share_memory_()``), as before.
Known storages are answered by their entry, which is why an entry whose array died stays
("no longer exported", not "unknown": the flag never comes back). Rejected: wrapping
``numpy()`` at ``import adaptive_eager`` (``import torch`` imports the package through
its autoload entry point, so every torch program would run our wrappers, and exports
before the import would still be missed); finding live arrays by a heap walk (ndarrays
are not tracked by ``gc``). Costs, measured on the shared 2-core machine: each real
tensor entering a window pays ~0.45 µs more (timeit at load average 9, 0.29 of it making
the storage object for ``resizable()``; the registry lookup alone was 0.04), nothing per
op after; end to end, 200 in-place adds of 200 parameters per window (fast path) ran
10.0 -> 10.3 µs per op at load ~2, and python -m benchmarks.overhead (one real input) did
not move (fast path 10.2 -> 9.9 µs per op, noise). The use count is read only for storages
that are not resizable.

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
_use_count = torch._C._storage_Use_Count


def _storage_of(t: torch.Tensor) -> Any:
    try:
        with torch._C.DisableTorchFunction():  # not an export of its own (observe.py passes it through)
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
    if sid in _EXPORTED:
        known = _known(sid)
        if known is not None:
            return known
    if not t.is_cpu:
        return False
    storage = _UNTYPED_STORAGE(t)
    return not storage.resizable() and _held_elsewhere(storage)  # the common case: resizable


def _held_elsewhere(storage: Any) -> bool:
    """Whether an unknown storage looks exported (Note [Memory exported before the
    runtime]): not resizable, not shared, and held by more than the entering tensor and
    ``storage`` itself."""
    return not storage.resizable() and storage.nbytes() > 0 and not storage.is_shared() \
        and _use_count(storage._cdata) > 2 + _lent_count(storage._cdata)


# Note [The runtime's own aliases are not exports]
# A compiled optimizer step's compile keeps its examples of the params and state as
# detached aliases (optim_inputs.py: a plain tensor over the same memory, no ``.grad``) until
# it finishes, seconds later. Each alias holds the storage (its use count), so a storage
# ``torch.load`` made (not resizable: a run resumed with ``opt.load_state_dict``) looked
# exported while its step compiled, and every optimizer op on it flushed
# (``exported_memory``, twice a step; the full suite's order made the resumed-state test
# in test_faults_corners meet it in CI). Aliases the runtime makes for itself are lent
# through :func:`lend`, which remembers them (weakly, by storage) when the storage is not
# resizable, the only case whose use count is read; the count discounts those alive.
_LENT: dict[int, weakref.WeakSet] = {}
_LENT_PRUNE_AT = [256]


def lend(t: torch.Tensor) -> torch.Tensor:
    """A detached alias of real tensor ``t`` for the runtime's own use (a compile's
    example), not taken for an export of ``t``'s memory while it lives
    (Note [The runtime's own aliases are not exports]).

    >>> w = torch.frombuffer(bytearray(8), dtype=torch.float32)   # not resizable
    >>> a = lend(w)
    >>> _held_elsewhere(w.untyped_storage())
    False
    """
    alias = t.detach()
    storage = _storage_of(alias)
    if storage is None or storage.resizable():
        return alias
    sid = storage._cdata
    with _LOCK:
        lent = _LENT.get(sid)
        if lent is None:
            lent = _LENT[sid] = weakref.WeakSet()
            if len(_LENT) > _LENT_PRUNE_AT[0]:
                for k in [k for k, v in _LENT.items() if not v]:
                    del _LENT[k]
                _LENT_PRUNE_AT[0] = max(256, 2 * len(_LENT))
        lent.add(alias)
    return alias


def _lent_count(sid: int) -> int:
    lent = _LENT.get(sid)
    if lent is None:
        return 0
    n = len(lent)
    if not n:
        with _LOCK:  # all returned: a later storage may get this id
            if _LENT.get(sid) is lent and not lent:
                del _LENT[sid]
    return n


def before_export(t: Any) -> None:
    """Call before a read that exports ``t`` (``numpy()``): an unknown export made
    earlier must not be taken for this one, whose end is watched; it is exported until
    the storage is freed."""
    if isinstance(t, torch.Tensor) and t.is_cpu:
        try:
            sid = torch._C._storage_id(t)
        except Exception:  # noqa: BLE001 - sparse, storage-less or foreign tensors
            return
        if _known(sid) is None:
            storage = _UNTYPED_STORAGE(t)
            if _held_elsewhere(storage):
                export_storage(storage)


def export_result(out: Any) -> Any:
    """Remember the memory a constructor aliased (``from_numpy``, ``frombuffer``) as
    exported until freed; returns ``out``."""
    if isinstance(out, torch.Tensor):
        export(out)
    return out


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


__all__ = ["Exported", "export", "export_storage", "export_array", "is_exported", "exported_input", "lend",
           "before_export", "export_result", "note_export", "clear"]
