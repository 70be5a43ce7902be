"""How the compile worker sets Inductor up for a compile (runtime/compile_worker.py runs
the worker): the graph-meta keys a compile carries, the vector-ISA probe and its trust
(Notes [Only the picked vector ISA is probed], [Only the picked ISA's own checks run],
[The worker's probe runs beside its first compile]), the pattern tables left unloaded
for graphs they cannot match, and Inductor's size asserts left out for checked steps.

Example::

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (x + 1,))(torch.ones(2))
    >>> _may_match_patterns(gm)
    False
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

from torch import fx

from ..hooks import HOOKS, Patch
from .worker_pacing import usable_cores


# gm.meta key: the program's intra-op thread count when the compile was submitted
# (CompileService.submit sets it). Inductor bakes the count into its CPU kernels, so a
# worker compiling with its own (1) made every compiled region single-threaded.
THREADS_META = "adaptive_eager_num_threads"


# gm.meta key: the caller checks every input's sizes and strides before each call, so the
# compiled code need not (Note [A checked step skips Inductor's size asserts]).
CHECKED_META = "adaptive_eager_inputs_checked"


# Note [A checked step skips Inductor's size asserts]
# Inductor's generated ``call`` begins with one ``assert_size_stride`` per input (its
# ``size_asserts`` option, on by default), ~0.86 µs each: an optimizer step over 100
# tensors has 302 inputs (SGD-momentum: param, grad, momentum buffer each, and two
# scalars), 0.26 ms of its 2.6 ms compiled step, and AdamW's 500 more. torch.compile pays
# them too, after Dynamo's guards checked the same. A compiled optimizer step is only
# called with inputs whose sizes and strides the caller checked: a full gather puts
# every input's (shape, stride, dtype, device) in the signature the compiled function is
# looked up by, and a known step checks its grads, params and state tensors with
# Dynamo's tensor guard (runtime/optim_fast.py). So such a graph carries CHECKED_META and
# is compiled with ``size_asserts`` off. Regions keep them (their inputs are checked by
# the window key too, but that path has more ways in).
def checked_config(gm: fx.GraphModule) -> Any:
    """Inductor's config patched for ``gm``: size asserts off where the caller checks
    (Note [A checked step skips Inductor's size asserts])."""
    if not gm.meta.get(CHECKED_META):
        return contextlib.nullcontext()
    from torch._inductor import config as inductor_config  # noqa: PLC0415 - loaded by now

    return inductor_config.patch({"size_asserts": False})


# The attribute a compiled artifact carries its saved bytes in, for the disk cache
# (runtime/region_store.py): set by the compile function that produced them.
ARTIFACT_BYTES = "adaptive_eager_artifact_bytes"

# gm.meta key: whether an earlier process saw the vector ISA Inductor picks pass its probe
# (Note [The vector ISA probe is remembered], runtime/region_store.py).
ISA_META = "adaptive_eager_vec_isa_ok"
# The attribute a compiled artifact carries the worker's probe verdict in (isa_probed()).
ISA_PROBED = "adaptive_eager_isa_probed"
_ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


def isa_probed() -> bool | None:
    """Whether this process probed (compiled and loaded a test library for) every vector
    ISA the CPU's flags allow, and each passed; None when it did not probe (told, or not
    x86). Cheap once Inductor has picked an ISA (its lists are cached)."""
    import platform  # noqa: PLC0415

    from torch._inductor import config as inductor_config  # noqa: PLC0415 - loaded by now
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415

    if inductor_config.cpp.vec_isa_ok is not None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    flags = cpu_vec_isa.x86_isa_checker()
    allowed = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
               if all(flag in flags for flag in str(isa).split())]
    return bool(allowed) and [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == allowed


# Note [Only the picked vector ISA is probed]
# Inductor's first kernel in a fresh process probes every vector ISA the CPU's flags allow
# (``cpu_vec_isa.valid_vec_isa_list``: amx, avx512_vnni, avx512, avx2 here), each a g++
# build of ATen's vector headers, and then uses the first that passed. On a fresh machine
# that was most of the first compile's wait: 10.6 s CPU in g++ (30 s wall at load average
# 7), against 1.4 s once the libraries are in Inductor's cache (``/tmp/w34_phases.py``-style
# measurement in the commit that added this). The worker probes only the ISA Inductor
# would pick (the first the flags allow; its own checks, the same build), and when it
# passes tells Inductor every ISA is usable (``cpp.vec_isa_ok``), which then picks that
# same first ISA without probing the rest. When it fails, Inductor probes as before. Not
# done when the user chose (TORCHINDUCTOR_VEC_ISA_OK, ATEN_CPU_CAPABILITY,
# ``cpp.simdlen``): Inductor's pick is then not the first allowed ISA.
def probe_picked_isa() -> bool | None:
    """Probe the vector ISA Inductor would pick (see the Note): True when it passed, False
    when it failed, None when the shortcut does not apply (a user's choice, not x86)."""
    import platform  # noqa: PLC0415

    if _ISA_ENV in os.environ or os.environ.get("ATEN_CPU_CAPABILITY") or \
            platform.machine() not in ("x86_64", "AMD64"):
        return None
    from torch._inductor import config as inductor_config  # noqa: PLC0415 - heavy, lazy
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415

    if inductor_config.cpp.vec_isa_ok is not None or inductor_config.cpp.simdlen is not None:
        return None
    flags = cpu_vec_isa.x86_isa_checker()
    allowed = [isa for isa in cpu_vec_isa.supported_vec_isa_list
               if all(flag in flags for flag in str(isa).split())]
    if not allowed:
        return None
    return bool(allowed[0])


# Note [Only the picked ISA's own checks run]
# ``cpp.vec_isa_ok`` skips each ISA's base probe, not the checks of its extensions: with
# it, Inductor's ``valid_vec_isa_list`` still built and dlopen-probed avx512_bf16 for each
# of avx512_vnni and avx512 (ISAs it never picks, being after amx in its order) and
# AMX's own tile and bf16 checks: 7 test libraries built by a fresh worker (g++, 6.2 s of
# its children's CPU with the kernel, load average 7.7, ``python -m benchmarks.first_region``)
# and 11 probe subprocesses in each process's first artifact load (1.3 s wall). Inductor
# picks the first ISA of that list (``pick_vec_isa``, the only caller, when neither
# ``cpp.simdlen`` nor ATEN_CPU_CAPABILITY chooses), which is the first ISA the CPU's flags
# allow whenever that one passes its checks. So while trusted, the list is that ISA alone
# after its own checks (``bool(isa)``: the ones that set its build flags), and Inductor's
# own list otherwise (it fails them, or a user's setting chooses): the same pick, with
# the other ISAs' builds and probes left out. The list is cut only inside the ``with`` (a
# load on the compile service's thread, or the worker's compile) and on the thread in it:
# a ``torch.compile`` on another thread meanwhile gets Inductor's own list (the same
# pick). The function is a row of the hooks registry (Note [The hooks registry],
# hooks.py): installed at the first trusted block, a wrapper that calls Inductor's own
# function outside one, undone by ``HOOKS.uninstall("vec-isa")``.
_TRUSTED = threading.local()  # .on: this thread is inside trusted_vec_isa (x86)


def _trusting_isa_list(original: Callable[[], list]) -> Callable[[], list]:
    from torch._inductor import config as inductor_config  # noqa: PLC0415 - loaded by now
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415

    def valid_vec_isa_list() -> list:
        on = getattr(_TRUSTED, "on", False)
        if callable(on):  # Note [The worker's probe runs beside its first compile]
            on = on() is True
        if on and inductor_config.cpp.simdlen is None and not os.environ.get("ATEN_CPU_CAPABILITY"):
            flags = cpu_vec_isa.x86_isa_checker()
            first = next((isa for isa in cpu_vec_isa.supported_vec_isa_list
                          if all(flag in flags for flag in str(isa).split())), None)
            if first is not None and first:
                return [first]
        return original()

    valid_vec_isa_list.cache_clear = getattr(original, "cache_clear", lambda: None)  # type: ignore[attr-defined]
    return valid_vec_isa_list


VEC_ISA_ROW = Patch("vec-isa", "torch._inductor.cpu_vec_isa", "valid_vec_isa_list", _trusting_isa_list)


@contextlib.contextmanager
def trusted_vec_isa(ok: bool) -> Iterator[None]:
    """Inductor told that every vector ISA the CPU allows works (``ok``), so it does not
    probe them again, and only the picked ISA's own checks run on this thread (Note [Only
    the picked ISA's own checks run]); a ``TORCHINDUCTOR_VEC_ISA_OK`` set by the user wins."""
    if not ok or _ISA_ENV in os.environ:
        yield
        return
    from torch._inductor import config as inductor_config  # noqa: PLC0415 - heavy, lazy

    with inductor_config.patch({"cpp.vec_isa_ok": True}), _trusting(True):
        yield


@contextlib.contextmanager
def _trusting(on: bool | Callable[[], bool | None]) -> Iterator[None]:
    """This thread's list cut to the picked ISA while ``on`` (or, a callable, once the
    verdict it waits for is True: Note [The worker's probe runs beside its first compile])
    and the CPU is x86; the registry's row installed there."""
    import platform  # noqa: PLC0415

    x86 = platform.machine() in ("x86_64", "AMD64")
    if x86:
        HOOKS.install([VEC_ISA_ROW])
    before = getattr(_TRUSTED, "on", False)
    _TRUSTED.on = on if x86 else False
    try:
        yield
    finally:
        _TRUSTED.on = before


# Note [The worker's probe runs beside its first compile]
# A fresh worker's first compile ran its steps one after another: import Inductor, probe
# the picked vector ISA (g++ builds a test library and a subprocess loads it: ~2.6 s of
# g++ CPU, Note [Only the picked vector ISA is probed]), then trace, lower and generate
# code, build the kernel. Only code generation needs the verdict (``pick_vec_isa``). So
# the worker imports what the probe uses (``cpu_vec_isa``, ``cpp_builder``,
# ``codecache``: two threads importing one package's circular modules at once can fail
# with a deadlock error, so the probe's thread imports nothing new), starts the probe on
# a thread of its own (it waits on g++ with the GIL released), and imports the rest of
# Inductor and traces and lowers the graph meanwhile; ``valid_vec_isa_list`` waits for
# the verdict where Inductor asks for it. The verdict's own build ran with
# ``cpp.vec_isa_ok`` unset, so Inductor's cached answer for the picked ISA is the probe's
# and nothing is built twice; a failed probe leaves Inductor's own list (it probes every
# ISA, as before). Nothing changes for a worker told the ISA passes (disk cache meta).
#
# Beside, only where a core is free for it: the worker compiles on one core and the
# program's intra-op threads take theirs, so the probe runs beside the compile only when
# the cores this process may use outnumber the program's threads by two; otherwise it
# runs first, on the worker's own core. Beside on a 2-core machine with a one-thread
# program it took a third core (sampled from /proc in the demo's fresh run: program
# 0.5-0.9 of a core, worker 0.5-0.7, the probe's cc1plus 0.5-0.8, for 3 s; the program's
# steps 200-300 ms wall at 160 ms of CPU). At nice 19 instead it starved where the
# program's threads kept both cores busy (OpenMP threads spin): the AdamW benchmark, two
# threads on two cores, never got its compiled step within the run (0% of steps compiled,
# 0.83x eager, from 100%).
def probe_beside(threads: int) -> bool:
    """Whether the worker's probe may run beside its compile: a core free for it, past the
    worker's own and the program's ``threads`` (Note [The worker's probe runs beside its
    first compile])."""
    return usable_cores() >= threads + 2


class _ProbeBeside:
    """``probe_picked_isa()`` on a thread of its own (``beside``; else now); calling the
    object waits for it."""

    def __init__(self, beside: bool = True) -> None:
        self._verdict: bool | None = None
        self._done = threading.Event()
        if not beside:  # no core free for it (see the Note): now, on this thread
            self._run()
            return
        try:
            from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401, PLC0415
            from torch.utils import _filelock  # noqa: F401, PLC0415
        except Exception:  # noqa: BLE001 - no verdict: Inductor probes as before
            self._done.set()
            return
        threading.Thread(target=self._run, name="adaptive_eager-isa-probe", daemon=True).start()

    def _run(self) -> None:
        try:
            self._verdict = probe_picked_isa()
        except Exception:  # noqa: BLE001 - no verdict: Inductor probes as before
            self._verdict = None
        finally:
            self._done.set()

    def __call__(self) -> bool | None:
        self._done.wait()
        return self._verdict


# Note [Pattern tables wait for a graph they can match]
# Inductor's joint-graph passes load their pattern tables at the process's first compile
# (``fx_passes.joint_graph.lazy_init``: the fused-attention patterns, mm padding, randperm
# indexing; ~1 s of a fresh worker's CPU, 1.46 s of 10 s under cProfile in the demo's first
# compile, its AdamW step). Every one of those patterns holds a matrix product (``mm``,
# ``bmm``, ``addmm``) or ``randperm``, so none can match a graph without one, which is
# what an optimizer step or a pointwise region is: the worker compiles such a graph with
# the tables left unloaded, and the first graph that has one loads them as before. The
# artifact is the same either way (no pattern could have matched), and so is Inductor's
# cache key. Conservative: any call of a module or method, or an anchor below, loads them.
_PATTERN_ANCHORS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "randperm", "_softmax",
                              "softmax", "_safe_softmax", "scaled_dot_product_attention",
                              "_scaled_dot_product_flash_attention_for_cpu",
                              "_scaled_dot_product_attention_math"})


def _may_match_patterns(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` holds an op some joint-graph pattern could match (see the Note)."""
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return True
        if node.op == "call_function":
            packet = getattr(node.target, "_overloadpacket", node.target)
            if getattr(packet, "__name__", None) in _PATTERN_ANCHORS:
                return True
    return False


@contextlib.contextmanager
def _patterns_deferred(gm: fx.GraphModule) -> Iterator[None]:
    """Inside: Inductor's joint-graph pattern tables are not loaded for ``gm`` when no
    pattern could match it (see the Note)."""
    try:
        from torch._inductor.fx_passes import joint_graph  # noqa: PLC0415 - heavy, lazy
    except Exception:  # noqa: BLE001 - a torch without it: nothing to defer
        yield
        return
    original = joint_graph.lazy_init
    if _may_match_patterns(gm):
        yield
        return
    joint_graph.lazy_init = lambda *args, **kwargs: None
    try:
        yield
    finally:
        joint_graph.lazy_init = original
