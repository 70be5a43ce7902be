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
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, BinaryIO, Callable, Iterator

import torch
from torch import fx

log = logging.getLogger("adaptive_eager")


# The worker's Inductor set-up (runtime/inductor_setup.py), re-exported: the runtime and
# the tests import these names from here.
from .gc_quiet import QUIET
from .pacing import pace_hashing, paced
from .worker_pacing import WorkerPacer, contended, usable_cores
from .inductor_setup import (  # noqa: F401
    THREADS_META, CHECKED_META, checked_config, ARTIFACT_BYTES, ISA_META, ISA_PROBED,
    _ISA_ENV, isa_probed, probe_picked_isa, _TRUSTED, _trusting_isa_list, VEC_ISA_ROW,
    trusted_vec_isa, _trusting, _ProbeBeside, _PATTERN_ANCHORS, _may_match_patterns,
    _patterns_deferred, probe_beside,
)

# gm.meta: the program's intra-op thread count when it runs on while this compile is in
# flight (an asynchronous service; else 0): the worker is paced where those threads fill
# the cores (Note [The worker runs in slices while the program fills the cores],
# runtime/worker_pacing.py)
PACED_META = "adaptive_eager_paced"



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
        self._pacer: WorkerPacer | None = None  # the running worker's
        self._paused_s = 0.0  # held paused by earlier workers' pacers

    def paused_s(self) -> float:
        """Seconds the worker was held stopped while compiling, in this process."""
        pacer = self._pacer
        return self._paused_s + (pacer.paused_s if pacer is not None and self._pid == os.getpid() else 0.0)

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
                # its own process group, which the pacer stops and continues whole (the
                # worker and the compiler it runs), and which a terminal's ^C does not
                # reach: the program decides what an interrupt abandons
                process_group=0,
            )
        except OSError as e:
            self._broken = f"cannot start the compile worker: {e}"
            raise WorkerUnavailable(self._broken) from e
        if self._pid != os.getpid() or self._dir is None:  # Note [The artifacts' folder goes at exit]
            self._dir = tempfile.mkdtemp(prefix="adaptive_eager-artifacts-")
        if self._pid != os.getpid():
            self._paused_s, self._pacer = 0.0, None  # a forked child's account starts at 0
        elif self._pacer is not None:
            self._paused_s += self._pacer.paused_s
        self._pacer = WorkerPacer(self._proc.pid, usable_cores())
        self._pid = os.getpid()
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
                _send(proc.stdin, (payload, path, isa_ok, probe_beside(threads)))
                program_threads = gm.meta.get(PACED_META) or 0
                paced = program_threads > 0 and contended(program_threads) and self._pacer is not None
                with abandonable(), self._pacer.pacing() if paced else contextlib.nullcontext():
                    # Note [The loader is warmed while the worker compiles]
                    warm_loader(lambda: _has_reply(proc.stdout), _holder(self._pacer, threads))
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
            except FileNotFoundError as e:  # close() at exit took the folder meanwhile
                if self._closed:
                    raise Exiting("interpreter exiting; compile abandoned") from e
                raise
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
        awaited (the thread waiting on it sees :class:`Exiting`); this process's
        artifacts' folder is removed."""
        self._closed = True
        self._kill()
        folder, self._dir = self._dir, None
        if folder is not None and self._pid == os.getpid():
            shutil.rmtree(folder, ignore_errors=True)


# Note [The artifacts' folder goes at exit]
# The worker hands each artifact back through a file in a private temporary folder (the
# program reads and unlinks it). The folder was made at every start of the worker and
# never removed: each program that compiled left an empty adaptive_eager-artifacts-*
# folder in /tmp (49 in one day of this machine's tests and benchmarks), one more per
# worker restart. Now one folder serves a process's workers, and close() (at exit)
# removes it with whatever an abandoned compile left in it; a forked child makes its own
# and leaves its parent's alone.


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


def paused_s() -> float:
    """Seconds this process's compile worker was held stopped while compiling (Note [The
    worker runs in slices while the program fills the cores]): time a compile's timeout
    does not count."""
    return _WORKER.paused_s()


def exiting() -> bool:
    """Whether the interpreter has begun to exit (the worker closed at exit, or finalizing)."""
    return _WORKER._closed or sys.is_finalizing()


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _has_reply(stream: BinaryIO) -> bool:
    """Whether the worker wrote to ``stream`` (or closed it): a read would not wait."""
    try:
        return bool(select.select([stream.fileno()], [], [], 0)[0])
    except (OSError, ValueError):  # closed meanwhile: nothing to wait for
        return True


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


# Note [The worker waits while the loader runs]
# The loader's warm-up (Note [The loader is warmed while the worker compiles]) runs on the
# service thread, paced to a fifth of the wall time, beside the worker's compile. On 2
# cores with a one-thread program that made three busy threads for two cores: the OS
# preempted the service thread while it held the GIL (an import's unmarshalling, a
# collection of the garbage collector: one gen-2 collection took 204 ms on it), and the
# program's thread, which needs the GIL back after every op, waited. The fresh demo's
# steps 2-39 ran 190-366 ms wall against 168 ms eager at an unchanged 166-177 ms of the
# program thread's CPU (``python -m benchmarks.step_events --steps 70``). So where the
# cores do not cover the program's threads, the loader and the worker (``probe_beside``'s
# test: the same two extra threads), the worker's process group is stopped (its pacer's
# ``hold``) while the loader runs a slice
# and continued while it sleeps (``paced``'s ``hold``): two busy threads for two cores.
# Same command after (fresh caches, load 0.3): steps 2-40 at 174-241 ms (most 174-201),
# slow steps 3, 4 (the first captures' own CPU), 19, 61. The compile pays for it: it
# loses the loader's slices, their GIL waits included (the warm-up: 11.6 s wall, 2.15 s
# CPU). The demo fresh (`adaptive-eager demo`, fresh caches, load ~1.2), alternated with
# the tree before: slow steps after the first two 5, 26, 6, 5 against 11, 6, 20; whole run
# 1.44x, 1.34x, 1.43x, 1.57x against 1.48x, 1.53x, 1.34x; the first region ready after
# 11.4-14.5 s against 10.5-11.5 s. The loader's own steps run nearer eager's; the demo's
# other slow steps (first captures, first calls, the optimizer step's check) vary from run
# to run; the arrival is 2-3 s later.
def _holder(pacer: WorkerPacer | None, threads: int) -> Callable[[bool], None] | None:
    """``hold(on)`` stopping (True) or continuing (False) the worker's process group
    (``pacer``'s), or None where a core is free for each (see the Note)."""
    if pacer is None or probe_beside(threads):
        return None
    return pacer.hold


def warm_loader(ready: Callable[[], bool] | None = None,
                hold: Callable[[bool], None] | None = None) -> None:
    """Pay the first artifact load's one-time set-up now (see the Note); idempotent, and
    never raises (the load pays it instead). ``ready``: whether the worker's reply is
    there; until then the imports are paced (Note [The loader's warm-up is paced while the
    worker compiles], runtime/pacing.py), and ``hold`` stops the worker while they run
    (Note [The worker waits while the loader runs])."""
    if _LOADER_WARM:
        return
    _LOADER_WARM.append(True)
    import importlib  # noqa: PLC0415

    try:
        # Note [The runtime's imports freeze the heap they grew] (runtime/gc_quiet.py)
        with QUIET.burst(), \
                paced(lambda: exiting() or ready(), hold=hold) if ready is not None else contextlib.nullcontext():
            for name in _LOADER_MODULES:
                if exiting():  # the compile thread is waited for at exit (compiler.py)
                    return
                importlib.import_module(name)
            from torch._inductor.codecache import torch_key  # noqa: PLC0415

            pace_hashing()
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
        with QUIET.burst():  # the first load imports Inductor's loader (gc_quiet.py's Note)
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
            payload, path, isa_ok, beside = _recv(inp)
        except EOFError:
            return
        # Note [Only the picked vector ISA is probed], probed beside the compile's start
        # (Note [The worker's probe runs beside its first compile]): before the graph is
        # unpickled, which imports most of Inductor
        verdict = None if isa_ok else _ProbeBeside(beside)
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


