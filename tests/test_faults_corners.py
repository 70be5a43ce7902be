"""The last corners of the fault-injection suite (issue 21): memory exported before the
runtime existed, a block left in another thread, bad switches in the environment, and
the parked-op estimate in ``stats()``.

Each test runs its program eagerly and under adaptive eager with capture forced
(``helpers.mode``) and compares what the program sees; the ones that need a fresh
interpreter (nothing installed yet, or an environment of their own) run in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch.nn as nn

from adaptive_eager import session
from adaptive_eager.dispatch.exported import exported_input

from helpers import mode


def _run_script(body: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with this one's search path (and ``env``)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=timeout, env=full)


# -- item 1: numpy views made before the runtime existed ----------------------------------

_BEFORE_IMPORT = """
    import json, torch, numpy as np

    def aliases():
        w = torch.zeros(4096)
        arr = w.numpy()                                   # before adaptive_eager exists
        v = torch.zeros(64)
        view = v.numpy()[8:16]                            # a view of the array only
        return w, arr, v, view

    def program(w, arr, v, view):
        seen = []
        for _ in range(3):
            w.add_(1.0)
            v.mul_(2.0).add_(1.0)
            seen.append([float(arr.sum()), float(view.sum())])
        arr[:] = 5.0                                      # a write through the alias
        seen.append(float((w * 2).sum()))
        return seen

    eager_args, block_args = aliases(), aliases()
    u = torch.zeros(4)
    u.numpy()                                             # an array that died at once
    import adaptive_eager as ae
    from adaptive_eager.dispatch.exported import exported_input
    expected = program(*eager_args)
    with ae.adaptive_eager(backend="eager", adaptive_passthrough=False):
        actual = program(*block_args)
    print(json.dumps([expected, actual, exported_input(u, torch._C._storage_id(u))]))
"""


def test_numpy_views_made_before_import_see_the_blocks_writes():
    proc = _run_script(_BEFORE_IMPORT)
    assert proc.returncode == 0, proc.stderr
    expected, actual, dead_alias_exported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert expected[0] == [4096.0, 8.0]
    assert actual == expected
    assert not dead_alias_exported


def test_a_numpy_view_that_died_before_the_block_costs_nothing():
    w = torch.zeros(4)
    tmp = w.detach().numpy()
    del tmp                                               # the array's base went with it
    w2 = torch.zeros(4)
    w2.numpy()                                            # made and dropped at once
    for t in (w, w2):
        assert not exported_input(t, torch._C._storage_id(t))


def _resumed_adamw(tmp_path):
    """A Linear and its AdamW whose state was loaded from a checkpoint (storages
    ``torch.load`` made: not resizable)."""
    torch.manual_seed(0)
    m = nn.Linear(8, 8)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    opt.load_state_dict(torch.load(tmp_path / "opt.pt"))
    return m, opt


def test_a_resumed_optimizer_state_is_not_taken_for_exported_memory(tmp_path):
    m, opt = _resumed_adamw(tmp_path)
    state = opt.state[m.weight]["exp_avg"]
    assert not state.untyped_storage().resizable()
    assert not exported_input(state, torch._C._storage_id(state))
    before = session.counters().flushes.get("exported_memory", 0)
    with mode():
        for _ in range(3):
            opt.zero_grad()
            m(torch.randn(4, 8)).sum().backward()
            opt.step()
        m.weight.sum().item()
    assert session.counters().flushes.get("exported_memory", 0) == before


def test_a_resumed_state_is_not_taken_for_exported_memory_while_its_step_compiles(tmp_path):
    # the step's compile holds aliases of the params and state until it finishes
    # (Note [The runtime's own aliases are not exports]): a slow compile must not make
    # memory torch.load made look exported (before: two exported_memory flushes a step)
    gate = threading.Event()

    def slow(gm, example_inputs):
        gate.wait(20)
        return gm

    m, opt = _resumed_adamw(tmp_path)
    try:
        with mode(backend=slow, async_compile=True):
            for _ in range(3):
                opt.zero_grad()
                m(torch.randn(4, 8)).sum().backward()
                opt.step()
            assert session.counters().compiles_in_flight == 1       # still compiling
            m.weight.sum().item()
    finally:
        gate.set()
    assert session.counters().flushes.get("exported_memory", 0) == 0


def test_from_numpy_after_the_first_block_is_exported():
    import numpy as np

    with mode():
        pass                                              # the wrappers are installed
    src = np.zeros(8, dtype=np.float32)
    f = torch.from_numpy(src)
    buf = bytearray(16)
    g = torch.frombuffer(buf, dtype=torch.float32)
    with mode():
        for i in range(1, 4):
            f.add_(1.0)
            g.add_(2.0)
            assert float(src.sum()) == 8.0 * i                # numpy reads, no torch call
            assert float(np.frombuffer(bytes(buf), dtype=np.float32).sum()) == 8.0 * i


def test_arrays_made_between_blocks_are_exported_while_they_live():
    with mode():
        pass                                              # the wrappers are installed
    w = torch.zeros(4)
    arr = w.detach().numpy()                              # between blocks
    with mode():
        w.add_(1.0)
        assert arr.tolist() == [1.0] * 4                  # read through the alias, no torch call
        w.add_(1.0)
        assert arr.tolist() == [2.0] * 4
    del arr
    before = session.counters().flushes.get("exported_memory", 0)
    with mode():
        w.add_(1.0)
        w.add_(1.0)                                       # the array died: deferred again
        assert w.tolist() == [4.0] * 4
    assert session.counters().flushes.get("exported_memory", 0) == before


def test_ordinary_parameters_are_not_taken_for_exported_memory():
    torch.manual_seed(0)
    m = nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for p in m.parameters():
        assert not exported_input(p, torch._C._storage_id(p))
    before = session.counters().flushes.get("exported_memory", 0)
    with mode():
        for _ in range(3):
            m(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        m.weight.sum().item()
    assert session.counters().flushes.get("exported_memory", 0) == before


# -- item 2: a block exited in another thread ---------------------------------------------

def test_exit_in_another_thread_runs_the_pending_work_and_unstacks_at_the_next_read():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from adaptive_eager.dispatch import LazyTensor

    ctx = mode()
    ctx.__enter__()
    x = torch.ones(3) * 2                                 # pending when the block is closed
    errors = []

    def worker():
        try:
            ctx.__exit__(None, None, None)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=worker, name="closer")
    t.start()
    t.join()
    assert len(errors) == 1 and "'MainThread'" in errors[0] and "'closer'" in errors[0]
    assert x._ae_real is not None                         # the closing thread ran the window
    y = x + 1                                             # the next op: plain eager
    assert type(y) is torch.Tensor and y.tolist() == [3.0, 3.0, 3.0]
    assert _get_current_dispatch_mode_stack() == []       # the read parked the closed mode
    assert session.current_mode() is None                 # the next use of the runtime left it
    with mode():                                          # and the thread's next block works
        z = (x * 3).sum()
        assert z.item() == 18.0
    assert _get_current_dispatch_mode_stack() == []
    assert type(z) is torch.Tensor


# -- item 3: bad switches in the environment ----------------------------------------------

@pytest.mark.parametrize("var,value", [("ADAPTIVE_EAGER", "garbage"), ("ADAPTIVE_EAGER_LOG", "bogus"),
                                       ("ADAPTIVE_EAGER_NEURON_SIM", "maybe")])
def test_bad_switches_that_are_not_options_warn_once_and_blocks_run(monkeypatch, caplog, var, value):
    from adaptive_eager import _logging

    monkeypatch.setenv(var, value)
    monkeypatch.setattr(_logging, "_WARNED", set())       # a fresh process's "once"
    with caplog.at_level("WARNING", logger="adaptive_eager"):
        for _ in range(3):
            with mode():
                y = torch.ones(3) * 2
                assert y.tolist() == [2.0, 2.0, 2.0]
    warned = [r.getMessage() for r in caplog.records if var + "=" in r.getMessage()]
    assert len(warned) == 1 and repr(value) in warned[0], caplog.text


def test_a_bad_option_in_the_environment_still_stops_the_block(monkeypatch):
    import adaptive_eager as ae

    monkeypatch.setenv("ADAPTIVE_EAGER_WINDOW_SIZE", "abc")
    with pytest.raises(ae.ConfigError, match="ADAPTIVE_EAGER_WINDOW_SIZE"):
        with mode():
            pass


def test_a_bad_opt_in_warns_once_from_import_to_the_last_block():
    env = {k: v for k, v in os.environ.items() if (not k.startswith("ADAPTIVE_EAGER") or k == "ADAPTIVE_EAGER_CACHE_DIR")}
    env["ADAPTIVE_EAGER"] = "garbage"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, adaptive_eager as ae
        for _ in range(2):
            with ae.adaptive_eager(backend="eager"):
                print((torch.ones(2) * 2).tolist())
        print(ae.is_enabled())
    """)], capture_output=True, text=True, timeout=120,
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[2.0,", "2.0]", "[2.0,", "2.0]", "False"]
    assert proc.stderr.count("ADAPTIVE_EAGER='garbage'") == 1, proc.stderr


# -- item 5: the parked-op estimate in stats() and its JSON --------------------------------

def test_stats_and_json_carry_the_parked_op_estimate_the_report_shows():
    from adaptive_eager import Stats

    from test_report import _parked_report

    s, text = _parked_report(40)
    assert s.optimizer_steps_parked >= 20                 # the run parked (test_report.py)
    assert s.ops_parked_estimate is not None and s.ops_parked_estimate > 0
    assert f"while parked: ~{s.ops_parked_estimate:,}, {s.ops_parked_estimate_how}" in text
    data = json.loads(s.to_json())
    assert data["ops_parked_estimate"] == s.ops_parked_estimate
    assert data["ops_parked_estimate_how"].startswith("estimated: ")
    idle = json.loads(Stats().to_json())
    assert idle["ops_parked_estimate"] == 0
    assert idle["ops_parked_estimate_how"] == "no safe point was passed while parked"
    unknown = Stats(reads=5, reads_parked=5)              # parked with no optimizer step
    assert unknown.ops_parked_estimate is None and "no optimizer step" in unknown.ops_parked_estimate_how


def test_dataloader_worker_batches_are_not_taken_for_exported_memory():
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.randn(16, 4)
    loader = DataLoader(TensorDataset(data), batch_size=4, num_workers=1)
    (batch,) = next(iter(loader))                         # shared, not resizable
    assert not batch.untyped_storage().resizable() and batch.untyped_storage().is_shared()
    assert not exported_input(batch, torch._C._storage_id(batch))
    expected = (data[:4] * 2 + 1).sum().item()
    captured = session.counters().ops_captured
    with mode():
        assert (batch * 2 + 1).sum().item() == expected
    assert session.counters().ops_captured - captured == 3   # mul, add, sum: none ran at once


# -- Note [No compile starts at a fork or at exit] (runtime/holds.py) -----------------------
_FORCED_SYNC = {"ADAPTIVE_EAGER": "1", "ADAPTIVE_EAGER_ADAPTIVE_PASSTHROUGH": "0",
                "ADAPTIVE_EAGER_BACKEND": "aot_eager", "ADAPTIVE_EAGER_COMPILE_AFTER": "1",
                "ADAPTIVE_EAGER_ASYNC_COMPILE": "0", "ADAPTIVE_EAGER_MIN_REGION_WORK": "0"}


def test_a_fork_flushes_the_window_without_compiling_it():
    """The window pending at a fork runs at the fork's flush, but nothing compiles there:
    before, a synchronous compile ran inside the fork's before-hooks (its imports
    registered filelock's fork hooks mid-fork: a KeyError traceback in the parent). The
    child reads the parent's values."""
    r = _run_script("""
        import torch, torch.multiprocessing as mp
        from adaptive_eager import session
        def child(q, t):
            q.put((t * 2 + 1).sum().item())
        if __name__ == "__main__":
            torch.manual_seed(0)
            w = torch.randn(100)
            for i in range(5):
                w = (w * 1.01 + 0.1).tanh()
            before = session.counters().regions_compiled
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q, w))
            p.start(); got = q.get(); p.join()
            print(before, session.counters().regions_compiled, p.exitcode, round(got, 3), round((w * 2 + 1).sum().item(), 3))
    """, env=_FORCED_SYNC)
    assert r.returncode == 0, r.stderr[-3000:]
    before, after, exitcode, child, parent = r.stdout.split()[-5:]
    assert after == before and exitcode == "0" and child == parent, (r.stdout, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_the_flush_at_exit_compiles_nothing():
    """A program that ends (sys.exit) with a recurring window pending: its last flush runs
    the window; before, a synchronous compile started there and failed ("can't register
    atexit after shutdown", logged as a region running eagerly from now on)."""
    r = _run_script("""
        import atexit, sys, torch
        torch.manual_seed(0)
        acc = torch.zeros(10)
        atexit.register(lambda: print("at exit", round(acc.sum().item(), 4)))
        for i in range(50):
            acc.add_(torch.randn(10).abs())
            if i == 30:
                sys.exit(0)
    """, env=_FORCED_SYNC)
    torch.manual_seed(0)
    acc = torch.zeros(10)
    for i in range(31):
        acc.add_(torch.randn(10).abs())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == str(round(acc.sum().item(), 4)), (r.stdout, r.stderr[-3000:])
    assert "compile failed" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
