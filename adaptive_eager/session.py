"""Sessions: what a ``with adaptive_eager():`` block turns on, and where it is kept.

A :class:`Session` is everything that should outlive one ``with`` block: options,
the executor (and so the compiled-region cache), the op table and the metadata memo.
Sessions are kept per Options in a process-wide registry, so a training loop that
enters the context every step reuses its caches. Modes are per thread (PyTorch's
mode stacks are thread-local): each thread that enters gets its own mode, with its
own open window, over the shared session.

:func:`enable` / :func:`disable` turn the runtime on for the whole process: the
calling thread at once, and every thread started afterwards through ``threading``
(Note [Process-wide enable]).

Example::

    >>> import torch
    >>> from adaptive_eager import adaptive_eager
    >>> with adaptive_eager(backend="eager"):
    ...     (torch.ones(2) * 2).sum().item()
    4.0
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import config
from .config import Options
from .dispatch import AdaptiveEagerMode, MetaMemo, Observer, OpTable
from .dispatch import interrupts, parking
from .dispatch.kernel_state import install as install_state_setters
from .dispatch.opaque import install as install_opaque_calls
from .dispatch.source import user_source
from .runtime import Counters, DeferPolicy, make_executor
from .runtime.gc_quiet import QUIET
from .exit_report import report_at_exit
from .reasons import R

if TYPE_CHECKING:
    from .dispatch.trace import TraceBook
    from .runtime import Executor
    from .statistics import Stats

# Note [Process-wide registries]
# _COUNTERS (what stats() reports) and _SESSIONS (caches per Options) are the
# process-wide state of the public API layer. Both are explicit and resettable
# (reset_stats(), clear_sessions()). They are not the only module-level state: the
# package has 39 mutable module-level objects besides these two (and 12 locks; counted by
# ``scripts/structure-counts --list``), each documented where it lives, of these kinds:
# - the process's patches and hooks: hooks.HOOKS (every patch of torch and the standard
#   library, Note [The hooks registry]) and what they act on: process._ENABLED,
#   interrupts._STATE, parking.SAFE_POINTS, exit_report's four lists, _logging's flags;
# - per-thread state: this module's _TLS, observe._TLS, lazy._TLS, hooks._RNG;
# - shared services: compile_worker._WORKER, optim_compile.STEPS, disk_cache._OPEN;
# - caches and marks bounded by the program's code (Note [Every cache is bounded]):
#   match._CODE, fusion.scalars._BY_ID, fusion.indices._POSITIONS, dynamo's two marks,
#   meta.KERNEL_LAYOUT_OPS, _logging._WARNED;
# - memory the program exported: exported._EXPORTED/_PRUNE_AT, lazy._SHARES;
# - what the program registered: backends._REGISTRY (Backend entries, codecs in them), config._PATCHES;
# - this layer's _MODES and _ABANDONED (below) and _TLS;
# - the emulated device's (neuron_sim: five) and two benchmark workloads' caches.
_COUNTERS: Counters = Counters()
_SESSIONS: dict[Options, "Session"] = {}
_SESSIONS_LOCK = threading.Lock()
_TLS = threading.local()
# Note [Every cache is bounded]
# A long program must not grow the runtime's memory (issue 15 item 18: 90,000 distinct
# slices interned 90,002 specs, RSS +18 MiB). Each cache and registry, and its bound:
# - per value (grow with the program's data): the metadata memo (LRU,
#   ``meta_cache_size``) and its spec interner (generations, Note [Bounded spec
#   interning]); compiled regions (RegionCache, ``cache_size``); plans, eager and
#   capture times, first sightings (the executor's LRUs, >= ``cache_size``); the traces
#   of recurring windows (TraceBook: emptied past MAX_NODES nodes); a
#   region's lifted scalars (one per slot); bound handles (pruned, Note [Releasing
#   bound handles]); sessions (LRU of _MAX_SESSIONS: a new backend callable per block
#   makes new options each time).
# - per op overload or code object (bounded by the program's code, not its data): the
#   op table and the recorder's op flags, ``_as_record``, fusion.scalars._BY_ID, the
#   Dynamo marks (dispatch/dynamo.py), sync sites and fallback counts (Counters), the
#   compile service's and warn_once's logged kinds, the opaque-call patches.
# - per window (emptied at every flush): the recorder's buffers.
# Sessions kept at most, least recently made or used dropped first (active modes keep
# theirs).
_MAX_SESSIONS = 32
# Every live mode, in any thread: what a change of global state flushes
# (Note [Global state that kernels read], dispatch/kernel_state.py). Weak: a mode
# lives as long as its block.
_MODES: "weakref.WeakSet[AdaptiveEagerMode]" = weakref.WeakSet()
_MODES_LOCK = threading.Lock()


@dataclass
class Session:
    """What outlives one block: options, executor (compiled regions), the pass-through
    policy (runtime.adapt, owned here and handed to each mode), op table, metadata memo."""

    options: Options
    executor: Executor
    counters: Counters
    policy: DeferPolicy
    table: OpTable = field(default_factory=OpTable)
    memo: MetaMemo | None = None
    traces: "TraceBook | None" = None  # recurring windows' traces (dispatch/trace.py)
    _traces_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def new_mode(self) -> AdaptiveEagerMode:
        if self.memo is None:
            self.memo = MetaMemo(self.options.meta_cache_size, self.counters)
        mode = AdaptiveEagerMode(self.options, self.executor, self.counters, self.policy,
                                 self.table, self.memo, self.trace_book)
        with _MODES_LOCK:
            _MODES.add(mode)
        return mode

    def trace_book(self) -> "TraceBook":
        """The session's traces, made when a mode of it first builds its window (Note
        [The window is built at the first capture], dispatch/mode.py)."""
        with self._traces_lock:
            if self.traces is None:
                from .dispatch.trace import TraceBook  # noqa: PLC0415

                self.traces = TraceBook(self.options.window_size)
            return self.traces



def _global_state_changed(name: str, dtype_changed: bool) -> None:
    """A setter of global state that kernels read is about to run (kernel_state.py)."""
    with _MODES_LOCK:
        modes = list(_MODES)
    for mode in modes:
        # A mode busy in another thread (recording, flushing) is not waited for: two
        # threads each flushing the other's mode would deadlock.
        if len(mode.recorder) and mode.lock.acquire(blocking=False):
            try:
                mode.flush(R.GLOBAL_STATE, user_source(2))
            finally:
                mode.lock.release()
    if dtype_changed:  # memoized metadata followed the old default dtype
        with _SESSIONS_LOCK:
            memos = {id(s.memo): s.memo for s in _SESSIONS.values() if s.memo is not None}
        memos.update((id(m.memo), m.memo) for m in modes)
        for memo in memos.values():
            memo.clear()


def get_session(options: Options) -> Session:
    if not options.warmup or not options.adaptive_passthrough:
        parking.import_dynamo()  # capture from the first op: Note [Import Dynamo before capture]
    with _SESSIONS_LOCK:
        s = _SESSIONS.pop(options, None)
        if s is None:
            parking.install(_thread_stack, _COUNTERS)  # Note [The safe points registry]
            install_opaque_calls()  # Note [Opaque calls]
            install_state_setters(_global_state_changed)  # Note [Global state that kernels read]
            policy = DeferPolicy.for_options(options, _COUNTERS)
            policy.on_stop = parking.policy_stopped  # Note [Parking the mode]
            s = Session(options, make_executor(options, _COUNTERS), _COUNTERS, policy)
            if options.report:
                report_at_exit(options.report, stats)
        _SESSIONS[options] = s  # most recently used last
        while len(_SESSIONS) > _MAX_SESSIONS:  # active modes keep theirs
            del _SESSIONS[next(iter(_SESSIONS))]
        return s


def clear_sessions() -> None:
    """Drop every session (and its compiled regions). Active modes keep theirs."""
    with _SESSIONS_LOCK:
        _SESSIONS.clear()


def counters() -> Counters:
    return _COUNTERS


def _stack() -> list:
    st = getattr(_TLS, "stack", None)
    if st is None:
        st = _TLS.stack = []
    if _ABANDONED:
        _prune(st)  # Note [A block is left in the thread that entered it]
    return st


def _thread_stack() -> list | None:
    """This thread's runtime stack for the safe points (dispatch/parking.py), or None."""
    st = getattr(_TLS, "stack", None)
    if st and _ABANDONED:
        _prune(st)  # Note [A block is left in the thread that entered it]
    return st


def _enter(st: list, options: Options) -> tuple:
    """Enter a block with ``options`` in this thread; the entry pushed on ``st``."""
    if st and st[-1][0].options == options:
        entry = (st[-1][0], None)
        st.append(entry)
        return entry
    outer = current_mode()
    if outer is not None:
        outer.flush(R.NESTED_ENTER)
        parking.unpark(outer, R.NESTED_ENTER)  # a parked outer mode goes back under the new one
    mode = get_session(options).new_mode()
    mode.counters.device = describe_device(options)
    observer = Observer(mode)
    mode.__enter__()
    observer.__enter__()
    entry = (mode, observer)
    st.append(entry)
    parking.block_entered(mode)  # a safe point: a warming policy parks at once
    return entry


def _leave(entry: tuple) -> None:
    """Leave the block of ``entry`` (already popped from this thread's stack)."""
    mode, observer = entry
    try:
        mode.flush(R.EXIT)
        if observer is not None:
            mode.release_handles()  # Note [Releasing bound handles]
    finally:
        if observer is not None:
            observer.__exit__(None, None, None)
            parking.block_left(mode)  # back on the stack, so that its own __exit__ pops it
            mode.__exit__(None, None, None)


# Note [A block is left in the thread that entered it]
# PyTorch's mode stacks are per thread, and no thread can pop another's. A block
# entered in one thread and exited in another (a context handed to a worker) used to
# fail with "IndexError: pop from empty list" in the worker and leave the entering
# thread capturing for good. Now the exit in the wrong thread raises an error naming
# both threads; the block counts as closed: the exiting thread runs what the block
# left pending (under the mode's lock, as a change of global state does), so every
# value made in it is bound, and its mode stops deferring. No thread can pop another's
# mode stack, and a mode cannot pop itself inside an op (torch pushes it back when
# __torch_dispatch__ returns), so the entering thread's ops pass straight through it to
# plain tensors (~5 µs each) until that thread's next safe point (a read such as
# print/.item()/.tolist(), an optimizer step, backward()), where it parks: off the
# dispatch-mode stack. The entering thread leaves the block for good (its handles
# released, its runtime stack popped) the next time it touches the runtime (a block's
# entry or exit, current_mode(), sync(), an optimizer step or a module call while
# parked). _ABANDONED holds such entries per thread id until then.
_ABANDONED: dict[int, list[tuple]] = {}
_ABANDONED_LOCK = threading.Lock()


def _exited_elsewhere(entered: list) -> None:
    here = threading.current_thread().name
    if not entered:
        raise RuntimeError(f"adaptive_eager: __exit__ in thread {here!r} without __enter__")
    ident, name, entry = entered.pop()
    mode, observe = entry
    failure = None
    QUIET.thaw()  # the block is closed (Note [The runtime's imports freeze the heap they grew])
    if observe is not None:
        mode.stop_deferring()
        failure = _run_pending(mode)
    alive = {t.ident for t in threading.enumerate()}
    with _ABANDONED_LOCK:
        for dead in [i for i in _ABANDONED if i not in alive]:
            del _ABANDONED[dead]
        if ident in alive:
            _ABANDONED.setdefault(ident, []).append(entry)
    raise RuntimeError(
        f"adaptive_eager: a block entered in thread {name!r} was exited in thread {here!r}; "
        f"leave a block in the thread that entered it (PyTorch's modes are per thread). "
        f"The block is closed: thread {name!r} runs plain eager from its next torch call and "
        "leaves the block the next time it uses the runtime (Note [A block is left in the "
        "thread that entered it])") from failure


def _run_pending(mode: AdaptiveEagerMode) -> BaseException | None:
    """Run what a block closed from another thread left pending, in the calling thread
    (Note [A block is left in the thread that entered it]); the flush's error, if any."""
    if not mode.lock.acquire(timeout=_FOREIGN_FLUSH_WAIT_S):
        return None  # busy in its thread for that long: it flushes when it leaves
    try:
        if len(mode.recorder):
            mode.flush(R.EXIT, user_source(3))
    except Exception as e:  # noqa: BLE001 - raised again with the thread error
        return e
    finally:
        mode.lock.release()
    return None


# How long the exiting thread waits for an op of the entering thread's to end.
_FOREIGN_FLUSH_WAIT_S = 5.0


def _prune(st: list) -> None:
    """Leave this thread's blocks that another thread exited, innermost first."""
    ident = threading.get_ident()
    while True:
        with _ABANDONED_LOCK:
            gone = _ABANDONED.get(ident)
            if not gone or not st or not any(e is st[-1] for e in gone):
                return
            entry = st.pop()
            gone[:] = [e for e in gone if e is not entry]
            if not gone:
                del _ABANDONED[ident]
        try:
            _leave(entry)
        finally:
            interrupts.release()


def current_mode() -> AdaptiveEagerMode | None:
    """The innermost active mode in this thread, if any."""
    st = _stack()
    return st[-1][0] if st else None


# Note [Platform defaults]
# With torch_neuronx installed, the natural target is the Trainium device: device and
# backend default to "neuron". These sit just above the built-in defaults: an
# environment variable, config.patch() or a keyword argument still wins.
_NEURON_DEFAULTS = {"device": "neuron", "backend": "neuron"}


@functools.lru_cache(maxsize=None)
def _torch_neuronx_installed() -> bool:
    if "torch_neuronx" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch_neuronx") is not None
    except (ImportError, ValueError):
        return False


def platform_defaults() -> dict[str, Any]:
    """Defaults that differ from config's because of what is installed (torch_neuronx)."""
    return dict(_NEURON_DEFAULTS) if _torch_neuronx_installed() else {}


def describe_device(options: Options) -> str:
    """The report's words for the device a block defers (Note [device="auto"] in config).

    Example::

        >>> describe_device(config.resolve(device="cpu"))
        'cpu (set by the device option)'
    """
    if not options.device_auto:
        return f"{options.device} (set by the device option)"
    if options.device == "cpu":
        return "cpu (device=auto: no accelerator)"
    return f"{options.device} (device=auto: the accelerator torch.accelerator reports)"


def resolve_options(**overrides: Any) -> Options:
    """``config.resolve`` with :func:`platform_defaults` under env vars and patches.

    Example::

        >>> resolve_options(backend="eager").backend
        'eager'
    """
    platform = {k: v for k, v in platform_defaults().items() if k not in overrides}
    if platform:
        explicit = set(config.env_overrides())
        for layer in getattr(config, "_PATCHES", ()):  # names set by config.patch()
            explicit.update(layer)
        platform = {k: v for k, v in platform.items() if k not in explicit}
    return config.resolve(**platform, **overrides)


class adaptive_eager:
    """Run the enclosed code under adaptive eager; also usable as a decorator.

    Options are keyword arguments (see ``adaptive_eager.config``). Nested blocks with
    the same options share one mode; a nested block with other options flushes the
    outer window first. Leaving the block flushes: every tensor made inside is then an
    ordinary tensor.

    Example::

        >>> import torch
        >>> @adaptive_eager(backend="eager")
        ... def f(x):
        ...     return (x + 1) * 2
        >>> f(torch.zeros(2))
        tensor([2., 2.])
    """

    def __init__(self, **options: Any):
        self._overrides = options
        self.options = resolve_options(**options)  # validates now, at the user's line
        self._entered: list[tuple[int, str, tuple]] = []  # (thread id, name, stack entry)

    @classmethod
    def _from_options(cls, options: Options) -> "adaptive_eager":
        ctx = cls.__new__(cls)
        ctx._overrides = {f: getattr(options, f) for f in config.OPTION_NAMES}
        ctx.options = options
        ctx._entered = []
        return ctx

    def __enter__(self) -> "adaptive_eager":
        st = _stack()
        interrupts.hold()  # Note [Interrupts wait for the flush]
        try:
            entry = _enter(st, self.options)
        except BaseException:
            interrupts.release()
            raise
        if len(st) == 1:
            QUIET.block_entered()  # Note [The runtime's imports freeze the heap they grew]
        thread = threading.current_thread()
        self._entered.append((thread.ident, thread.name, entry))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ident = threading.get_ident()
        mine = [i for i, rec in enumerate(self._entered) if rec[0] == ident]
        if not mine:
            _exited_elsewhere(self._entered)
        del self._entered[mine[-1]]
        outermost = False
        try:
            entry = _stack().pop()
            outermost = not _stack()
            if outermost and parking.SAFE_POINTS is not None:
                parking.SAFE_POINTS.restore_foreach()  # Note [Optimizer steps at the foreach level]
            _leave(entry)
        finally:
            if outermost:  # a flush that raised at the exit too
                QUIET.block_left()  # Note [The runtime's imports freeze the heap they grew]
            interrupts.release()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with adaptive_eager(**self._overrides):
                return fn(*args, **kwargs)

        return wrapper


def sync() -> None:
    """Flush the current thread's open window now (no-op outside the runtime).

    Example::

        >>> sync()
    """
    mode = current_mode()
    if mode is not None:
        mode.flush(R.EXPLICIT_SYNC)
        parking.safe_point(mode, parking.At.CALL)  # between the program's torch calls


def stats() -> "Stats":
    """A frozen snapshot of the runtime's statistics (all threads, since the last reset).

    Example::

        >>> import torch
        >>> reset_stats()
        >>> with adaptive_eager(backend="eager"):
        ...     (torch.ones(3) + 1).sum().item()
        6.0
        >>> stats().flushes
        {'item': 1}
    """
    from .statistics import snapshot  # noqa: PLC0415 - when asked (Note [The window is built at the first capture])

    return snapshot(_COUNTERS)


def reset_stats() -> None:
    """Zero every statistic (the compiles still in flight stay counted).

    Example::

        >>> reset_stats(); stats().ops_captured
        0
    """
    with _COUNTERS.lock:
        in_flight = _COUNTERS.compiles_in_flight
        _COUNTERS.reset()
        _COUNTERS.compiles_in_flight = in_flight


__all__ = [
    "adaptive_eager", "sync", "stats", "reset_stats",
    "Session", "get_session", "clear_sessions", "counters", "current_mode",
    "resolve_options", "platform_defaults", "describe_device",
]


def report() -> str:
    """The current statistics as a readable table, with advice; see ``adaptive_eager.reporting``.

    Example::

        >>> import torch
        >>> with adaptive_eager(backend="eager"):
        ...     x = torch.ones(3).sum().item()
        >>> print(report())  # doctest: +SKIP
        adaptive_eager report
        ...
    """
    from .reporting import format_report

    return format_report(stats())


__all__.append("report")


# Process-wide enabling (enable, disable, is_enabled) lives in adaptive_eager.process,
# which imports this module (never the other way round).


