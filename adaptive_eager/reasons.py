"""Reasons: why the runtime flushed a window or ran an op eagerly, and what to change.

A leaf module (it imports nothing of the package): the names the runtime records, each with its advice.
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

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fallback:
    """One kind of fallback, a key of ``Counters.fallback_ops``: ``op`` (an op's name, or
    "region" for a compiled region that runs eagerly) and ``reason`` (an ``R`` fallback
    reason, or a region's failure kind). ``str()`` is the report's text.

    Example::

        >>> f = Fallback("aten::nonzero", R.DATA_DEPENDENT)
        >>> str(f), f.op
        ('aten::nonzero: data_dependent', 'aten::nonzero')
    """

    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op}: {self.reason}"


class R:
    """The reasons the runtime records, by name: every emitter uses these constants, and
    every one has advice below (tests/test_report.py checks both).

    Flush (sync) reasons may carry a prefix (``observe:<read>``, a Python-level read seen
    by a read wrapper of dispatch/observe.py, named after the method) or a suffix (``opaque:<call>``). Region
    failures are the text before the first ``:`` of a failure's description.
    """

    # routine flushes
    EXIT = "exit"
    WINDOW_FULL = "window_full"
    WINDOW_BYTES = "window_bytes"
    NESTED_ENTER = "nested_enter"
    EXPLICIT_SYNC = "explicit_sync"
    OPTIMIZER_STEP = "optimizer_step"
    # syncs: the program (or C++ it calls) needs real values
    ITEM = "item"
    BOOL = "bool"
    EQUAL = "equal"
    TRANSFER = "transfer"
    RANDOM = "random"
    RESIZE = "resize"
    SYNC = "sync"
    UNCAPTURABLE = "uncapturable"
    ESCAPED = "escaped"
    FOREIGN_HANDLE = "foreign_handle"
    TORCH_COMPILE = "torch.compile"
    GLOBAL_STATE = "global_state"
    INTEGER_DIVISION = "integer_division"
    SET_DATA = "set_data"
    TENSOR_FROM_DATA = "tensor_from_data"
    EXPORTED_MEMORY = "exported_memory"
    COLLECTIVE = "collective"
    OBSERVE = "observe"  # prefix: observe:<read>; a handle's own reads are named as these:
    REPR = "repr"
    FORMAT = "format"
    NUMPY = "numpy"
    TOLIST = "tolist"
    DLPACK = "dlpack"
    OPAQUE = "opaque"    # prefix: opaque:<call>; also a fallback (not an ATen op)
    # syncs that are also fallbacks (the op cannot be captured)
    DATA_DEPENDENT = "data_dependent"
    NO_META_KERNEL = "no_meta_kernel"
    METADATA_MUTATION = "metadata_mutation"
    NON_TENSOR_OUTPUT = "non_tensor_output"
    # why a node stays out of compiled regions (fusion/)
    TOO_SMALL = "too_small"
    NOT_WORTH_IT = "not_worth_it"
    NOTHING_TO_FUSE = "nothing_to_fuse"
    ALIASED_INPUTS = "aliased_inputs"
    FACTORY = "factory"
    OFFSET_VIEW = "offset_view"
    STEP_FLOAT = "step_float"
    UNSUPPORTED_BY_BACKEND = "unsupported_by_backend"
    NAN_PAYLOAD = "nan_payload"
    UNCHECKED_INDEX = "unchecked_index"
    # why a compiled region runs eagerly from now on (runtime/)
    COMPILE_FAILED = "compile failed"
    LOWERING_FAILED = "lowering failed"
    COMPILED_CALL_FAILED = "compiled call failed"
    COMPILED_OUTPUTS_DIFFER = "compiled outputs differ"
    DEMOTED = "demoted"
    COMPILE_TIMED_OUT = "compile timed out after"
    # the op a region's compile failure or stride mismatch comes from (runtime/layouts.py)
    COMPILER_LAYOUT = "compiler_layout"

    @classmethod
    def all(cls) -> dict[str, str]:
        """Every reason constant: name -> value."""
        return {k: v for k, v in vars(cls).items() if k.isupper()}


# Flushes that are part of normal operation rather than something to fix.
ROUTINE_REASONS = frozenset({R.EXIT, R.WINDOW_FULL, R.WINDOW_BYTES, R.NESTED_ENTER, R.EXPLICIT_SYNC, R.OPTIMIZER_STEP})
# Fusion's cost model said no: normal, not a fallback to report.
COST_REASONS = frozenset({R.TOO_SMALL, R.NOT_WORTH_IT, R.NOTHING_TO_FUSE})
# The ATen ops that are syncs by nature, and what their sync is called (reported under
# sync sites, never as fallbacks).
SYNC_OPS = {"aten::_local_scalar_dense": R.ITEM, "aten::is_nonzero": R.BOOL, "aten::equal": R.EQUAL}

# Flush (sync) reasons -> what to change. A reason may carry a prefix: "observe:" (a
# Python-level read seen by dispatch/observe.py) or a suffix after ":" ("opaque:<call>").
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
    "foreign_handle": "a tensor pending in another thread's (or block's) window was used here: "
                      "hand tensors between threads after a sync (Note [Threads see what was "
                      "synced])",
    "opaque": "a call that reads tensor memory from C++ (listed in dispatch/opaque.py) runs "
              "on real tensors; call it once, outside the hot loop",
    "window_full": "routine: the window reached window_size ops (raise ADAPTIVE_EAGER_WINDOW_SIZE "
                   "if regions are cut too often)",
    "window_bytes": "routine: the window kept alive more bytes the program had dropped than "
                    "window_bytes allows (Note [A byte budget per window]); raise "
                    "ADAPTIVE_EAGER_WINDOW_BYTES if memory allows and regions are cut too often",
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
    "too_small": "the region touches fewer elements than min_region_work, so compiling it "
                 "cannot pay; it runs eagerly (lower ADAPTIVE_EAGER_MIN_REGION_WORK to try)",
    "not_worth_it": "fusing these ops saves less than a compiled call costs (the cost model); "
                    "they run eagerly; nothing to change",
    "nothing_to_fuse": "a single op: there is nothing to fuse, so it runs eagerly; nothing to "
                       "change",
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
    "aliased_inputs": "the region writes memory that two of its inputs share, views of one "
                      "tensor it cannot rebuild from one of them (the reason names them: e.g. "
                      "overlapping slices, one written in place); it replays eagerly, results "
                      "unchanged (Note [Aliased inputs are rebuilt as views])",
    "step_float": "a fused optimizer step (AdamW(fused=True), the Hugging Face Trainer's "
                  "default) whose learning rate a schedule changes every step: it runs "
                  "eagerly between the regions with each step's rate, so the rest of its "
                  "window compiles once (Note [A fused optimizer's learning rate is lifted, "
                  "and the op runs eagerly]); nothing to change",
    "offset_view": "a slice, narrow or select of a real tensor (a batch X[i:i + n] of a "
                   "dataset): it runs just before its region, which takes the view as an "
                   "input, so one compiled region serves every offset (Note [View offsets "
                   "are inputs]); nothing to change",
    "factory": "creates a tensor from nothing (arange, zeros): it runs just before its "
               "region, which takes it as an input (Note [Factories outside Inductor "
               "regions]); nothing to change",
    "compiler_layout": "the compile backend lays this op's result out with other strides than "
                       "eager (its decomposition), so its region failed to compile or returned "
                       "other strides and runs eagerly, results unchanged; TORCH_LOGS=ae_compiles "
                       "shows the strides (Note [Which op's layout disagreed]; please report it)",
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
STRICT_FALLBACKS = frozenset({R.DATA_DEPENDENT, R.NO_META_KERNEL, R.METADATA_MUTATION, R.OPAQUE,
                              R.UNSUPPORTED_BY_BACKEND})


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


__all__ = ["R", "Fallback", "COST_REASONS", "SYNC_OPS", "ROUTINE_REASONS", "STRICT_FALLBACKS", "StrictModeError", "ADVICE", "FALLBACK_ADVICE", "REGION_ADVICE", "advice_for",
           "reason_key"]
