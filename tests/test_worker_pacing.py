"""Note [The worker runs in slices while the program fills the cores]
(runtime/worker_pacing.py): the compile worker's process group is stopped and continued
while a compile is in flight and the program's threads fill the cores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from adaptive_eager.runtime import compile_worker, worker_pacing
from adaptive_eager.runtime.cache import COMPILED, COMPILING, EAGER_ONLY, RegionEntry
from adaptive_eager.runtime.compiler import CompileService
from adaptive_eager.runtime.counters import Counters
from adaptive_eager.runtime.worker_pacing import WorkerPacer


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def busy_group():
    """A busy process in a process group of its own (as the worker is)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], process_group=0)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_paced_only_where_the_programs_threads_fill_the_cores(monkeypatch):
    assert worker_pacing.contended(2, cores=2) and worker_pacing.contended(1, cores=1)
    assert not worker_pacing.contended(1, cores=2) and not worker_pacing.contended(7, cores=8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert worker_pacing.usable_cores() == 4 and worker_pacing.contended(4)
    # a program busy on every core: a slice; one leaving a core free: the worker runs on
    assert worker_pacing.next_run_s(2.0, 2) == worker_pacing.RUN_S
    assert worker_pacing.next_run_s(1.0, 2) == worker_pacing.FREE_RUN_S
    assert worker_pacing.next_run_s(0.0, 1) == worker_pacing.FREE_RUN_S
    assert worker_pacing.next_run_s(0.9, 1) == worker_pacing.RUN_S
    with pytest.raises(ValueError, match="pgid"):
        WorkerPacer(0, cores=2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_program_gets_the_worker_in_slices_and_it_runs_on_after(busy_group):
    # the program looks busy on its one core (its CPU rate during each pause: 1 core)
    pacer = WorkerPacer(busy_group.pid, cores=1, cpu=time.monotonic)
    time.sleep(0.1)
    c0, t0 = _cpu_s(busy_group.pid), time.monotonic()
    with pacer.pacing():
        time.sleep(1.0)
    wall = time.monotonic() - t0
    share = (_cpu_s(busy_group.pid) - c0) / wall
    nominal = worker_pacing.RUN_S / (worker_pacing.RUN_S + worker_pacing.PAUSE_S)
    assert share < nominal + 0.25, share  # 0.25 nominal; alone it would take a whole core
    assert pacer.paused_s > 0.5 * wall and pacer.pauses >= 10
    time.sleep(0.05)
    assert _state(busy_group.pid) != "T"  # continued at the end of the pacing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_program_leaving_a_core_free_lets_the_worker_run_on(busy_group):
    pacer = WorkerPacer(busy_group.pid, cores=2, cpu=lambda: 0.0)  # an idle program
    t0 = time.monotonic()
    with pacer.pacing():
        time.sleep(1.0)
    wall = time.monotonic() - t0
    # one pause of PAUSE_S per FREE_RUN_S run: about a quarter of the time, never most
    assert 0 < pacer.paused_s < 0.45 * wall
    assert _state(busy_group.pid) != "T"


def test_pacing_a_group_that_is_gone_ends_quietly():
    sent = []

    def gone(pgid, sig):
        sent.append(sig)
        raise ProcessLookupError(pgid)

    with WorkerPacer(12345, cores=1, signal=gone).pacing():
        time.sleep(0.05)
    assert sent and sent[-1] == signal.SIGCONT


def test_a_compiles_timeout_counts_only_the_workers_running_time():
    paused = [0.0]
    svc = CompileService(lambda gm, ex: gm, Counters(), async_=True, timeout_s=1.0,
                         paused=lambda: paused[0])
    e = RegionEntry("k", state=COMPILING)
    e.submitted_at, e.submitted_paused = time.monotonic() - 5.0, 0.0
    paused[0] = 4.5  # held stopped 4.5 of the 5 s: ran 0.5 s
    svc.check_timeout(e)
    assert e.state == COMPILING and 0.4 < svc.running_s(e) < 0.7
    paused[0] = 3.0  # ran 2 s: past the 1 s timeout
    svc.check_timeout(e)
    assert e.state == EAGER_ONLY and "timed out" in e.reason


def test_only_an_asynchronous_service_asks_for_pacing(monkeypatch):
    """The worker is paced only where the program runs on beside the compile: the
    service tells it the program's thread count, 0 when the program waits for it or the
    option pace_compiles is off."""
    seen = []

    def compile_fn(gm, example):
        seen.append(gm.meta.get(compile_worker.PACED_META))
        return gm

    gm_of = lambda: torch.fx.symbolic_trace(lambda x: (x + 1,))  # noqa: E731
    for async_, pace in ((False, True), (True, True), (True, False)):  # pace: option pace_compiles
        svc = CompileService(compile_fn, Counters(), async_=async_, timeout_s=10, pace=pace)
        e = RegionEntry(("k", async_, pace))
        svc.submit(e, lambda: (gm_of(), [torch.zeros(2)]))
        deadline = time.monotonic() + 10
        while e.state == COMPILING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert e.state == COMPILED
    assert seen == [0, torch.get_num_threads(), 0]


@pytest.mark.inductor
def test_a_paced_worker_compile_lands_and_the_report_says_what_pausing_cost(monkeypatch):
    """A real compile in the worker, paced (the program's threads said to fill the
    cores): it lands with eager's values, and the counters keep the time it was held."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from adaptive_eager import reporting, statistics

    monkeypatch.setattr(compile_worker, "contended", lambda threads: True)
    counters = Counters()
    svc = CompileService(compile_worker.compile_in_worker, counters, async_=True, timeout_s=300,
                         pace=True)

    def f(x):
        return ((x.sin() * 2 + 1).relu(),)

    x = torch.randn(1024)
    e = RegionEntry("paced")
    svc.submit(e, lambda: (make_fx(f)(x), [x]))
    deadline = time.monotonic() + 280
    while e.state == COMPILING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert e.state == COMPILED, e.reason
    torch.testing.assert_close(e.fn(x)[0], f(x)[0])
    assert counters.compile_paused_s > 0
    assert 0 < counters.compile_paused_s <= compile_worker.paused_s()
    text = "\n".join(reporting.format_time(statistics.snapshot(counters)))
    assert "worker paused" in text and "held stopped" in text
    proc = compile_worker._WORKER._proc
    assert proc is not None and _state(proc.pid) != "T"
    # a process group of its own: the one the pacer stops, which the terminal's ^C misses
    assert os.getpgid(proc.pid) == proc.pid != os.getpgrp()


def test_pacing_is_an_option_off_by_default():
    from adaptive_eager import config

    assert config.resolve().pace_compiles is False
    assert config.resolve(pace_compiles=True).pace_compiles is True
    assert CompileService(lambda gm, ex: gm, Counters(), async_=True, timeout_s=1).pace is False
