"""The per-step re-check of an optimizer whose step signature is known
(Note [A known step is re-checked, not re-gathered]).

:func:`optim_graph.gather` builds a signature key from every tensor's spec: ~5 specs per
parameter, a big tuple to hash, every step. :class:`KnownStep` remembers what the last
gather found for one optimizer and checks, per step, only what can change between steps
of a training loop, returning the step's inputs and hyperparameters, or None (gather
again).

Example::

    >>> import torch
    >>> from adaptive_eager.runtime.optim_graph import gather
    >>> p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)
    >>> opt = torch.optim.SGD([p], lr=0.1, momentum=0.9); opt.step()
    >>> known = KnownStep(opt, gather(opt, (torch.Tensor, torch.nn.Parameter)))
    >>> got = known.check(opt); len(got.inputs), got.hyper[:1]
    (3, [0.1])
    >>> p.grad = None; known.check(opt) is None
    True
"""

from __future__ import annotations

import operator
import weakref
from typing import Any

import torch

from .optim_graph import MAX_EXACT_STEP, Gathered

_is = operator.is_


# Note [A known step is re-checked, not re-gathered]
# Between two steps of a training loop the grads are new tensors (backward makes them, or
# zero_grad(set_to_none) dropped them) and the hyperparameters change; the params, the
# state tensors and the groups' other options almost never do. So a known step checks:
# the same groups, param lists and state dict (identity), each param's grad present and
# dense with its recorded strides (the grad setter already enforces the param's shape,
# dtype and device), each param's state values the same tensor objects, and every
# non-float option equal; it reads the float options as the hyperparameters. The step
# counters are read with ``.item()`` only when their version counter moved since the
# compiled step last wrote them (a program or load_state_dict that changes them is seen).
# A param whose data was swapped in place (``p.data = other``) is not seen: a limitation.
class KnownStep:
    """What the last full gather found for one optimizer (see the module docstring)."""

    def __init__(self, opt: torch.optim.Optimizer, got: Gathered):
        self.key = got.key
        self.usable = True  # False: some state value is not a tensor (gather every step)
        self.state = opt.state
        self.groups = []
        sget = opt.state.get
        for g in opt.param_groups:
            params = g["params"]
            opts = tuple((k, v) for k, v in g.items() if k != "params" and type(v) is not float
                         and not (k == "foreach" and v is not False)
                         and not (type(v) is tuple and v and all(type(x) is float for x in v)))
            per = []
            for p in params:
                gr = p.grad
                if gr is None:
                    per.append(None)
                    continue
                st = sget(p) or {}
                if not all(type(v) is torch.Tensor for v in st.values()):
                    self.usable = False  # a non-tensor, or a handle (Note [Releasing bound handles])
                # weak: a state handle must stay releasable (Note [Releasing bound handles])
                per.append((gr.stride(), tuple(weakref.ref(v) for v in st.values()
                                               if type(v) is torch.Tensor) if self.usable else ()))
            self.groups.append((g, params, list(params), opts, per))
        self.steps: list | None = None     # known step values and the counters' versions
        self.versions: list | None = None

    def check(self, opt: torch.optim.Optimizer) -> Gathered | None:
        """This step's inputs and hyperparameters if its signature is the known one."""
        groups = opt.param_groups
        if not self.usable or opt.state is not self.state or len(groups) != len(self.groups):
            return None
        sget = self.state.get
        inputs: list = []
        hyper: list = []
        strided = torch.strided
        for g, (g0, plist, params, opts, per) in zip(groups, self.groups):
            if g is not g0 or g["params"] is not plist or len(plist) != len(params) \
                    or not all(map(_is, plist, params)):
                return None
            others = []
            for k, v in g.items():
                if k == "params":
                    continue
                tv = type(v)
                if tv is float:
                    hyper.append(v)
                elif tv is tuple and v and all(type(x) is float for x in v):
                    hyper.extend(v)
                elif k != "foreach" or v is False:  # None or True: the same trace
                    others.append((k, v))
            if tuple(others) != opts:
                return None
            for p, known in zip(params, per):
                gr = p.grad
                if known is None:
                    if gr is not None:
                        return None
                    continue
                if gr is None or gr.layout is not strided or gr.stride() != known[0]:
                    return None
                vals = (sget(p) or {}).values()
                if len(vals) != len(known[1]) or not all(r() is v for r, v in zip(known[1], vals)):
                    return None
                inputs.append(p)
                inputs.append(gr)
                inputs.extend(vals)
        return Gathered(self.key, inputs, hyper)

    def step_values(self, reads: tuple, inputs: list) -> list | None:
        """The counters ``reads`` (input positions) before the step: the known values when
        no counter was written since, else read (None: not exact float32 integers)."""
        known = self.steps
        if known is not None and all(inputs[n]._version == v for n, v in zip(reads, self.versions)):
            return known
        out = []
        for n in reads:
            v = inputs[n].item()
            if not (0.0 <= v < MAX_EXACT_STEP) or v != int(v):
                return None
            out.append(v)
        return out

    def stepped(self, reads: tuple, deltas: tuple, steps: list, inputs: list) -> None:
        """The compiled step ran: the counters now hold ``steps + deltas``."""
        self.steps = [s + d for s, d in zip(steps, deltas)]
        self.versions = [inputs[n]._version for n in reads]

    def forget_steps(self) -> None:
        self.steps = self.versions = None


__all__ = ["KnownStep"]
