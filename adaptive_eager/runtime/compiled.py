"""CompiledExecutor: hot regions compiled, cold ones eager, no compile stalls.

Per flush: storage groups and the window key are computed (cheap, linear); the plan
(partition, region signatures, lifted-scalar slots) is looked up by key and built only
on a miss. Each fused region is then run through its cache entry:

+------------+-------------------------------------------------------------------+
| entry      | what a flush does with the region                                 |
+============+===================================================================+
| cold       | replay eagerly; after ``compile_after`` sightings, submit compile |
| compiling  | replay eagerly (async); eager-only past the compile timeout       |
| compiled   | call the artifact directly (the signature is the guard); the first|
|            | call is checked (metadata, and values when ``verify_compiled``),  |
|            | the next few timed against eager (slower: demoted)                |
| eager_only | replay eagerly (failed, timed out, mismatched, demoted)           |
+------------+-------------------------------------------------------------------+

Example::

    >>> import torch
    >>> from adaptive_eager import config
    >>> from adaptive_eager.runtime.counters import Counters
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> aten = torch.ops.aten
    >>> x = torch.ones(1 << 16); s = TensorSpec.of(x)
    >>> w = Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), 2.0), (), (1,)),
    ...                     OpNode(aten.add.Tensor, (ValueRef(1), 1.0), (), (2,))),
    ...            {0: s, 1: s, 2: s}, frozenset({2}))
    >>> ex = CompiledExecutor(config.resolve(backend="eager", compile_after=1,
    ...                                      async_compile=False), Counters())
    >>> float(ex.run(w).values[2][0]), ex.counters.regions_compiled  # first call: checked vs eager
    (3.0, 1)
    >>> float(ex.run(w).values[2][0]), ex.counters.compiled_calls, ex.counters.ops_fused
    (3.0, 1, 2)
"""

from __future__ import annotations

import logging
import time
from math import copysign
from dataclasses import dataclass, field
from typing import Any, Mapping

import cachetools
import torch
from torch.autograd.profiler import _is_profiler_enabled  # noqa: F401 - cheap check, below

from .._logging import artifact_logger
from .windows import NOVEL, UNPAYING, WindowHistory, WindowLog, judge, route
from ..fusion.fxgraph import lower
from ..fusion.graph import storage_groups
from ..fusion.ir import Window
from ..fusion.liveness import release_after, replay_peak
from ..fusion.partition import Partition, Region, partition
from ..fusion.policy import DefaultCost, SupportPolicy
from ..fusion.scalars import lift_rule, lifted_dtype, scalar_dtype
from ..fusion.signature import miss_cause, outline, window_key
from .backends import backend_support, for_device, is_debugging, layout_decompositions
from .occupancy import device_clock, span_cost
from .cache import COMPILED, COMPILING, EAGER_ONLY, RegionCache, RegionEntry
from .checks import indices_in_range
from .first_call import CompiledCodeWroteInput, first_call, run_eager_timed
from .first_call import layout_why as _why
from .compiler import CompileService
from .region_store import open_store
from .counters import Counters
from .memory import window_budget
from .executor import Executor, FlushResult, Known, Sighting, Verdict, replay_guard, run_nodes
from .replay import EagerReplay
from ..reasons import COST_REASONS as _COST_REASONS
from ..reasons import R

_MISS_LOG = artifact_logger("ae_recompiles")
_TIMED_CALLS = 3  # compiled calls timed against eager before keeping a region


@dataclass(frozen=True)
class Step:
    """One region of a plan, the lifted-scalar slots it reads ((float index, dtype)) and
    where its written inputs sit among its arguments."""

    region: Region
    scalars: tuple[tuple[int, torch.dtype], ...] = ()
    mutated: tuple[int, ...] = ()  # positions in region.inputs of the inputs it writes
    # (position in region.inputs, ((lo, hi, allowed), ...)): Region.index_checks by input
    index_checks: tuple[tuple[int, tuple[tuple[int, int, int | None], ...]], ...] = ()
    # Its eager replay, generated at its second eager run (Note [Generated eager replay])
    replay: EagerReplay | None = field(default=None, compare=False)
    # Note [Replay frees at last use] (fusion/liveness.py): node index -> the ids dropped
    # after it, for the step's nodes; ``drop``: all of them, dropped once the step is done.
    release: Mapping[int, tuple[int, ...]] = field(default_factory=dict, compare=False)
    drop: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What a window key maps to: the steps, whether anything in it is fusible, and the
    most bytes its run holds at once with every step replayed eagerly (from the specs)."""

    steps: tuple[Step, ...]
    worth: bool
    peak_bytes: int = 0


_set_versions = torch._C._autograd._unsafe_set_version_counter


def _by_input(region: Region) -> tuple:
    """``region.index_checks`` grouped by the position of the input they check."""
    pos = {v: j for j, v in enumerate(region.inputs)}
    grouped: dict[int, list] = {}
    for vid, lo, hi, allowed in region.index_checks:
        grouped.setdefault(pos[vid], []).append((lo, hi, allowed))
    return tuple((j, tuple(r)) for j, r in grouped.items())


def _profiling() -> bool:
    return torch.autograd.profiler._is_profiler_enabled


# Note [The program's threads are its own]
# The runtime never changes the program's visible state, its intra-op thread count
# included. It used to lend one of the program's threads to the compile worker while a
# compile was in flight (``set_num_threads(n - 1)``): the program read 1 from
# ``torch.get_num_threads()`` after setting 2, and its eager kernels, run with another
# thread count, reduced in another order (fp32 losses 1e-7 off eager's with nothing
# compiled). The worker now competes for the cores as any process does. Measured with
# ``python -m benchmarks.threads_share`` (MLP step, 2 threads, 2 cores shared with other
# jobs, load average 2-5, so read ratios loosely): alone 168-322 ms; next to a busy
# process at nice 0 320-644 ms; with one thread fewer 195-213 ms; busy process at nice 10
# 194-344 ms, at the cost of 0.36-0.57x its progress. A lower-priority worker was not
# adopted: its compiles would take 2-3x longer, and at nice 10 it once starved outright
# (Note [Compile in a subprocess]); the slowdown while a compile runs is in the README.


class CompiledExecutor(Executor):
    """Executor (see ``runtime.executor``) that compiles hot regions of windows."""

    def __init__(self, options: Any, counters: Counters, support: SupportPolicy | None = None,
                 cost: Any = None, fuel: int | None = -1):
        self.options = options
        self.counters = counters
        self.support = support or backend_support(options.backend)
        self.cost = cost or DefaultCost(min_work=options.min_region_work)
        self.cache = RegionCache(options.cache_size, counters)
        self.compiler = CompileService(for_device(options.backend, options.device), counters,
                                       options.async_compile, options.compile_timeout_s, fuel,
                                       layout_decompositions(options.backend), open_store(options),
                                       pace=options.pace_compiles)
        self.demote = not is_debugging(options.backend)
        # Note [The first compiled call runs on copies] (first_call.py): larger first
        # calls are checked lean.
        self.check_bytes = window_budget(options) // 4
        # Note [One history per window key] (runtime/windows.py): plan, first sighting and
        # measured times of a window key live in one entry, evicted together.
        self.windows = WindowLog(max(256, 4 * options.cache_size))
        self._outlines: cachetools.LRUCache = cachetools.LRUCache(256)  # site -> outline (ae_recompiles)
        # Note [Fusion saves device time] (occupancy.py): a window's eager time is the
        # larger of its host time and its launches' device time, where the device says
        self._device_time = device_clock(torch.device(options.device).type)

    # -- the Executor contract ------------------------------------------------------
    def run(self, window: Window, known: Known | None = None) -> FlushResult:
        start = time.perf_counter_ns()  # Note [What the time breakdown measures] (reporting.py)
        result, eager_ns = self._run(window, known)
        self.counters.note_run(window.opened_ns, start, time.perf_counter_ns(), eager_ns)
        return result

    def _run(self, window: Window, known: Known | None) -> tuple[FlushResult, int | None]:
        """Run ``window``; also its measured eager time when compiled regions ran in it."""
        if known is None:
            groups = storage_groups(window)
            key, floats = window_key(window, groups)
        else:  # a matched trace's (Note [Keys hash once], fusion/signature.py)
            key, floats, groups = known.key, known.floats, known.groups
        history = self.windows.get(key)
        recurred = history is not None
        if recurred and history.key is not None:
            key = history.key  # the object the log holds: lookups with it compare by identity
        if history is None:
            history = self.windows.entry(key)
        rare = self.windows.sighted(history)  # Note [Rare windows wait] (runtime/windows.py)
        n_ops = len(window.nodes)
        how = route(history if recurred else None, n_ops, self.options, self.demote, rare)
        if how == UNPAYING:
            return self._run_unpaying(window, history, key, groups), None
        if how == NOVEL:
            if _MISS_LOG.isEnabledFor(logging.DEBUG):
                self._log_miss(window)  # a new window, not the second sighting of one
            return self._run_novel(window, history, key, recurred, groups), None
        first = history.plan is None
        if first:
            if not history.novel and _MISS_LOG.isEnabledFor(logging.DEBUG):
                self._log_miss(window)
            history.plan = self._plan(window, groups)
            if history.novel:
                # Credit the regions with the first sighting, which ran without a plan.
                history.novel = False
                for step in history.plan.steps:
                    if step.region.fused:
                        self.cache.entry(step.region.key).seen += 1
        plan = history.plan
        if not history.retimed and not first and self.demote and self.options.adaptive_passthrough \
                and self._all_compiled(plan):
            return self._retime(window, history, key, groups), None
        env = window.start_run()
        worth = False
        compiled_before = self.counters.compiled_calls
        d0 = self._device_ns()
        t0 = time.perf_counter_ns()
        pop = env.pop
        with replay_guard():
            for step in plan.steps:
                region = step.region
                if region.fused:
                    worth |= self._run_fused(window, step, env, floats)
                else:
                    self._run_eager(window, step, env, floats)
                for v in step.drop:
                    pop(v, None)
        t1 = time.perf_counter_ns()
        device_ns = self._device_ns() - d0
        self.counters.note_replay_bytes(plan.peak_bytes)
        if first and history.eager_ns is None:  # unplanned, all eager: its time is eager's
            history.eager_ns = span_cost(t1 - t0, device_ns)
        compiling = any(s.region.fused and self.cache.entry(s.region.key).state == COMPILING
                        for s in plan.steps)
        ran_compiled = self.counters.compiled_calls > compiled_before
        verdict = judge(history, n_ops, worth, ran_compiled, compiling, t1, window.opened_ns,
                        self.options.async_compile, t1 - t0, device_ns)
        return (FlushResult({vid: env[vid] for vid in window.outputs}, verdict,
                            Sighting(key, recurred, groups)),
                history.eager_ns if ran_compiled else None)

    def close(self) -> None:
        """Stop the compile service's thread (queued compiles are dropped)."""
        self.compiler.shutdown()

    def _log_miss(self, window: Window) -> None:
        """Note [Why a window missed the plan cache] (fusion/signature.py)."""
        now = outline(window)
        site = window.source or window.reason
        cause = miss_cause(self._outlines.get(site), now)
        self._outlines[site] = now
        _MISS_LOG.debug("window plan miss (%d ops, flushed by %s at %s): %s", len(window.nodes),
                        window.reason, window.source, cause)

    def _run_novel(self, window: Window, history: WindowHistory, key: Any,
                   recurred: bool, groups: Mapping[int, int]) -> FlushResult:
        """A first sighting: replayed eagerly and timed (Note [First sightings are not
        planned], runtime/windows.py)."""
        values, capture_ns, eager_ns = self._replay_timed(window)
        history.novel = True
        history.eager_ns, history.capture_ns = eager_ns, capture_ns
        ops = tuple(node.target for node in window.nodes)  # the window without its shapes
        specs = window.specs
        sizes = tuple(specs[v].numel for node in window.nodes for v in node.outputs if v is not None)
        reshaped, grew = self.windows.reshaped(ops, sizes)
        return FlushResult(values, Verdict(len(window.nodes), novel=True, reshaped=reshaped, grew=grew,
                                           eager_ns=eager_ns, capture_ns=capture_ns),
                           Sighting(key, recurred, groups))

    def _replay_timed(self, window: Window) -> tuple[dict[int, torch.Tensor], int | None, int]:
        """Run every node eagerly: (outputs, capture time or None, eager time), in ns;
        the eager time is ``span_cost`` of its host and device times."""
        order = range(len(window.nodes))
        release = release_after(window.nodes, order, window.outputs)
        env = window.start_run()
        d0 = self._device_ns()
        t0 = time.perf_counter_ns()
        with replay_guard():
            run_nodes(window, order, env, release)
        host_ns = time.perf_counter_ns() - t0
        self.counters.ops_eager += len(window.nodes)
        self.counters.eager_replay_ns += host_ns
        capture_ns = t0 - window.opened_ns if window.opened_ns else None
        return ({vid: env[vid] for vid in window.outputs}, capture_ns,
                span_cost(host_ns, self._device_ns() - d0))

    def _device_ns(self) -> int:
        """The device clock (occupancy.device_clock), 0 where there is none."""
        return self._device_time() if self._device_time is not None else 0

    # Note [A compiled window's eager time is measured again]
    # Whether a compiled window still pays (judge: its capture and run against its eager
    # time) rests on an eager time taken at its first sighting, cold (torch's per-op
    # state, the first allocations of its sizes) and often beside a compile: on the GPT
    # benchmark (2 threads on 2 cores, its AdamW and region compiles in flight) it read
    # 496 ms for a window whose step takes 175-186 ms eagerly, so the captured window,
    # 179 ms a run, was judged worth capturing for the rest of the run, and the report
    # claimed 6.0 s saved against eager where the steps were no faster (188 ms against
    # 174-186). So once every region of its plan is compiled and no compile is in flight,
    # the next sighting is replayed eagerly and timed, once, and the lesser of the two
    # eager times stands (a busy machine only inflates a time). It costs one eager run of
    # the window (what eager would spend; one compiled run's saving). Only where the
    # verdict can change what happens: not for debugging backends (never demoted) nor
    # under forced capture (adaptive_passthrough off).
    def _all_compiled(self, plan: Plan) -> bool:
        """Whether every fused region of ``plan`` is compiled now, with no compile in
        flight anywhere (a retime would measure the worker too)."""
        if self.counters.compiles_in_flight:
            return False
        fused = [s.region for s in plan.steps if s.region.fused]
        return bool(fused) and all(self.cache.entry(r.key).state == COMPILED for r in fused)

    def _retime(self, window: Window, history: WindowHistory, key: Any,
                groups: Mapping[int, int]) -> FlushResult:
        """Note [A compiled window's eager time is measured again]."""
        values, _capture_ns, ran_ns = self._replay_timed(window)
        history.retimed = True
        history.timed(ran_ns, None)  # the lesser eager time stands
        return FlushResult(values, Verdict(len(window.nodes), worth=True), Sighting(key, True, groups))

    def _run_unpaying(self, window: Window, history: WindowHistory, key: Any,
                      groups: Mapping[int, int]) -> FlushResult:
        """A window whose capture cannot pay (Note [Windows that cannot pay for their
        capture are not compiled], runtime/windows.py): replayed and timed again (the first
        sighting's capture ran metadata kernels cold), never planned."""
        values, capture_ns, ran_ns = self._replay_timed(window)
        history.timed(ran_ns, capture_ns if history.capture_ns is not None else None)
        return FlushResult(values, Verdict(len(window.nodes), eager_ns=ran_ns, capture_ns=capture_ns),
                           Sighting(key, True, groups))

    # -- planning -------------------------------------------------------------------
    def _plan(self, window: Window, groups: Mapping[int, int]) -> Plan:
        part: Partition = partition(window, groups, self.support, self.cost)
        index = {}  # node index -> lifted float index
        for i, node in enumerate(window.nodes):
            rule = lift_rule(node, window.specs) if node.args else None
            if rule is not None:
                index[i] = len(index)
        order = [i for region in part.steps for i in region.nodes]
        release = release_after(window.nodes, order, window.outputs)
        steps = []
        for region in part.steps:
            slots = tuple((index[i], scalar_dtype(lifted_dtype(window.nodes[i], window.specs)))
                          for i in region.nodes if i in index) if region.fused else ()
            mutated = tuple(j for j, v in enumerate(region.inputs) if v in region.mutated)
            lifted = {i: (index[i], lift_rule(window.nodes[i], window.specs).where)
                      for i in region.nodes if i in index}
            mine = {i: release[i] for i in region.nodes if i in release}
            # an offset view's integers are not in the key (Note [View offsets are
            # inputs]): run from this window's node, never from generated code
            replay = None if region.reason == R.OFFSET_VIEW else \
                EagerReplay(region.nodes, region.outputs, lifted, mine)
            steps.append(Step(region, slots, mutated, _by_input(region), replay, mine,
                              tuple(v for vs in mine.values() for v in vs)))
        return Plan(tuple(steps), any(r.fused for r in part.steps),
                    replay_peak(window, order))

    # -- running --------------------------------------------------------------------
    def _run_eager(self, window: Window, step: Step, env: dict, floats: list) -> None:
        region = step.region
        t0 = time.perf_counter_ns()
        if _profiling():
            with torch.profiler.record_function("adaptive_eager.eager_replay"):
                run_nodes(window, region.nodes, env, step.release)
        elif step.replay is None or not step.replay.run(window, env, floats):
            run_nodes(window, region.nodes, env, step.release)
        self.counters.eager_replay_ns += time.perf_counter_ns() - t0
        self.counters.ops_eager += len(region.nodes)
        if not region.fused and region.reason not in _COST_REASONS:
            for i in region.nodes:
                node = window.nodes[i]
                self.counters.note_fallback(node.name, region.reason, target=node.target)

    def _run_fused(self, window: Window, step: Step, env: dict, floats: list) -> bool:
        """Run one fused region; True while it is (or may become) compiled."""
        region = step.region
        entry = self.cache.entry(region.key)
        if entry.state == COMPILED and entry.fn is not None:
            self.counters.cache_hits += 1
            self._call_compiled(window, step, entry, env, floats)
            window.progress.done.extend(region.nodes)
            return True
        if entry.state == EAGER_ONLY:
            self._run_eager(window, step, env, floats)
            return False
        self.counters.cache_misses += 1
        if entry.state == COMPILING:
            self.compiler.check_timeout(entry)
        else:
            entry.seen += 1
            # Note [Regions compiled by an earlier process] (runtime/compiler.py)
            started = self.compiler.from_disk(entry)
            if not started and entry.seen >= self.options.compile_after and self.compiler.take_fuel():
                self.compiler.submit(entry, lambda: self._lower(window, region, entry))
                started = True
            if started and entry.state == COMPILED:  # a synchronous compile or load
                self._call_compiled(window, step, entry, env, floats)
                window.progress.done.extend(region.nodes)
                return True
        t0 = time.perf_counter_ns()
        self._run_eager(window, step, env, floats)
        if len(entry.eager_ns) < _TIMED_CALLS:
            entry.eager_ns.append(time.perf_counter_ns() - t0)
        return entry.state != EAGER_ONLY

    def _lower(self, window: Window, region: Region, entry: RegionEntry | None = None
               ) -> tuple[Any, list]:
        lowered = lower(window, region)
        if entry is not None:
            entry.compiled_for = lowered.input_specs
        # A backend that compiles on CPU views (the emulated device) takes CPU examples:
        # no device memory for them (Note [Compiling for the emulated neuron device]).
        return lowered.module, lowered.example_inputs(
            getattr(self.compiler.compile_fn, "examples_device", None))

    def _scalars(self, step: Step, entry: RegionEntry, floats: list) -> list[torch.Tensor]:
        out = []
        cache = entry.scalars
        for slot, (fi, dtype) in enumerate(step.scalars):
            v = floats[fi]
            hit = cache.get(slot)
            # -0.0 == 0.0, but not as a factor (Note [Floats in keys are compared by
            # bits]); NaN != NaN, so a NaN is made afresh, payload and all.
            if hit is None or hit[0] != v or (v == 0.0 and copysign(1.0, v) != copysign(1.0, hit[0])):
                hit = cache[slot] = (v, torch.tensor(v, dtype=dtype))
            out.append(hit[1])
        return out

    def _call_compiled(self, window: Window, step: Step, entry: RegionEntry, env: dict,
                       floats: list) -> None:
        region = step.region
        args = [env[v] for v in region.inputs]
        if step.scalars:
            args.extend(self._scalars(step, entry, floats))
        if step.index_checks and not indices_in_range(args, step.index_checks):
            # Note [Compiled code never sees an index eager would reject]: eager raises
            # its own error (or computes, where a range is stricter than eager's).
            self._run_eager(window, step, env, floats)
            return
        if not entry.checked:
            self._first_call(window, step, entry, env, args, floats)
            return
        if self.demote and not entry.eager_ns and len(entry.compiled_ns) >= _TIMED_CALLS:
            self._time_eager_once(window, step, entry, env, floats)
            return
        written = [args[j] for j in step.mutated if not args[j].is_inference()]
        versions = [t._version for t in written]
        timed = len(entry.compiled_ns) < _TIMED_CALLS and self.demote
        try:
            t0 = time.perf_counter_ns()
            if _profiling():
                with torch.profiler.record_function("adaptive_eager.compiled_region"):
                    outs = entry.fn(*args)
            else:
                outs = entry.fn(*args)
            ran_ns = time.perf_counter_ns() - t0
        except Exception as e:  # noqa: BLE001 - a checked artifact that fails later
            reason = f"{R.COMPILED_CALL_FAILED}: {type(e).__name__}: {e}{_why(window, region, entry, args, e)}"
            if region.mutated:
                # Its in-place updates may be partly done: replaying them would apply
                # them twice, so the program sees the error (Note [The first compiled
                # call runs on copies] covers the first call only).
                self.compiler.fail(entry, reason, stays_correct=False)
                raise
            self.compiler.fail(entry, reason)
            self._run_eager(window, step, env, floats)
            return
        if written:
            # Note [Version counters of written inputs]
            # Each in-place op bumped its tensor's version when it was recorded (autograd's
            # ADInplaceOrView runs before our mode), as eager does, and a write through
            # ``p.data`` bumped none of p's. Functionalizing backends (aot_eager, Inductor)
            # write mutated inputs back with a copy into the input itself, which bumps it
            # again (a hand-written SGD step moved ``weight._version`` 1 -> 3 in 3 steps);
            # the counts are put back to what eager shows.
            _set_versions(tuple(written), tuple(versions))
        self.counters.compiled_region_ns += ran_ns
        self._bind(region, env, outs)
        if timed:
            entry.compiled_ns.append(ran_ns)
            self._maybe_demote(entry)

    def _bind(self, region: Region, env: dict, outs: Any) -> None:
        seen: set[int] = set()
        for vid, t in zip(region.outputs, outs):
            if id(t) in seen:
                # Note [Each output its own tensor]
                # Inductor returns one object for an output and an alias of it (a detach);
                # eager made two tensors sharing memory, and a later window that reads both
                # is keyed by its inputs, one or two: it was a new window from the first
                # compiled step on (HF Llama's and T5's backward windows; 8 steps under
                # Inductor: Llama 44% -> 56% fused, T5 43% -> 55%).
                t = _alias(t)
            seen.add(id(t))
            env[vid] = t
        self.counters.compiled_calls += 1
        self.counters.ops_fused += len(region.nodes)

    def _first_call(self, window: Window, step: Step, entry: RegionEntry, env: dict,
                    args: list, floats: list) -> bool:
        """Check the artifact once (Note [The first compiled call runs on copies],
        runtime/first_call.py): True when its results were bound, False when the region
        ran eagerly this time."""
        return first_call(self, window, step, entry, env, args, floats)

    def _explain_layout(self, window: Window, region: Region) -> str:
        """`` [layout: ...]``: the op whose layout the compiler changed (Note [Which op's
        layout disagreed], layouts.py), else ``""``."""
        lowered = lower(window, region)
        found = self.compiler.explain_layout(lowered.module, lowered.example_inputs())
        return f" [layout: {found.describe()}]" if found is not None else ""

    # Note [A region never run eagerly is timed eagerly once]
    # A region is demoted when its timed compiled calls are no faster than its eager runs
    # (_maybe_demote), which come from its sightings while it compiled and from its first
    # call's check. A region an earlier process compiled and checked has neither: loaded
    # from disk at its first sighting and trusted (Note [A region checked once is trusted
    # by the next process]), it was never run eagerly, so it was never demoted, however
    # slow. The GPT train step on this 2-core CPU (``python -m benchmarks.train_interleave
    # --workload gpt-train``): a process that loaded its forward-backward region unchecked
    # ran it eagerly in its first call's check, found it slower and demoted it (adaptive
    # 1.11x eager, torch.compile 1.08x, same run); the next process loaded it checked, so
    # trusted, and kept it (adaptive 0.88x, torch.compile 0.96x).
    # So after its timed compiled calls, such a region runs eagerly once, timed, and is
    # judged as any other: one eager run of it, what eager would have spent.
    def _time_eager_once(self, window: Window, step: Step, entry: RegionEntry, env: dict,
                         floats: list) -> None:
        """Note [A region never run eagerly is timed eagerly once]."""
        run_eager_timed(self, window, step, entry, env, floats)
        self._maybe_demote(entry)

    def _maybe_demote(self, entry: RegionEntry) -> None:
        if len(entry.compiled_ns) < _TIMED_CALLS or not entry.eager_ns:
            return
        if min(entry.compiled_ns) >= min(entry.eager_ns):
            self.compiler.fail(entry, f"{R.DEMOTED}: compiled not faster than eager", "demotions")


_alias = torch.ops.aten.alias.default


__all__ = ["CompiledExecutor", "CompiledCodeWroteInput", "Plan", "Step"]
