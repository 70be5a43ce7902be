"""An emulated Trainium device: PrivateUse1 renamed to ``neuron``, data in CPU memory.

TorchNeuron exposes Trainium as the PrivateUse1 device ``neuron``. This subpackage
emulates that device in pure Python so adaptive-eager's ``neuron`` paths can be
developed and tested without the hardware. A ``neuron`` tensor is a real PrivateUse1
tensor (``t.device == torch.device("neuron", 0)``, ``t.is_neuron``) whose storage is
ordinary CPU memory; its kernels are torch's CPU kernels, so values and gradients
equal CPU eager bit for bit.

Nothing happens on import. The device exists only after ``enable()`` (or
``maybe_enable_from_env()`` with ``ADAPTIVE_EAGER_NEURON_SIM=1``), and enabling is
process-global and irreversible (torch cannot un-rename PrivateUse1).

Example::

    >>> import torch, adaptive_eager.neuron_sim as neuron_sim
    >>> neuron_sim.enable()
    >>> x = torch.ones(2, 3, device="neuron", requires_grad=True)
    >>> (x * 2).sum().backward()
    >>> x.grad
    tensor([[2., 2., 2.],
            [2., 2., 2.]], device='neuron:0')

Public API:

- ``enable(launch_latency_us=None, async_launch=None)``, ``is_enabled()``,
  ``maybe_enable_from_env()``
- launch model: ``launch_count()``, ``reset_launch_count()``,
  ``set_launch_latency_us(us)``, ``launch_latency_us()``, ``single_launch()``;
  asynchronous launches (the default): ``queue_depth()``, ``device_backlog_ns()``, ``device_time_ns()``,
  ``wait_for_device()``
  (what ``torch.neuron.synchronize()`` does), ``set_async_launch(b)``, ``async_launch()``
- environment (read by ``maybe_enable_from_env``): ``ADAPTIVE_EAGER_NEURON_SIM``,
  ``ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US`` (µs per launch),
  ``ADAPTIVE_EAGER_NEURON_SIM_ASYNC`` (1: asynchronous, the default; 0: synchronous)
- zero-copy data access: ``to_cpu_view(t)``, ``from_cpu(t)``
- ``DEVICE_TYPE`` (``"neuron"``), ``ENV_VAR`` (``"ADAPTIVE_EAGER_NEURON_SIM"``)

Limitations of torch's Python PrivateUse1 path are listed in ``LIMITATIONS``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ._launch import (
    async_launch,
    device_backlog_ns,
    device_time_ns,
    launch_count,
    launch_latency_us,
    queue_depth,
    reset_launch_count,
    set_async_launch,
    set_launch_latency_us,
    single_launch,
    wait_for_device,
)
from ._names import ASYNC_ENV_VAR, DEVICE_TYPE, ENV_VAR, LATENCY_ENV_VAR

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEVICE_TYPE",
    "ENV_VAR",
    "LATENCY_ENV_VAR",
    "ASYNC_ENV_VAR",
    "LIMITATIONS",
    "enable",
    "is_enabled",
    "maybe_enable_from_env",
    "launch_count",
    "reset_launch_count",
    "set_launch_latency_us",
    "launch_latency_us",
    "single_launch",
    "queue_depth",
    "device_backlog_ns",
    "device_time_ns",
    "wait_for_device",
    "set_async_launch",
    "async_launch",
    "to_cpu_view",
    "from_cpu",
]


LIMITATIONS = """\
- One device only: torch's C++ Python device guard hard-codes deviceCount() == 1.
- torch.Generator(device="neuron") raises NotImplementedError (getNewGenerator is not
  overridable from Python); neuron random ops draw from the CPU default generator.
- torch.accelerator.synchronize() raises "Backend doesn't support synchronizing all
  streams on device." (synchronizeDevice is not overridable); use
  torch.neuron.synchronize(). Streams and events are the C++ guard's no-ops.
- storage.resize_() on a neuron storage raises NotImplementedError
  (resizePrivateUse1Bytes); Tensor.resize_ works (it swaps in a larger storage).
- scaled_dot_product_attention runs the math decomposition (no fused SDPA stub can be
  registered from Python), so it is close to, not bit-equal with, CPU eager.
- Pinned memory: Tensor.pin_memory() raises NotImplementedError
  (getPinnedMemoryAllocator is not overridable); non_blocking copies are synchronous.
- Only strided dense tensors: sparse/quantized/nested tensors cannot move to the device.
- Tensor.resize_ growing a tensor gives it a new storage; other views of the old
  storage keep the old memory (eager grows the shared storage in place).
"""

_log = logging.getLogger(__name__)


def enable(launch_latency_us: float | None = None, async_launch: bool | None = None) -> None:
    """Create the emulated ``neuron`` device in this process (idempotent).

    Renames PrivateUse1 to ``neuron``, registers ``torch.neuron``, the hooks, the
    device guard and the kernels. A later call only updates the launch model, if given.

    Args:
        launch_latency_us: if not None, every kernel launch takes this many µs
            (see ``set_launch_latency_us``).
        async_launch: if not None, whether launches are asynchronous (the default:
            the host runs ahead and waits where it reads device data) or synchronous
            (each launch busy-waits its latency); see ``set_async_launch``.

    Raises:
        RuntimeError: the real ``torch_neuronx`` is importable, or PrivateUse1 was
            already renamed by another library.

    Example::

        >>> import torch
        >>> enable(launch_latency_us=10)
        >>> torch.zeros(2, device="neuron").device
        device(type='neuron', index=0)
        >>> set_launch_latency_us(0)
    """
    from ._enable import enable as _enable_impl

    _enable_impl(launch_latency_us, async_launch)


def is_enabled() -> bool:
    """Whether ``enable()`` has run in this process.

    Example::

        >>> enable()
        >>> is_enabled()
        True
    """
    from ._enable import is_enabled as _is_enabled_impl

    return _is_enabled_impl()


def maybe_enable_from_env() -> bool:
    """Enable the emulator if ``ADAPTIVE_EAGER_NEURON_SIM`` is set to a true value.

    Meant for the core's autoload entry point: it returns at once when the variable
    is unset (no heavy imports) and never raises; a refusal or failure is logged and
    the device stays off. ``ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US`` and
    ``ADAPTIVE_EAGER_NEURON_SIM_ASYNC`` set the launch model, so an unmodified program
    can run on a device with launch latency; a bad value is logged and ignored.
    Returns whether the emulator is enabled afterwards.

    Example::

        >>> os.environ["ADAPTIVE_EAGER_NEURON_SIM"] = "1"
        >>> maybe_enable_from_env()
        True
    """
    value = os.environ.get(ENV_VAR, "").strip().lower()
    from .._env import OFF_WORDS  # noqa: PLC0415

    if value in OFF_WORDS:
        return False
    try:
        enable()
    except Exception:  # noqa: BLE001 - an autoload hook must never break `import torch`
        _log.warning("%s=%s: neuron emulator not enabled", ENV_VAR, value, exc_info=True)
        return False
    _launch_model_from_env()
    return True


def _launch_model_from_env() -> None:
    from ..config import ConfigError, switch  # noqa: PLC0415 - only when the variables are set

    for variable, apply in ((ASYNC_ENV_VAR, set_async_launch),
                            (LATENCY_ENV_VAR, set_launch_latency_us)):
        if os.environ.get(variable, "").strip() == "":
            continue
        try:
            apply(switch(variable))
        except ConfigError as e:
            _log.warning("%s=%r ignored: %s", variable, os.environ[variable], e)


def to_cpu_view(t: torch.Tensor) -> torch.Tensor:
    """CPU tensor sharing ``t``'s memory: same sizes, strides and dtype, no copy.

    Writes through the view are seen by ``t`` and vice versa, which is how the
    runtime runs Inductor-compiled CPU code on neuron data. The view holds no autograd
    history and keeps ``t``'s memory alive; its storage starts at ``t.data_ptr()``.

    Example::

        >>> import torch
        >>> enable()
        >>> n = torch.zeros(3, device="neuron")
        >>> _ = to_cpu_view(n).add_(1)
        >>> n.cpu()
        tensor([1., 1., 1.])
    """
    _check_device(t, DEVICE_TYPE, "to_cpu_view")
    from ._kernels import to_cpu_view as _to_cpu_view_impl

    return _to_cpu_view_impl(t)


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """Neuron tensor sharing CPU tensor ``t``'s memory (the reverse of ``to_cpu_view``).

    No copy and no autograd history; the result keeps ``t``'s memory alive.

    Example::

        >>> import torch
        >>> enable()
        >>> c = torch.arange(3.0)
        >>> n = from_cpu(c)
        >>> n.device, n.data_ptr() == c.data_ptr()
        (device(type='neuron', index=0), True)
    """
    _check_device(t, "cpu", "from_cpu")
    from ._kernels import from_cpu as _from_cpu_impl

    return _from_cpu_impl(t)


def _check_device(t: torch.Tensor, device_type: str, fn: str) -> None:
    if not is_enabled():
        raise RuntimeError(f"neuron_sim.{fn}: the emulator is not enabled; call enable() first")
    if t.device.type != device_type:
        raise ValueError(f"neuron_sim.{fn} expects a {device_type} tensor, got one on {t.device}")
