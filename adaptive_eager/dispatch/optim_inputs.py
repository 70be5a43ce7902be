"""What a compiled optimizer step's compile is handed: its example inputs and the thread
count its kernel is written for (dispatch/optim_compile.py drives both).

Example::

    >>> import torch
    >>> kernel_threads([torch.zeros(3), torch.zeros(GRAIN_SIZE)])
    1
    >>> example(torch.ones(2), dropped=True, device=None).shape
    torch.Size([2])
    >>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.ones(2)
    >>> e = example(p, dropped=False, device=None)
    >>> (type(e).__name__, e.grad, e.data_ptr() == p.data_ptr())
    ('Tensor', None, True)
"""
from __future__ import annotations

from typing import Any

import torch

from .exported import lend
from .lazy import LazyTensor


# Note [A step's compile holds no gradient]
# A step's compile keeps its example inputs until it finishes, several steps later when it
# runs in the background. The program's params and state are alive then anyway, but
# ``zero_grad(set_to_none=True)`` drops each step's grads: examples that were the real
# grads kept one gradient-sized list alive beside the next step's grads (the emulated
# neuron MLP loop: device peak 13.0 -> 19.0 MiB while AdamW's step compiled). So a grad
# and a handle (whose real tensor must not be kept, Note [Releasing bound handles]) are
# handed as uninitialized tensors of their specs, made where the backend takes its
# examples (``examples_device``: the CPU for the emulated device): on the CPU, untouched
# pages are never made resident.
#
# A kept input (a param, a state tensor) is handed detached: a plain tensor sharing its
# memory, with no ``.grad``. Handing the Parameter itself made the backend's fake-tensor
# conversion describe its ``.grad`` too, and a grad still pending in the window (a
# captured backward, read by nothing yet) was then flushed from the compile thread: with
# a synchronous compile that flush waited on the compiler running it, until the 120 s
# compile timeout (tests/test_faults_dispatch.py's old-style weight decay, 2 minutes).
# The alias is lent (exported.py's Note [The runtime's own aliases are not exports]): it
# holds the memory, which must not make memory ``torch.load`` made look exported meanwhile.
def example(t: torch.Tensor, dropped: bool, device: Any) -> torch.Tensor:
    """A compile example for step input ``t`` (``dropped``: the program may drop it)."""
    if type(t) is not LazyTensor and not dropped:
        return lend(t)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device or t.device)


# Note [A small step's kernel runs on one thread]
# Inductor writes the step as one C++ kernel: an OpenMP parallel region around a loop per
# tensor, each loop ending in a barrier (``omp for``, ``omp single``). Eager's ops split
# work over threads only above ATen's grain size (32,768 elements): a step over small
# tensors runs on the calling thread. With two threads, the barriers cost little on an
# idle machine but a descheduled thread each on a busy one: SGD-momentum over the
# benchmark's quick parameter set (40 tensors, 2,048 elements at most) took 23.5 ms a step
# compiled against eager's 0.6 ms, and 1.7 ms compiled with one thread (load average
# 5.7 on 2 cores). So a step whose tensors are all at most the grain size is compiled for
# one thread, as eager would run each of its ops; a bigger one for the program's count.
GRAIN_SIZE = 32768  # at::internal::GRAIN_SIZE


def kernel_threads(inputs: list) -> int | None:
    """1 when every tensor of the step is within ATen's grain size, else None (the
    program's thread count); see Note [A small step's kernel runs on one thread]."""
    return 1 if all(t.numel() <= GRAIN_SIZE for t in inputs) else None


__all__ = ["GRAIN_SIZE", "example", "kernel_threads"]
