"""Turning the emulated device on: checks, PrivateUse1 setup, kernel registration.

# Note [Enabling is one-way]
Renaming PrivateUse1, registering the hooks/guard and the device module are
process-global and irreversible in torch, so `enable()` is idempotent and there is
no `disable()`. The only state is the `_STATE` registry below.
"""

from __future__ import annotations

import functools
import importlib.util
import threading

import torch

from . import _kernels, _storage
from ._launch import set_async_launch, set_launch_latency_us
from ._names import DEVICE_TYPE, ENV_VAR

__all__ = ["enable", "is_enabled"]

_DEFAULT_BACKEND_NAME = "privateuseone"


class _EnableState:
    """Registry of what `enable()` did (see Note [Enabling is one-way])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = False
        self.libraries: list[torch.library.Library] = []


_STATE = _EnableState()


def is_enabled() -> bool:
    """Whether `enable()` completed in this process."""
    return _STATE.enabled


def _refuse_if_unsafe() -> None:
    if importlib.util.find_spec("torch_neuronx") is not None:
        raise RuntimeError(
            "adaptive_eager.neuron_sim: refusing to emulate the 'neuron' device because "
            "the real torch_neuronx is installed; use the real device instead "
            f"(unset {ENV_VAR} or do not call neuron_sim.enable())."
        )
    name = torch._C._get_privateuse1_backend_name()
    if name != _DEFAULT_BACKEND_NAME:
        raise RuntimeError(
            "adaptive_eager.neuron_sim: refusing to enable: the PrivateUse1 backend is "
            f"already registered as {name!r} by another library; torch allows only one "
            "PrivateUse1 backend per process."
        )


def enable(launch_latency_us: float | None = None, async_launch: bool | None = None) -> None:
    """Implementation of `adaptive_eager.neuron_sim.enable` (documented there)."""
    with _STATE.lock:
        if not _STATE.enabled:
            _refuse_if_unsafe()
            _setup_backend()
            _STATE.enabled = True
    if async_launch is not None:
        set_async_launch(async_launch)
    if launch_latency_us is not None:
        set_launch_latency_us(launch_latency_us)


def _setup_backend() -> None:
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from ._device import NeuronDeviceGuard, NeuronDeviceModule, NeuronHooks

    _setup_privateuseone_for_python_backend(
        rename=DEVICE_TYPE,
        backend_module=NeuronDeviceModule(),
        hook=NeuronHooks(),
        device_guard=NeuronDeviceGuard(),
    )
    fallback_library = torch.library.Library("_", "IMPL")
    fallback_library.fallback(_kernels.neuron_fallback, dispatch_key="PrivateUse1")
    # Note [Conjugate views and cross-device copies]
    # copy_ on a backend other than CPU/CUDA goes through _copy_from, which the
    # Conjugate/Negative fallbacks handle by materializing the input with clone(),
    # and clone() copies with copy_ -> _copy_from -> clone() ... until the stack
    # overflows (a segfault on `neuron_tensor.conj().clone()`). The copy kernels
    # handle the bits themselves (to_cpu_view keeps them), so those keys fall through.
    aten_library = torch.library.Library("aten", "IMPL")
    for op in _ops_with_cpu_and_composite_kernels():
        aten_library.impl(op, functools.partial(_kernels.neuron_fallback, op), "PrivateUse1")
    for op in ("_copy_from", "_copy_from_and_resize", "_to_copy"):
        for key in ("Conjugate", "Negative"):
            aten_library.impl(op, torch.library.fallthrough_kernel, key)
    _storage.install()
    # Keep both alive: dropping a Library unregisters its kernels.
    _STATE.libraries = [fallback_library, aten_library]


def _ops_with_cpu_and_composite_kernels() -> list[torch._ops.OpOverload]:
    # Note [CPU kernels over composite ones]
    # A backend without its own kernel for an op that has a CompositeExplicitAutograd
    # (or ...NonFunctional) kernel gets the composite, not the fallback: e.g.
    # native_layer_norm would run as a batch_norm decomposition and differ from CPU
    # eager in the last bit, and structured ops (add, mul, ...) would go through
    # meta + empty + out= (three dispatches). Where CPU has a dedicated kernel we
    # register the fallback explicitly, so neuron numerics equal CPU eager bit for bit.
    # convolution(_backward) are added by name: their composites route a backend
    # other than CPU/CUDA to convolution_overrideable, which has no kernel at all;
    # _to_copy because its composite pins memory for non_blocking copies to the CPU.
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    aten = torch.ops.aten
    ops = [aten.convolution.default, aten.convolution_backward.default, aten._to_copy.default]
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or not has_kernel(name, "CPU"):
            continue
        if not (
            has_kernel(name, "CompositeExplicitAutograd")
            or has_kernel(name, "CompositeExplicitAutogradNonFunctional")
        ):
            continue
        op_name, _, overload = name[len("aten::"):].partition(".")
        ops.append(getattr(getattr(torch.ops.aten, op_name), overload or "default"))
    return ops
