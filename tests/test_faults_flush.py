"""Faults around flushes (issue 15): caught errors, global state, interrupts, threads,
unbounded caches, bad configuration.

Each test compares with plain eager where a value is involved; "neuron" runs on the
emulated device (conftest enables it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import adaptive_eager as ae
from adaptive_eager import config, session
from adaptive_eager.dispatch import DeferredError, LazyTensor
from adaptive_eager.dispatch.meta import MetaMemo
from adaptive_eager.fusion.ir import TensorSpec
from adaptive_eager.runtime import executor as executor_mod
from tests.helpers import mode

DEVICES = ["cpu", "neuron"]


def _no_modes_left() -> None:
    assert session.current_mode() is None
    assert _get_current_dispatch_mode_stack() == []
    assert not torch._C._is_torch_function_mode_enabled()


def _both(fn, device):
    """``fn(device)`` eagerly, then under forced capture on ``device``."""
    expected = fn(device)
    with mode(device=device):
        actual = fn(device)
    return expected, actual


def _program(x: torch.Tensor) -> torch.Tensor:
    return ((x * 2 + 1).sin() * x).sum(dim=0)


def _compiled(backend) -> dict:
    """The first window compiles and its artifact is called at once, unchecked."""
    return dict(backend=backend, compile_after=1, async_compile=False, min_region_work=0,
                verify_compiled=False)


# -- item 3: an exception the program catches loses no later work -----------------------

def _caught(kind: str):
    def program(device):
        p = torch.zeros(3, device=device)
        a = torch.arange(3, device=device)
        z = torch.zeros(3, dtype=torch.long, device=device)
        caught = []
        for _ in range(3):
            try:
                if kind == "int_mul_float":
                    a.mul_(0.5)
                elif kind == "int_add_complex":
                    a.add_(1j)
                elif kind == "silu_int":
                    torch.nn.functional.silu(a, inplace=True)
                elif kind == "floordiv_zeros":
                    _ = a // z
                elif kind == "remainder_zeros":
                    _ = a % z
                elif kind == "rounding_div_zeros":
                    _ = torch.div(a, z, rounding_mode="floor")
                elif kind == "scalar_remainder_zeros":
                    _ = 5 % z
                elif kind == "inplace_floordiv_zeros":
                    a //= z
                elif kind == "floordiv_zero_scalar":
                    _ = a // 0
                elif kind == "shape":
                    _ = torch.ones(3, device=device) + torch.ones(4, device=device)
            except RuntimeError as e:
                caught.append(str(e).split("\n")[0][:40])
            p.add_(1)
        return p.cpu().tolist(), a.cpu().tolist(), caught
    return program


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", [
    "int_mul_float", "int_add_complex", "silu_int", "floordiv_zeros", "remainder_zeros",
    "rounding_div_zeros", "scalar_remainder_zeros", "inplace_floordiv_zeros",
    "floordiv_zero_scalar", "shape",
])
def test_caught_error_is_raised_at_the_op_and_later_work_is_kept(kind, device):
    expected, actual = _both(_caught(kind), device)
    assert len(expected[2]) == 3
    assert actual == expected


def test_integer_division_by_a_tensor_syncs_float_division_does_not():
    a = torch.arange(1, 7)
    d = torch.full((6,), 2)
    ae.reset_stats()
    with mode():
        q = (a + 0) // d
        assert type(q) is not LazyTensor      # ran at once
        f = a.float() / d.float()
        assert type(f) is LazyTensor          # deferred
        r = (f * 2).sum()
        r.item()
    assert q.tolist() == (a // d).tolist()
    flushes = ae.stats().flushes
    assert flushes.get("integer_division") == 1, flushes
    assert set(flushes) == {"integer_division", "item"}, flushes


def test_error_found_only_at_the_flush_keeps_the_independent_work():
    # An out-of-range index depends on values: the window fails at its flush. What
    # does not depend on the failed op still runs; what does raises on reading.
    x = torch.arange(4.0)
    bad = torch.tensor([7])
    p = torch.zeros(3)
    with mode():
        y = x.index_select(0, bad)        # fails when run
        z = y * 2                         # depends on it
        for _ in range(3):
            p.add_(1)                     # does not
        w = torch.ones(3) * 5
        with pytest.raises(IndexError, match="index out of range"):
            p.tolist()                    # eager's error type, at the first read
        assert p.tolist() == [3.0, 3.0, 3.0]
        assert w.tolist() == [5.0, 5.0, 5.0]
        for h in (y, z):
            with pytest.raises(DeferredError, match="index out of range"):
                h.tolist()
        assert (torch.ones(2) + 1).tolist() == [2.0, 2.0]   # the runtime still works
    _no_modes_left()


def test_a_failing_partial_flush_fails_what_reads_it_and_keeps_the_rest():
    x = torch.arange(4.0)
    bad = torch.tensor([9])
    p = torch.zeros(2)
    with mode():
        big = torch.ones(64) * 3
        s = x.index_select(0, bad).sum()    # a scalar: read through a partial flush
        t = s * 2                           # the rest of the window reads the slice
        p.add_(1)
        with pytest.raises(IndexError):
            s.item()
        with pytest.raises(DeferredError):
            t.item()
        assert p.tolist() == [1.0, 1.0]
        assert big.sum().item() == 192.0
    _no_modes_left()


def test_a_compiled_region_that_raises_runs_eagerly_without_an_error():
    calls = {"n": 0}

    def flaky_backend(gm, example_inputs):
        def run(*args):
            calls["n"] += 1
            if calls["n"] > 1:
                raise RuntimeError("compiled code failed")
            return gm(*args)
        return run

    xs = [torch.randn(8, 4) for _ in range(3)]
    expected = [_program(x) for x in xs]
    with mode(**_compiled(flaky_backend)):
        for _ in range(3):
            outs = [_program(x) for x in xs]
            ae.sync()
    assert calls["n"] > 1
    for o, e in zip(outs, expected):
        torch.testing.assert_close(o, e)


# -- item 4 and 5: global state that kernels read ----------------------------------------

def _default_dtype_program(device):
    a = torch.ones(64, device=device)
    b = torch.full((64,), 1 / 3, device=device)
    c = torch.arange(0.0, 64.0, device=device)
    d = torch.arange(4, device=device) * 0.5          # type promotion reads the default
    e = torch.arange(4, device=device).sin()
    torch.set_default_dtype(torch.float64)
    try:
        f = torch.ones(3, device=device)
        g = torch.arange(4, device=device) * 0.5
    finally:
        torch.set_default_dtype(torch.float32)
    return [(t.dtype, t.cpu().tolist()) for t in (a, b, c, d, e, f, g)]


@pytest.mark.parametrize("device", DEVICES)
def test_default_dtype_change_does_not_reach_pending_ops(device):
    expected, actual = _both(_default_dtype_program, device)
    assert actual == expected


def test_default_dtype_changed_unseen_gives_factories_their_dtype_or_a_clear_error():
    # torch._C directly: no wrapper sees it. Factories keep their dtype; an op whose
    # dtype followed the old default fails clearly instead of changing dtype.
    with mode():
        a = torch.ones(8)
        d = torch.arange(4) * 0.5
        torch._C._set_default_dtype(torch.float64)
        try:
            assert a.dtype == torch.float32 and a.tolist() == [1.0] * 8
            with pytest.raises(RuntimeError, match="promised"):
                d.tolist()
        finally:
            torch._C._set_default_dtype(torch.float32)


def _deterministic_empty(device):
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.empty(16, device=device)
        y = torch.empty_like(x)
    finally:
        torch.use_deterministic_algorithms(False)
    return x.isnan().all().item(), y.isnan().all().item()


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode_toggled_before_the_read(device):
    expected, actual = _both(_deterministic_empty, device)
    assert expected == (True, True)
    assert actual == expected


def test_fill_uninitialized_memory_toggled_before_the_read():
    def program(device):
        torch.use_deterministic_algorithms(True)
        try:
            x = torch.empty(16, device=device)
            torch.utils.deterministic.fill_uninitialized_memory = False
            torch.utils.deterministic.fill_uninitialized_memory = True
        finally:
            torch.use_deterministic_algorithms(False)
        return x.isnan().all().item()

    expected, actual = _both(program, "cpu")
    assert expected is True and actual is True


def test_flush_denormal_toggled_before_the_read():
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")

    def program(device):
        x = torch.full((4,), 1e-39, device=device) * 1.5   # a denormal result
        torch.set_flush_denormal(True)
        try:
            y = (x * 1).tolist()        # a read while denormals flush to zero
        finally:
            torch.set_flush_denormal(False)
        return x.tolist(), y

    expected, actual = _both(program, "cpu")
    assert actual == expected


def test_wrapped_setters_keep_their_names_and_docs():
    ae.adaptive_eager()  # makes no session; entering a block installs the wrappers
    with mode():
        pass
    for name in ("set_default_dtype", "use_deterministic_algorithms", "set_flush_denormal"):
        fn = getattr(torch, name)
        assert fn.__name__ == name and fn.__doc__ and hasattr(fn, "__wrapped__")


# -- item 11: interrupts ------------------------------------------------------------------

def _interrupting(fn, at_call: int):
    """``fn``, except that its ``at_call``-th call raises KeyboardInterrupt instead."""
    calls = {"n": 0}

    def wrapper(*args):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return fn(*args)
    return wrapper


def test_interrupt_inside_a_node_finishes_the_window_and_keeps_every_value(monkeypatch):
    real = executor_mod.run_node
    p = torch.zeros(4)
    total = torch.zeros(())
    monkeypatch.setattr(executor_mod, "run_node", _interrupting(real, at_call=5))
    with pytest.raises(KeyboardInterrupt):
        with mode():
            for step in range(4):
                p.add_(1)                       # real tensor, updated in place
                total = total + p.sum()         # the program's running total
            y = p * 2
            p.tolist()                          # the flush is interrupted at its 5th op
    monkeypatch.setattr(executor_mod, "run_node", real)
    _no_modes_left()
    assert p.tolist() == [4.0] * 4              # each update applied exactly once
    assert total.item() == 40.0
    assert y.tolist() == [8.0] * 4


def test_interrupt_from_a_compiled_region_finishes_the_window_eagerly():
    calls = {"n": 0}

    def interrupting_backend(gm, example_inputs):
        def run(*args):
            calls["n"] += 1
            raise KeyboardInterrupt
        return run

    xs = [torch.randn(8, 4) for _ in range(3)]
    with pytest.raises(KeyboardInterrupt):
        with mode(**_compiled(interrupting_backend)):
            ys = [_program(x) for x in xs]
            ae.sync()
    _no_modes_left()
    assert calls["n"] == 1
    for y, x in zip(ys, xs):
        torch.testing.assert_close(y, _program(x))


def test_interrupt_between_seal_and_run_leaves_no_recursing_handle(monkeypatch):
    counters = session.counters()
    monkeypatch.setattr(counters, "note_flush", _interrupting(counters.note_flush, at_call=1))
    with pytest.raises(KeyboardInterrupt):
        with mode():
            y = torch.ones(3) + 1
            y.tolist()
    _no_modes_left()
    assert y.tolist() == [2.0, 2.0, 2.0]


_SIGNAL_SCRIPT = textwrap.dedent('''
    import os, random, signal, threading, time
    import torch, adaptive_eager as ae

    def interrupt_soon():
        time.sleep(random.uniform(0.05, 0.3))
        os.kill(os.getpid(), signal.SIGINT)

    random.seed(0)
    bad = 0
    # The first trials' signals may land in one-time set-up (importing Dynamo, the meta
    # kernels' lazy imports): that must break nothing either (see "fallbacks" below).
    opts = dict(backend="eager", adaptive_passthrough=False, window_size=16)
    x = torch.ones(1024, 2048)   # kernels long enough that most signals land in a flush
    for trial in range(12):
        p = torch.zeros(1024, 2048)
        total = torch.zeros(())
        steps = 0
        threading.Thread(target=interrupt_soon).start()
        try:
            with ae.adaptive_eager(**opts):
                while True:                     # windows cut by window_size: the time is
                    p.add_(x)                   # spent in their flushes
                    total = total + 1
                    steps += 1
        except KeyboardInterrupt:
            pass
        try:
            t, s = total.item(), p[0, 0].item()
        except Exception as e:
            print("unreadable", type(e).__name__, e)
            bad += 1
            continue
        # The interrupt lands between two statements: each value is at most one step ahead.
        if not (steps <= t <= steps + 1 and steps <= s <= steps + 1 and abs(t - s) <= 1):
            print("inconsistent", steps, t, s)
            bad += 1
    print("fallbacks", dict(ae.stats().fallback_ops))   # no op lost its meta kernel
    print("bad", bad)
''')


def test_sigint_during_flushes_keeps_the_running_total(tmp_path):
    path = tmp_path / "interrupted.py"
    path.write_text(_SIGNAL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-2:] == ["fallbacks {}", "bad 0"], out.stdout[-3000:]


def test_the_program_sigint_handler_is_back_after_the_block():
    import signal

    before = signal.getsignal(signal.SIGINT)
    with mode():
        assert signal.getsignal(signal.SIGINT) is not before   # deferring during flushes
        (torch.ones(2) + 1).tolist()
    assert signal.getsignal(signal.SIGINT) is before


# -- item 16: a block exited in another thread ---------------------------------------------

def test_exit_in_another_thread_raises_a_clear_error_and_leaves_both_threads_clean():
    ctx = mode()
    ctx.__enter__()
    y = torch.ones(3) * 2
    seen = {}

    def worker():
        try:
            ctx.__exit__(None, None, None)
        except RuntimeError as e:
            seen["error"] = str(e)
        seen["stack"] = len(_get_current_dispatch_mode_stack())
        seen["mode"] = session.current_mode()

    t = threading.Thread(target=worker, name="the-worker")
    t.start()
    t.join()
    assert "MainThread" in seen["error"] and "the-worker" in seen["error"], seen
    assert seen["stack"] == 0 and seen["mode"] is None
    assert session.current_mode() is None                  # the entering thread left it
    _no_modes_left()
    assert y.tolist() == [2.0, 2.0, 2.0]
    assert not isinstance(torch.ones(2) + 1, LazyTensor)


def test_exit_in_another_thread_stops_capture_at_the_next_torch_call():
    ctx = mode()
    ctx.__enter__()
    t = threading.Thread(target=lambda: pytest.raises(RuntimeError, ctx.__exit__, None, None, None))
    t.start()
    t.join()
    z = torch.ones(2) + 1          # passes straight through ...
    assert not isinstance(z, LazyTensor)
    assert session.current_mode() is None   # ... and the thread's next use of the runtime leaves it
    assert _get_current_dispatch_mode_stack() == []
    _no_modes_left()


# -- item 18: bounded caches ----------------------------------------------------------------

def test_spec_interning_is_bounded_and_stays_correct():
    memo = MetaMemo(16)
    ids = set()
    for i in range(3 * memo.max_specs):
        spec = TensorSpec((4,), (1,), i, torch.float32, torch.device("cpu"))
        ids.add(memo.intern(spec))
        assert len(memo._sids) <= memo.max_specs
    assert len(ids) == 3 * memo.max_specs                  # never reused for another spec
    base = torch.arange(5000.0)
    expected = [base[i:i + 4].sum().item() for i in range(0, 4000, 3)]
    with mode(meta_cache_size=16):
        got = [base[i:i + 4].sum().item() for i in range(0, 4000, 3)]
        m = session.current_mode().memo
        assert len(m._sids) <= m.max_specs
    assert got == expected


def test_sessions_are_bounded():
    for i in range(session._MAX_SESSIONS + 10):
        session.get_session(session.resolve_options(backend="eager", window_size=100 + i))
    assert len(session._SESSIONS) <= session._MAX_SESSIONS


# -- item 19: options and switches ----------------------------------------------------------

@pytest.mark.parametrize("how", ["keyword", "env"])
def test_unknown_device_type_is_a_config_error_listing_what_is_accepted(how, monkeypatch):
    if how == "env":
        monkeypatch.setenv("ADAPTIVE_EAGER_DEVICE", "gpu")
        make = lambda: ae.adaptive_eager()  # noqa: E731
    else:
        make = lambda: ae.adaptive_eager(device="gpu")  # noqa: E731
    with pytest.raises(ae.ConfigError) as info:
        make()
    msg = str(info.value)
    assert "'device'" in msg and "'gpu'" in msg and "cuda" in msg and "neuron" in msg


def test_known_device_types_are_accepted():
    for text, kind in [("cpu", "cpu"), ("cuda:1", "cuda"), ("neuron", "neuron"),
                       (torch.device("mps"), "mps")]:
        assert config.resolve(device=text).device == kind


def test_neuron_is_accepted_before_it_is_registered(tmp_path):
    code = ("from adaptive_eager import config; import torch; "
            "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'; "
            "print(config.resolve(device='neuron').device)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTIVE_EAGER")}
    env["PYTHONPATH"] = os.getcwd()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "neuron"


@pytest.mark.parametrize("var,value", [("ADAPTIVE_EAGER_FUEL", "abc"), ("ADAPTIVE_EAGER_FUEL", "-1")])
def test_bad_switches_are_config_errors_naming_them(monkeypatch, var, value):
    # The switches that are not a block's (ADAPTIVE_EAGER, _LOG, _NEURON_SIM) warn instead:
    # tests/test_faults_corners.py (issue 21, Note [Switches that never stop a block]).
    monkeypatch.setenv(var, value)
    with pytest.raises(ae.ConfigError) as info:
        ae.adaptive_eager()
    assert var in str(info.value) and repr(value) in str(info.value)


_AUTOLOAD_SCRIPT = textwrap.dedent('''
    import threading
    import torch
    seen = {}
    def work():
        seen["ran"] = (torch.ones(2) * 2).tolist()
    t = threading.Thread(target=work)
    t.start(); t.join()
    print("thread", seen.get("ran"))
    print("main", type(torch.ones(2) * 2).__name__)
''')


def test_bad_switch_under_autoload_logs_and_runs_plain_eager_threads_included(tmp_path):
    from tests.test_autoload import _entry_point_installed

    if not _entry_point_installed():
        pytest.skip("package not installed (pip install -e .)")
    path = tmp_path / "prog.py"
    path.write_text(_AUTOLOAD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTIVE_EAGER")}
    env.update(ADAPTIVE_EAGER="1", ADAPTIVE_EAGER_FUEL="abc", PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "thread [2.0, 2.0]" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "main Tensor" in out.stdout
    assert "ADAPTIVE_EAGER_FUEL" in out.stderr
