"""A compiled region's first call, checked before it is trusted.

Note [The first compiled call runs on copies]
An artifact's first call is checked: its outputs against the recorded specs, the inputs
it must only read against what they held, and (``verify_compiled``) its outputs and
in-place updates against an eager run. No compiler bug may reach the program's data, so
the call never leaves its marks on the program's tensors, in one of three ways:

- on the CPU, small regions (inputs and outputs within a quarter of the window budget,
  Note [A byte budget per window], runtime/memory.py) run on copies of every argument: a
  write into an input the region only reads is caught on the copy, and an in-place update
  (an SGD step, ``p.data.add_(g)``, Note [Writes through views made inside a region])
  lands on the copy, to be compared with eager's, which is the one the program keeps.
  Only a region that writes no input, returns no view of one and passed every check
  binds the compiled results of this call; the others run eagerly this once;
- on the CPU, larger regions get a lean check: the copies were a spike above eager's
  peak (a GPT step's regions copied its activations and held compiled and eager outputs
  at once: 2x eager's peak, ``python -m benchmarks.memory``). Only the inputs the region
  writes are copied; those it only reads are handed as they are and hashed before and
  after (``checks.bits_hash``); its outputs are checked against the specs, summarized
  (``checks.summary``: sums, magnitudes, NaN and infinity counts) and dropped before the
  eager run, whose results the program keeps and the summaries are compared with. A lean
  check catches a wrong kernel, not a difference in the last bits, and an input it only
  reads that the compiled code wrote cannot be put back: the region goes eager-only and
  the flush raises CompiledCodeWroteInput once the window is done. Note [A large region's
  checked results are kept]: without ``verify_compiled`` nothing is compared with eager's
  values, so a region that writes no input and returns no view of one keeps its compiled
  outputs once they match the specs and its inputs' hashes hold, as a small region's
  copies do, and eager does not run: its arrival costs the program one compiled call and
  two hashes of what it reads, not a compiled and an eager run (a 3-op pointwise region
  over fp32[4096, 4096], backend eager, one thread: first call 276 -> 170 ms, later calls
  ~105 ms; with ``verify_compiled``, the default, 1235 -> 586 ms by Note [Summaries of
  finite tensors take two passes], checks.py);
- on an accelerator (the emulated neuron device included), device memory is what a
  program sized for eager runs out of, and host memory is plentiful: the call runs on
  the program's own tensors after each argument was copied to the host; what the call
  left (its outputs, the inputs it writes) is copied to the host, every argument is put
  back from its host copy (and its version counter with it), and eager runs. Device
  memory above eager's: nothing but the call's own outputs, which eager's run makes too
  (an MLP training loop on the emulated device: 47 MiB at its first call with device
  copies, 13 MiB eager).

Example::

    >>> import torch
    >>> from adaptive_eager.runtime.first_call import on_host
    >>> on_host(torch.ones(2, 3).t()).stride()   # a copy with the same strides
    (1, 3)
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..fusion.ir import Window
from ..fusion.liveness import spec_bytes
from ..reasons import R
from .cache import RegionEntry
from .checks import (aliases_any, bits_hash, clone_strided, close, inputs_intact, outputs_match,
                     same_bits, summaries_close, summary)

_set_versions = torch._C._autograd._unsafe_set_version_counter


class CompiledCodeWroteInput(BaseException):
    """A compiled region's first call wrote an input it only reads, too large to have been
    copied (Note [The first compiled call runs on copies]): the program's data is not what
    eager would hold. A BaseException, as an interrupt is: the window is finished, then it
    is raised at the flush."""


def on_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` with its strides."""
    return clone_strided(t, "cpu")


def first_call(ex: Any, window: Window, step: Any, entry: RegionEntry, env: dict,
               args: list, floats: list) -> bool:
    """Check ``entry``'s artifact on its first call (see the Note). ``ex``: the
    CompiledExecutor (its options, compiler, eager runner and binder). True when the
    compiled results were bound; False when the region ran eagerly."""
    entry.checked = True
    region = step.region
    if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
        return _via_host(ex, window, step, entry, env, args, floats)
    size = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    size += sum(spec_bytes(window.specs[v]) for v in region.outputs)
    if size > ex.check_bytes:
        return _lean(ex, window, step, entry, env, args, floats)
    return _on_copies(ex, window, step, entry, env, args, floats)


def run_eager_timed(ex: Any, window: Window, step: Any, entry: RegionEntry, env: dict, floats: list) -> None:
    """Run ``step``'s region eagerly through ``ex`` and record the time in ``entry.eager_ns``."""
    t0 = time.perf_counter_ns()
    ex._run_eager(window, step, env, floats)
    entry.eager_ns.append(time.perf_counter_ns() - t0)


def _verdict(ex: Any, entry: RegionEntry, problem: str | None, window: Window | None = None,
          region: Any = None) -> None:
    """The check's verdict: ``problem`` makes the region eager-only; None records the pass
    (Note [A region checked once is trusted by the next process])."""
    if problem is None:
        ex.compiler.passed_check(entry)
        return
    if not problem.startswith(R.COMPILED_CALL_FAILED):
        if "strides" in problem and window is not None:
            problem += ex._explain_layout(window, region)  # Note [Which op's layout disagreed]
        problem = f"{R.COMPILED_OUTPUTS_DIFFER}: {problem}"
    ex.compiler.fail(entry, problem)


def _call(entry: RegionEntry, args: list, why: Any = None) -> tuple[Any, str | None]:
    """The artifact's outputs, or why it raised (``why(error)``: what its arguments'
    layouts say, Note [Which op's layout disagreed] in layouts.py)."""
    try:
        return entry.fn(*args), None
    except Exception as e:  # noqa: BLE001 - a failing artifact: eager-only
        return None, f"{R.COMPILED_CALL_FAILED}: {type(e).__name__}: {e}{why(e) if why else ''}"


def _on_copies(ex: Any, window: Window, step: Any, entry: RegionEntry, env: dict,
               args: list, floats: list) -> bool:
    region = step.region
    copies = [clone_strided(a) if isinstance(a, torch.Tensor) else a for a in args]
    outs, problem = _call(entry, copies, lambda e: layout_why(window, region, entry, args, e))
    if problem is None:
        problem = outputs_match(window, region, outs, None, None, None) or \
            inputs_intact(region, args, copies)
        if problem is None and not ex.options.verify_compiled and not region.mutated \
                and not aliases_any(outs, copies):
            ex._bind(region, env, outs)
            _verdict(ex, entry, None)  # passed
            return True
    written = {v: env[v] for v in region.mutated}  # its run may drop the dead ones
    run_eager_timed(ex, window, step, entry, env, floats)
    if problem is None and ex.options.verify_compiled:
        ref = [env[v] for v in region.outputs]
        problem = outputs_match(window, region, outs, ref, copies, written)
    _verdict(ex, entry, problem, window, region)
    return False


def _first_outputs(ex: Any, window: Window, step: Any, entry: RegionEntry, args: list, call: list,
                   keep: Callable[[torch.Tensor], Any]) -> tuple:
    """The first compiled call on ``call`` (``args``, or copies of them): (outputs, problem,
    what ``keep`` keeps of each output and of each input the step writes, to compare with
    eager's; both None unless ``verify_compiled`` and the outputs matched their specs)."""
    region = step.region
    kept = kept_written = None
    outs, problem = _call(entry, call, lambda e: layout_why(window, region, entry, args, e))
    if problem is None:
        problem = outputs_match(window, region, outs, None, None, None)
        if problem is None and ex.options.verify_compiled:
            kept = [keep(o) for o in outs]
            kept_written = [keep(call[j]) for j in step.mutated]
    return outs, problem, kept, kept_written


def _lean(ex: Any, window: Window, step: Any, entry: RegionEntry, env: dict,
          args: list, floats: list) -> bool:
    region = step.region
    written = set(step.mutated)
    hashes = {j: bits_hash(a) for j, a in enumerate(args)
              if j not in written and isinstance(a, torch.Tensor)}
    call = [clone_strided(a) if j in written else a for j, a in enumerate(args)]
    outs, problem, sums, sums_written = _first_outputs(ex, window, step, entry, args, call, summary)
    # Note [A large region's checked results are kept]
    keep = problem is None and not ex.options.verify_compiled and not region.mutated \
        and not step.mutated and not aliases_any(outs, call)
    if not keep:
        del outs
    del call
    changed = [_name(region, j) for j, h in hashes.items() if bits_hash(args[j]) != h]
    if changed:
        reason = f"{R.COMPILED_OUTPUTS_DIFFER}: the compiled code wrote inputs it only reads ({changed})"
        ex.compiler.fail(entry, reason, stays_correct=False)
        raise CompiledCodeWroteInput(reason)
    if keep:
        ex._bind(region, env, outs)
        _verdict(ex, entry, None)  # passed
        return True
    run_eager_timed(ex, window, step, entry, env, floats)
    if problem is None and sums is not None:
        ref = [summary(env[v]) for v in region.outputs]
        ref_written = [summary(args[j]) for j in step.mutated]
        bad = [v for v, a, b in zip(region.outputs, sums, ref) if not summaries_close(a, b)]
        bad += [region.inputs[j] for j, a, b in zip(step.mutated, sums_written, ref_written)
                if not summaries_close(a, b)]
        if bad:
            problem = f"values {bad} differ from eager's (lean check of a large region)"
    _verdict(ex, entry, problem, window, region)
    return False


def _via_host(ex: Any, window: Window, step: Any, entry: RegionEntry, env: dict,
              args: list, floats: list) -> bool:
    region = step.region
    tensors = [j for j, a in enumerate(args) if isinstance(a, torch.Tensor)]
    saved = {j: on_host(args[j]) for j in tensors}
    versions = {j: args[j]._version for j in tensors if not args[j].is_inference()}
    outs, problem, got, got_written = _first_outputs(ex, window, step, entry, args, args, on_host)
    del outs
    written = set(step.mutated)
    changed = [j for j in tensors if j not in written and not same_bits(on_host(args[j]), saved[j])]
    try:
        with torch.no_grad():
            for j in tensors:  # put back whatever the call may have changed
                if j in written or j in changed:
                    args[j].copy_(saved[j])
    except RuntimeError as e:  # an input that cannot be written back (an expanded view)
        reason = f"{R.COMPILED_OUTPUTS_DIFFER}: the compiled code wrote inputs it only reads " \
                 f"({[_name(region, j) for j in changed]}) and they cannot be put back: {e}"
        ex.compiler.fail(entry, reason, stays_correct=False)
        raise CompiledCodeWroteInput(reason) from e
    back = [j for j in versions if j in written or j in changed]
    if back:
        _set_versions(tuple(args[j] for j in back), tuple(versions[j] for j in back))
    del saved
    if changed and problem is None:
        problem = f"input {_name(region, changed[0])}: the compiled code wrote an input it only reads"
    run_eager_timed(ex, window, step, entry, env, floats)
    if problem is None and got is not None:
        for vid, g in zip(region.outputs, got):
            if not close(g, on_host(env[vid])):
                problem = f"value {vid}: values differ from eager"
                break
        else:
            for j, g in zip(step.mutated, got_written):
                if not close(g, on_host(args[j])):
                    problem = f"input {region.inputs[j]}: in-place update differs from eager"
                    break
    _verdict(ex, entry, problem, window, region)
    return False


def layout_why(window: Window, region: Any, entry: RegionEntry, args: list, error: BaseException) -> str:
    """`` [layout: input ...]`` when a compiled call's error is about strides and an
    argument's layout is not the one it was compiled for (layouts.py), else ``""``."""
    # layouts imports the fx lowering: not at enable() (Note [The compiled executor is
    # built at the first window], runtime/deferred.py); an error path, so imported here.
    from .layouts import explains_layout, input_disagreement  # noqa: PLC0415

    if not explains_layout(error):
        return ""
    found = input_disagreement(window, region, args, entry.compiled_for)
    return f" [layout: {found}]" if found else ""


def _name(region: Any, j: int) -> Any:
    return region.inputs[j] if j < len(region.inputs) else f"scalar {j}"


__all__ = ["first_call", "run_eager_timed", "on_host", "layout_why", "CompiledCodeWroteInput"]
