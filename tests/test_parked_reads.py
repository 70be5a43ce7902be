"""A parked program's safe points (Note [A parked read costs a counter], Note [Probes come
between optimizer steps], dispatch/parking.py): reads, backward() and optimizer steps'
ends only count while nothing is due, and count exactly what the general path counts."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import observe, parking
from adaptive_eager.runtime import adapt


def _parked_inference(m: torch.nn.Module):
    """Run ``m`` until the default policy parks; the mode."""
    mode = session.current_mode()
    for _ in range(40):
        (m(torch.randn(4, 8)).relu() * 2 + 1).sum().item()
        if mode._parked and mode.policy.phase is adapt.Phase.PASSING:
            return mode
    raise AssertionError(f"never parked: {mode.policy.phase}")


def test_a_parked_read_counts_what_the_general_path_counts_without_it(monkeypatch):
    m = torch.nn.Linear(8, 8)
    general = []
    real_safe_point = observe.safe_point
    monkeypatch.setattr(observe, "safe_point", lambda mode, at: (general.append(at), real_safe_point(mode, at)))
    t = torch.tensor([2.5])
    with torch.no_grad(), ae.adaptive_eager(backend="eager"):
        mode = _parked_inference(m)
        c, policy = mode.counters, mode.policy
        reads, parked_reads, calls = c.reads, c.reads_parked, policy._calls
        general.clear()
        got = [t.item(), bool(t), float(t), int(t), t.cpu().tolist()]
        assert got == [2.5, True, 2.5, 2, [2.5]]
        # six reads (cpu() and tolist() are two) counted as reads of a parked mode, each
        # a read's worth towards the next probe; tolist (a copying read) through the
        # general path, the others not
        assert (c.reads - reads, c.reads_parked - parked_reads) == (6, 6)
        assert policy._calls - calls == 6 * adapt.READ_WEIGHT
        assert len(general) == 1 and mode._parked
        # a probe due: the read takes the general path, which brings the mode back
        policy._calls = policy.probe_every - 1
        policy._phase_ns = 0  # Note [Probes are paid for]: due now
        t.item()
        assert general[-1] is parking.AT_READ
        assert not mode._parked and _get_current_dispatch_mode_stack() == [mode]


def _lbfgs(probe_inside: list | None = None):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    opt = torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=3)
    losses = []
    recording = False

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        losses.append(loss.item())
        loss.backward()
        if probe_inside is not None and recording:
            probe_inside.append(session.current_mode()._parked)
        return loss

    for i in range(12):
        if probe_inside is not None and i == 8:
            mode = session.current_mode()
            assert mode._parked
            mode.policy._calls = mode.policy.probe_every - 1  # a probe due from now ...
            mode.policy._phase_ns = 0
            recording = True
        opt.step(closure)
        if recording:
            recording = False
            probe_inside.append(("after the step", session.current_mode()._parked))
    return losses, [p.detach().clone() for p in m.parameters()]


def test_backward_inside_an_optimizer_step_is_no_probe_point():
    """LBFGS runs forward and backward inside its step (the closure): a probe due there
    waits for the step's end, so no backward pass goes through the mode while settling."""
    ref_losses, ref_params = _lbfgs()
    seen: list = []
    with ae.adaptive_eager(backend="eager"):
        losses, params = _lbfgs(seen)
    assert losses == ref_losses
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)
    # ... parked through every closure's read and backward of that step, back at its end
    assert seen[:-1] and all(seen[:-1]), seen
    assert seen[-1] == ("after the step", False)


def test_a_step_left_open_by_a_raise_stops_counting_as_open_at_block_exit():
    m = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def closure():
        raise ValueError("closure failed")

    with pytest.raises(ValueError, match="closure failed"):
        with ae.adaptive_eager(backend="eager"):
            opt.step(closure)  # its post hook never runs
    assert parking.SAFE_POINTS is not None and not parking.SAFE_POINTS.in_step()
    assert opt is not None  # still alive: the weak set alone would have kept it open
