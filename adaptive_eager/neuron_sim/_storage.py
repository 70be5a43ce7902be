"""Storage-level allocation for the emulated device.

# Note [No PrivateUse1 allocator from Python]
torch allocates a *storage* (not a tensor) through the allocator registered for
its device, and Python cannot register one for PrivateUse1: there is no Python
binding for `c10::SetAllocator`. Every storage-level allocation on `neuron` would
then dereference a null allocator and crash the process (segfault), e.g.
`torch.UntypedStorage(8, device="neuron")`, `storage.clone()` (used by
`copy.deepcopy` of a tensor or module) and `storage.neuron()`.

Tensor-level allocation is fine (it reaches our `empty` kernel), so `install()`
routes those three storage entry points through it. They are the only patches to
torch classes the emulator makes, and they only change behaviour for `neuron`
storages; everything else is delegated to the original methods.
"""

from __future__ import annotations

from typing import Any

import torch

from ..hooks import HOOKS, Patch
from ._device import check_device_index
from ._names import DEVICE_TYPE

__all__ = ["install", "new_neuron_storage"]


def new_neuron_storage(nbytes: int) -> torch.UntypedStorage:
    """A zero-filled neuron storage of `nbytes` bytes, allocated via `torch.empty`."""
    return torch.zeros(nbytes, dtype=torch.uint8, device=DEVICE_TYPE).untyped_storage()


def _is_neuron_device(device: Any) -> bool:
    if device is None:
        return False
    return torch.device(device).type == DEVICE_TYPE


def _clone(original_clone: Any) -> Any:
    def clone(self: torch.storage._StorageBase) -> torch.storage._StorageBase:
        if self.device.type != DEVICE_TYPE:
            return original_clone(self)
        return new_neuron_storage(self.nbytes()).copy_(self)

    return clone


def _to_neuron(_absent: Any) -> Any:
    def to_neuron(
        self: torch.storage._StorageBase,
        device: int | str | torch.device | None = None,
        non_blocking: bool = False,
    ) -> torch.storage._StorageBase:
        index = device if isinstance(device, int) or device is None else torch.device(device).index
        check_device_index(index)
        if self.device.type == DEVICE_TYPE:
            return self
        return new_neuron_storage(self.nbytes()).copy_(self, non_blocking)

    return to_neuron


def _new(original_new: Any) -> Any:
    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not _is_neuron_device(kwargs.get("device")):
            return original_new(cls, *args, **kwargs)
        check_device_index(torch.device(kwargs["device"]).index)
        if len(args) == 1 and isinstance(args[0], int) and set(kwargs) == {"device"}:
            return new_neuron_storage(args[0])
        if not args and set(kwargs) == {"device"}:
            return new_neuron_storage(0)
        raise RuntimeError(
            "neuron (adaptive_eager.neuron_sim): only UntypedStorage(nbytes, device='neuron') "
            "is supported; build other storages on the CPU and move them with .to('neuron')"
        )

    return staticmethod(new)


# The rows of the hooks registry (Note [The hooks registry], adaptive_eager/hooks.py).
ROWS = (
    Patch("neuron-sim", "torch.storage._StorageBase", "clone", _clone),
    Patch("neuron-sim", "torch.storage._StorageBase", DEVICE_TYPE, _to_neuron, adds=True),
    Patch("neuron-sim", "torch.UntypedStorage", "__new__", _new),
)


def install() -> None:
    """Patch storage allocation so it never reaches the missing allocator (idempotent)."""
    HOOKS.install(ROWS)
