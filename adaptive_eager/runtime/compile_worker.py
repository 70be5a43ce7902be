"""Inductor compiles in a separate process, so the program's thread never waits for one.

# Note [Compile in a subprocess]
# A background *thread* compiling with Inductor runs pure Python for seconds. Each
# ATen op the program's thread runs releases the GIL and must take it back, and a
# busy thread gives it up only every ``sys.getswitchinterval()`` (5 ms): measured on
# this 2-core CPU, 1000 in-place ops on fp32[1000] took 4.5 ms alone and 12.7 s next to
# a Python-busy thread (``python -m benchmarks.gil_convoy``). That convoy, not the
# compile itself, was the multi-second stall seen in the first iterations of the AdamW
# and GPT benchmarks. So Inductor compiles run in one long-lived worker process
# (``_serve`` below, in a fresh interpreter) with ``torch._inductor.standalone_compile``;
# the artifact comes back as a file that the service thread loads in milliseconds,
# while it waits on a pipe with the GIL released.
#
# The worker starts with the first compile, not with the session: it competes for the
# cores while it works (an AdamW step with 2 intra-op threads went from 11 to 32 ms
# next to one busy process on this 2-core machine), so a program that never compiles
# must not pay for it (starting it with the session and warming Inductor up there
# made the benchmark's AdamW step 45 ms, from 25, for its first 15 s). That is also why
# windows wait for their compiles eagerly and why windows that cannot pay are never
# compiled (runtime/compiled.py). It runs at normal priority: at nice 10 it starved
# (still importing sympy 25 s in) while the program kept both cores busy.
#
# Only what can cross a process boundary goes there: CPU tensors, graphs that pickle,
# ops the worker knows (ATen). Anything else (a custom op registered by the program, a
# worker that died or cannot start) compiles in-process as before: the worker is a way
# to compile, never a new way to fail. Inductor options set with
# ``torch._inductor.config`` in the program are not seen by the worker; set them
# through ``TORCHINDUCTOR_*`` environment variables instead (inherited by the worker).

Example::

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (x.sin() * 2,))(torch.ones(4))
    >>> fn = compile_in_worker(gm, [torch.ones(4)])   # doctest: +SKIP
    >>> fn(torch.zeros(4))                              # doctest: +SKIP
    [tensor([0., 0., 0., 0.])]
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from typing import Any, BinaryIO, Callable, Iterator

import torch
from torch import fx

from ..hooks import HOOKS, Patch

log = logging.getLogger("adaptive_eager")


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
class _ProbeBeside:
    """``probe_picked_isa()`` on a thread of its own; calling the object waits for it."""

    def __init__(self) -> None:
        self._verdict: bool | None = None
        self._done = threading.Event()
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


class WorkerUnavailable(RuntimeError):
    """The job cannot go to the worker (or the worker failed); compile in-process."""


class CompileError(RuntimeError):
    """Inductor itself failed on the graph in the worker (the message is its error)."""


class Exiting(CompileError):
    """The interpreter is exiting: the worker was stopped, the compile abandoned."""


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
            raise WorkerUnavailable(f"input on {x.device} / {type(x).__name__}")
        return ("t", tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype,
                x.untyped_storage().nbytes() // max(x.element_size(), 1))
    if isinstance(x, (int, float, bool)) or x is None:
        return x
    raise WorkerUnavailable(f"example input of type {type(x).__name__}")


def _rebuild(d: Any) -> Any:
    if isinstance(d, tuple) and d and d[0] == "t":
        _, shape, stride, offset, dtype, numel = d
        base = torch.zeros(max(numel, 1), dtype=dtype)
        return base.as_strided(shape, stride, offset)
    return d


class _Worker:
    """One worker process and the pipes to it; jobs are serialized by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = -1
        self._dir: str | None = None
        self._broken: str | None = None
        self._closed = False
        self._jobs = itertools.count()  # artifact file names

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            return self._proc
        if self._broken is not None:
            raise WorkerUnavailable(self._broken)
        env = dict(os.environ)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        env.pop("ADAPTIVE_EAGER", None)  # the worker compiles; it never runs the runtime
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "from adaptive_eager.runtime.compile_worker import _serve; _serve()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                # The worker's own messages (Inductor warnings) show only when the
                # program asked for this runtime's debug log.
                stderr=None if log.isEnabledFor(logging.DEBUG) else subprocess.DEVNULL,
                env=env, close_fds=True,
            )
        except OSError as e:
            self._broken = f"cannot start the compile worker: {e}"
            raise WorkerUnavailable(self._broken) from e
        self._pid = os.getpid()
        self._dir = tempfile.mkdtemp(prefix="adaptive_eager-artifacts-")
        return self._proc

    def compile(self, gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        threads = gm.meta.get(THREADS_META) or torch.get_num_threads()
        isa_ok = bool(gm.meta.get(ISA_META))
        try:
            payload = pickle.dumps((gm, [_describe(x) for x in example_inputs], threads,
                                    bool(gm.meta.get(CHECKED_META))))  # meta does not pickle
        except WorkerUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - unpicklable graph: compile in-process
            raise WorkerUnavailable(f"graph does not pickle: {type(e).__name__}: {e}") from e
        if self._closed:
            raise Exiting("interpreter exiting; compile abandoned")
        with self._lock:
            proc = self._start()
            assert self._dir is not None
            path = os.path.join(self._dir, f"{next(self._jobs)}.bin")
            try:
                _send(proc.stdin, (payload, path, isa_ok))
                with abandonable():
                    warm_loader()  # Note [The loader is warmed while the worker compiles]
                    status, detail = _recv(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as e:
                if self._closed:
                    raise Exiting("interpreter exiting; compile abandoned") from e
                self._kill()
                raise WorkerUnavailable(f"compile worker died: {type(e).__name__}: {e}") from e
        if status == "ok":
            try:
                with open(path, "rb") as f:
                    data = f.read()
            finally:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            # The worker was told the ISA probe passes, or just saw it pass: this process
            # need not probe again (Note [The vector ISA probe is remembered]).
            with trusted_vec_isa(isa_ok or detail is True):
                art = load_artifact(data)
            setattr(art, ISA_PROBED, detail)
            return art
        if status == "compile_error":
            raise CompileError(detail)
        raise WorkerUnavailable(detail)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._pid == os.getpid():
            try:
                proc.kill()
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass

    def close(self) -> None:
        """Stop the worker at interpreter exit; a compile in progress is abandoned, not
        awaited (the thread waiting on it sees :class:`Exiting`)."""
        self._closed = True
        self._kill()


@contextlib.contextmanager
def abandonable() -> Iterator[None]:
    """Mark the calling thread as safe to abandon at exit while in the block: it runs
    Python (imports) or waits on the worker's pipe, never inside torch's C++, so the exit
    need not wait for it (compiler.py's Note [A thread in torch's C++ at exit is let
    finish]; a first compile's loader warm-up takes ~1 s)."""
    thread = threading.current_thread()
    thread.adaptive_eager_abandonable = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        thread.adaptive_eager_abandonable = False  # type: ignore[attr-defined]


def close() -> None:
    """Kill the worker at interpreter exit (idempotent): a compile waiting on it sees
    :class:`Exiting` at once."""
    _WORKER.close()


def exiting() -> bool:
    """Whether the interpreter has begun to exit (the worker closed at exit, or finalizing)."""
    return _WORKER._closed or sys.is_finalizing()


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("compile worker closed its pipe")
    n = int.from_bytes(head, "little")
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("compile worker closed its pipe mid-message")
    return pickle.loads(data)


# Note [One worker per process]
# Module-level, like the backend registry: every session of this process shares the
# one worker (a process per session would multiply import costs). Forked children get
# their own on first use (the pid check). The worker is killed at interpreter exit
# (a compile in progress is abandoned: the program is done) and exits by itself when
# its pipe closes (its parent died).
_WORKER = _Worker()
# Before the interpreter joins threads (concurrent.futures registers its own join the
# same way), so that exit never waits for a compile the program no longer needs.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_WORKER.close)
else:  # pragma: no cover - every CPython this project supports has it
    atexit.register(_WORKER.close)


def compile_in_worker(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Compile ``gm`` with Inductor in the worker process; the loaded artifact.

    Raises :class:`WorkerUnavailable` when the job cannot be done there (compile it
    in-process instead) and :class:`CompileError` when Inductor fails on the graph.
    """
    return _WORKER.compile(gm, example_inputs)


# Note [The loader is warmed while the worker compiles]
# The first ``CompiledArtifact.load`` in a process pays Inductor's one-time set-up on the
# service thread: imports (compile_fx, codecache, AOTAutograd's cache entries; 0.8-0.9 s
# CPU) and ``codecache.torch_key()`` (a hash of torch's sources, ~0.3 s), holding the GIL
# against the program at the very moment a region arrives. Measured on a saved artifact
# (``python -m benchmarks.first_region``, load average 6.5): 1.0 s thread CPU for the first
# load, 0.2-0.3 s after the warm-up, 6 ms for later ones. So the service thread pays the
# set-up while it waits for the worker's first compile (seconds, with nothing else to do),
# when the program runs eagerly anyway, not at the region's arrival. The vector ISA
# checks are not warmed: whether Inductor may trust them is the worker's verdict, which
# comes with the artifact (Note [The vector ISA probe is remembered]).
_LOADER_MODULES = ("torch._inductor.standalone_compile", "torch._inductor.compile_fx",
                   "torch._inductor.codecache", "torch._inductor.output_code",
                   "torch._functorch._aot_autograd.aot_autograd_result",
                   "torch._inductor.async_compile", "torch._inductor.runtime.compile_tasks")
_LOADER_WARM: list[bool] = []  # one entry once warmed (a flag, process-wide like _WORKER)


def warm_loader() -> None:
    """Pay the first artifact load's one-time set-up now (see the Note); idempotent, and
    never raises (the load pays it instead)."""
    if _LOADER_WARM:
        return
    _LOADER_WARM.append(True)
    import importlib  # noqa: PLC0415

    try:
        for name in _LOADER_MODULES:
            if exiting():  # the compile thread is waited for at exit (compiler.py)
                return
            importlib.import_module(name)
        from torch._inductor.codecache import torch_key  # noqa: PLC0415

        torch_key()
    except Exception as e:  # noqa: BLE001 - an optional head start
        log.debug("adaptive_eager: warming the artifact loader failed: %s: %s", type(e).__name__, e)


def load_artifact(data: bytes) -> Callable[..., Any]:
    """A saved ``standalone_compile`` artifact (binary format) loaded in this process; it
    carries ``data`` as ``backends.ARTIFACT_BYTES``, for the disk cache."""
    from torch._inductor import CompiledArtifact  # noqa: PLC0415 - heavy, lazy

    fd, path = tempfile.mkstemp(prefix="adaptive_eager-artifact-", suffix=".bin")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        art = CompiledArtifact.load(path=path, format="binary")
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    setattr(art, ARTIFACT_BYTES, data)
    return art


def _serve() -> None:  # pragma: no cover - runs in the worker process
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from compilers must not corrupt the protocol
    inp = sys.stdin.buffer
    torch.set_num_threads(1)

    while True:
        try:
            payload, path, isa_ok = _recv(inp)
        except EOFError:
            return
        # Note [Only the picked vector ISA is probed], probed beside the compile's start
        # (Note [The worker's probe runs beside its first compile]): before the graph is
        # unpickled, which imports most of Inductor
        verdict = None if isa_ok else _ProbeBeside()
        try:
            from torch._inductor import standalone_compile  # noqa: PLC0415 - beside the probe

            gm, described, threads, checked = pickle.loads(payload)
            gm.meta[CHECKED_META] = checked
            example = [_rebuild(d) for d in described]
            # Inductor writes the thread count into its CPU kernels (parallel_num_threads):
            # compile for the program's, not this process's.
            torch.set_num_threads(threads)
        except Exception as e:  # noqa: BLE001
            _send(out, ("unavailable", f"worker cannot load the graph: {type(e).__name__}: {e}"))
            continue
        try:
            with torch.no_grad(), trusted_vec_isa(True) if isa_ok else _trusting(verdict), \
                    _patterns_deferred(gm), checked_config(gm):
                art = standalone_compile(gm, example, dynamic_shapes="from_example_inputs")
            picked = verdict() if verdict is not None else None
            art.save(path=path, format="binary")
            # told: Inductor's ISA lists now hold what it was told, not what a probe found
            _send(out, ("ok", None if isa_ok else True if picked else isa_probed()))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            _send(out, ("compile_error", f"{type(e).__name__}: {e}"[:2000]))


