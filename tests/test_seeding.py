"""Note [Seeding the memo from real runs] (dispatch/meta.py): ops passed through in the span
after a measure decides to capture seed the meta memo, so the first capture runs no meta kernel for them;
seeded specs are what meta (or the kernel) says; data-dependent ops are never seeded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager.dispatch import recorder as recorder_mod
from adaptive_eager.dispatch.meta import MetaMemo, meta_execute
from adaptive_eager.dispatch.optable import OpTable
from adaptive_eager.dispatch.recorder import Recorder
from adaptive_eager.runtime import adapt

aten = torch.ops.aten


def _step(x, w, b):
    return F.gelu(torch.addmm(b, x, w)).softmax(-1).sum()


def test_the_settling_span_seeds_the_first_capture(monkeypatch):
    monkeypatch.setattr(adapt, "MEASURE_NS_PER_OP", 0)  # capture after measuring
    monkeypatch.setattr(adapt, "MEASURE_OPS", 1)
    metas = []
    real = recorder_mod.meta_execute
    monkeypatch.setattr(recorder_mod, "meta_execute",
                        lambda func, *a: metas.append(func) or real(func, *a))
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)
    ref = [_step(x * (i + 0.5), w, b).item() for i in range(7)]
    captured = []
    with ae.adaptive_eager(backend="eager", warmup=True):
        got = []
        for i in range(7):
            y = _step(x * (i + 0.5), w, b)
            captured.append(type(y) is ae.dispatch.LazyTensor)
            got.append(y.item())
    assert got == ref
    # warm-up (to the read's second sighting: Note [The first iteration ends where a
    # boundary recurs]), settling, measuring, seeding: passed through; then captured
    assert captured[:5] == [False] * 5 and any(captured[5:]), captured
    assert ae.stats().ops_captured > 0
    # every op of the step ran for real while seeding: capture ran no meta kernel
    assert metas == [], metas


_CASES = [
    (aten.add.Tensor, lambda: (torch.randn(4, 1), torch.randn(1, 5)), {}),
    (aten.mul.Tensor, lambda: (torch.randn(3, 4).t(), 2.5), {}),
    (aten.addmm.default, lambda: (torch.randn(6), torch.randn(5, 4), torch.randn(6, 4).t()), {}),
    (aten.gelu.default, lambda: (torch.randn(2, 3, 4).permute(2, 0, 1),), {"approximate": "tanh"}),
    (aten.sum.dim_IntList, lambda: (torch.randn(3, 4, 5), [1], True), {}),
    (aten._softmax.default, lambda: (torch.randn(3, 7), -1, False), {}),
    (aten.add_.Tensor, lambda: (torch.randn(4, 4)[1:], torch.randn(4)), {}),
    (aten.cat.default, lambda: ([torch.randn(2, 3), torch.randn(4, 3)], 0), {}),
    (aten.full.default, lambda: ([2, 3], 1.5), {"dtype": None, "device": torch.device("cpu"),
                                              "pin_memory": False}),
    (aten._to_copy.default, lambda: (torch.randn(3, 2).t(),), {"dtype": torch.float64}),
    (aten.convolution.default, lambda: (torch.randn(1, 3, 6, 6).to(memory_format=torch.channels_last),
                                        torch.randn(4, 3, 3, 3), None, [1, 1], [0, 0], [1, 1],
                                        False, [0, 0], 1), {}),
]


@pytest.mark.parametrize("func,make,kwargs", _CASES, ids=[str(c[0]) for c in _CASES])
def test_a_seeded_result_is_what_a_capture_would_compute(func, make, kwargs):
    """The seeded key is the key capture builds (a memo miss finds the seed, and meta is not
    run), and its specs are meta's (or, where they differ, the kernel's: Note [Layouts only
    the kernel knows])."""
    torch.manual_seed(0)
    args = make()
    table = OpTable()
    memo = MetaMemo(64)
    rec = Recorder(torch.device("cpu"), memo, owner=None)
    out = func(*args, **kwargs)
    rec.seed(func, table.traits(func), args, kwargs, out)
    assert len(memo.seeded) == 1
    seeded = next(iter(memo.seeded.values()))
    # meta's answer for the same call, through the recorder's own encoding
    rec2 = Recorder(torch.device("cpu"), MetaMemo(64), owner=None)
    enc, key = [], [func]
    rec2._encode(args, False, enc, key)
    enc_kwargs = {}
    for k, v in kwargs.items():
        e = []
        rec2._encode((v,), False, e, key)
        enc_kwargs[k] = e[0]
    meta = meta_execute(func, tuple(enc), enc_kwargs, rec2.specs, torch.device("cpu"))
    assert seeded.structure == meta.structure
    real = (out,) if isinstance(out, torch.Tensor) else tuple(out or ())
    for s, m, t in zip(seeded.specs, meta.specs, real):
        assert (s.shape, s.dtype, s.storage_offset) == (m.shape, m.dtype, m.storage_offset)
        assert s.stride == tuple(t.stride())  # the kernel's layout, which the flush makes
    # and recording the same call takes the seed (no meta run)
    calls = []
    real_meta = recorder_mod.meta_execute
    try:
        recorder_mod.meta_execute = lambda *a: calls.append(a) or real_meta(*a)
        rec.record(func, table.traits(func), args, kwargs)
    finally:
        recorder_mod.meta_execute = real_meta
    assert calls == [] and not memo.seeded


@pytest.mark.parametrize("func,make", [
    (aten.nonzero.default, lambda: (torch.tensor([0.0, 1.0, 2.0]),)),
    (aten.masked_select.default, lambda: (torch.randn(4), torch.tensor([True, False, True, True]))),
    (aten.unique_consecutive.default, lambda: (torch.tensor([1, 1, 2]),)),
    (aten.normal.Tensor_float, lambda: (torch.zeros(3),)),          # random
    (aten.transpose.int, lambda: (torch.randn(2, 3), 0, 1)),        # a view
])
def test_data_dependent_random_and_view_ops_are_not_seeded(func, make):
    args = make()
    memo = MetaMemo(64)
    rec = Recorder(torch.device("cpu"), memo, owner=None)
    rec.seed(func, OpTable().traits(func), args, {}, func(*args))
    assert not memo.seeded


def test_seeds_are_bounded_and_cleared_with_the_memo():
    memo = MetaMemo(4)
    rec = Recorder(torch.device("cpu"), memo, owner=None)
    table = OpTable()
    for n in range(1, 12):
        x = torch.randn(n)
        rec.seed(aten.neg.default, table.traits(aten.neg.default), (x,), {}, -x)
    assert len(memo.seeded) <= memo.max_seeded == 4
    memo.clear()
    assert not memo.seeded


def test_a_program_that_parks_seeds_nothing(monkeypatch):
    """Seeding comes after a decision to capture: ops too cheap to capture are measured,
    the mode parks, and no seed was paid for."""
    monkeypatch.setattr(adapt, "MEASURE_NS_PER_OP", 10**12)  # nothing is worth capturing
    monkeypatch.setattr(adapt, "MEASURE_OPS", 1)
    x = torch.randn(16)
    with ae.adaptive_eager(backend="eager", warmup=True):
        mode = ae.session.current_mode()
        for i in range(6):
            ((x * i + 1).sin() * 2).sum().item()
        parked = mode._parked
        seeded = len(mode.memo.seeded)
    assert parked and seeded == 0
    assert ae.stats().ops_captured == 0
