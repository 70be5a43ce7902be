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
from itertools import chain, compress, repeat
from typing import Any

import torch

from .optim_graph import MAX_EXACT_STEP, Gathered, _spec

_is = operator.is_
_grad_of = operator.attrgetter("grad")
_layout_of = operator.attrgetter("layout")
_stride_of = torch.Tensor.stride
_PARAMS = (torch.Tensor, torch.nn.Parameter)


def _floats(v: Any) -> bool:
    """Whether an option is a hyperparameter (a float, or a tuple of floats: betas)."""
    return type(v) is float or (type(v) is tuple and bool(v) and all(type(x) is float for x in v))


def _options(g: dict) -> tuple:
    """A group's non-float options (``foreach`` None and True alike: the same trace)."""
    return tuple((k, v) for k, v in g.items() if k != "params" and not _floats(v)
                 and not (k == "foreach" and v is not False))


# Note [Grads checked by Dynamo's tensor guard]
# A known step's grads are new tensors every step; each must be dense with its recorded
# strides. Dynamo's C++ tensor guard (``TensorGuards``, what torch.compile checks its
# graph's tensors with) checks a list of tensors' dispatch keys (so their layout), dtype,
# device, requires_grad, sizes and strides in one call: 5.9 µs for the benchmark's 100
# grads against 14.9 µs for ``map`` over their layouts and strides (SGD's whole re-check:
# ~48 µs). It is a fast path: it checks more than the layout and strides (a grad that
# became a runtime handle, or one with requires_grad, fails it), so a failure falls back
# to the plain check, which decides.
def _grad_guard(grads: list) -> Any:
    """A guard that holds for tensors like ``grads``, or None (no such guard here)."""
    make = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    make = getattr(make, "TensorGuards", None)
    if make is None or not grads:
        return None
    try:
        return make(*grads, dynamic_dims_sizes=[list(g.shape) for g in grads],
                    dynamic_dims_strides=[list(g.stride()) for g in grads])
    except Exception:  # noqa: BLE001 - another torch's signature: the plain check
        return None


# Note [A known step is re-checked, not re-gathered]
# Between two steps of a training loop the grads are new tensors (backward makes them, or
# zero_grad(set_to_none) dropped them) and the hyperparameters change; the params, the
# state tensors and the groups' other options almost never do. So a known step checks,
# with C-level ``map`` over whole lists where it can (a Python loop per parameter was
# ~95 µs a step of SGD over 100 tensors, a third of the step's Python): the same groups,
# param lists and state dict (identity), the state dict's keys and per-param dicts in
# the same order (identity: no hashing of tensors), each per-param dict's keys and
# values the same (identity), each param's grad present or absent as before, dense, with
# its recorded strides (the grad setter already enforces the param's shape, dtype and
# device), and every non-float option equal; it reads the float options as the
# hyperparameters. The step's inputs are the recorded list with this step's grads put in
# place. The step counters are read with ``.item()`` only when their version counter
# moved since the compiled step last wrote them (a program or load_state_dict that
# changes them is seen). It holds the state tensors it checks (the optimizer's state
# dict, which it also holds, keeps them alive anyway); a state holding a runtime handle
# or a non-tensor, or a param that is a handle, makes it unusable (a full gather every
# step: handles must stay releasable, Note [Releasing bound handles]). Params and state
# tensors are checked by a tensor guard too: a param whose data was swapped in place (``p.data =
# other``) keeps its identity, and the compiled step does not check sizes itself (Note [A
# checked step skips Inductor's size asserts], runtime/inductor_setup.py).
class KnownStep:
    """What the last full gather found for one optimizer (see the module docstring)."""

    def __init__(self, opt: torch.optim.Optimizer, got: Gathered):
        self.key = got.key
        self.state = state = opt.state
        self.usable = True
        self.state_keys = list(state)
        self.state_dicts = list(state.values())
        self.groups = []        # (group, its params list, a copy of it, options)
        self.params: list = []  # every group's params, in order
        self.present: list = []  # per param: whether it had a grad
        dicts, template, grad_at, strides = [], [], [], []
        for g in opt.param_groups:
            params = g["params"]
            self.groups.append((g, params, list(params), _options(g)))
            for p in params:
                gr = p.grad
                self.params.append(p)
                self.present.append(gr is not None)
                if type(p) not in _PARAMS:
                    self.usable = False  # a handle (Note [Releasing bound handles])
                if gr is None:
                    continue
                st = state.get(p)
                if st is None:
                    st = {}  # no entry: one made later changes the state dict's length
                if not all(type(v) is torch.Tensor for v in st.values()):
                    self.usable = False  # a non-tensor, or a handle
                dicts.append(st)
                template.append(p)
                grad_at.append(len(template))
                template.append(None)
                template.extend(st.values())
                strides.append(gr.stride())
        self.dicts = dicts
        self.state_names = list(chain.from_iterable(dicts))
        self.values = list(chain.from_iterable(map(dict.values, dicts)))
        self.template = template
        self.grad_at = grad_at
        self.grad_set = frozenset(grad_at)
        self.strides = strides
        self.grad_guard = _grad_guard([p.grad for p, had in zip(self.params, self.present) if had])
        # Note [A checked step skips Inductor's size asserts] (runtime/inductor_setup.py):
        # the params and state tensors are checked as the grads are (a param's data swapped
        # for another shape, ``p.data = t``, keeps its identity)
        held = [t for t in template if t is not None]
        self.held = held
        self.held_guard = _grad_guard(held)
        self.held_specs = list(map(_spec, held))
        if not self.usable:  # hold nothing of a state that may hold handles
            self.state_dicts = self.dicts = self.values = self.template = []
            self.held, self.held_specs = [], []
        self.steps: list | None = None     # known step values and the counters' versions
        self.versions: list | None = None

    def check(self, opt: torch.optim.Optimizer) -> Gathered | None:
        """This step's inputs and hyperparameters if its signature is the known one."""
        groups = opt.param_groups
        state = opt.state
        if not self.usable or state is not self.state or len(groups) != len(self.groups) \
                or len(state) != len(self.state_keys):
            return None
        hyper: list = []
        for g, (g0, plist, params, opts) in zip(groups, self.groups):
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
        if not all(map(_is, state, self.state_keys)) or not all(map(_is, state.values(), self.state_dicts)):
            return None
        dicts = self.dicts
        if list(chain.from_iterable(dicts)) != self.state_names:
            return None
        values = list(chain.from_iterable(map(dict.values, dicts)))
        if len(values) != len(self.values) or not all(map(_is, values, self.values)):
            return None
        every = list(map(_grad_of, self.params))
        if [g is not None for g in every] != self.present:
            return None
        grads = list(compress(every, self.present))
        guard = self.grad_guard
        if (guard is None or not guard.check(*grads)) and (  # Note [Grads checked by Dynamo's tensor guard]
                not all(map(_is, map(_layout_of, grads), repeat(torch.strided)))
                or list(map(_stride_of, grads)) != self.strides):
            return None
        held = self.held
        guard = self.held_guard
        if (guard is None or not guard.check(*held)) and (
                list(map(_spec, held)) != self.held_specs):
            return None  # Note [A checked step skips Inductor's size asserts]
        inputs = self.template.copy()
        for n, gr in zip(self.grad_at, grads):
            inputs[n] = gr
        return Gathered(self.key, inputs, hyper, self.grad_set, known=True)

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
