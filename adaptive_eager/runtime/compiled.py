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
    >>> float(ex.run(w)[2][0]), ex.counters.regions_compiled  # first call: checked vs eager
    (3.0, 1)
    >>> float(ex.run(w)[2][0]), ex.counters.compiled_calls, ex.counters.ops_fused
    (3.0, 1, 2)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

import cachetools
import torch
from torch.autograd.profiler import _is_profiler_enabled  # noqa: F401 - cheap check, below

from ..fusion.fxgraph import lower
from ..fusion.graph import storage_groups
from ..fusion.ir import Window
from ..fusion.partition import Partition, Region, partition
from ..fusion.policy import DefaultCost, SupportPolicy
from ..fusion.scalars import lift_rule, scalar_dtype
from ..fusion.signature import window_key
from .backends import backend_support, for_device, get_backend, is_debugging
from .cache import COLD, COMPILED, COMPILING, EAGER_ONLY, RegionCache, RegionEntry
from .checks import clone_strided, outputs_match
from .compiler import CompileService
from .counters import Counters
from .executor import replay_guard, run_nodes
from .passthrough import DeferPolicy, pays_for_capture

_TIMED_CALLS = 3  # compiled calls timed against eager before keeping a region
_COST_REASONS = frozenset({"too_small", "not_worth_it", "nothing_to_fuse"})  # not fallbacks


@dataclass(frozen=True)
class Step:
    """One region of a plan and the lifted-scalar slots it reads: (float index, dtype)."""

    region: Region
    scalars: tuple[tuple[int, torch.dtype], ...] = ()


@dataclass(frozen=True)
class Plan:
    """What a window key maps to: the steps and whether anything in it is fusible."""

    steps: tuple[Step, ...]
    worth: bool


def _profiling() -> bool:
    return torch.autograd.profiler._is_profiler_enabled


# Note [Sharing the cores with the compile worker]
# While the worker process compiles, the program's intra-op threads and the worker
# oversubscribe the cores when torch already uses all of them: measured on this 2-core
# machine, a GPT training step (2 threads) took 268 ms alone and 869 ms next to one
# CPU-bound process (``python -c "while True: pass"``), but 526 ms with 1 thread. So
# while the program waits for a compile (Note [Waiting for compiles runs eagerly]) the thread
# that waits uses one intra-op thread fewer, and gets its count back when the wait
# ends or its block exits, unless the program changed it meanwhile.
class ThreadShare:
    """Lower ``torch.get_num_threads()`` by one while compiles run in the worker."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._saved: tuple[int, int] | None = None  # (the program's count, ours)

    def waiting(self, started: bool) -> None:
        if not self.enabled:
            return
        if started:
            if self._saved is not None:
                return
            n = torch.get_num_threads()
            try:
                cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cores = os.cpu_count() or 1
            if n >= cores and n > 1:
                torch.set_num_threads(n - 1)
                self._saved = (n, n - 1)
        else:
            self.restore()

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None and torch.get_num_threads() == saved[1]:
            torch.set_num_threads(saved[0])


class CompiledExecutor:
    """Executor (see ``runtime.executor``) that compiles hot regions of windows."""

    def __init__(self, options: Any, counters: Counters, support: SupportPolicy | None = None,
                 cost: Any = None, fuel: int | None = -1):
        self.options = options
        self.counters = counters
        self.support = support or backend_support(options.backend)
        self.cost = cost or DefaultCost(min_work=options.min_region_work)
        self.cache = RegionCache(options.cache_size, counters)
        self.plans: cachetools.LRUCache = cachetools.LRUCache(max(64, options.cache_size))
        self.compiler = CompileService(for_device(get_backend(options.backend), options.device), counters,
                                       options.async_compile, options.compile_timeout_s, fuel)
        self.demote = not is_debugging(options.backend)
        self.threads = ThreadShare(options.backend == "inductor")
        self.defer = DeferPolicy(options.adaptive_passthrough, warmup=options.warmup,
                                 in_flight=lambda: counters.compiles_in_flight,
                                 on_wait=self.threads.waiting)
        self.should_defer = self.defer.should_defer  # hot: asked on every torch call
        self._eager_ns: cachetools.LRUCache = cachetools.LRUCache(max(64, options.cache_size))
        self._novel: cachetools.LRUCache = cachetools.LRUCache(max(256, 4 * options.cache_size))
        self._capture_ns: cachetools.LRUCache = cachetools.LRUCache(max(64, options.cache_size))
        self._novel_ops: cachetools.LRUCache = cachetools.LRUCache(256)

    # -- the Executor contract ------------------------------------------------------
    def run(self, window: Window) -> Mapping[int, torch.Tensor]:
        groups = storage_groups(window)
        key, floats = window_key(window, groups)
        eager_ns = self._eager_ns.get(key)
        if eager_ns is not None and self.demote and self.defer.enabled and \
                not self._pays(key, eager_ns, len(window.nodes)):
            return self._run_unpaying(window, key, eager_ns)
        plan = self.plans.get(key)
        first = plan is None
        if first:
            if self.options.compile_after > 1 and key not in self._novel:
                return self._run_novel(window, key)
            plan = self.plans[key] = self._plan(window, groups)
            if self._novel.pop(key, None) is not None:
                # Credit the regions with the first sighting, which ran without a plan.
                for step in plan.steps:
                    if step.region.fused:
                        self.cache.entry(step.region.key).seen += 1
        env = window.progress.start(window.inputs)
        worth = False
        compiled_before = self.counters.compiled_calls
        t0 = time.perf_counter_ns()
        with replay_guard():
            for step in plan.steps:
                region = step.region
                if region.fused:
                    worth |= self._run_fused(window, step, env, floats)
                else:
                    self._run_eager(window, region, env)
        t1 = time.perf_counter_ns()
        if first and key not in self._eager_ns:  # unplanned, all eager: its time is eager's
            self._eager_ns[key] = t1 - t0
        eager_ns = self._eager_ns.get(key)
        worth = worth and (eager_ns is None or pays_for_capture(eager_ns, len(window.nodes)))
        ran_compiled = self.counters.compiled_calls > compiled_before
        if worth and not ran_compiled and self.options.async_compile and any(
                s.region.fused and self.cache.entry(s.region.key).state == COMPILING
                for s in plan.steps):
            # Note [Waiting for compiles runs eagerly]
            # Its regions are compiling (in the worker process): capturing now would only
            # add per-op cost until they are ready, so ops pass straight through until
            # no compile is in flight, then the window is captured and judged again.
            self.defer.note_window(len(window.nodes), True, pending=True)
            return {vid: env[vid] for vid in window.outputs}
        if worth and ran_compiled and eager_ns is not None and window.opened_ns:
            # Measured, not estimated: once its regions run compiled, capturing this
            # window (from its first op to the flush) plus running it must beat eager
            # (Note [Capture must cost less than the work]).
            worth = (t1 - window.opened_ns) < eager_ns
        self.defer.note_window(len(window.nodes), worth)
        return {vid: env[vid] for vid in window.outputs}

    def _run_novel(self, window: Window, key: Any) -> Mapping[int, torch.Tensor]:
        # Note [First sightings are not planned]
        # Nothing compiles on a window's first sighting (compile_after > 1), and programs
        # whose windows never recur (a new sequence length every step) would pay for
        # partitioning and lowering each one. So a first sighting is replayed eagerly,
        # timed (the eager cost the pass-through policy weighs against capture), and
        # only remembered; the plan is made when the window comes back.
        values, capture_ns, eager_ns = self._replay_timed(window)
        if capture_ns is not None:
            self._capture_ns[key] = capture_ns
        self._novel[key] = True
        self._eager_ns[key] = eager_ns
        ops = tuple(node.target for node in window.nodes)  # the window without its shapes
        reshaped = ops in self._novel_ops
        self._novel_ops[ops] = True
        self.defer.note_window(len(window.nodes), False, novel=True, reshaped=reshaped)
        return values

    def _replay_timed(self, window: Window) -> tuple[dict[int, torch.Tensor], int | None, int]:
        """Run every node eagerly: (outputs, capture time or None, eager time), in ns."""
        env = window.progress.start(window.inputs)
        t0 = time.perf_counter_ns()
        with replay_guard():
            run_nodes(window, range(len(window.nodes)), env)
        eager_ns = time.perf_counter_ns() - t0
        self.counters.ops_eager += len(window.nodes)
        capture_ns = t0 - window.opened_ns if window.opened_ns else None
        return {vid: env[vid] for vid in window.outputs}, capture_ns, eager_ns

    def _pays(self, key: Any, eager_ns: int, n_ops: int) -> bool:
        """Whether the window's eager run outweighs capturing it (Note [Windows that cannot
        pay for their capture are not compiled]). Both are measured on the window's first
        sighting, in the same conditions, and lowered to the minimum over later
        sightings that run eagerly: a busy machine inflates both alike, where a fixed
        per-op capture cost would make every window look worth compiling."""
        cap = self._capture_ns.get(key)
        if cap is None:
            return pays_for_capture(eager_ns, n_ops)
        return eager_ns >= cap

    def _run_unpaying(self, window: Window, key: Any, eager_ns: int) -> Mapping[int, torch.Tensor]:
        # Note [Windows that cannot pay for their capture are not compiled]
        # A window whose eager run takes less than capturing its ops took (measured
        # from its first op to its flush on its first sighting; ``_pays``) loses to
        # eager however well it fuses, so it is neither planned nor compiled: it is
        # replayed, timed again (the kept time is the
        # minimum, as a busy machine only ever inflates it), and counts against
        # deferral. AdamW's 256-op windows (2-3 ms eager, ~4 ms to capture) are the
        # case: compiling them cost a 2-core machine tens of seconds of contended CPU
        # for a result that could not beat eager.
        values, capture_ns, ran_ns = self._replay_timed(window)
        cap = self._capture_ns.get(key)
        if capture_ns is not None and cap is not None:
            # The first sighting's capture ran metadata kernels cold (memo misses).
            self._capture_ns[key] = min(cap, capture_ns)
        self._eager_ns[key] = min(eager_ns, ran_ns)
        self.defer.note_window(len(window.nodes), False)
        return values

    def should_defer(self, weight: int = 1) -> bool:
        """O(1): whether the mode should keep deferring ops (``passthrough.DeferPolicy``).

        (Each instance binds this name to its policy's method directly: it is asked on
        every torch call.)"""
        return self.defer.should_defer(weight)

    # -- planning -------------------------------------------------------------------
    def _plan(self, window: Window, groups: Mapping[int, int]) -> Plan:
        part: Partition = partition(window, groups, self.support, self.cost)
        index = {}  # node index -> lifted float index
        for i, node in enumerate(window.nodes):
            rule = lift_rule(node, window.specs) if node.args else None
            if rule is not None:
                index[i] = len(index)
        steps = []
        for region in part.steps:
            slots = tuple((index[i], scalar_dtype(window.specs[window.nodes[i].outputs[0]].dtype))
                          for i in region.nodes if i in index) if region.fused else ()
            steps.append(Step(region, slots))
        return Plan(tuple(steps), any(r.fused for r in part.steps))

    # -- running --------------------------------------------------------------------
    def _run_eager(self, window: Window, region: Region, env: dict) -> None:
        if _profiling():
            with torch.profiler.record_function("adaptive_eager.eager_replay"):
                run_nodes(window, region.nodes, env)
        else:
            run_nodes(window, region.nodes, env)
        self.counters.ops_eager += len(region.nodes)
        if not region.fused and region.reason not in _COST_REASONS:
            for i in region.nodes:
                self.counters.note_fallback(window.nodes[i].name, region.reason)

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
            self._run_eager(window, region, env)
            return False
        self.counters.cache_misses += 1
        if entry.state == COMPILING:
            self.compiler.check_timeout(entry)
        else:
            entry.seen += 1
            if entry.seen >= self.options.compile_after and self.compiler.take_fuel():
                self.compiler.submit(entry, lambda: self._lower(window, region))
                if entry.state == COMPILED:
                    self._call_compiled(window, step, entry, env, floats)
                    window.progress.done.extend(region.nodes)
                    return True
        t0 = time.perf_counter_ns()
        self._run_eager(window, region, env)
        if len(entry.eager_ns) < _TIMED_CALLS:
            entry.eager_ns.append(time.perf_counter_ns() - t0)
        return entry.state != EAGER_ONLY

    def _lower(self, window: Window, region: Region) -> tuple[Any, list]:
        lowered = lower(window, region)
        return lowered.module, lowered.example_inputs()

    def _scalars(self, step: Step, entry: RegionEntry, floats: list) -> list[torch.Tensor]:
        out = []
        cache = entry.scalars
        for slot, (fi, dtype) in enumerate(step.scalars):
            v = floats[fi]
            hit = cache.get(slot)
            if hit is None or hit[0] != v:
                hit = cache[slot] = (v, torch.tensor(v, dtype=dtype))
            out.append(hit[1])
        return out

    def _call_compiled(self, window: Window, step: Step, entry: RegionEntry, env: dict,
                       floats: list) -> None:
        region = step.region
        args = [env[v] for v in region.inputs]
        if step.scalars:
            args.extend(self._scalars(step, entry, floats))
        if not entry.checked:
            if not self._first_call(window, region, entry, env, args):
                return
        elif len(entry.compiled_ns) < _TIMED_CALLS and self.demote:
            t0 = time.perf_counter_ns()
            outs = entry.fn(*args)
            entry.compiled_ns.append(time.perf_counter_ns() - t0)
            self._bind(region, env, outs)
            self._maybe_demote(entry)
            return
        elif _profiling():
            with torch.profiler.record_function("adaptive_eager.compiled_region"):
                outs = entry.fn(*args)
            self._bind(region, env, outs)
        else:
            self._bind(region, env, entry.fn(*args))

    def _bind(self, region: Region, env: dict, outs: Any) -> None:
        for vid, t in zip(region.outputs, outs):
            env[vid] = t
        self.counters.compiled_calls += 1
        self.counters.ops_fused += len(region.nodes)

    def _first_call(self, window: Window, region: Region, entry: RegionEntry, env: dict,
                    args: list) -> bool:
        """Check the artifact once: compiled on clones vs eager on the real inputs.

        True when the compiled results were bound; False when the region ran eagerly.
        """
        entry.checked = True
        clones = [clone_strided(a) if i < len(region.inputs) and
                  region.mutated else a for i, a in enumerate(args)]
        try:
            outs = entry.fn(*clones)
        except Exception as e:  # noqa: BLE001 - a failing artifact: eager-only
            self.compiler.fail(entry, f"compiled call failed: {type(e).__name__}: {e}")
            self._run_eager(window, region, env)
            return False
        if not self.options.verify_compiled:
            problem = outputs_match(window, region, outs, None, None, None)
            if problem is None and not region.mutated:
                self._bind(region, env, outs)
                return True
        t0 = time.perf_counter_ns()
        self._run_eager(window, region, env)
        entry.eager_ns.append(time.perf_counter_ns() - t0)
        ref = [env[v] for v in region.outputs]
        problem = outputs_match(window, region, outs, ref, clones, env)
        if problem is not None:
            self.compiler.fail(entry, f"compiled outputs differ: {problem}")
        return False

    def _maybe_demote(self, entry: RegionEntry) -> None:
        if len(entry.compiled_ns) < _TIMED_CALLS or not entry.eager_ns:
            return
        if min(entry.compiled_ns) >= min(entry.eager_ns):
            self.compiler.fail(entry, "demoted: compiled not faster than eager", "demotions")


__all__ = ["CompiledExecutor", "Plan", "Step"]
