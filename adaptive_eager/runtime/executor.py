"""Executors: how a flushed window is turned into real tensors.

The contract (:class:`Executor`, one signature for every executor): ``run(window, known)``
takes a :class:`~adaptive_eager.fusion.ir.Window` and, when its capture matched a
recorded trace (dispatch/trace.py), what that trace knows (:class:`Known`: its key,
lifted floats and storage groups, so that an executor that keys windows need not derive
them again, Note [Keys hash once], fusion/signature.py; None otherwise). It returns a
:class:`FlushResult`: ``values``, ``{value id: real tensor}`` for every id in
``window.outputs``, having applied every in-place update of the window's real inputs; a
:class:`Verdict`, the facts about the window that the pass-through policy weighs
(``runtime.adapt``; an executor never steers the policy itself); and, from an executor
that keys windows (the compiled one), a :class:`Sighting` (the key, whether it had been
seen, the storage groups it was made with), from which recurring windows become traces;
None from one that does not. ``close`` releases what it holds (compile threads). While it runs, it keeps
``window.progress`` (its env from ``progress.start``, the nodes done), so that a run
that fails part-way can be finished by ``runtime.recovery``. :class:`EagerExecutor`
replays the window op by op; the compiled executor (``runtime.compiled``) runs
hot regions through a compile backend and delegates the rest to it.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> x = torch.ones(2)
    >>> w = Window({0: x}, (OpNode(torch.ops.aten.add.Tensor, (ValueRef(0), ValueRef(0)), (), (1,)),),
    ...            {0: TensorSpec.of(x), 1: TensorSpec.of(x)}, frozenset({1}))
    >>> r = EagerExecutor().run(w)
    >>> r.values[1], r.verdict
    (tensor([2., 2.]), Verdict(ops=1, worth=False, novel=False, reshaped=False, pending=False, eager_ns=None, capture_ns=None, grew=False))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..fusion.ir import OpNode, Window, map_refs
from ..fusion.liveness import release_after
from .verdicts import Verdict  # noqa: F401 - re-exported: a flush result carries one

_K = torch._C.DispatchKey
_AUTOCAST_KEYS = torch._C.DispatchKeySet(_K.AutocastCPU)
for _name in ("AutocastCUDA", "AutocastXPU", "AutocastMPS", "AutocastPrivateUse1", "AutocastHPU"):
    if hasattr(_K, _name):
        _AUTOCAST_KEYS = _AUTOCAST_KEYS | torch._C.DispatchKeySet(getattr(_K, _name))


# Note [Replay below autograd]
# A window holds ops the dispatcher had already passed through autograd, autocast
# and every Python mode above ours when they were recorded. Replaying them must
# not go through those layers again: autograd would record a second graph (and
# refuse in-place updates of leaves), autocast would cast a second time, and our own
# mode would capture the replay. The
# dispatch modes are popped for the duration rather than masked with
# _DisableTorchDispatch: Python-registered backend kernels (torch.library, e.g. the
# emulated neuron device) hit an internal assert when a mode is on the stack but
# Python dispatch is excluded. So replay runs with those keys excluded, exactly
# where the op would have run had our mode computed it on the spot.
@contextlib.contextmanager
def replay_guard() -> Iterator[None]:
    """Run ATen ops as the backend kernel would, below autograd, autocast and Python modes."""
    with torch._C._AutoDispatchBelowADInplaceOrView(), \
            torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS), \
            _disable_current_modes(), \
            torch._C.DisableTorchFunction():
        yield


def run_node(node: OpNode, env: dict[int, torch.Tensor]) -> None:
    """Run one node on real tensors from ``env`` and store its results in ``env``."""
    args = map_refs(node.args, env)
    kwargs = {k: map_refs(v, env) for k, v in node.kwargs}
    out = node.target(*args, **kwargs)
    outs = node.outputs
    if not outs:
        return
    if isinstance(out, torch.Tensor):
        env[outs[0]] = out
        return
    for vid, t in zip(outs, out):
        if vid is not None:
            env[vid] = t


def run_nodes(window: Window, indices: Iterable[int], env: dict[int, torch.Tensor],
              release: Mapping[int, tuple[int, ...]] | None = None) -> None:
    """Run ``window.nodes[i]`` for each ``i`` in order, recording ``window.progress``.

    ``release``: node index -> value ids dropped from ``env`` right after it (Note
    [Replay frees at last use], fusion/liveness.py); None keeps every value.
    """
    nodes = window.nodes
    progress = window.progress
    done = progress.done
    if release is None:
        for i in indices:
            progress.at = i
            run_node(nodes[i], env)
            done.append(i)
    else:
        pop = env.pop
        for i in indices:
            progress.at = i
            run_node(nodes[i], env)
            done.append(i)
            for v in release.get(i, ()):
                pop(v, None)
    progress.at = -1


def run_window(window: Window) -> dict[int, torch.Tensor]:
    """Run every node of ``window`` in order, freeing each value after its last use;
    its live outputs (``{value id: tensor}``)."""
    env = window.start_run()
    with replay_guard():
        run_nodes(window, range(len(window.nodes)), env,
                  release_after(window.nodes, range(len(window.nodes)), window.outputs))
    return {vid: env[vid] for vid in window.outputs}


@dataclass(frozen=True, slots=True)
class Sighting:
    """How an executor that keys windows saw one: ``key``, the window's key (a
    ``fusion.signature.Key``); ``recurred``, that key had been seen before this run;
    ``groups``, the storage groups of its inputs the key was made with
    (``fusion.graph.storage_groups``, taken before the run: a run frees the inputs it
    owns, Window.start_run)."""

    key: Any
    recurred: bool
    groups: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class FlushResult:
    """``Executor.run``'s answer: the live values, the verdict on the window, and how the
    executor saw it (:class:`Sighting`; None from an executor that does not key windows)."""

    values: Mapping[int, torch.Tensor]
    verdict: Verdict
    sighting: Sighting | None = None


@dataclass(frozen=True, slots=True)
class Known:
    """What a matched trace already knows about a window (``Executor.run``'s ``known``):
    its key, its lifted floats in node order, and its inputs' storage groups."""

    key: Any
    floats: list
    groups: Mapping[int, int]


class Executor:
    """Runs windows; see the module docstring for the contract. Executors subclass it."""

    def run(self, window: Window, known: Known | None = None) -> FlushResult:
        """Run ``window``: its live values, the verdict on it and, when the executor keys
        windows, its sighting. ``known``: its key, floats and storage groups, when a
        matched trace has them (executors that do not key windows ignore it)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the executor holds (compile threads); it may not run again."""


class EagerExecutor(Executor):
    """Replays a window op by op, as eager would have run it.

    Each value is dropped after its last use (Note [Replay frees at last use],
    fusion/liveness.py), as eager frees it.
    """

    def run(self, window: Window, known: Known | None = None) -> FlushResult:
        return FlushResult(run_window(window), Verdict(len(window.nodes)))

    def close(self) -> None:
        pass


__all__ = ["Executor", "EagerExecutor", "FlushResult", "Known", "Sighting", "Verdict", "replay_guard", "run_node",
           "run_nodes", "run_window"]
