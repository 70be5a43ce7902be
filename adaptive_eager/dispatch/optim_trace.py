"""A new optimizer-step signature traced, and its compile queued or its artifact loaded
(Note [Compiled steps in the persistent cache]); :class:`~.optim_compile.StepCompiler`
calls these where a step's signature has no usable trace yet.

Example::

    >>> from adaptive_eager.dispatch.optim_trace import submit_compile, trace_signature
    >>> callable(trace_signature) and callable(submit_compile)
    True
"""
from __future__ import annotations

import logging
from typing import Any

from torch.utils._python_dispatch import _disable_current_modes

from ..reasons import R
from ..runtime.backends import is_debugging
from ..runtime.cache import COLD, COMPILING, EAGER_ONLY, RegionEntry
from ..runtime.compile_worker import CHECKED_META, THREADS_META
from ..runtime.optim_graph import NotTraceable, StateNotReady, lerp_for_compiler, step_values, trace_step
from .optim_inputs import example as _example, kernel_threads
from .optim_records import Why, _Entry, _note
from .optim_speed import StepSpeed
from .optim_threshold import note_trace

log = logging.getLogger("adaptive_eager")


def trace_signature(opt: Any, got: Any, service: Any, table: Any, counters: Any, cls: str,
                backend: Any, speed: StepSpeed) -> None:
    """Trace a new signature (or another branch of one) and queue its compile; this
    step runs eagerly. ``speed``: the compiled steps' timings (Note [A step found
    slower than eager stays eager in the next process])."""
    try:
        # off the mode stack: a tensor the step makes (AdamW's ``torch.tensor(1.0)`` for
        # its CPU step counters) becomes a constant of the program, and a captured one
        # would be a handle, which the compile worker cannot take (the compile then ran
        # in-process and loaded Inductor's compiler into the program: +115 MiB resident)
        with _disable_current_modes():
            program = trace_step(opt, got)
    except StateNotReady:
        _note(counters, cls, "eager: " + Why.STATE)
        return
    except NotTraceable as e:
        table.setdefault(got.key, []).append(_Entry(cls, None, None, str(e)))
        _note(counters, cls, "signatures")
        _note(counters, cls, f"eager: {Why.FAILED}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - a failure inside the runtime: eager
        log.debug("adaptive_eager: tracing %s's step failed", cls, exc_info=True)
        table.setdefault(got.key, []).append(_Entry(cls, None, None, f"trace failed: {type(e).__name__}: {e}"))
        _note(counters, cls, f"eager: {Why.FAILED}: trace failed")
        return
    # Note [Compiled steps in the persistent cache]
    # The region key is spelled the same in every process (region_store.stable_text):
    # the class by name, the rest of the signature (option names and values, tensor
    # specs, state layout) and the traced graph's code, which fixes the artifact's
    # calling convention (inputs, constants, lifted scalars); the store adds torch's
    # version, the backend and the kernel's thread count. A trace whose artifact an
    # earlier process saved loads it instead of compiling, and its first call is
    # checked like a compiled one's (verify_compiled).
    cls_name = f"{type(opt).__module__}.{type(opt).__qualname__}"
    region = RegionEntry(("optimizer", cls_name, got.key[1:], len(table.get(got.key) or ()),
                          program.gm.code), is_region=False)
    entry = _Entry(cls, program, region)
    table.setdefault(got.key, []).append(entry)
    _note(counters, cls, "signatures")
    steps = step_values(program, got.inputs) or []
    with _disable_current_modes():  # real example tensors (a pending handle: its specs)
        device = getattr(service.compile_fn, "examples_device", None)
        example = [_example(t, j in got.grads, device) for j, t in enumerate(got.inputs)] + \
            list(program.consts) + \
            (program.scalars(got.hyper, steps) or [])
    entry.build = (example, kernel_threads(got.inputs), is_debugging(backend))
    if service.from_disk(region, entry.build[1]):
        _note(counters, cls, "loads from disk")
    elif region.state == COLD and not entry.build[2] and speed.found_slow(opt, region, service):
        entry.build = None  # Note [A step found slower than eager stays eager in the next process]
        _note(counters, cls, f"eager: {Why.FAILED}: {region.reason}")
        return
    # Note [A saved step skips the cost threshold]
    note_trace(getattr(service, "store", None), got, region.disk_key)
    if region.state == COLD:  # nothing saved, or an entry that did not load
        submit_compile(entry, service, counters)
    _note(counters, cls, "eager: " + (Why.COMPILING if region.state == COMPILING else
                                        f"{Why.FAILED}: {region.reason}" if region.state == EAGER_ONLY
                                        else "traced"))

def submit_compile(entry: _Entry, service: Any, counters: Any) -> None:
    """Queue ``entry``'s compile (the build its trace left)."""
    if service.held():  # Note [No compile starts at a fork or at exit]: the trace
        return          # stays for a later step
    cls, program, region = entry.cls, entry.program, entry.region
    example, threads, exact = entry.build
    entry.build = None
    if not service.take_fuel():
        service.fail(region, f"{R.COMPILE_FAILED}: out of fuel")
        return
    _note(counters, cls, "compiles")

    def build() -> tuple:
        gm = program.gm if exact else lerp_for_compiler(program.gm)
        if threads is not None:
            gm.meta[THREADS_META] = threads
        # Note [A checked step skips Inductor's size asserts] (runtime/inductor_setup.py)
        gm.meta[CHECKED_META] = True
        return gm, example

    service.submit(region, build)


__all__ = ["submit_compile", "trace_signature"]
