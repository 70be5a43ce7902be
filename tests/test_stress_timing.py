"""Values never depend on timing (issue 21 item 4; Note [Timing decides speed, never
values] in runtime/windows.py).

The runtime decides from timings which windows to capture, which to plan, when a compile
is given up and when a mode parks. Each decision may change how a program's ops are run
(passed through, replayed op by op, replayed by generated code, called compiled) but never
what they compute. These programs run beside a process that burns a core, and with every
timing threshold forced to one side and then the other, and must equal eager bit for bit
(backends that do not compile: ``eager``, and ones that stall or land late).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn as nn

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.runtime import adapt, verdicts, windows

from helpers import assert_same


@pytest.fixture(scope="module")
def busy_core():
    """A process that burns a core while this module's tests run (killed by its pid)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# Each side of every timing threshold: "capture" makes every measure say capturing pays
# and every window worth compiling; "park" makes every measure say it cannot pay.
_SIDES = {
    "capture": {(windows, "CAPTURE_NS_PER_OP"): 0, (adapt, "MEASURE_NS_PER_OP"): 0,
                (adapt, "LAUNCH_MEASURE_NS_PER_OP"): 0, (verdicts, "CANNOT_PAY_EVIDENCE_NS"): 10**18},
    "park": {(windows, "CAPTURE_NS_PER_OP"): 10**12, (adapt, "MEASURE_NS_PER_OP"): 10**15,
             (adapt, "LAUNCH_MEASURE_NS_PER_OP"): 10**15, (verdicts, "CANNOT_PAY_EVIDENCE_NS"): 0},
    "as is": {},
}


@pytest.fixture(params=sorted(_SIDES))
def thresholds(request, monkeypatch):
    for (module, name), value in _SIDES[request.param].items():
        monkeypatch.setattr(module, name, value)
    return request.param


def _random_cumsum(steps: int = 12) -> list:
    out = []
    for i in range(steps):
        torch.manual_seed(i)
        y = torch.randn(4096, dtype=torch.float64).exp().cumsum(0)
        out.append(y.sum().item())                        # a read every step
        out.append(y.clone())
    return out


def _pointwise_sum(x: torch.Tensor, steps: int = 8) -> list:
    return [((x * 2 + 1).sin() * x).sum().item() for _ in range(steps)]


def _training(steps: int = 6) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = [torch.randn(32, 64) for _ in range(steps)]
    losses = []
    for x in data:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses + [p.detach().clone() for p in model.parameters()]


class _LateBackend:
    """A compiler that takes ``delay_s`` (or stalls until released) and then returns the
    graph itself: its compiles land at any moment of the program, or past the timeout."""

    def __init__(self, delay_s: float | None):
        self.delay_s = delay_s
        self.release = threading.Event()

    def __call__(self, gm, example_inputs):
        if self.delay_s is None:
            self.release.wait(30)
        else:
            time.sleep(self.delay_s)
        return gm


_OPTION_SETS = {
    "captured": dict(adaptive_passthrough=False),
    "adaptive": dict(),
    "compile at once": dict(adaptive_passthrough=False, compile_after=1, min_region_work=0),
}


@pytest.mark.parametrize("options", sorted(_OPTION_SETS))
@pytest.mark.parametrize("program", ["random_cumsum", "training"])
def test_values_equal_eager_under_load_with_thresholds_forced(busy_core, thresholds, options, program):
    fn = {"random_cumsum": _random_cumsum, "training": _training}[program]
    expected = fn()
    session.clear_sessions()
    with ae.adaptive_eager(backend="eager", **_OPTION_SETS[options]):
        actual = fn()
    assert_same(expected, actual, exact=True)


@pytest.mark.parametrize("delay_s", [None, 0.0, 0.03])
@pytest.mark.parametrize("async_compile", [True, False])
def test_compiles_that_stall_or_land_late_change_no_value(busy_core, thresholds, delay_s, async_compile):
    x = torch.randn(64, 64)
    expected = _pointwise_sum(x)
    backend = _LateBackend(delay_s)
    try:
        with ae.adaptive_eager(backend=backend, compile_after=1, min_region_work=0,
                               async_compile=async_compile, compile_timeout_s=0.05,
                               adaptive_passthrough=False):
            actual = _pointwise_sum(x)
    finally:
        backend.release.set()
    assert actual == expected
