"""Note [Page faults between optimizer steps] (runtime/step_usage.py): the program thread's
page faults between optimizer steps are counted in any phase and told in the report when
they cost a large share of the steps."""

from __future__ import annotations

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.reporting import format_report
from adaptive_eager.runtime import step_usage

linux = pytest.mark.skipif(step_usage.sample() is None, reason="needs RUSAGE_THREAD (Linux)")


@linux
def test_each_step_end_books_the_threads_usage_in_any_phase():
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with ae.adaptive_eager(backend="eager"):  # the default policy: warm-up, then it decides
        for _ in range(6):
            opt.zero_grad()
            m(torch.randn(8, 64)).sum().backward()
            opt.step()
    c = session.counters()
    assert c.steps_sampled == 5                               # from one step end to the next
    with ae.adaptive_eager(backend="eager"):                  # a block counts from its own
        opt.step()                                            # first step end
    assert session.counters().steps_sampled == 5
    assert c.step_wall_s > 0 and c.step_faults >= 0 and c.step_system_s >= 0


@linux
def test_a_step_that_faults_its_buffers_in_each_time_is_named_in_the_report():
    # 8 fresh 64 MiB buffers a step: glibc maps and unmaps each, so each is faulted in again
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    with ae.adaptive_eager(backend="eager"):
        for _ in range(5):
            for _ in range(8):
                torch.ones(1 << 24).sum()
            p.grad = torch.ones(1)
            opt.step()
    c = session.counters()
    assert c.steps_sampled == 4
    assert c.step_faults / c.steps_sampled > 5 * step_usage.FAULTS_PER_STEP
    report = format_report(ae.stats())
    assert "page faults" in report and step_usage.KEEP_MEMORY in report, report


def test_the_line_is_left_out_when_faults_cost_little():
    assert step_usage.report_line(2, 10**6, 5.0, 6.0) is None            # too few steps
    assert step_usage.report_line(100, 50_000, 0.1, 10.0) is None        # few faults a step
    assert step_usage.report_line(100, 500_000, 0.5, 10.0) is None       # 5% of the time
    assert "5,000 a step" in step_usage.report_line(100, 500_000, 5.0, 10.0)


@linux
def test_steps_that_end_with_a_compile_in_flight_are_told_apart_in_the_report():
    """The report says what waiting for a compile cost: the steps that ended with one in
    flight, against the others."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    c = session.counters()
    with ae.adaptive_eager(backend="eager"):
        for i in range(8):
            c.compiles_in_flight = 1 if 3 <= i < 6 else 0  # as the compile service counts
            p.grad = torch.ones(1)
            opt.step()
        c.compiles_in_flight = 0
    assert c.steps_sampled == 7 and c.steps_waiting == 3
    assert 0 < c.step_waiting_wall_s < c.step_wall_s
    report = format_report(ae.stats())
    assert "while compiling" in report and "3 of 7 steps" in report, report
    assert step_usage.waiting_line(7, 1.0, 0, 0.0) is None   # none waited
    assert step_usage.waiting_line(3, 1.0, 3, 1.0) is None   # no others to compare
