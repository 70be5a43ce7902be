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

import atexit
import functools
import importlib.util
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import config
from ._logging import log
from .config import Options
from .dispatch import AdaptiveEagerMode, MetaMemo, ObserveMode, OpTable
from .dispatch.opaque import install as install_opaque_calls
from .dispatch.optim import restore as restore_foreach
from .dispatch.optim import use_foreach
from .dispatch.source import user_source
from .runtime import Counters, Executor, make_executor
from .statistics import SiteCounters, Stats, snapshot

# Note [Process-wide registries]
# _COUNTERS (what stats() reports) and _SESSIONS (caches per Options) are the
# process-wide state of the public API layer. Both are explicit and resettable
# (reset_stats(), clear_sessions()); nothing below this layer holds global state.
_COUNTERS: Counters = SiteCounters()
_SESSIONS: dict[Options, "Session"] = {}
_SESSIONS_LOCK = threading.Lock()
_TLS = threading.local()


@dataclass
class Session:
    options: Options
    executor: Executor
    counters: Counters
    table: OpTable = field(default_factory=OpTable)
    memo: MetaMemo | None = None

    def new_mode(self) -> AdaptiveEagerMode:
        if self.memo is None:
            self.memo = MetaMemo(self.options.meta_cache_size, self.counters)
        mode = AdaptiveEagerMode(self.options, self.executor, self.counters, self.table, self.memo)
        mode.on_park = _parked_changed
        return mode


# Note [Import Dynamo at the first session, not at the first op]
# torch's Python meta kernels (torch._refs, _meta_registrations) are wrapped in
# torch._disable_dynamo, which imports torch._dynamo on its first call: 2.5-3 s on this
# CPU. Capturing the program's first op runs such a kernel, so that import would
# land in the program's first iteration, a stall of exactly the kind this runtime
# promises not to add. It is done when the first session is made (entering the first
# ``adaptive_eager()`` block or ``enable()``), where a one-time set-up cost belongs.
def _import_dynamo() -> None:
    try:
        import torch._dynamo  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - an optional speed-up; the first op imports it anyway
        log.debug("adaptive_eager: importing torch._dynamo failed", exc_info=True)


def get_session(options: Options) -> Session:
    if "torch._dynamo" not in sys.modules:
        _import_dynamo()
    with _SESSIONS_LOCK:
        s = _SESSIONS.get(options)
        if s is None:
            _install_safe_point()
            install_opaque_calls()  # Note [Opaque calls]
            s = _SESSIONS[options] = Session(options, make_executor(options, _COUNTERS), _COUNTERS)
            if options.report:
                _report_at_exit(options.report)
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
    return st


def _innermost_observe(st: list) -> ObserveMode | None:
    for _, observe in reversed(st):
        if observe is not None:
            return observe
    return None


# A safe point counts for this many torch calls towards the pass-through policy's probes.
_SAFE_POINT_WEIGHT = 100


def _park_or_resume(mode: AdaptiveEagerMode, weight: int) -> bool:
    """At a safe point: deep-park a parked runtime, or bring a deep-parked one back when
    the policy wants to capture again (Note [Deep parking], dispatch/observe.py). False
    when the runtime is capturing (neither parked nor deep-parked)."""
    observe = _innermost_observe(_TLS.stack)
    if observe is None or observe.mode is not mode or mode._should_defer is None:
        return True
    if observe.deep:
        if mode._should_defer(weight):
            observe.resume()
    elif mode._parked:
        if not (mode._policy is not None and mode._policy.warming):
            observe.deep_park()
    else:
        return False
    return True


def _step_starts(opt: Any, *_: Any) -> None:
    """The start of an optimizer step (a global optimizer step pre hook): qualifying
    param groups run at the foreach level (Note [Optimizer steps at the foreach level])."""
    switched = _foreach_switched()
    left = switched.pop(opt, None)
    if left:  # the last step raised before its post hook ran
        restore_foreach(left)
    if getattr(_TLS, "stack", None):
        groups = use_foreach(opt)
        if groups:
            switched[opt] = groups
            _COUNTERS.optimizer_steps_foreach += 1


def _foreach_switched() -> "weakref.WeakKeyDictionary":
    switched = getattr(_TLS, "foreach", None)
    if switched is None:
        switched = _TLS.foreach = weakref.WeakKeyDictionary()
    return switched


def _restore_foreach_all() -> None:
    """Every group this thread switched and did not restore yet gets foreach=None back."""
    switched = getattr(_TLS, "foreach", None)
    while switched:
        _, groups = switched.popitem()
        restore_foreach(groups)


def _safe_point(opt: Any, *_: Any) -> None:
    """The end of an optimizer step (a global optimizer step post hook)."""
    switched = getattr(_TLS, "foreach", None)
    if switched:
        groups = switched.pop(opt, None)
        if groups:
            restore_foreach(groups)
    st = getattr(_TLS, "stack", None)
    if not st:
        return
    mode = st[-1][0]
    if mode._policy is not None and mode._policy.warming:
        mode.end_warmup("optimizer step", None)  # Note [The first iteration runs eagerly]
        return
    if not _park_or_resume(mode, _SAFE_POINT_WEIGHT) and len(mode.recorder):
        # Note [Optimizer steps end windows]
        # A program that reads nothing every step (loss read every N steps) has its
        # windows cut only by window_size, at a different op each iteration (an
        # iteration of 307 ops: 256, then 51 + 205, ...), so no window recurs and
        # nothing compiles. Ending the window at the end of each optimizer step
        # anchors windows to iterations: the same ops each step, so they recur.
        mode.flush("optimizer_step", user_source(2))


# Note [Deep parking at module calls]
# Optimizer steps are the safe points of training loops; an inference loop (or any
# loop stepping no torch.optim optimizer) has none, so a parked runtime kept paying
# ObserveMode's Python call on every torch function (measured: a small GPT forward with
# a new sequence length each step, 20% over eager once passed through). While some
# runtime in the process is parked, a global module forward pre-hook is installed, and
# each module call is a safe point too: it deep-parks the parked runtime of its thread,
# and while deep-parked counts towards the policy's probes (a module call standing for
# a few torch calls) and brings ObserveMode back when the policy probes. Module calls
# happen between torch calls, never inside ObserveMode, like an optimizer step's end.
# While the warm-up lasts, ObserveMode stays: it is what sees the first read. The hook
# is removed when no runtime is parked, so programs pay for it only while parked.
_MODULE_CALL_WEIGHT = 8
_PARKED = [0]
_MODULE_HOOK: list = []
_PARK_LOCK = threading.Lock()


def _module_safe_point(*_: Any) -> None:
    """Before a module's forward (a global module forward pre-hook, while parked)."""
    st = getattr(_TLS, "stack", None)
    if st:
        _park_or_resume(st[-1][0], _MODULE_CALL_WEIGHT)


def _parked_changed(parked: bool) -> None:
    with _PARK_LOCK:
        _PARKED[0] += 1 if parked else -1
        if _PARKED[0] > 0 and not _MODULE_HOOK:
            from torch.nn.modules.module import register_module_forward_pre_hook  # noqa: PLC0415

            _MODULE_HOOK.append(register_module_forward_pre_hook(_module_safe_point))
        elif _PARKED[0] <= 0 and _MODULE_HOOK:
            _PARKED[0] = 0
            _MODULE_HOOK.pop().remove()


_SAFE_POINT_HOOK: list = []


def _install_safe_point() -> None:
    # Global optimizer hooks are torch's public API and cost nothing to code that
    # never steps an optimizer; installed once per process, with the first session.
    if not _SAFE_POINT_HOOK:
        from torch.optim.optimizer import (  # noqa: PLC0415
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        _SAFE_POINT_HOOK.append(register_optimizer_step_pre_hook(_step_starts))
        _SAFE_POINT_HOOK.append(register_optimizer_step_post_hook(_safe_point))


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

    @classmethod
    def _from_options(cls, options: Options) -> "adaptive_eager":
        ctx = cls.__new__(cls)
        ctx._overrides = {f: getattr(options, f) for f in config.OPTION_NAMES}
        ctx.options = options
        return ctx

    def __enter__(self) -> "adaptive_eager":
        st = _stack()
        if st and st[-1][0].options == self.options:
            st.append((st[-1][0], None))
            return self
        outer = current_mode()
        if outer is not None:
            outer.flush("nested_enter")
            outer_observe = _innermost_observe(st)
            if outer_observe is not None:
                outer_observe.resume()  # Note [Deep parking]
            outer.unpark()  # a parked outer mode goes back under the new one
        mode = get_session(self.options).new_mode()
        observe = ObserveMode(mode)
        mode.__enter__()
        observe.__enter__()
        st.append((mode, observe))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        mode, observe = _stack().pop()
        try:
            if not _stack():
                _restore_foreach_all()
            mode.flush("exit")
            if observe is not None:
                mode.release_handles()  # Note [Releasing bound handles]
        finally:
            if observe is not None:
                if observe.deep and not observe.resume():
                    observe.deep = False  # off the stack already: nothing to pop
                else:
                    observe.__exit__(None, None, None)
                mode.unpark()  # back on the stack, so that its own __exit__ pops it
                mode.__exit__(None, None, None)

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
        mode.flush("explicit_sync")


def stats() -> Stats:
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


# Note [Process-wide enable]
# PyTorch's mode stacks are thread-local, so "the whole process" means: the calling
# thread now, and every thread started later. enable() enters a mode in the calling
# thread and patches threading.Thread.start so that each thread started afterwards
# runs its run() inside `with adaptive_eager(...)` (the instance's run is wrapped,
# so Thread subclasses that override run() are covered too). Not covered, by design
# or by necessity:
# - threads already running when enable() is called: another thread's mode stack
#   cannot be changed from outside; they stay plain eager (they may call enable() or
#   use `with adaptive_eager()` themselves);
# - threads started by torch or by adaptive_eager itself (compile workers, pin-memory
#   threads): the runtime must never capture its own machinery; a thread can also
#   opt out with `thread.adaptive_eager_exempt = True` before start();
# - threads started with _thread.start_new_thread, below the threading module.
# disable() undoes the patch and leaves the mode in the calling thread; threads
# started while enabled keep the runtime until their run() returns.
class _Enabled:
    """The registry of process-wide enabling: options, the patch, per-thread contexts."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.options: Options | None = None
        self.original_start: Callable | None = None
        self.exit_hook_registered = False
        self.report_destinations: list[str] = []


_ENABLED = _Enabled()
_EXEMPT_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)
_THREADING_DIRS = (
    os.path.abspath(threading.__file__),
    os.path.join(os.path.dirname(os.path.abspath(threading.__file__)), "concurrent") + os.sep,
)


def _started_by_library(depth: int) -> bool:
    """Whether the code that started a thread is torch's or ours (skipping threading)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_THREADING_DIRS):
        f = f.f_back
    return f is not None and f.f_code.co_filename.startswith(_EXEMPT_DIRS)


def _run_under(options: Options, run: Callable[[], None]) -> Callable[[], None]:
    @functools.wraps(run)
    def run_under_runtime() -> None:
        with adaptive_eager._from_options(options):
            run()

    return run_under_runtime


def _patched_start(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
    options = _ENABLED.options
    if options is not None and not getattr(self, "adaptive_eager_exempt", False) \
            and not _started_by_library(2):
        self.run = _run_under(options, self.run)  # type: ignore[method-assign]
    return _ENABLED.original_start(self, *args, **kwargs)  # type: ignore[misc]


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect (new threads start under the runtime)."""
    return _ENABLED.options is not None


def enable(**options: Any) -> None:
    """Run the rest of the program under adaptive eager: this thread and new threads.

    Options are those of :class:`adaptive_eager`. The calling thread enters the runtime
    at once; threads started afterwards run under it too. Threads already running are
    not affected (Note [Process-wide enable]). Calling it again with other options
    switches to them; with the same options it only enters the calling thread.
    The runtime is left (the window flushed) by :func:`disable` or at process exit.

    Example::

        >>> import torch, adaptive_eager as ae
        >>> ae.enable(backend="eager")
        >>> (torch.ones(2) * 3).tolist()
        [3.0, 3.0]
        >>> ae.disable()
    """
    resolved = resolve_options(**options)
    if getattr(_TLS, "enabled_ctx", None) is None and _stack():
        raise RuntimeError(
            "adaptive_eager.enable() was called inside a `with adaptive_eager()` block; "
            "call it outside (before) the block"
        )
    with _ENABLED.lock:
        if _ENABLED.options is not None and _ENABLED.options != resolved:
            disable()
        _ENABLED.options = resolved
        if _ENABLED.original_start is None:
            _ENABLED.original_start = threading.Thread.start
            threading.Thread.start = _patched_start  # type: ignore[method-assign]
        _register_exit_hook()
    if getattr(_TLS, "enabled_ctx", None) is None:
        ctx = adaptive_eager._from_options(resolved)
        ctx.__enter__()
        _TLS.enabled_ctx = ctx
        _TLS.enabled_depth = len(_stack())
    log.debug("enabled process-wide: %s", resolved)


def disable() -> None:
    """Undo :func:`enable`: flush and leave the runtime in this thread; new threads run eager.

    Must not be called inside a ``with adaptive_eager()`` block of the same thread.
    A no-op when not enabled.

    Example::

        >>> import adaptive_eager as ae
        >>> ae.disable()
    """
    with _ENABLED.lock:
        _ENABLED.options = None
        if _ENABLED.original_start is not None:
            if threading.Thread.start is _patched_start:
                threading.Thread.start = _ENABLED.original_start  # type: ignore[method-assign]
            _ENABLED.original_start = None
    ctx = getattr(_TLS, "enabled_ctx", None)
    if ctx is None:
        return
    if len(_stack()) != _TLS.enabled_depth:
        raise RuntimeError(
            "adaptive_eager.disable() was called inside a `with adaptive_eager()` block; "
            "leave the block first"
        )
    _TLS.enabled_ctx = None
    ctx.__exit__(None, None, None)


def _report_at_exit(destination: str) -> None:
    with _ENABLED.lock:
        if destination not in _ENABLED.report_destinations:
            _ENABLED.report_destinations.append(destination)
        _register_exit_hook()


def _register_exit_hook() -> None:
    if not _ENABLED.exit_hook_registered:
        _ENABLED.exit_hook_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    # Flush the main thread's window, then write the requested reports.
    try:
        if getattr(_TLS, "enabled_ctx", None) is not None:
            disable()
    except Exception as e:  # at exit, a message is better than a traceback
        log.warning("adaptive_eager: leaving the runtime at exit failed: %s", e)
    if _ENABLED.report_destinations:
        from .reporting import emit_report

        snap = stats()
        for dest in _ENABLED.report_destinations:
            emit_report(snap, dest)  # JSON for a .json path


__all__ = [
    "adaptive_eager", "sync", "enable", "disable", "is_enabled", "stats", "reset_stats",
    "Session", "get_session", "clear_sessions", "counters", "current_mode",
    "resolve_options", "platform_defaults",
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
