"""Reasons: why the runtime flushed a window or ran an op eagerly, and what to change.

A leaf module (it imports nothing): the names the runtime records, each with its advice.
Flush reasons come from dispatch/ (mode, observe, lazy, opaque, dynamo) and session.py,
fallback reasons from fusion/policy.py, fusion/partition.py and runtime/ (compile
failures of a region). :func:`advice_for` is what the report and strict mode print.

Example::

    >>> advice_for("observe:repr") == ADVICE["repr"]
    True
    >>> advice_for("compile timed out after 120 s", fallback=True).startswith("compiling took")
    True
"""

from __future__ import annotations

# Flushes that are part of normal operation rather than something to fix.
ROUTINE_REASONS = frozenset({"exit", "window_full", "nested_enter", "explicit_sync", "optimizer_step"})

# Flush (sync) reasons -> what to change. A reason may carry a prefix: "observe:" (a
# Python-level read seen by ObserveMode) or a suffix after ":" ("opaque:<call>").
ADVICE: dict[str, str] = {
    "global_state": "a setting kernels read (default dtype, deterministic algorithms, threads, "
                    "...) changed: pending work ran first; set it once before the loop",
    "integer_division": "integer //, % or fmod by a tensor can raise on a zero, so it runs at "
                        "once: divide floats, or keep it out of the hot loop",
    "item": ".item() in a loop: keep the value as a tensor (accumulate with +=) "
            "or read it every N steps",
    "bool": "Python branches on a tensor (if/while/and/or): use torch.where, or check every N steps",
    "equal": "torch.equal returns a Python bool: use (a == b).all() and keep it a tensor",
    "repr": "printing a tensor: print every N steps, or after the loop",
    "format": "formatting a tensor into a string: log every N steps, or after the loop",
    "numpy": "reading values into NumPy: do it every N steps, or after the loop",
    "array": "reading values into NumPy: do it every N steps, or after the loop",
    "tolist": ".tolist() reads values into Python: do it every N steps, or after the loop",
    "data_ptr": "raw memory access (data_ptr) needs the real tensor: move it out of the hot loop",
    "dlpack": "DLPack export needs the real tensor: export outside the hot loop",
    "storage": "storage access needs the real tensor: move it out of the hot loop",
    "untyped_storage": "storage access needs the real tensor: move it out of the hot loop",
    "typed_storage": "storage access needs the real tensor: move it out of the hot loop",
    "pickle": "saving/pickling tensors (torch.save): checkpoint every N steps",
    "reduce_ex": "saving/pickling tensors (torch.save): checkpoint every N steps",
    "getstate": "saving/pickling tensors (torch.save): checkpoint every N steps",
    "setstate": "loading tensors into existing ones: load outside the hot loop",
    "deepcopy": "copy.deepcopy of tensors: copy outside the hot loop",
    "share_memory": "moving a tensor to shared memory needs its real data, and its later ops "
                    "run at once: share once, before the loop",
    "set_data": "`t.data = v` replaces a tensor's storage, so pending work on either runs "
                "first: update in place instead (with torch.no_grad(): t.mul_(0.9) or t.copy_(v))",
    "tensor_from_data": "torch.tensor/as_tensor of a list of tensors copies their values in C++: "
                        "use torch.stack or torch.cat, which stay deferred",
    "exported_memory": "an op touched memory exported to NumPy/DLPack/data_ptr/shared memory, "
                       "so it ran at once, alone: drop the alias (a live numpy view of a "
                       "parameter) or export a copy (t.detach().clone().numpy())",
    "transfer": "device transfer (.to/.cpu/.cuda): move data once before the loop, or every N steps",
    "data_dependent": "the output's shape depends on the values (nonzero, masked_select, unique, "
                      "boolean-mask indexing): use fixed-shape forms (torch.where, masked_fill, "
                      "multiplying by a mask)",
    "no_meta_kernel": "the op has no meta kernel, so its output shape is unknown until it runs: "
                      "register one (torch.library.register_fake) or keep the op out of the hot loop",
    "metadata_mutation": "in-place change of a tensor's shape (resize_, set_): allocate the final "
                         "shape instead",
    "non_tensor_output": "the op returns a Python value, which needs real data: keep it out of "
                         "the hot loop",
    "uncapturable": "the op's result cannot be deferred (its metadata is only known when it "
                    "runs): keep it out of the hot loop",
    "collective": "collective communication syncs by design",
    "random": "a random op reads pending values (e.g. bernoulli(p) of a computed p): draw "
              "torch.rand_like(p) and compare instead",
    "resize": "an op's output shape differed from the prediction; please report it",
    "sync": "an op needed real values here; look at the line for a read into Python",
    "observe": "a read of a tensor's values; look at the line for a read into Python",
    "escaped": "a tensor made inside the block was used outside it while still pending: "
               "use it inside, or leave the block later",
    "opaque": "a call that reads tensor memory from C++ (listed in dispatch/opaque.py) runs "
              "on real tensors; call it once, outside the hot loop",
    "window_full": "routine: the window reached window_size ops (raise ADAPTIVE_EAGER_WINDOW_SIZE "
                   "if regions are cut too often)",
    "exit": "routine: end of an adaptive_eager block",
    "optimizer_step": "routine: an optimizer step ends its window, so windows line up with "
                      "iterations and recur",
    "torch.compile": "a torch.compile'd function needs its inputs: pending work runs first",
    "explicit_sync": "adaptive_eager.sync() was called: drop it if nothing needs it",
    "nested_enter": "a nested block with other options: use the same options to share one window",
}

# Fallback reasons (an op ran eagerly, outside compiled regions) where they differ from,
# or are missing in, the flush reasons above.
FALLBACK_ADVICE: dict[str, str] = {
    "nan_payload": "the op bakes a NaN constant with a non-standard bit pattern, which generated "
                   "code cannot spell; it runs eagerly (Note [NaN payloads run eagerly]); "
                   "nothing to change",
    "unchecked_index": "the op reads integer indices that compiled regions cannot bounds-check "
                       "(fusion/indices.py has no rule for it), so it runs eagerly (Note "
                       "[Compiled code never sees an index eager would reject]); nothing to change",
    "random": "random ops run eagerly (in program order, for eager's exact numbers); "
              "nothing to change",
    "opaque": "not an ATen op the compiler understands (a custom or Python op): it runs "
              "eagerly; move it out of the hot loop if it splits a region",
    "unsupported_by_backend": "the compile backend cannot run this op: try another backend "
                              "(--backend or ADAPTIVE_EAGER_BACKEND)",
    "aliased_inputs": "the region updates views of one tensor in place (e.g. optimizer steps, "
                      "slices written in place); it replays eagerly, results unchanged",
    "factory": "creates a tensor from nothing (arange, zeros): it runs just before its "
               "region, which takes it as an input (Note [Factories outside Inductor "
               "regions]); nothing to change",
}

# Why a compiled region runs eagerly from now on (runtime/compiler.py, runtime/compiled.py):
# the text before the first ":" of the failure, which the statistics keep.
REGION_ADVICE: dict[str, str] = {
    "compile failed": "the backend could not compile the region; it runs eagerly, results "
                      "unchanged (TORCH_LOGS=ae_compiles says why; try another backend)",
    "lowering failed": "the region could not be turned into an FX graph; it runs eagerly, "
                       "results unchanged (please report it)",
    "compiled call failed": "the compiled region raised when called; it runs eagerly, "
                            "results unchanged (TORCH_LOGS=ae_compiles says why)",
    "compiled outputs differ": "the compiled region's first outputs differed from eager's; "
                               "it runs eagerly, results unchanged",
    "demoted": "the compiled region was not faster than eager; it runs eagerly",
    "compile timed out after": "compiling took longer than compile_timeout_s; the region runs "
                               "eagerly (raise ADAPTIVE_EAGER_COMPILE_TIMEOUT_S)",
}


def reason_key(reason: str) -> str:
    """The advice key of a recorded reason: ``observe:repr`` -> ``repr``,
    ``opaque:DistributedDataParallel`` -> ``opaque``, ``__array__`` -> ``array``."""
    if reason.startswith("observe:"):
        reason = reason[len("observe:"):]
    head = reason.split(":", 1)[0]
    return head.strip("_") or head


def advice_for(reason: str, fallback: bool = False) -> str:
    """What to change for a flush (or, with ``fallback``, a fallback) ``reason``; ``""``
    if unknown."""
    key = reason_key(reason)
    if fallback:
        if key in FALLBACK_ADVICE:
            return FALLBACK_ADVICE[key]
        for prefix, text in REGION_ADVICE.items():
            if key.startswith(prefix):
                return text
    return ADVICE.get(key, "")


# Fallback reasons strict mode raises on: the ones the program can act on. Random ops,
# factories and aliased in-place updates run eagerly by design ("nothing to change").
STRICT_FALLBACKS = frozenset({"data_dependent", "no_meta_kernel", "metadata_mutation", "opaque",
                              "unsupported_by_backend"})


class StrictModeError(RuntimeError):
    """Raised under ``strict=True`` at the program's line that synced or fell back.

    Example::

        >>> str(StrictModeError.at("sync", "item", "<stdin>:1 (<module>)")).splitlines()[0]
        'adaptive_eager strict mode: sync [item] at <stdin>:1 (<module>)'
    """

    @classmethod
    def at(cls, what: str, reason: str, source: str | None, op: str | None = None) -> "StrictModeError":
        """The error for a ``what`` ("sync" or "fallback") with ``reason`` at ``source``."""
        import linecache  # noqa: PLC0415
        import re  # noqa: PLC0415

        where = source or "<unknown>"
        lines = [f"adaptive_eager strict mode: {what}{' of ' + op if op else ''} [{reason}] at {where}"]
        m = re.match(r"^(.*):(\d+)(?: \(.*\))?$", where)
        code = linecache.getline(m.group(1), int(m.group(2))).strip() if m else ""
        if code:
            lines.append(f"    > {code}")
        advice = advice_for(reason, fallback=what == "fallback") or advice_for(reason)
        if advice:
            lines.append(f"    advice: {advice}")
        lines.append("    (strict=False, the default, runs it eagerly and counts it in the report)")
        return cls("\n".join(lines))


__all__ = ["ROUTINE_REASONS", "STRICT_FALLBACKS", "StrictModeError", "ADVICE", "FALLBACK_ADVICE", "REGION_ADVICE", "advice_for",
           "reason_key"]
