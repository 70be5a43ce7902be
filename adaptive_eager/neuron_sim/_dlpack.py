"""Zero-copy retargeting of a tensor between the CPU and the emulated device.

The emulated `neuron` device keeps its data in ordinary CPU memory. What makes a
tensor a `neuron` tensor is only the device recorded in its storage's `DataPtr`.
This module moves a tensor between the two devices without copying a byte.

# Note [Retargeting through DLPack]
Python has no way to register a PrivateUse1 allocator, so a PrivateUse1 storage
cannot be allocated from Python directly. DLPack is the one public path that builds
a tensor from foreign memory *with an owner*: `torch._C._from_dlpack` wraps the
data pointer in a storage whose deleter releases the capsule's producer. We export
a tensor with `torch._C._to_dlpack`, rewrite `device_type` in the capsule's
`DLTensor` (kDLCPU <-> kDLExtDev, which torch maps to PrivateUse1) and import it
again. The result aliases the same bytes and keeps the source tensor alive for as
long as the new storage lives, so there is no dangling pointer in either direction.

Consequences:
- the new tensor's storage begins at the source's `data_ptr()` (the storage offset
  is folded into the pointer) and spans only the bytes the source can reach;
- its storage is not resizable (no allocator behind it); `resize_` on a neuron
  tensor therefore swaps in a new storage (see `_kernels.resize_`).
"""

from __future__ import annotations

import ctypes

import torch

__all__ = ["retarget", "KDL_CPU", "KDL_EXT_DEV"]

KDL_CPU = 1
KDL_EXT_DEV = 12  # torch maps kDLExtDev to PrivateUse1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
    ]


class _DLTensor(ctypes.Structure):
    # Layout of DLTensor (dlpack.h); a DLManagedTensor starts with one.
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


to_dlpack = torch._C._to_dlpack
from_dlpack = torch._C._from_dlpack
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Byte offset of DLTensor.device.device_type, written through a c_int32 view:
# building ctypes structures or calling memmove per conversion costs several µs,
# and every op converts two or three tensors.
_DEVICE_TYPE_OFFSET = _DLTensor.device.offset + _DLDevice.device_type.offset
_int32_at = ctypes.c_int32.from_address


def retarget(t: torch.Tensor, device_type: int) -> torch.Tensor:
    """Return a tensor aliasing `t`'s memory whose device is `device_type`.

    `device_type` is a DLPack device code: `KDL_CPU` or `KDL_EXT_DEV` (neuron); the
    device index stays 0 (the emulator has one device).
    Sizes, strides and dtype are preserved; autograd history is not (the result is a
    fresh leaf, like `t.detach()`).

    Example::

        >>> x = torch.arange(3.0)
        >>> n = retarget(x, KDL_EXT_DEV)   # a neuron tensor over x's bytes
        >>> retarget(n, KDL_CPU).data_ptr() == x.data_ptr()
        True
    """
    capsule = to_dlpack(t)
    address = _capsule_pointer(capsule, b"dltensor")
    _int32_at(address + _DEVICE_TYPE_OFFSET).value = device_type
    return from_dlpack(capsule)
