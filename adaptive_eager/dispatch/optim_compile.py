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
    >>> with ae.adaptive_eager(backend="eager", async_compile=False):
    ...     for _ in range(5):   # state creation, trace and compile, first call checked
    ...         p.grad = torch.ones(8); opt.step()
    >>> ae.stats().optimizer_steps_compiled
    2
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import cachetools
import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..runtime.backends import is_debugging
from ..runtime.cache import COLD, COMPILED, COMPILING, EAGER_ONLY, RegionEntry
from ..runtime.checks import clone_strided, close
from ..runtime.compile_worker import THREADS_META
from ..runtime.first_call import CompiledCodeWroteInput, on_host
from ..runtime.optim_fast import KnownStep
from ..runtime.optim_graph import (NotTraceable, lerp_for_compiler, StateNotReady, StepProgram, gather, step_values,
                                   trace_step)
from ..reasons import R
from .lazy import LazyTensor
from .optim import FOREACH_EQUAL
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
MAX_PROGRAMS = 4        # traces per signature (guards that fail: another branch of torch's code)
MAX_SIGNATURES = 64     # signatures kept per session (LRU)
CANDIDATES = FOREACH_EQUAL
_PLAIN = (torch.Tensor, torch.nn.Parameter, LazyTensor)


class Why:
    """Why a step ran eagerly (the report's words)."""

    CLOSURE = "a closure (LBFGS-style step)"
    SUBCLASS = "a subclass of a torch.optim class (it may override step)"
    CLASS = "class not supported"
    OPTION = "group option"            # + the option: fused, differentiable, capturable, foreach=False
    STATE = "state creation (first step)"
    CHEAP = "cheaper so far than a compile (optimizer_step_after_ms)"
    COMPILING = "compile not ready"
    MODES = "another dispatch mode is active"
    TOO_MANY = f"more than {MAX_PROGRAMS} traces of one signature"
    STEPS = "step counters not exact integers"
    VERIFYING = "checking the first compiled call against eager"
    FAILED = "eager-only"               # + the entry's reason


class _Entry:
    """One trace of a signature: its program and the compile service's entry."""

    __slots__ = ("program", "region", "reason", "checked", "cls", "build")

    def __init__(self, cls: str, program: StepProgram | None, region: RegionEntry | None,
                 reason: str = ""):
        self.cls = cls
        self.program = program
        self.region = region
        self.reason = reason
        self.checked = False
        # (example inputs, kernel threads, exact) while a disk load may still need a compile
        self.build: tuple | None = None


def _unwrap(t: torch.Tensor) -> torch.Tensor | None:
    return t._ae_real if type(t) is LazyTensor else t


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
def _example(t: torch.Tensor, dropped: bool, device: Any) -> torch.Tensor:
    """A compile example for step input ``t`` (``dropped``: the program may drop it)."""
    if type(t) is not LazyTensor and not dropped:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device or t.device)


class StepCompiler:
    """The process's compiled optimizer steps: per compile service (one per session), a
    bounded map from signature to traces; per thread, the groups handed back after a
    step and the first compiled call being checked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread_stack: Any = None  # the safe points' (see attach)
        self._by_service: "weakref.WeakKeyDictionary[Any, cachetools.LRUCache]" = weakref.WeakKeyDictionary()
        self._hooked: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        # optimizer -> (KnownStep, its entry, the compile service it belongs to)
        self._known: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        self._tls = threading.local()
        # Note [A step compiles once it has cost enough]: optimizer -> its eager steps' ns
        self._spent: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._started: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()

    # -- hooks ----------------------------------------------------------------------------
    def attach(self, opt: Any, thread_stack: Any) -> None:
        """Make sure ``opt`` has our instance hooks, ours the last pre-hook and the first
        post-hook (called from the global step pre-hook, before the instance hooks run);
        ``thread_stack``: the safe points' (dispatch/parking.py), which the pre-hook asks
        for the thread's mode (passed in: parking imports this module)."""
        if type(opt) not in CANDIDATES:
            return
        self.thread_stack = thread_stack
        handles = self._hooked.get(opt)
        if handles is None:
            handles = (opt.register_step_pre_hook(_pre_hook), opt.register_step_post_hook(_post_hook))
            self._hooked[opt] = handles
        pre, post = opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks
        if handles[0].id in pre and next(reversed(pre)) != handles[0].id:
            pre.move_to_end(handles[0].id)
        if handles[1].id in post and next(iter(post)) != handles[1].id:
            post.move_to_end(handles[1].id, last=False)

    def _pending(self) -> "weakref.WeakKeyDictionary":
        d = getattr(self._tls, "groups", None)
        if d is None:
            d = self._tls.groups = weakref.WeakKeyDictionary()
        return d

    def give_back(self, opt: Any = None) -> None:
        """Give ``opt`` (None: every optimizer of this thread) its param groups back."""
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
    def before_step(self, opt: Any, mode: Any, args: tuple, kwargs: dict) -> None:
        """Our (last) step pre-hook: run the step compiled when it can, else leave it to
        torch's body (eager)."""
        if not mode.options.optimizer_step:
            return
        cls = type(opt).__name__
        why = self._why_not(opt, args, kwargs)
        counters = mode.counters
        if why is not None:
            _note(counters, cls, "eager: " + why)
            return
        service = mode.executor.compiler
        known = self._known.get(opt)
        got = known[0].check(opt) if known is not None and known[2] is service else None
        entry = scalars = steps = None
        if got is not None:  # Note [A known step is re-checked, not re-gathered]
            entry = known[1]
            if entry.program is not None:
                steps = known[0].step_values(entry.program.reads, got.inputs)
                scalars = _scalars(entry.program, got.hyper, steps, mode) if steps is not None else None
            if scalars is None:
                entry = None
        if entry is None and known is None and self._cheap(opt, mode):
            _note(counters, cls, "eager: " + Why.CHEAP)
            return
        if entry is None:
            got = gather(opt, _PLAIN)
            if isinstance(got, str):
                _note(counters, cls, "eager: " + got)
                return
            entry, steps, scalars = self._lookup(opt, got, service, counters, cls, mode.options.backend)
            if entry is None:
                return
            known = (KnownStep(opt, got), entry, service)
            self._known[opt] = known
        region = entry.region
        if entry.build is not None and region.state != COMPILING:
            if region.state == COLD:  # a disk load that did not load: compile it
                self._submit(entry, service, counters)
            entry.build = None  # the example inputs are the program's tensors: let go
        if region.state == COMPILING:
            service.check_timeout(region)
        if region.state != COMPILED or region.fn is None:
            reason = Why.COMPILING if region.state == COMPILING else f"{Why.FAILED}: {region.reason}"
            _note(counters, cls, "eager: " + reason)
            return
        if self._run(opt, mode, entry, got, scalars, service, counters, cls):
            known[0].stepped(entry.program.reads, entry.program.deltas, steps, got.inputs)

    # Note [A step compiles once it has cost enough]
    # Compiling a step has a price the program pays whether or not the compile ever lands:
    # the trace on the program's thread (~17 ms a signature, Adam over 4 tensors), the
    # first compiled call checked against eager, and Inductor loaded into the process on a
    # service thread (~1 s of CPU, holding the GIL against the program: right after a
    # session, a 60-step GAN ran its eager steps at 119-210 ms against 42 ms for the ~5 s
    # it took). A short program, or one whose step is cheap, never earns that back: the
    # patterns benchmark measured gan 1.83x eager CPU with compiled steps against 1.18x
    # without, nanogpt_train 1.26x against 1.03x, loss_print 1.6x against 1.07x (none of
    # them got a compiled step in before it ended). So, as in ski rental, an optimizer's
    # steps run eagerly (timed on the program's thread, pre-hook to post-hook) until they
    # have cost ``optimizer_step_after_ms`` (100 ms by default, about what compiling costs
    # the program), and only then is its step traced: a step that never costs that much
    # never pays for a compile; one that does (the demo's AdamW: ~60 ms a step, so from
    # its third step; AdamW over 120 tensors: ~6 ms, from its ~17th) pays at most twice.
    def _cheap(self, opt: Any, mode: Any) -> bool:
        """Whether ``opt``'s steps have cost less than the compile threshold so far (this
        step is then timed, to the post-hook)."""
        after_ns = mode.options.optimizer_step_after_ms * 1e6
        spent = self._spent.get(opt, 0)
        if spent >= after_ns:
            return False
        self._started[opt] = time.thread_time_ns()
        return True

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
            self._trace(opt, got, service, table, counters, cls, backend)
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

    def _call_on_copies(self, entry: Any, service: Any, inputs: list, grads: frozenset, rest: list,
                        counters: Any, cls: Any) -> list | None:
        """The first compiled call on the CPU, on copies of what the step writes; the list
        it was called on (grads: the program's own), or None when the call failed.

        Note [A step's first call copies what it writes]: the traced step never writes a
        grad (Note [Grads stay the program's], runtime/optim_graph.py), so grads are handed
        as they are and hashed before and after, as a large region's lean check does
        (runtime/first_call.py): AdamW's copies are 3 parameter-sized lists, not 4 (the
        step alone over the GPT's 49.6 MiB of parameters, ``python -m benchmarks.memory
        --workloads adamw-step --modes sync``: process peak 772 -> 723 MiB, 613 unchecked).
        A grad the compiled code wrote cannot be put back: the step goes eager-only and
        CompiledCodeWroteInput is raised at the program's ``step()``.
        """
        # hashes kept as tensors and compared with torch.equal: an int() of one is a read
        # the parked runtime would count as the program's (checks.bits_hash is that int)
        with torch.no_grad(), _disable_current_modes():  # real copies, not captured ones
            hashes = {j: torch.hash_tensor(inputs[j]) for j in grads if inputs[j].numel()}  # float, dense
            call = [t if j in hashes else clone_strided(t) for j, t in enumerate(inputs)]
        if not self._call(entry, service, call + rest, counters, cls):
            return None
        with torch.no_grad(), _disable_current_modes():
            changed = [j for j, h in hashes.items() if not torch.equal(torch.hash_tensor(inputs[j]), h)]
        if changed:
            reason = f"{R.COMPILED_OUTPUTS_DIFFER}: the compiled optimizer step wrote grads ({changed})"
            service.fail(entry.region, reason, stays_correct=False)
            _note(counters, cls, f"eager: {Why.FAILED}: compiled step wrote its grads")
            raise CompiledCodeWroteInput(reason)
        return call

    def after_step(self, opt: Any) -> None:
        """Our (first) step post-hook: the groups back; a first compiled call checked."""
        t0 = self._started.pop(opt, None)
        if t0 is not None:  # Note [A step compiles once it has cost enough]
            self._spent[opt] = self._spent.get(opt, 0) + time.thread_time_ns() - t0
        held = self._pending().pop(opt, None)
        if held is None:
            return
        groups, check = held
        opt.param_groups = groups
        if check is not None:
            entry, service, inputs, copies, mode, exact = check
            counters = mode.counters
            if not mode._parked and len(mode.recorder):  # eager's step, captured: run it
                mode.flush(R.OPTIMIZER_STEP, user_source())
            with torch.no_grad(), _disable_current_modes():
                bad = next((i for i, (a, b) in enumerate(zip(inputs, copies))
                            if not (torch.equal(_here(a, b), b) if exact else close(_here(a, b), b))),
                           None)
            if bad is not None:
                service.fail(entry.region, f"{R.COMPILED_OUTPUTS_DIFFER}: optimizer step input {bad}")
                _note(counters, entry.cls, f"eager: {Why.FAILED}: compiled step differs from eager")

    def _why_not(self, opt: Any, args: tuple, kwargs: dict) -> str | None:
        if len(args) > 1 or kwargs.get("closure") is not None:
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

    def _trace(self, opt: Any, got: Any, service: Any, table: Any, counters: Any, cls: str,
               backend: Any) -> None:
        """Trace a new signature (or another branch of one) and queue its compile; this
        step runs eagerly."""
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
        if region.state == COLD:  # nothing saved, or an entry that did not load
            self._submit(entry, service, counters)
        _note(counters, cls, "eager: " + (Why.COMPILING if region.state == COMPILING else
                                            f"{Why.FAILED}: {region.reason}" if region.state == EAGER_ONLY
                                            else "traced"))

    def _submit(self, entry: _Entry, service: Any, counters: Any) -> None:
        """Queue ``entry``'s compile (the build its trace left)."""
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
            return gm, example

        service.submit(region, build)

    def _run(self, opt: Any, mode: Any, entry: _Entry, got: Any, scalars: list, service: Any,
             counters: Any, cls: str) -> bool:
        depth = torch._C._len_torch_dispatch_stack()
        if depth > (0 if mode._parked else 1):
            _note(counters, cls, "eager: " + Why.MODES)
            return False
        if not mode._parked and len(mode.recorder):
            mode.flush(R.OPTIMIZER_STEP, user_source())
        # handles (a grad made by a captured backward, bound by now, possibly kept while
        # parked): their real tensors
        lazy = LazyTensor
        inputs = [t._ae_real if type(t) is lazy else t for t in got.inputs]
        if any(t is None for t in inputs):
            _note(counters, cls, "eager: unbound handle")
            return False
        rest = list(entry.program.consts) + scalars
        if not entry.checked:
            entry.checked = True
            if mode.options.verify_compiled:
                # Note [The optimizer step as one compiled unit]: the first call runs on
                # copies; torch's body runs on the real tensors this once, after_step compares
                if any(t.device.type != "cpu" for t in inputs):
                    # on an accelerator, host copies (Note [The first compiled call runs on
                    # copies], runtime/first_call.py): device memory stays at eager's
                    ok, copies = self._call_via_host(entry, service, inputs, rest, counters, cls)
                else:
                    copies = self._call_on_copies(entry, service, inputs, got.grads, rest, counters, cls)
                    ok = copies is not None
                if ok:
                    exact = is_debugging(mode.options.backend)
                    self._pending()[opt] = (opt.param_groups, (entry, service, inputs, copies, mode, exact))
                    _note(counters, cls, "eager: " + Why.VERIFYING)
                return False
        if not self._call(entry, service, inputs + rest, counters, cls):
            return False
        self._pending()[opt] = (opt.param_groups, None)
        opt.param_groups = []
        with counters.lock:
            counters.optimizer_steps_compiled += 1
        _note(counters, cls, "compiled steps")
        return True

    def _call(self, entry: _Entry, service: Any, args: list, counters: Any, cls: str) -> bool:
        try:
            with torch.no_grad(), _disable_current_modes(), torch._C.DisableTorchFunction():
                entry.region.fn(*args)
        except Exception as e:  # noqa: BLE001 - a failing artifact: eager-only
            service.fail(entry.region, f"{R.COMPILED_CALL_FAILED}: {type(e).__name__}: {e}")
            _note(counters, cls, f"eager: {Why.FAILED}: compiled call failed")
            return False
        return True


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


def _scalars(program: StepProgram, hyper: list, steps: list, mode: Any) -> list | None:
    """The program's lifted scalars as real tensors (made off the mode stack)."""
    if mode is not None and mode._parked:
        return program.scalars(hyper, steps)
    with _disable_current_modes():
        return program.scalars(hyper, steps)


def _here(a: Any, b: torch.Tensor) -> torch.Tensor:
    """``a``'s real tensor, on ``b``'s device (host copies are compared on the host)."""
    t = _unwrap(a)
    return on_host(t) if b.device != t.device else t


_set_versions = torch._C._autograd._unsafe_set_version_counter


def _note(counters: Any, cls: str, what: str) -> None:
    with counters.lock:
        counters.optimizer_step_kinds[f"{cls}|{what}"] += 1


def _pre_hook(opt: Any, args: tuple, kwargs: dict) -> None:
    stack = STEPS.thread_stack
    st = stack() if stack is not None else None
    if st:
        try:
            STEPS.before_step(opt, st[-1][0], args, kwargs)
        except Exception:  # noqa: BLE001 - a failure inside the runtime: the step runs eagerly
            log.debug("adaptive_eager: the compiled optimizer step failed; eager", exc_info=True)
            STEPS.give_back(opt)


def _post_hook(opt: Any, args: tuple, kwargs: dict) -> None:
    STEPS.after_step(opt)


# Note [The step compiler registry]: one per process, like the safe points it is driven by.
STEPS = StepCompiler()

__all__ = ["StepCompiler", "STEPS", "CANDIDATES", "Why", "MAX_PROGRAMS"]
