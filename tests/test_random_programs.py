"""Random programs, differential against plain eager (values and gradients).

Hypothesis draws straight-line programs of 3-15 ops over a pool of (3, 4) tensors:
two leaves that require grad and a plain buffer that in-place ops may update (the
deferred update of a real tensor). Ops cover elementwise, reductions (broadcast back),
views, in-place updates through views, indexing, matmul, and mid-program observations
(``.item()``) that split the program into several windows. Each program runs once
eagerly and once under the mode; every value it made, the buffer, and the leaves'
gradients after backward must match.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_eager as ae
from adaptive_eager import session

from helpers import assert_same, mode

IDX = torch.tensor([2, 0, 1])
COLS = torch.tensor([[1, 0, 3, 2], [0, 0, 1, 1], [3, 2, 1, 0]])


def _inplace(fn):
    """An in-place op on a fresh clone (leaves that require grad can't be mutated)."""
    def run(a, b, c):
        y = a.clone()
        fn(y, b, c)
        return y
    return run


def _buffer_update(buf, a, c):
    with torch.no_grad():
        buf.mul_(0.5).add_(a.detach(), alpha=c)
    return buf * 1


OPS = {
    # elementwise
    "relu": lambda a, b, c: torch.relu(a),
    "sigmoid": lambda a, b, c: torch.sigmoid(a),
    "tanh": lambda a, b, c: a.tanh(),
    "sin": lambda a, b, c: a.sin(),
    "scale": lambda a, b, c: a * c + 1,
    "square": lambda a, b, c: a.pow(2) / 4,
    "add": lambda a, b, c: a + b,
    "sub_alpha": lambda a, b, c: torch.sub(a, b, alpha=c),
    "mul": lambda a, b, c: a * b,
    "div": lambda a, b, c: a / (b.abs() + 1),
    "maximum": lambda a, b, c: torch.maximum(a, b),
    "where": lambda a, b, c: torch.where(a > 0, a, b),
    "clamp": lambda a, b, c: a.clamp(-1, c),
    # reductions, broadcast back
    "center": lambda a, b, c: a - a.mean(1, keepdim=True),
    "colsum": lambda a, b, c: a * a.sum(0, keepdim=True).tanh(),
    "softmax": lambda a, b, c: torch.softmax(a, dim=-1),
    "logsumexp": lambda a, b, c: a - torch.logsumexp(a, 1, keepdim=True),
    "cumsum": lambda a, b, c: a.cumsum(1) / 4,
    "norm": lambda a, b, c: a / (a.norm() + 1),
    "max_dim": lambda a, b, c: a - a.max(1, keepdim=True).values,
    # views
    "t_t": lambda a, b, c: a.t().contiguous().t() + 0,
    "view": lambda a, b, c: a.reshape(12).view(4, 3).reshape(3, 4),
    "flip": lambda a, b, c: a.flip(0),
    "slice_cat": lambda a, b, c: torch.cat([a[:, 2:], a[:, :2]], dim=1),
    "expand": lambda a, b, c: a[:1].expand(3, 4) + a,
    "unsqueeze": lambda a, b, c: (a.unsqueeze(0) * b.unsqueeze(0)).squeeze(0),
    # in-place, also through views
    "add_": _inplace(lambda y, b, c: y.add_(b, alpha=c)),
    "mul_": _inplace(lambda y, b, c: y.mul_(c)),
    "view_mul_": _inplace(lambda y, b, c: y[:, 1:3].mul_(c)),
    "row_copy_": _inplace(lambda y, b, c: y[0].copy_(b[1])),
    "setitem": _inplace(lambda y, b, c: y.__setitem__((slice(None), 0), c)),
    "t_add_": _inplace(lambda y, b, c: y.t()[1].add_(1)),
    "relu_": _inplace(lambda y, b, c: y.relu_()),
    # indexing
    "index_rows": lambda a, b, c: a[IDX],
    "gather": lambda a, b, c: a.gather(1, COLS),
    "index_select": lambda a, b, c: a.index_select(0, IDX) + b,
    "index_add": lambda a, b, c: a.index_add(0, IDX, b, alpha=c),
    "masked_fill": lambda a, b, c: a.masked_fill(b > 0, c),
    # matmul
    "matmul": lambda a, b, c: (a @ b.t()) @ a / 4,
    "bmm": lambda a, b, c: torch.bmm(a[None], b.t()[None])[0] @ b / 8,
    "einsum": lambda a, b, c: torch.einsum("ij,kj->ik", a, b) @ a / 4,
}

STEP = st.tuples(
    st.sampled_from(sorted(OPS) + ["buffer_update", "observe"]),
    st.integers(0, 63), st.integers(0, 63), st.sampled_from([0.5, -1.0, 2.0]),
)


def run_program(steps, w1, w2, buf, observed):
    pool = [w1, w2, buf * 1]
    for name, i, j, c in steps:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        if name == "observe":
            observed.append(a.sum().item())
            continue
        if name == "buffer_update":
            pool.append(_buffer_update(buf, a, c))
            continue
        pool.append(OPS[name](a, b, c))
    loss = sum((p * (k + 1)).sum() for k, p in enumerate(pool) if p.requires_grad)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    return pool


def _leaves(seed):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(3, 4, generator=g).requires_grad_()
    w2 = torch.randn(3, 4, generator=g).requires_grad_()
    buf = torch.randn(3, 4, generator=g)
    return w1, w2, buf


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(STEP, min_size=3, max_size=15), seed=st.integers(0, 3),
       window_size=st.sampled_from([256, 3]))
def test_random_program_matches_eager(steps, seed, window_size):
    w1, w2, buf = _leaves(seed)
    obs_e: list = []
    pool_e = run_program(steps, w1, w2, buf, obs_e)

    v1, v2, vbuf = _leaves(seed)
    obs_a: list = []
    with mode(window_size=window_size):
        pool_a = run_program(steps, v1, v2, vbuf, obs_a)

    assert session.counters().ops_captured > 0
    assert_same([p.detach() for p in pool_e], [p.detach() for p in pool_a])
    assert obs_e == obs_a
    assert_same(buf, vbuf)
    assert_same((w1.grad, w2.grad), (v1.grad, v2.grad))


def test_every_op_once():
    """Each vocabulary op, alone, under the mode (a quick, readable failure per op)."""
    for name in sorted(OPS):
        steps = [(name, 0, 1, 2.0), (name, 3, 0, -1.0)]
        w1, w2, buf = _leaves(0)
        pool_e = run_program(steps, w1, w2, buf, [])
        v1, v2, vbuf = _leaves(0)
        with mode():
            pool_a = run_program(steps, v1, v2, vbuf, [])
        assert_same([p.detach() for p in pool_e], [p.detach() for p in pool_a]), name
        assert_same((w1.grad, w2.grad), (v1.grad, v2.grad)), name
