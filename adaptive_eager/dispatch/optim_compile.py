"""The optimizer step as one compiled unit (Note [The optimizer step as one compiled unit]).

While a runtime is active in a thread, a qualifying torch.optim optimizer's ``step()``
runs as one compiled function over its params, grads, state and 0-d hyperparameters
(runtime/optim_graph.py builds it from torch's own multi-tensor step), whether the mode
is capturing or parked. :class:`StepCompiler` is the process's one instance
(:data:`STEPS`), driven from the optimizer step hooks of dispatch/parking.py.

Example::

    >>> import torch, adaptive_eager as ae
    >>> p = torch.nn.Parameter(torch.ones(8)); opt = torch.optim.AdamW([p], lr=0.1)
    >>> ae.reset_stats()
    >>> with ae.adaptive_eager(backend="eager", async_compile=False, optimizer_step_after_ms=0):
    ...     for _ in range(5):   # state creation, trace and compile, first call checked
    ...         p.grad = torch.ones(8); opt.step()
    >>> ae.stats().optimizer_steps_compiled
    2
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import cachetools
import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..runtime.backends import is_debugging
from ..runtime.cache import COLD, COMPILED, COMPILING, EAGER_ONLY
from ..runtime.checks import close
from ..runtime.first_call import CompiledCodeWroteInput, on_host
from ..runtime.optim_fast import KnownStep
from .optim_speed import STEP_TIMED_CALLS, StepSpeed  # noqa: F401 - re-exported
from .optim_threshold import CostThreshold, thread_mark
from .optim_inputs import GRAIN_SIZE, example as _example, kernel_threads  # noqa: F401 - re-exported
from ..runtime.step_check import WROTE_READ_ONLY, BesideCheck, written_inputs
from ..runtime.optim_graph import (StepProgram, gather, step_values)
from ..reasons import R
from .lazy import LazyTensor
from .optim import FOREACH_EQUAL
from .optim_records import _WAITS, MAX_PROGRAMS, Why, _Entry, _note
from .optim_trace import submit_compile, trace_signature
from .optim_waiting import WaitingSteps
from .source import user_source

log = logging.getLogger("adaptive_eager")

# Note [The optimizer step as one compiled unit]
# torch.compile users speed up the optimizer step by hand with torch.compile(opt.step): it
# is memory-bound pointwise work over every parameter, and torch.optim's Python around it
# (grouping, per-parameter ``.item()`` reads, ~15 foreach calls over 100-tensor lists) costs
# as much as fusing saves when it is captured op by op (issue 12). Here a qualifying step
# (classes in FOREACH_EQUAL, exact type; no closure, fused, differentiable or capturable
# groups, no tensor hyperparameters; plain float32/float64 dense tensors) is traced once per
# signature (the classes, options, tensor specs and state layout, never float values) from
# torch's own ``step`` on meta stand-ins, and the graph goes to the session's compile
# service like any region. Until it is ready, and on the first step (state creation), the
# step runs as eager does. Once ready, the step runs the compiled function and torch's own
# step body is skipped: our hook is the optimizer's last step pre-hook (the program's
# pre-hooks, which may set lr, run first), it hands torch's body an empty ``param_groups``
# and our first post-hook gives the groups back before the program's post-hooks run. A
# step whose run raised before the post-hook gets its groups back at the optimizer's
# next step or when the block is left. The first compiled call runs on copies and is
# compared with eager's step, run on the real tensors that one time
# (``verify_compiled``: bitwise for the debugging backends, within the dtype's tolerance
# for a compiler); a mismatch makes the signature eager-only.
MAX_SIGNATURES = 64     # signatures kept per session (LRU)
CANDIDATES = FOREACH_EQUAL
_PLAIN = (torch.Tensor, torch.nn.Parameter, LazyTensor)


def _unwrap(t: torch.Tensor) -> torch.Tensor | None:
    return t._ae_real if type(t) is LazyTensor else t


class StepCompiler:
    """The process's compiled optimizer steps: per compile service (one per session), a
    bounded map from signature to traces; per thread, the groups handed back after a
    step and the first compiled call being checked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread_stack: Any = None  # the safe points' (see attach)
        self.switch_foreach: Any = None  # likewise: a step that runs eagerly, while capturing
        self._by_service: "weakref.WeakKeyDictionary[Any, cachetools.LRUCache]" = weakref.WeakKeyDictionary()
        self._hooked: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        # optimizer -> (KnownStep, its entry, the compile service it belongs to)
        self._known: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        self._tls = threading.local()
        self._waiting = WaitingSteps()  # Note [A step waiting for its compile is not captured]
        self._released: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
        self._threshold = CostThreshold(_PLAIN)  # Note [A step compiles once it has cost enough]
        self._speed = StepSpeed(self._threshold)  # Note [A compiled step slower than eager's goes back]
        # Note [The first compiled step is checked beside the program] (runtime/step_check.py)
        self._beside = BesideCheck()

    # -- hooks ----------------------------------------------------------------------------
    def attach(self, opt: Any, thread_stack: Any, switch_foreach: Any = None) -> bool:
        """Make sure ``opt`` has our instance hooks, ours the last pre-hook and the first
        post-hook (called from the global step pre-hook, before the instance hooks run);
        whether it has them (a candidate class). ``thread_stack``: the safe points'
        (dispatch/parking.py), which the pre-hook asks for the thread's mode;
        ``switch_foreach(opt)``: theirs too, called by the pre-hook when the step runs
        eagerly in a capturing mode (Note [The foreach switch waits for the step's
        decision]); both passed in: parking imports this module."""
        if type(opt) not in CANDIDATES:
            return False
        self.thread_stack = thread_stack
        self.switch_foreach = switch_foreach
        handles = self._hooked.get(opt)
        if handles is None:
            handles = (opt.register_step_pre_hook(_pre_hook), opt.register_step_post_hook(_post_hook))
            self._hooked[opt] = handles
        pre, post = opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks
        if handles[0].id in pre and next(reversed(pre)) != handles[0].id:
            pre.move_to_end(handles[0].id)
        if handles[1].id in post and next(iter(post)) != handles[1].id:
            post.move_to_end(handles[1].id, last=False)
        return True

    def _pending(self) -> "weakref.WeakKeyDictionary":
        d = getattr(self._tls, "groups", None)
        if d is None:
            d = self._tls.groups = weakref.WeakKeyDictionary()
        return d

    def give_back(self, opt: Any = None) -> None:
        """Give ``opt`` (None: every optimizer of this thread) its param groups back, and
        capture back where any step of this thread passed through and raised (Note [A
        step waiting for its compile is not captured])."""
        self._waiting.resume()
        if opt is None:
            self._tls.parked = None  # a fast-path step that raised: its block is left
        d = getattr(self._tls, "groups", None)
        if not d:
            return
        items = [(opt, d.pop(opt, None))] if opt is not None else list(d.items())
        if opt is None:
            d.clear()
        for o, held in items:
            if held is not None:
                o.param_groups = held[0]

    # -- one step -------------------------------------------------------------------------
    # Note [The foreach switch waits for the step's decision]
    # A step that runs eagerly in a capturing mode runs at the foreach level (Note
    # [Optimizer steps at the foreach level]); deciding whether its groups qualify reads
    # every param's and grad's type, dtype and layout (~45 µs a step over 100 tensors,
    # measured: a sixth of a compiled SGD step's Python). A compiled step hands torch's
    # body no groups, so the switch is only needed when the step runs eagerly: for a
    # candidate class the global pre-hook leaves it to our pre-hook, which switches the
    # groups after deciding (and after the program's own pre-hooks, which may change them).
    def before_step(self, opt: Any, mode: Any, args: tuple, kwargs: dict) -> None:
        """Our (last) step pre-hook: run the step compiled when it can, else leave it to
        torch's body (eager; at the foreach level while capturing, or passed through
        while its own compile is pending: Note [A step waiting for its compile is not
        captured])."""
        mark = thread_mark(mode)
        ran = self._step(opt, mode, args, kwargs, mark)
        if ran is _WAITS:
            self.passes_through(opt, mode)
        elif not ran:
            self.runs_eagerly(opt, mode)
        elif not is_debugging(mode.options.backend):  # Note [A compiled step slower than
            self._speed.started(opt, mark)             # eager's goes back]: timed to its end

    def parked_step(self, opt: Any, mode: Any, args: tuple, kwargs: dict) -> bool:
        """Our pre-hook's fast path (``mode`` parked): True if ``opt``'s step runs eagerly
        for its cost threshold with nothing else to decide, timed to our post-hook (Note [A
        parked cheap step costs a clock], optim_threshold.py); False: :meth:`before_step`."""
        rec = None
        if mode.options.optimizer_step and self._why_not(opt, args, kwargs) is None:
            rec = self._threshold.parked(opt, mode)
        self._tls.parked = opt if rec is not None else None  # for our post-hook
        if rec is None:
            return False
        counters = mode.counters
        with counters.lock:
            counters.optimizer_step_kinds[rec.cheap_key] += 1
        return True

    # Note [A step waiting for its compile is not captured] (dispatch/optim_waiting.py)
    def passes_through(self, opt: Any, mode: Any) -> None:
        """``opt``'s step runs torch's body with capture suspended (see the Note)."""
        if mode._parked:
            return
        if len(mode.recorder):
            mode.flush(R.OPTIMIZER_STEP, user_source())
        self.runs_eagerly(opt, mode)  # at the foreach level: fewer ops (launches), equal results
        self._waiting.suspend(opt)

    def not_a_candidate(self, opt: Any, mode: Any, args: tuple, kwargs: dict) -> None:
        """Note why ``opt`` (a class :meth:`attach` declined) steps eagerly: a closure, a
        subclass of a candidate class, or another class (LBFGS, NAdam, a custom one)."""
        if not mode.options.optimizer_step or not isinstance(opt, torch.optim.Optimizer):
            return
        cls = type(opt)
        if (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None:
            why = Why.CLOSURE
        elif issubclass(cls, tuple(CANDIDATES)):
            why = Why.SUBCLASS
        else:
            why = Why.CLASS
        _note(mode.counters, cls.__name__, "eager: " + why)

    def runs_eagerly(self, opt: Any, mode: Any) -> None:
        """``opt``'s step runs torch's body: its groups switched to the foreach level when
        the mode captures (Note [The foreach switch waits for the step's decision])."""
        if not mode._parked and self.switch_foreach is not None:
            self.switch_foreach(opt)

    def _step(self, opt: Any, mode: Any, args: tuple, kwargs: dict, mark: tuple) -> bool | str:
        """Run ``opt``'s step compiled if it can; whether it did (_WAITS: it runs eagerly,
        passed through, while its compile is pending or checked). ``mark``: where the step
        began (``thread_mark``)."""
        if not mode.options.optimizer_step:
            return False
        cls = type(opt).__name__
        why = self._why_not(opt, args, kwargs)
        counters = mode.counters
        if why is not None:
            _note(counters, cls, "eager: " + why)
            return False
        # Note [A cheap step does not build the compile pipeline]
        # A session's executor is built at its first window (Note [The compiled executor is
        # built at the first window], runtime/deferred.py), and asking it for its compile
        # service built it: a parked program's first optimizer step imported the compile
        # pipeline and made a CompileService it never used (~10 ms), and every later step
        # went through the deferred executor's ``__getattr__``. Nothing of the service is
        # needed while a step is cheaper than a compile and no trace of it exists: no
        # window of the session compiled (its table is empty) and no artifact of the
        # session's was loaded, so the threshold's look-up of saved steps waits for it.
        executor = mode.executor
        service = executor.compiler if getattr(executor, "built", True) else None
        known = self._known.get(opt)
        got = known[0].check(opt) if known is not None and service is not None and known[2] is service else None
        entry = scalars = steps = None
        if got is not None:  # Note [A known step is re-checked, not re-gathered]
            entry = known[1]
            if entry.region is not None and entry.region.state == EAGER_ONLY:
                # its signature's compile failed or was demoted: nothing to prepare
                _note(counters, cls, f"eager: {Why.FAILED}: {entry.region.reason}")
                return False
            if entry.program is not None:
                steps = known[0].step_values(entry.program.reads, got.inputs)
                scalars = _scalars(entry.program, got.hyper, steps, mode) if steps is not None else None
            if scalars is None:
                entry = None
        if entry is None and known is None and \
                self._threshold.cheap(opt, mode, service, lambda g: self._compiled(g, service), mark):
            _note(counters, cls, "eager: " + Why.CHEAP)
            return _WAITS  # Note [A step waiting for its compile is not captured]
        if service is None:
            service = executor.compiler
        if entry is None:
            got = gather(opt, _PLAIN)
            if isinstance(got, str):
                _note(counters, cls, "eager: " + got)
                return False
            entry, steps, scalars = self._lookup(opt, got, service, counters, cls, mode.options.backend)
            if entry is None:  # traced now (its compile queued: it waits for it), or eager
                return _WAITS if self._compiling(got, service) else False
            known = (KnownStep(opt, got), entry, service)
            self._known[opt] = known
        region = entry.region
        self._take_verdict(entry, service, counters)  # Note [The first compiled step is checked beside the program]
        if entry.build is not None and region.state != COMPILING:
            if region.state == COLD:  # a disk load that did not load: compile it
                submit_compile(entry, service, counters)
            entry.build = None  # the example inputs are the program's tensors: let go
        if region.state == COMPILING:
            service.check_timeout(region)
        if region.state != COMPILED or region.fn is None:
            reason = Why.COMPILING if region.state == COMPILING else f"{Why.FAILED}: {region.reason}"
            _note(counters, cls, "eager: " + reason)
            return _WAITS if region.state == COMPILING else False
        ran = self._run(opt, mode, entry, got, scalars, service, counters, cls)
        if ran is not True:
            return ran  # False, or _WAITS: its first compiled call is being checked
        known[0].stepped(entry.program.reads, entry.program.deltas, steps, got.inputs)
        return True

    def _compiling(self, got: Any, service: Any) -> bool:
        """Whether a trace of ``got``'s signature is compiling (Note [A step waiting for
        its compile is not captured])."""
        return any(e.region is not None and e.region.state == COMPILING
                   for e in self._table(service).get(got.key) or ())

    def _compiled(self, got: Any, service: Any) -> bool:
        """Whether the session holds a compiled trace of ``got``'s signature."""
        return any(e.region is not None and e.region.state == COMPILED
                   for e in self._table(service).get(got.key) or ())

    def _lookup(self, opt: Any, got: Any, service: Any, counters: Any, cls: str,
                backend: Any) -> tuple:
        """(entry, step values, scalars) for ``got``'s signature; (None, ...) when this step
        runs eagerly (traced now, or not a candidate: noted)."""
        table = self._table(service)
        entries = table.get(got.key)
        for e in entries or ():
            if e.program is None:
                _note(counters, cls, f"eager: {Why.FAILED}: {e.reason}")
                return None, None, None
            steps = step_values(e.program, got.inputs)
            if steps is None:
                _note(counters, cls, "eager: " + Why.STEPS)
                return None, None, None
            scalars = _scalars(e.program, got.hyper, steps, None)
            if scalars is not None:
                return e, steps, scalars
        if entries is not None and len(entries) >= MAX_PROGRAMS:
            _note(counters, cls, "eager: " + Why.TOO_MANY)
        else:
            trace_signature(opt, got, service, table, counters, cls, backend, self._speed)
        return None, None, None

    def _call_via_host(self, entry: Any, service: Any, inputs: list, rest: list, counters: Any,
                       cls: Any) -> tuple[bool, list]:
        """The first compiled call on the program's own tensors, each saved to the host
        first and put back after (version counters too): (ran, what the call left, on
        the host)."""
        with torch.no_grad(), _disable_current_modes():
            saved = [on_host(t) for t in inputs]
            versions = [t._version for t in inputs]
        ok = self._call(entry, service, inputs + rest, counters, cls)
        with torch.no_grad(), _disable_current_modes():
            got = [on_host(t) for t in inputs] if ok else []
            for t, s in zip(inputs, saved):
                t.copy_(s)
        _set_versions(tuple(inputs), tuple(versions))
        return ok, got

    # Note [A step's first call copies what it writes]
    # The traced step never writes a grad (Note [Grads stay the program's],
    # runtime/optim_graph.py; :func:`~..runtime.step_check.written_inputs` reads that from
    # the graph), so only what it writes is copied for its first call (params, state); the
    # grads are the program's own, read by the call (on the program's thread, before
    # eager's step: Note [No checker thread while OpenMP throttles its spin],
    # runtime/step_check.py) and hashed before and after it: AdamW's copies are 3
    # parameter-sized lists, not 4 (the step alone over the GPT's 49.6 MiB of parameters,
    # ``python -m benchmarks.memory --workloads adamw-step --modes sync``: process peak
    # 772 -> 723 MiB, 613 unchecked). The program waits for the call at the step's end
    # (``after_step``, our first post-hook), so nothing of the program (a post-hook,
    # ``zero_grad(set_to_none=False)``) writes a grad the call still reads. A grad the
    # compiled code wrote cannot be put back: the step goes eager-only and
    # CompiledCodeWroteInput is raised at the program's ``step()``.

    def after_step(self, opt: Any) -> None:
        """Our (first) step post-hook: the groups back; a first compiled call checked."""
        self._waiting.resume(opt)  # Note [A step waiting for its compile is not captured]
        self._threshold.charge(opt)  # Note [A step compiles once it has cost enough]
        self._speed.ended(opt, self._known.get(opt))  # Note [A compiled step slower than eager's goes back]
        held = self._pending().pop(opt, None)
        if held is None:
            return
        groups, check = held
        opt.param_groups = groups
        if check is not None:
            entry, service, inputs, copies, mode, exact, called = check
            counters = mode.counters
            if not mode._parked and len(mode.recorder):  # eager's step, captured: run it
                mode.flush(R.OPTIMIZER_STEP, user_source())
            if called is not None:  # Note [The first compiled step is checked beside the program]
                problem = BesideCheck.verdict(called)  # Note [A step's first call copies what it writes]
                if problem is not None and problem[1] == WROTE_READ_ONLY:
                    reason = f"{problem[0]}: the compiled optimizer step wrote grads"
                    service.fail(entry.region, reason, stays_correct=False)
                    _note(counters, entry.cls, f"eager: {Why.FAILED}: compiled step wrote its grads")
                    raise CompiledCodeWroteInput(reason)
                with _disable_current_modes(), torch._C.DisableTorchFunction():  # off the mode
                    entry.verdict = self._beside.compare(called, inputs, copies,
                                                         written_inputs(entry.program.gm), exact)
                # taken here, waiting for a comparison still running on the checker: its
                # copies go before the program's next forward (Note [The check's copies
                # are made after the backward], runtime/step_check.py)
                self._take_verdict(entry, service, counters)
                return
            with torch.no_grad(), _disable_current_modes():
                bad = next((i for i, (a, b) in enumerate(zip(inputs, copies))
                            if not (torch.equal(_here(a, b), b) if exact else close(_here(a, b), b))),
                           None)
            if bad is not None:
                service.fail(entry.region, f"{R.COMPILED_OUTPUTS_DIFFER}: optimizer step input {bad}")
                _note(counters, entry.cls, f"eager: {Why.FAILED}: compiled step differs from eager")
            else:
                service.passed_check(entry.region)  # Note [A region checked once is trusted by the next process]

    @staticmethod
    def _take_verdict(entry: _Entry, service: Any, counters: Any) -> None:
        pending, entry.verdict = entry.verdict, None
        if pending is None:
            return
        problem = BesideCheck.verdict(pending)
        if problem is None:
            service.passed_check(entry.region)  # Note [A region checked once is trusted by the next process]
            return
        service.fail(entry.region, problem[0])
        _note(counters, entry.cls, f"eager: {Why.FAILED}: {problem[1]}")

    def _why_not(self, opt: Any, args: tuple, kwargs: dict) -> str | None:
        # the hook's args hold the optimizer first; ``step(None)`` (accelerate's wrapper,
        # so every HF Trainer step) passes no closure
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is not None or len(args) > 2:
            return Why.CLOSURE
        if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
            return Why.OPTION + " grad_scale/found_inf (a fused GradScaler step)"
        for g in opt.param_groups:
            for name in ("fused", "differentiable", "capturable"):
                if g.get(name):
                    return f"{Why.OPTION} {name}"
            if g.get("foreach") is False:
                return f"{Why.OPTION} foreach=False"
        return None

    def _table(self, service: Any) -> cachetools.LRUCache:
        with self._lock:
            t = self._by_service.get(service)
            if t is None:
                t = self._by_service[service] = cachetools.LRUCache(MAX_SIGNATURES)
            return t

    def _run(self, opt: Any, mode: Any, entry: _Entry, got: Any, scalars: list, service: Any,
             counters: Any, cls: str) -> bool | str:
        depth = torch._C._len_torch_dispatch_stack()
        if depth > (0 if mode._parked else 1):
            _note(counters, cls, "eager: " + Why.MODES)
            return False
        if not mode._parked and len(mode.recorder):
            mode.flush(R.OPTIMIZER_STEP, user_source())
        if not got.known and not mode._parked and opt not in self._released \
                and not self._known[opt][0].usable:
            # Note [State made while capturing is released at its step]
            self._released[opt] = True
            mode.release_handles()
        # handles (a grad made by a captured backward, bound by now, possibly kept while
        # parked): their real tensors
        lazy = LazyTensor
        if got.known:  # only the grads may be handles
            inputs = got.inputs
            unbound = False
            for n in got.grads:
                t = inputs[n]
                if type(t) is lazy:
                    inputs[n] = t = t._ae_real
                    unbound = unbound or t is None
        else:
            inputs = [t._ae_real if type(t) is lazy else t for t in got.inputs]
            unbound = any(t is None for t in inputs)
        if unbound:
            _note(counters, cls, "eager: unbound handle")
            return False
        rest = list(entry.program.consts) + scalars
        # region.checked: its first call checked here, or by an earlier process (Note [A
        # region checked once is trusted by the next process], runtime/region_store.py)
        if not entry.region.checked:
            entry.region.checked = True
            if mode.options.verify_compiled:
                # Note [The optimizer step as one compiled unit]: the first call runs on
                # copies; torch's body runs on the real tensors this once, after_step compares
                if any(t.device.type != "cpu" for t in inputs):
                    # on an accelerator, host copies (Note [The first compiled call runs on
                    # copies], runtime/first_call.py): device memory stays at eager's
                    ok, copies = self._call_via_host(entry, service, inputs, rest, counters, cls)
                    called = None
                else:
                    # Note [The first compiled step is checked beside the program], [A step's first call copies...]
                    written, ok = written_inputs(entry.program.gm), True
                    with _disable_current_modes():  # real copies, not captured ones
                        copies = self._beside.clone(inputs, written)
                    read_only = [i for i in range(len(inputs)) if i not in written]
                    with _disable_current_modes(), torch._C.DisableTorchFunction():  # off the mode
                        called = self._beside.call(entry.region.fn, copies + rest, read_only,
                                                   (kernel_threads(inputs) or torch.get_num_threads()) == 1)
                if ok:
                    exact = is_debugging(mode.options.backend)
                    self._pending()[opt] = (opt.param_groups,
                                            (entry, service, inputs, copies, mode, exact, called))
                    _note(counters, cls, "eager: " + Why.VERIFYING)
                    return _WAITS  # eager's step, the one the check compares with
                return False
        if not self._call(entry, service, inputs + rest, counters, cls):
            return False
        self._pending()[opt] = (opt.param_groups, None)
        opt.param_groups = []
        with counters.lock:
            counters.optimizer_steps_compiled += 1
        _note(counters, cls, "compiled steps")
        return True

    # Note [State made while capturing is released at its step]
    # An optimizer whose first step ran while the mode captured holds handles in its state
    # (moments, momentum buffers): a known step must not hold them (Note [Releasing bound
    # handles]), so each of its steps was gathered, looked up and re-checked from scratch,
    # for as long as the mode did not park: AdamW over 100 tensors, its compiled step a
    # no-op, 1.94 ms of Python a step against ~0.14 ms for a known step. Its window has
    # just run (the flush above), so, once per optimizer, the mode's bound handles are
    # released here, as parking does: those nothing else holds become plain tensors in
    # place, and the next step's gather makes a known step.
    def _call(self, entry: _Entry, service: Any, args: list, counters: Any, cls: str) -> bool:
        try:
            with torch.no_grad(), _disable_current_modes(), torch._C.DisableTorchFunction():
                entry.region.fn(*args)
        except Exception as e:  # noqa: BLE001 - a failing artifact: eager-only
            service.fail(entry.region, f"{R.COMPILED_CALL_FAILED}: {type(e).__name__}: {e}")
            _note(counters, cls, f"eager: {Why.FAILED}: compiled call failed")
            return False
        return True


def _scalars(program: StepProgram, hyper: list, steps: list, mode: Any) -> list | None:
    """The program's lifted scalars as real tensors, made past the dispatch mode and
    without torch-function handling: ``torch.tensor`` of a list of floats checked each
    for an override (AdamW over 100 tensors: two 100-float lists; 69 -> 31 µs a step,
    and _disable_current_modes cost SGD's two scalars ~20 µs)."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        return program.scalars(hyper, steps)


def _here(a: Any, b: torch.Tensor) -> torch.Tensor:
    """``a``'s real tensor, on ``b``'s device (host copies are compared on the host)."""
    t = _unwrap(a)
    return on_host(t) if b.device != t.device else t


_set_versions = torch._C._autograd._unsafe_set_version_counter


def _pre_hook(opt: Any, args: tuple, kwargs: dict) -> None:
    stack = STEPS.thread_stack
    st = stack() if stack is not None else None
    if st:
        mode = st[-1][0]
        if mode._parked:
            if STEPS.parked_step(opt, mode, args, kwargs):
                return  # Note [A parked cheap step costs a clock] (optim_threshold.py)
        elif getattr(STEPS._tls, "parked", None) is not None:
            STEPS._tls.parked = None  # a fast-path step of ours raised: not this one
        try:
            STEPS.before_step(opt, mode, args, kwargs)
        except Exception:  # noqa: BLE001 - a failure inside the runtime: the step runs eagerly
            log.debug("adaptive_eager: the compiled optimizer step failed; eager", exc_info=True)
            STEPS.give_back(opt)
            STEPS.runs_eagerly(opt, st[-1][0])


def _post_hook(opt: Any, args: tuple, kwargs: dict) -> None:
    tls = STEPS._tls
    if getattr(tls, "parked", None) is opt:  # Note [A parked cheap step costs a clock]
        tls.parked = None
        STEPS._threshold.charge(opt)
        return
    stack = STEPS.thread_stack
    if (stack is None or not stack()) and not getattr(tls, "groups", None):
        return  # no runtime in this thread (its pre-hook did nothing) and no groups held
    STEPS.after_step(opt)


# Note [The step compiler registry]: one per process, like the safe points it is driven by.
STEPS = StepCompiler()

__all__ = ["StepCompiler", "STEPS", "CANDIDATES", "Why", "MAX_PROGRAMS"]
