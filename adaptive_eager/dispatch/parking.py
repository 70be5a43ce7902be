"""Parking: when the runtime steps off PyTorch's dispatch-mode stack, and when it comes back.

Whether to defer is the policy's decision (``runtime.adapt.DeferPolicy``); this module is
the mechanism that acts on it, in one place:

* :func:`park` / :func:`unpark`: the dispatch mode leaves or rejoins the dispatch-mode
  stack (Note [Parking the mode]);
* :func:`safe_point`: a point between torch calls where either may happen;
* :func:`end_warmup`: the program's first iteration is over (Note [The first iteration
  runs eagerly], runtime/adapt.py);
* :class:`SafePoints`: the safe points besides the program's reads (observe.py): the
  start and end of an optimizer step (global ``torch.optim`` hooks) and, while some
  runtime needs them, module calls (a global forward pre-hook).

Example::

    >>> import torch, adaptive_eager as ae
    >>> with ae.adaptive_eager(backend="eager") as ctx:   # a policy that passes through:
    ...     mode = ae.session.current_mode()
    ...     park(mode); parked = mode._parked; unpark(mode)
    >>> parked, mode._parked
    (True, False)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable

from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode
from torch.utils._python_dispatch import _pop_mode, _push_mode

from .._logging import artifact_logger
from ..hooks import HOOKS, Hook
from .optim import restore as restore_foreach
from .optim import use_foreach
from .source import user_source
from ..reasons import R
from ..runtime import step_usage
from ..runtime.phases import (ACT_CAPTURE, ACT_PARK, ACT_UNPARK, AT_BLOCK, AT_CALL, AT_MODULE, AT_READ,
                              AT_STEP, At, Moved, SafePoint, WarmupEnded)

_PARK_LOG = artifact_logger("ae_parking")


# Note [Parking the mode]
# Passing ops through still costs the dispatch mode's Python call (~5-8 µs per op),
# more than a tiny op itself. So while the pass-through policy says nothing pays and
# nothing is pending, the mode leaves the dispatch-mode stack ("parks") and ops run
# with no Python in between: nothing else of the runtime is on a mode stack (reads are
# seen by wrapped methods, Note [Reads are seen where they happen], observe.py). It
# parks, and comes back when the policy probes or its compiles are ready, at a safe
# point: a read of a tensor, the end of an optimizer step, a call of backward(), a
# block's entry, sync(), and module calls while a runtime needs them (SafePoints). A parked mode has nothing
# pending, so no read needs a flush. Parking only happens when the mode is on top of
# the stack (a mode the program entered meanwhile keeps its place), and a block
# unparks before exiting. Between the flush that stopped deferral and the next safe
# point (a flush inside an op, a full window) ops pass through the mode, counted.
def park(mode: Any) -> None:
    """``mode`` leaves the dispatch-mode stack while ops pass straight through."""
    if mode._parked or _current_dispatch_mode() is not mode:
        return
    _pop_mode()
    mode._parked = True
    mode.counters.end_spans()  # Note [Counting while passing through] (runtime/counters.py)
    mode.policy.feed(Moved(True, time.perf_counter_ns()))  # its own spans end too
    mode.counters.note_phase("parked", mode.policy.reason or "pass-through policy")
    if _PARK_LOG.isEnabledFor(logging.DEBUG):
        _PARK_LOG.debug("parked (ops pass straight through): %s",
                        mode.policy.reason or "pass-through policy")
    mode.release_handles()  # Note [Releasing bound handles] (release.py)
    if SAFE_POINTS is not None:  # parked: its probes come at reads, steps, backward
        SAFE_POINTS.wants_modules(mode, False)


def unpark(mode: Any, why: str = "", read: bool | None = None) -> None:
    """``mode`` is back on the dispatch-mode stack (capturing again); ``read``: at a read
    (True) or an optimizer step's end (False), where an on-stack span starts (Note
    [Counting while passing through])."""
    if not mode._parked:
        return
    _push_mode(mode)
    mode._parked = False
    mode.policy.feed(Moved(False, time.perf_counter_ns(), read))
    if read is not None:
        mode.counters.start_span(read)
    mode.counters.note_phase("measuring" if mode.policy.measuring else "captured",
                             why or mode.policy.why_deferring)
    if _PARK_LOG.isEnabledFor(logging.DEBUG):
        _PARK_LOG.debug("unparked: capturing again (%s) at %s", why or mode.policy.why_deferring,
                        user_source(2))
    if SAFE_POINTS is not None:  # measuring ends at a safe point; capturing needs none
        SAFE_POINTS.wants_modules(mode, mode.policy.measuring)


def policy_stopped() -> None:
    """The calling thread's policy stopped deferring (``DeferPolicy.on_stop``): its mode
    passes ops through until the next safe point, module calls included."""
    if SAFE_POINTS is not None:
        st = SAFE_POINTS.thread_stack()
        if st:
            mode = st[-1][0]
            if not mode._parked:
                mode.counters.note_phase("passed through", mode.policy.reason)
            SAFE_POINTS.wants_modules(mode, True)


def seen(mode: Any, read: bool) -> None:
    """A read (``read``) or an optimizer step's end was seen: counted for the stats and by
    the policy (its own spans; Note [Counting while passing through])."""
    parked = mode._parked
    mode.counters.safe_point_seen(read, parked)
    mode.policy.seen(read, parked)  # feed(Seen(read, parked)), without the event


# Note [A parked read costs a counter]
# A parked program's reads (``loss.item()``, ``if t:``, torch.optim's single-tensor steps
# reading each parameter's step counter) are safe points where, almost always, nothing
# happens: nothing is pending, no probe is due, so the read only counts (the stats' reads,
# the policy's calls towards the next probe). Through the general path (seen, the
# policy's at_safe_point, on_stack, should_defer, suspended capture) a parked ``item()``
# cost 2.1 µs against 0.16 µs eagerly, and its calls were most of what a parked program
# paid over eager (measured, 1 thread: regression 1.14x eager CPU parked from its first
# op, 0.99x with the read wrappers removed; a GAN's Adam steps read 8 step counters a
# step). So the read wrappers and backward() ask :func:`parked_read` /
# :func:`parked_call` first: while the mode is parked and the policy passes through with
# no probe due (DeferPolicy.parked_tick) they count and the read runs as it is; anything
# else (warming, a probe due, waiting for compiles, another block of ours in the thread)
# takes the general path. Whether a read is inside an optimizer step is first asked of a
# plain thread-local flag, set at a step's start and cleared at its end when no step of
# the thread is left open (_StepState.busy); only while it is set is the weak set of open
# steps asked (an optimizer whose step raised stays in it until freed: the flag does not
# know that, so it alone would have kept a later program "in a step" for good).
def parked_read(mode: Any) -> bool:
    """The hot path of a read while ``mode`` is parked (Note [A parked read costs a
    counter]): True if counting it is all there is to do (counted then); False: take
    the general path (:func:`seen`, then :func:`safe_point`)."""
    if not mode._parked:
        return False
    policy = mode.policy
    sp = SAFE_POINTS
    if sp is not None and sp._tls.busy and sp.in_step():  # Note [Probes come between optimizer steps]
        if policy.warming:
            return False  # the program's read inside a step (a closure's) may end it
    elif not policy.parked_tick():
        return False
    counters = mode.counters
    counters.reads += 1
    counters.reads_parked += 1
    return True


def parked_call(mode: Any) -> bool:
    """Like :func:`parked_read` for a safe point that is not a read (``backward()``,
    ``At.CALL``): True if ``mode`` is parked and counting it was all there was to do."""
    if not mode._parked:
        return False
    sp = SAFE_POINTS
    if sp is not None and sp._tls.busy and sp.in_step():
        return True  # Note [Probes come between optimizer steps]: nothing happens here
    return mode.policy.parked_tick(AT_CALL)


def safe_point(mode: Any, at: At) -> None:
    """Between torch calls (outside any op): the policy answers whether ``mode`` parks
    (it stopped deferring and nothing is pending) or comes back (a probe, compiles
    ready), and this applies the answer (``at``: which safe point this is)."""
    parked = mode._parked
    in_step = (at is AT_READ or at is AT_CALL) and parked and SAFE_POINTS is not None \
        and SAFE_POINTS.in_step()
    # feed(SafePoint(...)), without the event: every read of a parked program comes here
    act = mode.policy.at_safe_point(at, parked, bool(mode.recorder.nodes), in_step)
    if act is ACT_UNPARK:
        unpark(mode, read=True if at is AT_READ else False if at is AT_STEP else None)
    elif act is ACT_PARK:
        park(mode)
    elif act is ACT_CAPTURE:  # Note [Measure before capturing]
        import_dynamo()  # Note [Import Dynamo before capture]
        mode.counters.note_phase("captured", mode.policy.why_deferring)
        if SAFE_POINTS is not None:
            SAFE_POINTS.wants_modules(mode, False)


def block_entered(mode: Any) -> None:
    """A block's mode was just pushed: a safe point (a warming policy, or one that passes
    through, parks it at once; a probe counts a step's worth)."""
    if mode.policy.feed(SafePoint(AT_BLOCK, False)) is ACT_PARK:
        park(mode)


def block_left(mode: Any) -> None:
    """A block is being left: its mode goes back on the stack (if parked) to be popped by
    its own ``__exit__``, and needs no safe points any more."""
    if mode._parked:
        _push_mode(mode)
        mode._parked = False
    if SAFE_POINTS is not None:
        SAFE_POINTS.wants_modules(mode, False)


# Note [Import Dynamo before capture]
# torch's Python meta kernels (torch._refs, _meta_registrations) are wrapped in
# torch._disable_dynamo, which imports torch._dynamo on its first call: 1.2-3 s on this
# CPU. A capture's first meta kernel would pay it in the middle of a window, so it is
# imported where capture is decided: at the session's start when capture begins with
# the block's first op (warmup or adaptive_passthrough off), else at the safe point where
# a measure decides to capture. A program that parks never pays it: importing it at the
# first block cost every run 1.4 s (measured: word_language_model's LSTM pattern, 8
# steps, 0.1 s eagerly, 1.4-1.8 s under the runtime in a fresh process, nothing
# captured: the "20x" of issue 16).
def import_dynamo() -> None:
    """Import torch._dynamo now (Note [Import Dynamo before capture]), and the compile
    pipeline (Note [The compiled executor is built at the first window],
    runtime/deferred.py); idempotent."""
    if "torch._dynamo" in sys.modules and "adaptive_eager.runtime.compiled" in sys.modules \
            and __package__ + ".flush" in sys.modules:
        return
    from . import interrupts  # noqa: PLC0415 - a leaf module
    from ..runtime.deferred import import_compiled  # noqa: PLC0415

    try:
        with interrupts.critical():  # not half-imported by a Ctrl-C (Note [Interrupts wait for the flush])
            import torch._dynamo  # noqa: F401, PLC0415
            import_compiled()
            # the window's modules (Note [The window is built at the first capture], mode.py)
            from . import flush, recorder, trace  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - an optional speed-up; the first op imports it anyway
        _PARK_LOG.debug("adaptive_eager: importing torch._dynamo failed", exc_info=True)


def end_warmup(mode: Any, why: str, source: str | None, boundary: Any = None) -> None:
    """The program's first iteration ended (Note [The first iteration runs eagerly]), if
    ``boundary`` (an optimizer step, a read's line) was seen before (Note [The first
    iteration ends where a boundary recurs], runtime/adapt.py); None: ended now."""
    if mode.policy.feed(WarmupEnded(why, boundary)):
        if source is None:
            source = user_source(2)  # e.g. the program's opt.step() line
        mode.counters.warmup_ended = f"{why} at {source}"
        mode.counters.note_phase("warm-up ended", f"{why} at {source}")
        _PARK_LOG.debug("warm-up ended: %s at %s; capturing from now", why, source)


# Note [The step compiler is imported at the first step]
# The compiled optimizer step (dispatch/optim_compile.py) brings its tracing, the compile
# worker's client, the first-call checks and the backends table (~5 ms CPU of the ~55 ms
# that enabling cost, measured with benchmarks.fixed_cost's 20-op script): a program that
# never steps a torch.optim optimizer under the runtime needs none of it. So it is
# imported at the first step that starts while a runtime is active in the thread;
# before that, no optimizer can have param groups to give back.
def _steps(load: bool = True) -> Any:
    """The process's step compiler (``optim_compile.STEPS``); None if ``load`` is False
    and it was never imported (Note [The step compiler is imported at the first step]).

    A module in sys.modules may still be importing in another thread (two threads at
    their first optimizer step): without STEPS yet, it has been given no optimizer, so
    ``load=False`` answers None, and the import statement waits for the other thread's
    import to end (two threads training at once raised "partially initialized module
    ... has no attribute 'STEPS'" at their first step, 3 runs of 6)."""
    steps = getattr(sys.modules.get(__package__ + ".optim_compile"), "STEPS", None)
    if steps is not None or not load:
        return steps
    from . import optim_compile as module  # noqa: PLC0415 - waits for an import in progress
    return module.STEPS


class SafePoints:
    """The process's safe points: global torch.optim step hooks, and a global module
    forward pre-hook while some runtime needs it (Note [Deep parking at module calls]).

    ``thread_stack()`` returns the calling thread's runtime stack (a list of (mode,
    observe) entries, innermost last) or None; ``counters`` counts the optimizer steps
    switched to the foreach level. Installed once per process (:func:`install`).
    """

    def __init__(self, thread_stack: Callable[[], list | None], counters: Any):
        self.thread_stack = thread_stack
        self.counters = counters
        self._compiler: Any = None  # optim_compile.STEPS, once imported (_steps)
        self._lock = threading.Lock()
        self._wanting: "weakref.WeakSet[Any]" = weakref.WeakSet()  # modes that need module calls
        self._tls = _StepState()  # optimizer -> param groups switched to foreach
        # Rows of the hooks registry (Note [The hooks registry], hooks.py): torch's public
        # API; the step hooks cost nothing to code that never steps an optimizer.
        self.step_hooks = Hook("optim-steps", "torch.optim global step pre/post hooks",
                               self._add_step_hooks, _remove_handles)
        self.module_hook = Hook("module-calls", "global module forward pre-hook",
                                self._add_module_hook, _remove_handles)

    def _add_step_hooks(self) -> list:
        from torch.optim.optimizer import (  # noqa: PLC0415
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        return [register_optimizer_step_pre_hook(self.step_starts),
                register_optimizer_step_post_hook(self.step_ends)]

    def _add_module_hook(self) -> list:
        from torch.nn.modules.module import register_module_forward_pre_hook  # noqa: PLC0415

        return [register_module_forward_pre_hook(self.module_call)]

    # -- optimizer steps ----------------------------------------------------------------
    # Note [Probes come between optimizer steps]
    # torch.optim's single-tensor steps read their step counters (``_get_value(step)``:
    # one ``.item()`` per parameter), and a parked mode sees every read as a safe point. A
    # probe that came back at one of them measured the rest of that step: the program's
    # own single-tensor ops (a parked step runs as eager does), never the foreach step
    # capture would see (Note [Optimizer steps at the foreach level]), so it found
    # 18-40 µs an op and parked again, every ~0.2 s (AdamW over 100 tensors: 1.3 ms of
    # pass-through per probe, 0.79x eager). Reads inside an optimizer step (between its
    # pre and post hooks, this thread) are not where a parked mode comes back, nor are
    # calls of backward() there: LBFGS's closure runs forward and backward inside the
    # step, and a measure that came back at its backward() (the first safe point after
    # the warm-up ended at the closure's read) passed the whole backward and the rest of
    # the step through the mode while settling (time_sequence_prediction, the patterns
    # benchmark's lbfgs: 3,451 ops passed through for 66 timed, 1.15x eager CPU); it now
    # comes back at the step's end.
    def _stepping(self) -> "weakref.WeakSet":
        stepping = self._tls.stepping
        if stepping is None:
            stepping = self._tls.stepping = weakref.WeakSet()
        return stepping

    def in_step(self) -> bool:
        """Whether this thread is inside an optimizer step (Note [Probes come between
        optimizer steps])."""
        tls = self._tls
        if tls.stepping:
            return True
        tls.busy = False  # an open step's optimizer was freed (its step raised)
        return False

    def _switched(self) -> "weakref.WeakKeyDictionary":
        switched = self._tls.foreach
        if switched is None:
            switched = self._tls.foreach = weakref.WeakKeyDictionary()
        return switched

    def step_starts(self, opt: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        """The start of an optimizer step: qualifying param groups run at the foreach
        level (Note [Optimizer steps at the foreach level], dispatch/optim.py)."""
        tls = self._tls
        switched = tls.foreach
        left = switched.pop(opt, None) if switched else None
        if left:  # the last step raised before its post hook ran
            restore_foreach(left)
        steps = self._compiler or _steps(load=False)
        if steps is not None:
            steps.give_back(opt)  # likewise (Note [The optimizer step as one compiled unit])
        stepping = self._stepping()
        nested = opt in stepping  # a subclass's step calling its base class's
        stepping.add(opt)  # Note [Probes come between optimizer steps]
        tls.busy = True  # Note [A parked read costs a counter]
        st = self.thread_stack()
        if not st:
            return
        # its step may run compiled (dispatch/optim_compile.py); if so, our instance
        # pre-hook switches it to the foreach level only when it runs eagerly (Note [The
        # foreach switch waits for the step's decision])
        if steps is None:
            steps = self._compiler = _steps()
        mode = st[-1][0]
        if not steps.attach(opt, self.thread_stack, self.switch_foreach):
            if not nested:
                steps.not_a_candidate(opt, mode, args, kwargs or {})  # the report's reason
            if not mode._parked:  # parked: the program's own optimizer, as eager
                self.switch_foreach(opt)
        elif not nested and mode.policy.timing:
            # Note [Steps compiled on their own are not measured] (runtime/owned_steps.py)
            self._tls.owned = (opt, mode.policy.step_mark())

    def switch_foreach(self, opt: Any) -> None:
        """Switch ``opt``'s qualifying groups to the foreach level for this step (restored
        at its end)."""
        groups = use_foreach(opt)
        if groups:
            self._switched()[opt] = groups
            self.counters.optimizer_steps_foreach += 1
        elif groups is None:  # Note [The foreach switch never raises the peak] (optim.py)
            self.counters.optimizer_steps_foreach_kept += 1

    def restore_foreach(self) -> None:
        """Every group this thread switched and did not restore yet gets foreach=None back
        (and every optimizer whose compiled step did not end its param groups); the
        thread's last block is being left. A step still open then raised (its post hook
        never ran): it no longer counts as open (Note [Probes come between optimizer
        steps]; a live optimizer whose step raised kept a later block's reads and
        backward() calls from ever being probe points)."""
        steps = _steps(load=False)
        if steps is not None:
            steps.give_back()
        switched = self._tls.foreach
        while switched:
            _, groups = switched.popitem()
            restore_foreach(groups)
        self._tls.usage = None  # the next block counts from its own first step end
        self._tls.owned = None
        if self._tls.stepping:
            self._tls.stepping.clear()
        self._tls.busy = False

    def step_ends(self, opt: Any, *_: Any) -> None:
        """The end of an optimizer step."""
        tls = self._tls
        stepping = tls.stepping
        if stepping:
            stepping.discard(opt)
        tls.busy = bool(stepping)
        switched = tls.foreach
        if switched:
            groups = switched.pop(opt, None)
            if groups:
                restore_foreach(groups)
        st = self.thread_stack()
        if not st:
            return
        mode = st[-1][0]
        owned = self._tls.owned
        if owned is not None and owned[0] is opt:
            self._tls.owned = None
            mode.policy.step_owned(owned[1])  # Note [Steps compiled on their own are not measured]
        # Note [Page faults between optimizer steps]: only inside a block, which counts
        # from its own first step end (restore_foreach forgets the sample at its exit)
        now = step_usage.sample()
        last, self._tls.usage = self._tls.usage, now
        if last is not None and now is not None:
            step_usage.book(mode.counters, last, now, mode.counters.compiles_in_flight > 0)
        if mode._parked and mode.policy.parked_tick(AT_STEP):
            # Note [A parked read costs a counter]: what seen() and safe_point() do here
            counters = mode.counters
            counters.optimizer_steps += 1
            counters.optimizer_steps_parked += 1
            mode.policy.seen(False, True)
            return
        # Note [Counting while passing through] (runtime/counters.py)
        seen(mode, False)
        if mode.policy.warming:
            # Note [The first iteration runs eagerly], [The first iteration ends where a boundary recurs]
            # a weak reference, not id(opt): the policy outlives blocks, and a later
            # block's optimizer can be born at a freed one's address (seen first, it read
            # as recurring: its first iteration was measured). A dead referent's reference
            # equals no other.
            end_warmup(mode, "optimizer step", None, ("step", weakref.ref(opt)))
        elif not mode._parked and len(mode.recorder):
            # Note [Optimizer steps end windows]
            # A program that reads nothing every step (loss read every N steps) has its
            # windows cut only by window_size, at a different op each iteration (an
            # iteration of 307 ops: 256, then 51 + 205, ...), so no window recurs and
            # nothing compiles. Ending the window at the end of each optimizer step
            # anchors windows to iterations: the same ops each step, so they recur.
            mode.flush(R.OPTIMIZER_STEP, user_source(2))
        safe_point(mode, AT_STEP)

    # -- module calls ---------------------------------------------------------------------
    # Note [Deep parking at module calls]
    # Reads, optimizer steps and backward calls are the safe points of most loops, but a
    # stretch of ops may have none for long: a policy that stopped deferring at a full
    # window (inside an op, where the mode cannot leave the stack) would pass every op
    # through its Python call until the next one, and a measure (Note [Measure before
    # capturing]) would run on; a backward pass alone is thousands of ops. So while some
    # runtime is measuring or passing ops through on the stack, a global module forward
    # pre-hook is installed and each module call is a safe point too (standing for a few
    # torch calls towards the probes). Module calls happen between torch calls, like an
    # optimizer step's end. Parked or capturing, no runtime needs it, and it is removed:
    # a module call with a global hook costs ~1.7 µs more than one without (measured:
    # nn.GELU on fp32[2, 8], 1 thread: 8.9 vs 10.6 µs), which a parked program would pay
    # on every module call (measured at an earlier design: a GPT sampling loop 7% over
    # eager from the hook alone). A parked runtime probes at the other safe points only:
    # a loop with no reads, optimizer steps nor backward is not probed again.
    def module_call(self, *_: Any) -> None:
        """Before a module's forward (the global module forward pre-hook)."""
        st = self.thread_stack()
        if st:
            safe_point(st[-1][0], AT_MODULE)

    def wants_modules(self, mode: Any, wanted: bool) -> None:
        """Whether ``mode`` needs module calls as safe points now (the hook is installed
        while some mode does)."""
        if (mode in self._wanting) == wanted:
            return
        with self._lock:
            if wanted:
                self._wanting.add(mode)
            else:
                self._wanting.discard(mode)
            if self._wanting:
                HOOKS.install([self.module_hook])
            else:
                HOOKS.uninstall(self.module_hook)

    @property
    def module_hooked(self) -> bool:
        """Whether the module forward pre-hook is installed now."""
        return HOOKS.installed(self.module_hook)


class _StepState(threading.local):
    """A thread's optimizer steps: the open ones (a weak set), whether any is open (a
    plain flag: Note [A parked read costs a counter]), the groups switched to foreach.
    Class defaults: every thread reads them without a miss."""

    stepping: "weakref.WeakSet | None" = None
    busy = False
    foreach: "weakref.WeakKeyDictionary | None" = None
    usage: "tuple | None" = None  # the last step end's step_usage.sample()
    # (optimizer, mark) of the open candidate step a measure times (Note [Steps compiled
    # on their own are not measured], runtime/owned_steps.py)
    owned: "tuple | None" = None


def _remove_handles(handles: list) -> None:
    for handle in handles:
        handle.remove()


# Note [The safe points registry]
# One SafePoints per process, made with the first session; its global torch hooks are
# rows of the hooks registry (Note [The hooks registry], hooks.py), which installs each
# once. The documented state of this module.
SAFE_POINTS: SafePoints | None = None
_INSTALL_LOCK = threading.Lock()


def install(thread_stack: Callable[[], list | None], counters: Any) -> SafePoints:
    """Install the process's safe points once (idempotent); returns them."""
    global SAFE_POINTS
    with _INSTALL_LOCK:
        if SAFE_POINTS is None:
            SAFE_POINTS = SafePoints(thread_stack, counters)
        HOOKS.install([SAFE_POINTS.step_hooks])
        return SAFE_POINTS


__all__ = ["park", "unpark", "policy_stopped", "seen", "parked_read", "parked_call", "safe_point",
           "block_entered", "block_left", "end_warmup", "SafePoints", "install", "SAFE_POINTS", "At"]
