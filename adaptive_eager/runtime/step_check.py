"""A compiled optimizer step's first call, checked against eager's step: beside the program
on a checker thread that opens no OpenMP team while the program runs one torch thread, on
the program's thread otherwise (Note [A checker thread with one OpenMP thread]).

Note [The first compiled step is checked beside the program]
The first call of a compiled optimizer step runs on copies of its inputs and is compared
with eager's step, run on the real tensors that one time (Note [The optimizer step as one
compiled unit], dispatch/optim_compile.py). On the program's thread that check was the
largest arrival spike of the demo (issue 22, items 1 and 3): its AdamW step over 17.9M
parameters cloned 286 MB, called the compiled step on the copies and compared 72M floats
(params, grads and both moments) after eager's step: 0.99 s of the program thread's CPU
against 0.17 s for a whole eager step (one thread, load average 5.8; ``python -m
benchmarks.step_events``). ATen kernels release the GIL, so the call and the comparison
run as well on a daemon thread, on the core the program does not use, while the program
goes on. The clones must exist before eager's step writes the real tensors, so the program
waits for them, but makes them with the checker thread: each clones about half the bytes
(:meth:`BesideCheck.clone`), on both cores when the machine has one to spare. Measured the
same way (second run, load average 7.5-7.8): the check step 0.32 s of the program thread's
CPU with the clones on its thread, 0.26 s with them shared; the next step waited for the
verdict (90 ms CPU, its wall time whatever the checker still needed); the check step now
waits for it at its end (Note [The check's copies are made after the backward]). Undone, then brought
back for one-thread programs: Note [No checker thread while OpenMP throttles its spin]
and Note [A checker thread with one OpenMP thread].

What each part checks, and why the result stays eager's:
- the inputs the traced step writes (params, optimizer state: :func:`written_inputs`, from
  the graph's schemas) are compared, copy against the real tensor, within the dtype's
  tolerance (bit for bit for the debugging backends), once eager's step has run. Nothing
  but the optimizer writes them, and the check step waits for the verdict at its end
  (its post-hook, before the program's own), so the comparison reads settled values;
- the inputs it only reads (grads) are not copied (Note [A step's first call copies what
  it writes], dispatch/optim_compile.py): the call reads the program's own, and their
  bits before and after it (:func:`~.checks.bits_hash`) show it wrote none; the program
  waits for the call at the step's end, so nothing of it (``zero_grad(set_to_none=False)``,
  a post-hook) writes a grad the call still reads.
The real tensors are eager's throughout; a compiled call is never applied to them before
its verdict, which the program's thread takes (:meth:`BesideCheck.verdict`).

Example::

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda p, g: (p.add_(g),))(torch.ones(2), torch.ones(2))
    >>> sorted(written_inputs(gm))
    [0]
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from typing import Any, Callable, Collection, Sequence

import torch

from ..reasons import R
from .checks import bits_hash, clone_strided, close
from .compiler import DaemonThread


#: the report's words for a first call that wrote an input it only reads (a grad)
WROTE_READ_ONLY = "compiled step wrote an input it only reads"


def written_inputs(gm: Any) -> frozenset[int]:
    """Indices of ``gm``'s placeholders that some node writes in place (a mutable
    argument of its schema), in placeholder order."""
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    out: set[int] = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            x = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            for y in (x if isinstance(x, (list, tuple)) else [x]):
                if y in index:
                    out.add(index[y])
    return frozenset(out)


class BesideCheck:
    """Runs first compiled calls and their comparisons, in order, on a checker thread that
    opens no OpenMP team (Note [A checker thread with one OpenMP thread]), or on the
    calling thread where no such thread can be had; each returns a Future of a problem,
    ``(the compile service's reason, the optimizer report's words)``, or None when the
    check passed.

    Example::

        >>> c = BesideCheck()
        >>> p, g = torch.ones(3), torch.ones(3)
        >>> copies = c.clone([p, g], only={0})
        >>> called = c.call(lambda p, g: p.add_(g), copies, read_only=[1], beside=True)
        >>> _ = p.add_(g)        # eager's step, on the real tensors
        >>> c.compare(called, [p, g], copies, written=[0], exact=True).result() is None
        True
    """

    def __init__(self) -> None:
        self._thread: DaemonThread | _Inline | None = None  # made at the first check
        # Note [The check's copies are made after the backward]: none kept between steps

    def _checker(self) -> "DaemonThread | _Inline":
        if torch.get_num_threads() != 1:  # the program's team: Note [A checker thread with one OpenMP thread]
            return _Inline()
        if self._thread is None:
            thread = DaemonThread("adaptive_eager-check", finish_at_exit=True,
                                  on_start=_one_omp_thread_here)  # again in a restarted thread
            try:
                alone = thread.submit(_one_omp_thread_here).result(timeout=30)
            except Exception:  # noqa: BLE001 - no checker thread then
                alone = False
            if not alone:
                thread.shutdown()
            self._thread = thread if alone else _Inline()
        return self._thread

    @property
    def beside(self) -> bool:
        """Whether the parts run on a checker thread (False: on the calling thread)."""
        return isinstance(self._checker(), DaemonThread)

    def clone(self, inputs: Sequence[torch.Tensor],
              only: Collection[int] | None = None) -> list[torch.Tensor]:
        """Copies of ``inputs`` (:func:`~.checks.clone_strided`), those at ``only`` when
        given (the others are handed as they are), made by this thread and the checker's,
        about half the bytes each; returns once all are made."""
        picked = [i for i in range(len(inputs)) if only is None or i in only]
        theirs = _halves(inputs, picked)[1] if self.beside else ()
        made = self._checker().submit(_clones, [inputs[i] for i in theirs])
        skip, chosen = set(theirs), set(picked)
        with torch.no_grad():
            copies = [None if i in skip else clone_strided(t) if i in chosen else t
                      for i, t in enumerate(inputs)]
        for i, c in zip(theirs, made.result()):  # the GIL is released while it waits
            copies[i] = c
        return copies  # type: ignore[return-value]

    def call(self, fn: Callable, args: Sequence[Any], read_only: Sequence[int],
             beside: bool = False) -> cf.Future:
        """``fn(*args)`` (args: copies, then constants), checking that it leaves the copies
        at ``read_only`` bit for bit as they were; on the checker thread when ``beside``
        (a kernel that opens no OpenMP team of more than one thread), else now."""
        runner = self._checker() if beside else _Inline()
        return runner.submit(_call, fn, list(args), tuple(read_only))

    def compare(self, called: cf.Future, inputs: Sequence[torch.Tensor],
                copies: Sequence[torch.Tensor], written: Sequence[int], exact: bool) -> cf.Future:
        """After ``called``: each written input's copy against the real tensor. Beside the
        program, the checker compares about half the bytes and the calling thread, which
        waits for the verdict anyway (Note [The check's copies are made after the
        backward]), the rest; a problem this thread finds is the verdict."""
        theirs, mine = _halves(inputs, written) if self.beside else (tuple(written), ())
        pending = self._checker().submit(_compare, called, list(inputs), list(copies), theirs, exact)
        if not mine:
            return pending
        problem = _compare(called, inputs, copies, mine, exact)
        if problem is None:
            return pending
        out: cf.Future = cf.Future()
        out.set_result(problem)
        return out

    @staticmethod
    def verdict(pending: cf.Future) -> Any:
        """The check's problem or None, waiting for a check still running (the GIL is
        released meanwhile)."""
        try:
            return pending.result()
        except Exception as e:  # noqa: BLE001 - a check that broke: the step stays eager
            return (f"{R.COMPILED_OUTPUTS_DIFFER}: the check failed: {type(e).__name__}: {e}",
                    "compiled step differs from eager")


# Note [The check's copies are made after the backward]
# The check's copies (what the step writes: params and optimizer state) must be made
# before eager's step writes the real tensors, so the program waits for them at the check
# step's start, sharing them with the checker (about 44 ms of its thread CPU for half of
# the demo's 215 MB, load average 3). They were once started a step earlier instead, at
# the end of the step that found its compile ready (run eagerly once more for that), on
# the checker beside the program's next forward and backward: the program did not wait
# for them, but they lived through the activations' peak. The GPT step of ``python -m
# benchmarks.memory --workloads gpt`` (one thread, synchronous compiles: ``sync``) peaked
# +774 MiB against eager's +563 (1.37x); with the first call unchecked (``no-verify``),
# +627 (1.11x), the rest Inductor's loader (Note [Where the GPT step's extra memory comes
# from], benchmarks/memory.py). Memory is never to be above eager's for a speed-up (an
# accelerator sized for eager runs out), so the copies are made where the program holds
# least: after its backward has freed the activations, at the check step itself, and the
# check step waits at its end for the comparison still running on the checker (it had
# run on beside the next forward, holding the copies), then lets them go. The demo pays
# the wait and the copies on its check step once.
#
# Note [No checker thread while OpenMP throttles its spin]
# The check first ran on a daemon thread beside the program (the demo's check step: 0.99 s
# -> 0.26 s of the program thread's CPU). But a second thread that runs an OpenMP region
# (a clone, the compiled kernel, a comparison over large tensors) makes libgomp manage
# more threads than the machine has cores, and libgomp then throttles its spin-wait for
# the whole process: the program's own team sleeps on a futex between parallel regions,
# and a kernel with a barrier per tensor pays a wake-up at each. Measured (SGD-momentum
# over the benchmarks' 100 tensors, 2 threads, idle, ``OMP_WAIT_POLICY`` unset): the
# compiled step's kernel 0.65 ms -> 3.9 ms a call for the rest of the run, a step 1.5 ->
# 5.0 ms (0.36x eager); ``OMP_WAIT_POLICY=passive`` shows the same 5 ms without any check.
#
# Note [A checker thread with one OpenMP thread]
# ATen opens an OpenMP region only when ``omp_get_max_threads() > 1`` (``at::parallel_for``),
# and that count is a per-thread setting of the OpenMP runtime: ATen sets it in each thread
# at its first parallel op, from torch's thread count. So the checker thread, once ATen
# has set it up, sets its own count to 1 through the OpenMP runtime's C API
# (``omp_set_num_threads``, on this thread only; ``torch.set_num_threads`` would change the
# program's count too): its clones, hashes and comparisons run inline, no team. The
# compiled call goes to the checker only when its kernel is compiled for one thread
# (``call(beside=True)``): a kernel for more opens its own team of that many, so it runs on
# the program's thread, before eager's step. The checker is used only while the program
# runs one torch thread (the demo's setting), where no OpenMP team exists at all: with
# two, whether a one-thread checker still makes libgomp throttle the program's team could
# not be told apart from the load (a compiled SGD-momentum step over 100 tensors of 64K
# floats, 2 threads, load average 4-6: 2.1-24 ms a step in either variant, the checker on
# or not, ``/tmp/w51/throttle.py`` in the commit that added this), so there the parts
# run on the calling thread, in order (a Future already done), as they did. Where the
# count cannot be set (no OpenMP runtime found in the process) likewise.
def _one_omp_thread_here() -> bool:
    """Make the calling thread's OpenMP thread count 1; whether ATen now sees 1 here."""
    if torch.get_num_threads() == 1:  # ATen's set-up of this thread comes first
        return True
    lib = _openmp_runtime()
    if lib is None:
        return False
    lib.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


def _openmp_runtime() -> Any:
    """The OpenMP runtime torch loaded (its own libgomp copy in a pip wheel), or None."""
    import ctypes  # noqa: PLC0415

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith(("libgomp", "libiomp", "libomp")):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


class _Inline:
    """``submit(fn, *args)`` runs ``fn`` now, on the calling thread: a done Future."""

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to whoever reads the Future
            fut.set_exception(e)
        return fut

    def shutdown(self) -> None:
        pass


def _clones(tensors: list) -> list:
    with torch.no_grad():
        return [clone_strided(t) for t in tensors]


def _call(fn: Callable, args: list, read_only: tuple) -> Any:
    with torch.no_grad():
        before = [bits_hash(args[i]) for i in read_only]
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a failing artifact: the step stays eager
            return (f"{R.COMPILED_CALL_FAILED}: {type(e).__name__}: {e}", "compiled call failed")
        bad = next((i for i, h in zip(read_only, before) if bits_hash(args[i]) != h), None)
    if bad is not None:
        return (f"{R.COMPILED_OUTPUTS_DIFFER}: optimizer step input {bad} (read only) written",
                WROTE_READ_ONLY)
    return None


def _halves(inputs: Sequence[torch.Tensor], picked: Sequence[int]) -> tuple[tuple, tuple]:
    """``picked`` split in two of about the same bytes (largest first, each to the lighter
    side; the first half gets the largest): :meth:`BesideCheck.compare` hands the first to
    the checker, :meth:`BesideCheck.clone` the second (the program's thread clones the
    largest, as before the split was shared)."""
    halves: tuple[list[int], list[int]] = ([], [])
    sizes = [0, 0]
    for i in sorted(picked, key=lambda i: -inputs[i].nbytes):
        side = 0 if sizes[0] <= sizes[1] else 1
        halves[side].append(i)
        sizes[side] += inputs[i].nbytes
    return tuple(halves[0]), tuple(halves[1])


def _compare(called: cf.Future, inputs: Sequence[Any], copies: Sequence[Any], written: tuple,
             exact: bool) -> Any:
    problem = called.result()
    if problem is not None:
        return problem
    with torch.no_grad():
        for i in written:
            a, b = inputs[i], copies[i]
            a = a.to(b.device) if a.device != b.device else a
            if not (torch.equal(a, b) if exact else close(a, b)):
                return (f"{R.COMPILED_OUTPUTS_DIFFER}: optimizer step input {i}",
                        "compiled step differs from eager")
    return None


__all__ = ["BesideCheck", "WROTE_READ_ONLY", "written_inputs"]
