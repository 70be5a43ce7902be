"""The first iteration runs eagerly (Note [The first iteration runs eagerly]).

The rest of the suite turns the warm-up off (conftest.py); these tests run with the
default, ``warmup=True``, passed explicitly so the suite's environment does not decide.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager.dispatch import LazyTensor
from adaptive_eager.runtime.adapt import DeferPolicy

WARM = dict(backend="eager", warmup=True)


def test_first_iteration_is_eager_and_a_read_starts_capture(monkeypatch):
    """The program's first read, seen again, ends the warm-up; the next iteration settles (Note [The
    first span settles]), the two after measure what its ops cost (Note [Measure before
    capturing]; twice, as the first reads dear: Note [Noise only adds: capture is
    measured twice]) and, ops being dear enough (the threshold set to 0 here), the next
    seeds the meta memo (Note [Seeding the memo from real runs]) and the one after is
    captured."""
    from adaptive_eager.runtime import adapt

    monkeypatch.setattr(adapt, "MEASURE_NS_PER_OP", 0)
    monkeypatch.setattr(adapt, "MEASURE_OPS", 1)
    x = torch.randn(16)
    with ae.adaptive_eager(**WARM):
        mode = ae.session.current_mode()
        kinds = []
        for i in range(2):
            first = (x * 2 + 1).sin()
            kinds.append((type(first), mode._parked))
            before = ae.stats()
            # the first time a boundary, seen once: still warming; the second the same
            # read again: the first iteration ended (Note [The first iteration ends where
            # a boundary recurs])
            value = first.sum().item()
        second = (x * 2 + 1).sin()           # measured: on the stack, passed through
        second_type, parked_second = type(second), mode._parked
        again = second.sum().item()
        third = (x * 2 + 1).sin()            # measured (Note [The first span settles])
        third_type = type(third)
        last = third.sum().item()
        measured_again = type((x * 2 + 1).sin())  # measured a second time
        (x * 2 + 1).sin().sum().item()
        seeding = type((x * 2 + 1).sin())    # passed through, seeding the memo
        (x * 2 + 1).sin().sum().item()
        fourth = (x * 2 + 1).sin()           # captured
        fourth_type = type(fourth)
        fourth.sum().item()
        after = ae.stats()
    assert kinds == [(torch.Tensor, True)] * 2 and before.ops_captured == 0
    assert not before.warmup_ended
    assert second_type is torch.Tensor and not parked_second
    assert third_type is measured_again is seeding is torch.Tensor and fourth_type is LazyTensor and after.ops_captured > 0
    assert after.warmup_ended.startswith("observe:item at ")
    assert "test_warmup.py" in after.warmup_ended
    assert value == again == last == pytest.approx(float((x * 2 + 1).sin().sum()))
    assert "capture started" in ae.report()


def test_tiny_ops_are_measured_and_never_captured(monkeypatch):
    """Note [Measure before capturing]: after the warm-up, ops too cheap for capture to pay
    are passed through and counted, then the mode parks: nothing is captured, the report
    says why, and values equal eager's. The threshold is ten times the real one (ops of 16
    elements take ~10 µs; under CI's load such ops once read above the real 60 µs)."""
    from adaptive_eager.runtime import adapt

    monkeypatch.setattr(adapt, "MEASURE_NS_PER_OP", 10 * adapt.MEASURE_NS_PER_OP)

    x = torch.randn(16)
    ref = [float(((x * i + 1).sin() * 2).sum()) for i in range(60)]
    with ae.adaptive_eager(**WARM):
        got = [((x * i + 1).sin() * 2).sum().item() for i in range(60)]
        mode = ae.session.current_mode()
        parked = mode._parked
    s = ae.stats()
    assert got == ref
    assert parked and s.ops_captured == 0 and s.windows == 0
    assert s.ops_passthrough >= adapt.MEASURE_OPS and s.reads == 60
    phases = [p[0] for p in s.phases.values()]
    assert phases[:4] == ["parked", "warm-up ended", "measuring", "passed through"], phases
    assert "capture cannot pay" in list(s.phases.values())[3][-1]


def _train(model, data, runtime: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, captured_after_first = [], None
    with ae.adaptive_eager(**WARM) if runtime else contextlib.nullcontext():
        for i, (x, y) in enumerate(data):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)               # read after the loop: no sync inside it
            if i == 0:
                mode = ae.session.current_mode()
                parked_after_first = runtime and mode._parked
            if i == 1:  # the same optimizer's step again: the first iteration ended
                captured_after_first = parked_after_first and not mode._parked  # measuring, then capture
        stats = ae.stats()
    return [float(v.detach()) for v in losses], stats, captured_after_first


def test_optimizer_step_ends_the_warmup_and_training_equals_eager(monkeypatch):
    from adaptive_eager.runtime import adapt

    monkeypatch.setattr(adapt, "MEASURE_NS_PER_OP", 0)  # capture after measuring, however cheap
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    ref_model = copy.deepcopy(model)
    # 8 steps: a warm-up of two (Note [The first iteration ends where a boundary recurs]),
    # a settling span, two measures (Note [Noise only adds: capture is measured twice]), a
    # seeding span, then capture
    data = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(8)]
    ref_losses, _, plain = _train(ref_model, data, runtime=False)
    losses, stats, captured = _train(model, data, runtime=True)
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)
    assert not plain
    # AdamW reads its step count (.item()) inside opt.step(): torch's read, not the
    # program's, so the warm-up lasts to the step's end.
    assert stats.warmup_ended.startswith("optimizer step at ")  # the program's opt.step() line
    assert "test_warmup.py" in stats.warmup_ended and "None" not in stats.warmup_ended
    assert captured                           # parked after one step, on the stack after the second
    assert stats.ops_captured > 0


def test_without_adaptive_passthrough_there_is_no_warmup():
    with ae.adaptive_eager(backend="eager", warmup=True, adaptive_passthrough=False):
        y = torch.ones(3) * 2
        assert type(y) is LazyTensor


def test_warmup_off_captures_from_the_first_op():
    with ae.adaptive_eager(backend="eager", warmup=False):
        y = torch.ones(3) * 2
        assert type(y) is LazyTensor


def test_policy_warmup_ends_at_a_probe_when_the_program_never_syncs():
    p = DeferPolicy(warmup=True, probe_every=5)
    answers = [p.should_defer() for _ in range(6)]
    assert answers == [False, False, False, False, True, True]
    assert not p.warming
    assert not DeferPolicy(enabled=False, warmup=True).warming


def test_an_optimizer_born_at_a_freed_ones_address_is_seen_for_the_first_time():
    """Note [The first iteration ends where a boundary recurs]: the policy outlives blocks
    with equal options; a later block's new optimizer at the address of one freed after an
    earlier block was taken as that optimizer's second step (the warm-up ended inside its
    first iteration, which was then measured). It is known by a weak reference now."""
    import gc

    m = torch.nn.Linear(4, 1)

    def one_iteration(opt):
        with ae.adaptive_eager(**WARM):
            opt.zero_grad()
            m(torch.randn(8, 4)).mean().backward()
            opt.step()

    dead = set()  # the addresses of optimizers already stepped once and freed
    for _ in range(200):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        if id(opt) in dead:
            break
        one_iteration(opt)
        assert not ae.stats().warmup_ended
        dead.add(id(opt))
        del opt
        gc.collect()
    else:
        pytest.skip("no optimizer was born at a freed one's address")
    ae.reset_stats()
    one_iteration(opt)
    s = ae.stats()
    assert not s.warmup_ended and s.ops_passthrough == 0, (s.warmup_ended, s.ops_passthrough)


def test_two_optimizers_warm_up_through_the_whole_first_iteration():
    """Note [The first iteration ends where a boundary recurs]: with two optimizers (a
    GAN's discriminator and generator steps) the first step's end is the middle of the
    iteration; the warm-up lasts until the first optimizer steps again, so a run of one
    iteration passes nothing through the mode, and values equal eager's."""
    def gan(steps, ctx):
        torch.manual_seed(0)
        g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt_d, opt_g = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (d, g))
        ends = []
        with ctx:
            mode = ae.session.current_mode()
            for _ in range(steps):
                z = torch.randn(8, 4)
                opt_d.zero_grad()
                d(g(z).detach()).mean().backward()
                opt_d.step()
                opt_g.zero_grad()
                (-d(g(z))).mean().backward()
                opt_g.step()
                ends.append(mode is not None and not mode._parked)
        return [p.detach().clone() for p in (*g.parameters(), *d.parameters())], ends

    ref, _ = gan(3, contextlib.nullcontext())
    one, ends_one = gan(1, ae.adaptive_eager(**WARM))
    s = ae.stats()
    assert not s.warmup_ended and s.ops_passthrough == 0 and s.ops_captured == 0 and ends_one == [False]
    ae.reset_stats()
    out, ends = gan(3, ae.adaptive_eager(**WARM))
    s = ae.stats()
    assert s.warmup_ended.startswith("optimizer step at ") and ends[0] is False and ends[1] is True, (s.warmup_ended, ends)
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
