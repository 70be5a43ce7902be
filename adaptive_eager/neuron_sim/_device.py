"""The `torch.neuron` device module and the PrivateUse1 hooks of the emulated device.

`enable()` registers `NeuronDeviceModule()` as `torch.neuron` (via
`torch._register_device_module`), which is what `torch.neuron.is_available()`,
`torch.manual_seed` (it calls `manual_seed_all` on the device module) and
`torch.accelerator` look up.
"""

from __future__ import annotations

import torch

__all__ = ["NeuronDeviceModule", "NeuronHooks", "NeuronDeviceGuard", "check_device_index"]


def check_device_index(index: int | None) -> None:
    """Raise eager's invalid-ordinal RuntimeError for any neuron index but 0 (or None)."""
    if index not in (None, 0, -1):
        raise RuntimeError(
            f"neuron: invalid device ordinal {index}: the emulator has one device "
            "(torch.neuron.device_count() == 1)"
        )


class NeuronDeviceModule:
    """`torch.neuron`: a single emulated device whose memory is host memory.

    Example::

        >>> torch.neuron.is_available(), torch.neuron.device_count()
        (True, 1)
    """

    # NB: the C++ Python device guard hard-codes one device (deviceCount() == 1,
    # getDevice() == index 0), so more than one emulated device is not reachable.

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        """Autocast dtypes (torch.amp and torch.utils.checkpoint ask every device module)."""
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def set_device(device: int | str | torch.device) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        check_device_index(index)

    class device:
        """Context manager selecting a neuron device; only index 0 exists.

        Example::

            >>> with torch.neuron.device(0):
            ...     pass
        """

        def __init__(self, device: int | str | torch.device | None) -> None:
            if device is not None:
                NeuronDeviceModule.set_device(device)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc_info: object) -> None:
            return None

    @staticmethod
    def memory_allocated(device: int | str | torch.device | None = None) -> int:
        """Bytes held by live neuron tensors (``neuron_sim._memory``), as ``torch.cuda``'s."""
        from ._memory import memory_allocated

        return memory_allocated(device)

    @staticmethod
    def max_memory_allocated(device: int | str | torch.device | None = None) -> int:
        """The most bytes held at once since ``reset_peak_memory_stats()``."""
        from ._memory import max_memory_allocated

        return max_memory_allocated(device)

    @staticmethod
    def reset_peak_memory_stats(device: int | str | torch.device | None = None) -> None:
        """Start the peak from what is held now."""
        from ._memory import reset_peak_memory_stats

        reset_peak_memory_stats(device)

    @staticmethod
    def synchronize(device: int | str | torch.device | None = None) -> None:
        """Wait until every launch issued so far has finished (Note [Asynchronous launches])."""
        check_device_index(torch.device(device).index if isinstance(device, str) else
                           device.index if isinstance(device, torch.device) else device)
        from ._launch import wait_for_device

        wait_for_device()

    @staticmethod
    def manual_seed(seed: int) -> None:
        # Neuron random ops draw from the CPU default generator (see _kernels).
        torch.default_generator.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: int | str | torch.device = "neuron") -> torch.Tensor:
        return torch.default_generator.get_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: int | str | torch.device = "neuron") -> None:
        torch.default_generator.set_state(state)

    def __repr__(self) -> str:
        return "<torch.neuron (adaptive_eager.neuron_sim emulator)>"


class NeuronHooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks: the backend is built and available."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class NeuronDeviceGuard(torch._C._acc.DeviceGuard):
    """Device guard: PrivateUse1, one device, one default stream (C++ defaults)."""

    def type_(self) -> torch._C._autograd.DeviceType:
        return torch._C._autograd.DeviceType.PrivateUse1
