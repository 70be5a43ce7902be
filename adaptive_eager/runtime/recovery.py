"""Finishing a window whose run failed part-way.

Note [A failed flush loses no work]
A flush runs ops the program issued long before (a caught exception, a loop that
went on). When the run fails or is interrupted part-way, the ops that had not run
yet are still the program's work: a ``p.add_(1)`` recorded after a failing op, the
running total of the last completed step. So the window is finished, not abandoned:

- what ran stays (``window.progress.done``: each node is marked once its effects
  are applied; ``progress.at`` is the eager node that was running);
- every other node runs eagerly, in program order (the order the runner used
  respects every dependency, so what ran is closed under them and the rest can
  follow in window order);
- the node that raised an ``Exception`` is not run again (it may have written part
  of its output, as eager's kernel would have left it); its fresh outputs, and those
  of every later node that reads them, fail with that error, so reading them raises
  it. What a failed op was to update in place is left as its kernel left it, as in
  eager, and later updates of it still apply;
- an interrupt (``KeyboardInterrupt``, any ``BaseException`` that is not an
  ``Exception``) is not the node's fault: the interrupted node runs again (the
  interrupt came from code around the kernel: signals wait for the flush, Note
  [Interrupts wait for the flush] in dispatch/interrupts.py), then the rest, and the
  interrupt is raised once every value is bound;
- a compiled region that raised (``progress.at`` is -1) runs again eagerly: eager's
  own error, if any, is what the program sees.

The error raised at the flush is the first one an eagerly run op raised (eager's),
or the interrupt. Handles whose value could not be computed keep that error for
their reads. Plain tensors cannot carry an error: an update that depended on a
failed value is skipped, and the flush's error is what says so.

Example::

    >>> import torch
    >>> from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    >>> aten = torch.ops.aten
    >>> p = torch.zeros(2)
    >>> s = TensorSpec.of(p)
    >>> w = Window({0: p}, (OpNode(aten.add_.Tensor, (ValueRef(0), 1.0), (), (0,), (0,)),
    ...                     OpNode(aten.add_.Tensor, (ValueRef(0), 1.0), (), (0,), (0,))),
    ...            {0: s}, frozenset())
    >>> env = w.progress.start(w.inputs)
    >>> _ = aten.add_.Tensor(p, 1.0); w.progress.done.append(0)   # node 0 ran, then
    >>> out = finish(w, KeyboardInterrupt())                       # the run was interrupted
    >>> p.tolist(), type(out.error).__name__
    ([2.0, 2.0], 'KeyboardInterrupt')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..fusion.ir import Window
from .executor import replay_guard, run_node


@dataclass(frozen=True)
class Finished:
    """What finishing a window gave: the values computed, the values that failed (with
    their error), and the error to raise at the flush (None: nothing failed)."""

    values: Mapping[int, torch.Tensor]
    errors: Mapping[int, BaseException]
    error: BaseException | None


def finish(window: Window, error: BaseException | None,
           failed: Mapping[int, BaseException] | None = None) -> Finished:
    """Run what ``window.progress`` says has not run (Note [A failed flush loses no work]).

    ``error``: what the runner raised (None: it did not run at all). ``failed``: values
    of earlier windows that could not be computed (inputs this window lacks).
    """
    progress = window.progress
    env = progress.env
    if env is None:
        env = window.start_run()
    done = set(progress.done)
    bad: dict[int, BaseException] = dict(failed or {})
    first: BaseException | None = None
    interrupted = error is not None and not isinstance(error, Exception)
    at = progress.at
    if error is not None and not interrupted and 0 <= at and at not in done:
        _fail(window, at, error, bad)  # the node that raised is not run again
        done.add(at)
        first = error
    with replay_guard():
        for i, node in enumerate(window.nodes):
            if i in done:
                continue
            cause = next((bad[v] for v in (*node.inputs(), *node.mutates) if v in bad), None)
            if cause is not None:
                _fail(window, i, cause, bad)
                continue
            progress.at = i
            try:
                run_node(node, env)
            except Exception as e:  # noqa: BLE001 - eager's error, kept for the reads
                _fail(window, i, e, bad)
                first = first or e
            progress.done.append(i)
    progress.at = -1
    values = {v: env[v] for v in window.outputs if v not in bad and v in env}
    errors = {v: bad[v] for v in window.outputs if v in bad}
    return Finished(values, errors, error if interrupted else first)


def _fail(window: Window, i: int, error: BaseException, bad: dict[int, BaseException]) -> None:
    node = window.nodes[i]
    for v in node.outputs:
        if v is not None and v not in node.mutates:
            bad.setdefault(v, error)


__all__ = ["Finished", "finish"]
