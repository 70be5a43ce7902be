"""The compile service: runs backend compiles off the program's thread, with a timeout.

# Note [Compile in a worker thread, never under our modes]
# Inductor runs FakeTensorMode and AOTAutograd internally, so a compile must not run
# under DisableTorchDispatch, our dispatch mode, or autograd (flushes happen inside
# all three). Mode stacks are thread-local: a fresh thread has none. So every compile
# runs in the service's worker thread; a synchronous compile just waits for it. An
# asynchronous one lets the program continue eagerly and switch when ready.
# A compile past ``timeout_s`` marks its region eager-only; its late result is dropped.

Example::

    >>> from adaptive_eager.runtime.counters import Counters
    >>> from adaptive_eager.runtime.cache import RegionEntry
    >>> svc = CompileService(lambda gm, ex: gm, Counters(), async_=False, timeout_s=10)
    >>> e = RegionEntry("k")
    >>> svc.submit(e, lambda: (lambda x: x, []))
    >>> e.state
    'compiled'
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import logging
import os
import queue
import sys
import threading
import time
import weakref
from typing import Any, Callable

import torch

from .._logging import artifact_logger
from ..hooks import HOOKS, Patch, rng_setters_skipped, skip_rng_setters_in_this_thread
from .windows import transition
from .cache import COLD, COMPILED, COMPILING, EAGER_ONLY, RegionEntry
from .compile_worker import ISA_META, ISA_PROBED, PACED_META, THREADS_META, Exiting
from .compile_worker import close as close_worker, exiting as worker_exiting, paused_s as worker_paused_s
from .counters import Counters
from .holds import compiles_are_held
from .layouts import LayoutDisagreement, explains_layout, layout_disagreements
from .region_store import RegionStore
from ..reasons import R

log = logging.getLogger("adaptive_eager")
clog = artifact_logger("ae_compiles")

FUEL_ENV = "ADAPTIVE_EAGER_FUEL"

# Note [GIL convoy]
# A compile running Python in this service's thread holds the GIL for up to the
# interpreter's switch interval (5 ms) each time the program's thread wants it back,
# and the program's thread gives it up at every ATen op: measured, 1000 small ops took
# 4.5 ms alone and 12.7 s next to a busy thread, 205 ms with a 100 µs interval. Inductor
# compiles run in a worker process (Note [Compile in a subprocess]); for what still
# runs here (other backends, in-process fallbacks, loading artifacts) the interval is
# lowered while the compile runs and restored after.
COMPILE_SWITCH_INTERVAL_S = 1e-4


# Note [Compiles never rewind the program's random stream]
# AOTAutograd and Dynamo save the global generators' states when a compile starts and
# set them back when it ends (torch._dynamo.utils.preserve_rng_state, convert_frame's
# preserve_global_state): harmless on the thread that compiles, but these compiles run
# in the service's thread while the program goes on drawing random numbers, and setting
# the state back rewound the program's stream to where it was when the compile began.
# Measured: an MLP trained with AdamW under backend aot_eager drew its batches again
# from an earlier state once a compile finished (loss 7.8e-2 off eager at step 37 of
# 40, on CPU and on the emulated neuron device). The regions compiled here never hold a
# random op (SupportPolicy refuses them), so a compile draws nothing and has nothing to
# restore: on the service's thread, torch's set_rng_state functions do nothing (a
# thread-local flag, hooks.py's Note [The compile thread's random stream]; every other
# thread calls them as before). Inductor compiles run in a worker process, whose
# generators are its own. torch's and torch.random's set_rng_state are also opaque calls
# (dispatch/opaque.py), whose one wrapper checks the same flag (the row covers this one).
_RNG_SETTERS = ("torch.random", "torch", "torch.cuda", "torch.xpu", "torch.mps")


def _skipped_on_compile_thread(setter: Callable) -> Callable:
    def set_rng_state(*args: Any, **kwargs: Any) -> Any:
        if rng_setters_skipped():
            return None
        return setter(*args, **kwargs)

    set_rng_state.__doc__ = setter.__doc__
    set_rng_state.__name__ = getattr(setter, "__name__", "set_rng_state")
    return set_rng_state


# The compile thread's rows of the hooks registry (Note [The hooks registry], hooks.py).
RNG_ROWS = tuple(Patch("rng-guard", owner, "set_rng_state", _skipped_on_compile_thread)
                 for owner in _RNG_SETTERS)


def guard_rng_setters() -> None:
    """Install Note [Compiles never rewind the program's random stream] (idempotent)."""
    HOOKS.install(RNG_ROWS)


# Note [Compile threads never block exit]
# concurrent.futures' ThreadPoolExecutor joins its (non-daemon) threads at interpreter
# exit, so a compiler that never returns (a hung in-process compile: the timeout marks
# its region eager-only but cannot stop it) kept a finished program from exiting. The
# service runs its compiles in one daemon thread of its own instead; a compile still
# running at exit is abandoned, as the worker process's is (Note [One worker per process]).
#
# Note [A thread in torch's C++ at exit is let finish]
# A daemon thread still inside an ATen call when the interpreter finalizes is ended by
# CPython when it next takes the GIL: a forced unwind through torch's C++ frames, which
# calls std::terminate ("terminate called without an active exception", exit status 134,
# after the program had printed its results). The optimizer step's checker thread
# (runtime/step_check.py) clones up to the step's whole state right after a step, so a
# program ending then aborted (benchmarks.memory's GPT row, every run). A thread made
# with ``finish_at_exit=True`` is stopped when the interpreter begins to exit (before
# daemon threads are abandoned): queued calls are cancelled and the current one, a
# bounded stretch of tensor work, is waited for (at most FINISH_AT_EXIT_S).
# The compile thread is one too: a compile run in-process (a backend other than
# Inductor's worker, the optimizer step's trace, a region loaded from the disk cache)
# still running at exit aborted the same way (a gated backend released at exit: status
# 134 in 2 of 4 runs). The worker is closed first, so a compile waiting on the worker
# process ends at once (Exiting) instead of being waited for, and a thread inside
# ``compile_worker.abandonable()`` (imports, the pipe wait: Python only) is not waited
# for; only in-process work is (the first compile's loader warm-up had made a program
# ending just after queueing it wait ~1 s at exit), and not past the compile's own
# timeout (``compile_timeout_s``): a compile that never returns, eager-only once timed out,
# is abandoned as before (Note [Compile threads never block exit]; a hung backend with a
# 0.5 s timeout had made exit wait the whole FINISH_AT_EXIT_S).
FINISH_AT_EXIT_S = 30.0

# Note [An idle thread ends]
# A DaemonThread's thread waited for its next job forever, and the target (a bound
# method) kept the DaemonThread alive with it: every session dropped (evicted past
# _MAX_SESSIONS, session.clear_sessions(), which the benchmarks call between runs) left
# its compile thread and its checker thread behind, blocked on an empty queue. The test
# suite ended with ~260 such threads in one process. So a thread with nothing to do for
# IDLE_EXIT_S ends, and the next submit starts a new one (~0.1 ms, once per idle spell),
# which runs the thread's per-thread set-up again first (``on_start``: the checker
# thread's one OpenMP thread, Note [A checker thread with one OpenMP thread]).
# The start and the idle exit take one lock, so a job put while the thread decides to
# end is never left without a thread.
IDLE_EXIT_S = 30.0
_FINISHING: "weakref.WeakSet[DaemonThread]" = weakref.WeakSet()


def _finish_threads_at_exit() -> None:
    close_worker()  # Note [One worker per process]: idempotent; its own atexit row runs later
    for t in list(_FINISHING):
        t.finish()


if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_finish_threads_at_exit)
else:  # pragma: no cover - every CPython this project supports has it
    atexit.register(_finish_threads_at_exit)


class DaemonThread:
    """One daemon thread running submitted calls in order; each returns a Future.

    ``finish_at_exit``: stopped, its current call waited for, when the interpreter begins
    to exit (Note [A thread in torch's C++ at exit is let finish])."""

    def __init__(self, name: str, finish_at_exit: bool = False, idle_s: float | None = None,
                 on_start: Callable[[], Any] | None = None):
        self._name = name
        self._on_start = on_start  # run first in each thread it starts (Note [An idle thread ends])
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle_s = IDLE_EXIT_S if idle_s is None else idle_s
        self._started = threading.Lock()  # the thread's start and its idle exit
        self._deadline: float | None = None  # the current call's (time.monotonic), if any
        self._pid = -1
        if finish_at_exit:
            _FINISHING.add(self)

    def finish(self, timeout: float = FINISH_AT_EXIT_S) -> None:
        """Cancel queued calls and wait (up to ``timeout``, and not past the current call's
        own deadline) for the current one to end."""
        thread = self._thread
        self.shutdown()
        deadline = self._deadline
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        if thread is not None and self._pid == os.getpid() and thread is not threading.current_thread() \
                and not getattr(thread, "adaptive_eager_abandonable", False):  # compile_worker.abandonable
            thread.join(timeout)

    def is_current(self) -> bool:
        """Whether the caller runs on this thread (a job that submits another)."""
        return self._thread is threading.current_thread()

    def submit(self, fn: Callable, *args: Any, deadline: float | None = None) -> cf.Future:
        """Run ``fn(*args)`` after the calls before it; ``deadline`` (``time.monotonic()``):
        past it, the call is not waited for at exit."""
        fut: cf.Future = cf.Future()
        if self._pid != os.getpid() and self._pid != -1:  # forked: the parent's thread may
            self._started = threading.Lock()              # have held the lock at the fork
        with self._started:
            self._jobs.put((fut, fn, args, deadline))
            if self._thread is None or self._pid != os.getpid():  # none, idle, or forked
                self._pid = os.getpid()
                guard_rng_setters()
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.adaptive_eager_exempt = True  # type: ignore[attr-defined]
                self._thread.start()
        return fut

    def _next(self) -> Any:
        """The next job; None when told to stop or idle for ``idle_s`` (Note [An idle
        thread ends])."""
        while True:
            try:
                return self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._started:
                    if self._jobs.empty() and self._thread is threading.current_thread():
                        self._thread = None
                        return None

    def _run(self) -> None:
        skip_rng_setters_in_this_thread()  # Note [Compiles never rewind the program's random stream]
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # noqa: BLE001 - a set-up that fails leaves the thread as made
                pass
        while True:
            job = self._next()
            if job is None:
                return
            fut, fn, args, self._deadline = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on it
                fut.set_exception(e)
            self._deadline = None
            # The job's arguments (a graph and its example inputs: a region's worth of
            # memory) go now, not when the next job replaces them.
            del job, fut, fn, args

    def shutdown(self) -> None:
        """Cancel queued calls and let the thread end after the current one."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        self._jobs.put(None)


# Note [No compile starts at a fork or at exit]: runtime/holds.py.


def _fuel_from_env() -> int | None:
    """``ADAPTIVE_EAGER_FUEL`` (None: unset); a bad value raises ConfigError naming it."""
    from ..config import switch  # noqa: PLC0415 - a leaf module

    return switch(FUEL_ENV)


def _short(key: Any) -> str:
    """A region key as a short, stable id for logs."""
    return f"{hash(key) & 0xFFFFFFFF:08x}"


class CompileService:
    """Compiles region graphs with ``compile_fn`` in one worker thread.

    ``fuel``: how many regions may still be compiled (None: unlimited; from
    ``ADAPTIVE_EAGER_FUEL`` by default), to bisect a miscompile: with fuel N, only the
    first N regions compile and the rest run eagerly.
    """

    def __init__(self, compile_fn: Callable, counters: Counters, async_: bool, timeout_s: float,
                 fuel: int | None = -1, decompositions: Callable[[], Any] | None = None,
                 store: RegionStore | None = None, paused: Callable[[], float] = worker_paused_s,
                 pace: bool = False):
        self.compile_fn = compile_fn
        # seconds the worker was held stopped, in all: not counted by a compile's timeout
        # (Note [The worker runs in slices while the program fills the cores])
        self.paused = paused
        self.pace = pace  # option pace_compiles
        # the backend's decompositions, to name an op whose layout it changes (layouts.py)
        self.decompositions = decompositions
        self.store = store  # Note [Regions compiled by an earlier process]
        self.counters = counters
        self.async_ = async_
        self.timeout_s = timeout_s
        self.fuel = _fuel_from_env() if fuel == -1 else fuel
        self._pool: DaemonThread | None = None
        self._lock = threading.Lock()
        self._logged: set[str] = set()

    def _executor(self) -> DaemonThread:
        with self._lock:
            if self._pool is None:
                self._pool = DaemonThread("adaptive_eager-compile", finish_at_exit=True)
            return self._pool

    def _deadline(self, entry: RegionEntry) -> float | None:
        """When ``entry``'s compile times out (None: never): past it, exit does not wait."""
        return entry.submitted_at + self.timeout_s if self.timeout_s else None

    def take_fuel(self) -> bool:
        with self._lock:
            if self.fuel is None:
                return True
            if self.fuel <= 0:
                return False
            self.fuel -= 1
            return True

    @staticmethod
    def held() -> bool:
        """Whether no compile or load may start now: the calling thread is inside
        :func:`compiles_held` (a fork's flush), or the interpreter is exiting (Note [No
        compile starts at a fork or at exit])."""
        return compiles_are_held() or worker_exiting()

    def submit(self, entry: RegionEntry, build: Callable[[], tuple[Any, list]]) -> None:
        """Compile ``build()``'s (GraphModule, example inputs) for ``entry``.

        ``build`` runs here, in the caller's thread (it reads the window); the compile
        runs in the worker. Synchronous services wait (up to the timeout). While
        :meth:`held`, nothing starts: the region stays cold, for a later sighting.
        """
        if self.held():
            return
        try:
            gm, example = build()
        except Exception as e:  # noqa: BLE001 - lowering failure: region stays eager
            self.fail(entry, f"{R.LOWERING_FAILED}: {type(e).__name__}: {e}")
            return
        threads = program_threads = torch.get_num_threads()
        meta = getattr(gm, "meta", None)
        if isinstance(meta, dict):  # the program's thread count, for Inductor's kernels,
            # unless the builder chose one (Note [A small step's kernel runs on one thread])
            threads = meta.setdefault(THREADS_META, threads)
            meta[PACED_META] = program_threads if self.async_ and self.pace else 0
        if self.store is not None:
            if entry.disk_key is None:
                entry.disk_key = self.store.key(entry.key, threads)
            if isinstance(meta, dict):  # Note [The vector ISA probe is remembered]
                meta[ISA_META] = self.store.isa_ok()
        if not transition(entry, COMPILING):  # Note [A region's states] (runtime/windows.py)
            return
        entry.submitted_paused = self.paused()
        with self.counters.lock:
            self.counters.compiles_in_flight += 1
        clog.debug("compile queued: region %s (%d graph nodes, %d in flight)", _short(entry.key),
                   len(getattr(getattr(gm, "graph", None), "nodes", ())), self.counters.compiles_in_flight)
        pool = self._executor()
        fut = pool.submit(self._compile, entry, gm, example, deadline=self._deadline(entry))
        # Note [A compile never waits on its own thread]
        # A compile can flush the program's window: a backend's fake-tensor conversion that
        # reads a pending handle (a param's ``.grad`` still in the window) materializes it,
        # and that flush may submit a region of its own. On the compile thread a
        # synchronous wait for that job waits on the job running it: the program hung
        # until the compile timeout (120 s) and the outer compile failed. So a submit from
        # the compile thread never waits: the inner region runs eagerly until its compile,
        # queued behind this one, is ready, as with an asynchronous service.
        if not self.async_ and not pool.is_current():
            try:
                fut.result(timeout=self.timeout_s or None)
            except cf.TimeoutError:
                self.fail(entry, f"{R.COMPILE_TIMED_OUT} {self.timeout_s:.0f} s")

    def _landed(self) -> None:
        """A compile or a load ended (Note [A region landing ends the wait], runtime/adapt.py)."""
        with self.counters.lock:
            self.counters.regions_landed += 1

    def _compile(self, entry: RegionEntry, gm: Any, example: list) -> None:
        try:
            self._compile_one(entry, gm, example)
        finally:
            self._landed()

    def _compile_one(self, entry: RegionEntry, gm: Any, example: list) -> None:
        t0, paused0 = time.perf_counter(), self.paused()
        clog.debug("compile started: region %s (queued %.2f s)", _short(entry.key),
                   time.monotonic() - entry.submitted_at)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, COMPILE_SWITCH_INTERVAL_S))  # Note [GIL convoy]
        try:
            fn = self.compile_fn(gm, example)
            err = None
        except BaseException as e:  # noqa: BLE001 - a compiler error: eager-only, never
            fn, err = None, e          # raised; an interrupt: books kept, then re-raised
        finally:
            sys.setswitchinterval(switch)
        dt = time.perf_counter() - t0
        with self.counters.lock:  # a compile abandoned at exit was held too
            self.counters.compile_paused_s += self.paused() - paused0
        exiting = isinstance(err, Exiting)
        if exiting:
            # The interpreter is exiting: nothing to log, and the compile stays counted in
            # flight, which is what the exit report (written after the worker stops) says.
            transition(entry, EAGER_ONLY, str(err))
            return
        with self.counters.lock:
            self.counters.compiles_in_flight -= 1
            self.counters.compile_time_s += dt
        if entry.state != COMPILING:  # timed out meanwhile
            return
        if err is not None:
            found = self.explain_layout(gm, example) if isinstance(err, Exception) and \
                explains_layout(err) else None
            self.fail(entry, f"{R.COMPILE_FAILED}: {type(err).__name__}: {err}"
                      + (f" [layout: {found.describe()}]" if found else ""))
            if not isinstance(err, Exception):
                # An interrupt, not a compiler error: the region is eager-only and the books
                # are kept, and a synchronous caller (waiting on this future) re-raises it.
                raise err
            return
        transition(entry, COMPILED, fn=fn)
        if self.store is not None:
            self.store.note_isa(getattr(fn, ISA_PROBED, None))
            if entry.disk_key is not None:
                self.store.save(entry.disk_key, fn)
        latency = time.monotonic() - entry.submitted_at  # queued -> ready
        clog.debug("compile finished: region %s in %.2f s (%.2f s after it was queued)",
                   _short(entry.key), dt, latency)
        with self.counters.lock:
            if entry.is_region:  # an optimizer step's compile is counted by its class's line
                self.counters.regions_compiled += 1
            if not self.counters.compile_latency_s:
                self.counters.compile_latency_first_s = latency
            self.counters.compile_latency_s += latency
            self.counters.compile_latency_max_s = max(self.counters.compile_latency_max_s, latency)

    def explain_layout(self, gm: Any, example: list) -> LayoutDisagreement | None:
        """The first node of ``gm`` the backend lays out otherwise than eager, counted as a
        fallback of its op (reason ``compiler_layout``) and logged (ae_compiles); None when
        none is found (Note [Which op's layout disagreed], runtime/layouts.py)."""
        try:
            table = self.decompositions() if self.decompositions is not None else None
            found = layout_disagreements(gm, example, table, first=True)
        except Exception as e:  # noqa: BLE001 - a diagnosis must never fail a flush
            clog.debug("layout check failed: %s: %s", type(e).__name__, e)
            return None
        if not found:
            return None
        clog.debug("layout: %s", found[0].describe())
        with self.counters.lock:
            self.counters.note_fallback(found[0].op, R.COMPILER_LAYOUT, found[0].source,
                                        target=found[0].target)
        return found[0]

    # Note [Regions compiled by an earlier process]
    # A region seen for the first time in this process whose artifact an earlier process
    # saved (runtime/region_store.py, runtime/disk_cache.py) is loaded instead of compiled:
    # at its first sighting in a planned window (the window's first recurrence), with no
    # compile_after wait and no worker. The load runs on this service's thread like a
    # compile (the region runs eagerly meanwhile; a synchronous service waits), and its
    # artifact is checked at its first call like any other (Note [The first compiled call
    # runs on copies]). An entry that cannot be read or loaded (damaged, another torch) is
    # deleted and the region goes back to cold, to be compiled as usual; one that loads
    # but fails its checks is deleted too.
    def from_disk(self, entry: RegionEntry, threads: int | None = None) -> bool:
        """Start loading ``entry``'s artifact from the disk cache; True if started.
        ``threads``: the thread count it was compiled for (default: the program's)."""
        if self.store is None or entry.disk_tried or entry.state != COLD or self.held():
            return False
        entry.disk_tried = True
        key = entry.disk_key = self.store.key(entry.key, threads or torch.get_num_threads())
        if key is None or not os.path.exists(self.store.cache.entry_path(key)):
            return False
        if not self.take_fuel() or not transition(entry, COMPILING):
            return False
        entry.submitted_paused = self.paused()
        clog.debug("loading region %s from the disk cache", _short(entry.key))
        pool = self._executor()
        fut = pool.submit(self._load, entry, key, deadline=self._deadline(entry))
        if not self.async_ and not pool.is_current():  # Note [A compile never waits on its own thread]
            try:
                fut.result(timeout=self.timeout_s or None)
            except cf.TimeoutError:
                self.fail(entry, f"{R.COMPILE_TIMED_OUT} {self.timeout_s:.0f} s")
        return True

    def _load(self, entry: RegionEntry, key: str) -> None:
        try:
            self._load_one(entry, key)
        finally:
            self._landed()

    def _load_one(self, entry: RegionEntry, key: str) -> None:
        assert self.store is not None
        t0 = time.perf_counter()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, COMPILE_SWITCH_INTERVAL_S))  # Note [GIL convoy]
        try:
            data = self.store.get(key)
            fn = self.store.load(data) if data is not None else None
        except Exception as e:  # noqa: BLE001 - an entry that does not load: compile it
            # Note [A load cut short by exit keeps its entry]: a load still running when
            # the interpreter exits fails in its imports (modules torn down), not in its
            # entry: the entry stays for the next process.
            if worker_exiting():
                return
            clog.debug("region %s: disk cache entry does not load (%s: %s); deleted",
                       _short(entry.key), type(e).__name__, e)
            self.store.discard(key)
            fn = None
        finally:
            sys.setswitchinterval(switch)
        with self.counters.lock:
            self.counters.disk_load_time_s += time.perf_counter() - t0
        if entry.state != COMPILING:  # timed out meanwhile
            return
        if fn is None:
            transition(entry, COLD)
            return
        entry.from_disk = True
        # Note [A region checked once is trusted by the next process] (runtime/region_store.py)
        entry.checked = self.store.was_checked(key, data)
        transition(entry, COMPILED, fn=fn)
        clog.debug("region %s loaded from the disk cache in %.2f s%s", _short(entry.key),
                   time.perf_counter() - t0, ", checked by an earlier process" if entry.checked else "")
        with self.counters.lock:
            self.counters.regions_from_disk += 1

    def passed_check(self, entry: RegionEntry) -> None:
        """``entry``'s first call passed its check: the disk cache records it for later
        processes (Note [A region checked once is trusted by the next process])."""
        if self.store is not None and entry.disk_key is not None and entry.fn is not None:
            self.store.note_checked(entry.disk_key, entry.fn)

    def check_timeout(self, entry: RegionEntry) -> None:
        """Called by the executor on each use of a compiling entry (async mode)."""
        if self.timeout_s and self.running_s(entry) > self.timeout_s:
            self.fail(entry, f"{R.COMPILE_TIMED_OUT} {self.timeout_s:.0f} s")

    def running_s(self, entry: RegionEntry) -> float:
        """Seconds since ``entry`` was queued, less those the worker was held stopped."""
        return time.monotonic() - entry.submitted_at - (self.paused() - entry.submitted_paused)

    def fail(self, entry: RegionEntry, reason: str, count: str = "compile_failures",
             stays_correct: bool = True) -> None:
        """Mark ``entry`` eager-only, count it, and log once per kind of reason.

        ``stays_correct=False``: the failure reached the program (a compiled call that
        raised after its first, checked one, in a region that writes its inputs); the
        log says so instead of promising correct results."""
        if not transition(entry, EAGER_ONLY, reason):
            return  # eager-only already
        if entry.from_disk and count == "compile_failures" and self.store is not None:
            self.store.discard(entry.disk_key)  # Note [Regions compiled by an earlier process]
        clog.debug("%s: region %s runs eagerly from now on: %s",
                   "demoted" if count == "demotions" else "compile failed", _short(entry.key), reason)
        with self.counters.lock:
            setattr(self.counters, count, getattr(self.counters, count) + 1)
            self.counters.note_fallback("region", reason.split(":")[0])
        kind = reason.split(":")[0]
        if not stays_correct:
            log.warning("adaptive_eager: a compiled region raised (%s) after writing some of its "
                        "inputs; the error reaches the program and the region runs eagerly "
                        "from now on.", reason)
        elif kind not in self._logged:
            self._logged.add(kind)
            log.warning("adaptive_eager: a region runs eagerly from now on (%s); results stay "
                        "correct. Further such events are counted, not logged.", reason)

    def shutdown(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


__all__ = ["CompileService", "DaemonThread", "FUEL_ENV"]
