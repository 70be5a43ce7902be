"""Note [The first compiled step is checked beside the program] (runtime/step_check.py):
the first call of a compiled optimizer step and its comparison with eager's run on a
checker thread with one OpenMP thread while the program runs one torch thread, on the
program's thread otherwise (Note [A checker thread with one OpenMP thread]); either way
a wrong compiled step never reaches the program's tensors, and grads zeroed in place
meanwhile do not fail the check."""

from __future__ import annotations

import threading

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager.runtime.step_check import BesideCheck, written_inputs

O = torch.optim


def _kinds(cls: type) -> dict:
    """The optimizer report's lines of ``cls`` ("what" -> how many steps)."""
    kinds = ae.stats().optimizer_step_kinds
    return {key.partition("|")[2]: n for key, n in kinds.items() if key.startswith(cls.__name__ + "|")}


def _backend(calls: list, wrong=None):
    """A compile backend running the graph as is, recording each call's thread; ``wrong``
    (args) -> None, run after the graph on its first call only, makes it miscompile."""
    def compile_fn(gm, example):
        def fn(*args):
            calls.append(threading.current_thread().name)
            out = gm(*args)
            if wrong is not None and len(calls) == 1:
                wrong(args)
            return out
        return fn
    return compile_fn


def _train(steps: int, ctx=None, set_to_none: bool = True) -> list:
    torch.manual_seed(0)
    ps = [torch.randn(64, 32, requires_grad=True), torch.randn(32, requires_grad=True)]
    opt = O.AdamW(ps, lr=1e-2, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    with ctx if ctx is not None else torch.no_grad():
        for _ in range(steps):
            opt.zero_grad(set_to_none=set_to_none)
            for p in ps:
                g = torch.randn(p.shape, generator=gen)
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.copy_(g)
            opt.step()
    return [p.detach().clone() for p in ps]


def _close(ref: list, out: list) -> None:
    # a callable backend is no debugging backend: the step's lerp is traced as add/sub/mul
    # (Note [Lerp for a compiler], runtime/optim_graph.py), which rounds otherwise
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _runtime(backend):
    return ae.adaptive_eager(backend=backend, async_compile=False, optimizer_step_after_ms=0)


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def threads(request):
    """The program's torch thread count (1: the check runs beside it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _at(n: int) -> tuple:
    """The compiled step's calls (their threads) in 8 steps at ``n`` torch threads, the
    params checked against eager's."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        calls: list = []
        ref = _train(8)
        ae.reset_stats()
        out = _train(8, _runtime(_backend(calls)))
    finally:
        torch.set_num_threads(before)
    _close(ref, out)
    assert ae.stats().optimizer_steps_compiled == len(calls) - 1 > 0
    return calls


def test_at_two_threads_the_check_runs_on_the_programs_thread():
    # Note [No checker thread while OpenMP throttles its spin]: no second thread runs an
    # OpenMP region beside the program's team
    assert set(_at(2)) == {threading.current_thread().name}


def test_at_one_thread_the_first_call_runs_beside_the_program():
    calls = _at(1)
    assert calls[0] == "adaptive_eager-check", calls            # the check's call
    assert set(calls[1:]) == {threading.current_thread().name}  # the compiled steps


def test_the_checker_thread_runs_one_openmp_thread_and_leaves_the_programs_count():
    from adaptive_eager.runtime import step_check

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list = []
        t = threading.Thread(target=lambda: seen.append(
            (step_check._one_omp_thread_here(), torch.get_num_threads())))
        t.start()
        t.join()
        assert torch.get_num_threads() == 2  # the program's count: not torch.set_num_threads
    finally:
        torch.set_num_threads(before)
    if step_check._openmp_runtime() is None:
        pytest.skip("no OpenMP runtime in this process")
    assert seen == [(True, 1)]


def test_a_wrong_compiled_step_is_caught_and_never_applied(threads):
    def wrong(args):  # the first written input (a param) off by far more than rounding
        args[0].add_(1e-2)

    calls: list = []
    ref = _train(8)
    ae.reset_stats()
    out = _train(8, _runtime(_backend(calls, wrong)))
    _close(ref, out)
    k = _kinds(O.AdamW)
    assert k.get("eager: eager-only: compiled step differs from eager") == 1, k
    assert ae.stats().optimizer_steps_compiled == 0 and len(calls) == 1


def test_a_compiled_step_writing_a_grad_is_caught(threads):
    def wrong(args):  # grads come after the params in the step's inputs; all are read only
        n = sum(1 for a in args if isinstance(a, torch.Tensor) and a.dim() > 0) // 4
        args[n].mul_(2)

    calls: list = []
    ref = _train(8)
    ae.reset_stats()
    out = _train(8, _runtime(_backend(calls, wrong)))
    _close(ref, out)
    assert ae.stats().optimizer_steps_compiled == 0, _kinds(O.AdamW)


def test_grads_zeroed_in_place_during_the_check_do_not_fail_it(threads):
    """zero_grad(set_to_none=False) zeroes the grads the check's copies were made of while
    the comparison may still run: the grads are checked on the copies alone."""
    calls: list = []
    ref = _train(8, set_to_none=False)
    ae.reset_stats()
    out = _train(8, _runtime(_backend(calls)), set_to_none=False)
    _close(ref, out)
    assert ae.stats().optimizer_steps_compiled == 8 - 3, _kinds(O.AdamW)


def test_written_inputs_and_a_check_that_differs():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda p, g, m: (torch._foreach_add_([p, m], [g, g]),))(
        torch.ones(2), torch.ones(2), torch.ones(2))
    assert written_inputs(gm) == {0, 2}
    c = BesideCheck()
    p, g = torch.ones(3), torch.ones(3)
    copies = [p.clone(), g.clone()]
    called = c.call(lambda p, g: p.add_(g).add_(1.0), copies, read_only=[1])
    p.add_(g)
    problem = BesideCheck.verdict(c.compare(called, [p, g], copies, written=[0], exact=False))
    assert problem is not None and "optimizer step input 0" in problem[0]


def test_the_clones_are_shared_with_the_checker_at_one_thread_and_equal_their_tensors(
        monkeypatch, threads):
    from adaptive_eager.runtime import step_check

    made_on: list = []
    real = step_check.clone_strided

    def spy(t):
        made_on.append(threading.current_thread().name)
        return real(t)

    monkeypatch.setattr(step_check, "clone_strided", spy)
    ts = [torch.randn(64, 64), torch.randn(64, 64).t(), torch.randn(16), torch.arange(5.0)[:, None].expand(5, 3)]
    copies = BesideCheck().clone(ts)
    kept = BesideCheck().clone(ts, only={0})  # the others handed as they are
    assert kept[0].data_ptr() != ts[0].data_ptr() and all(a is b for a, b in zip(kept[1:], ts[1:]))
    assert all(torch.equal(a, b) and a.stride() == b.stride() and a.data_ptr() != b.data_ptr()
               for a, b in zip(ts, copies))
    here = threading.current_thread().name
    assert set(made_on) == ({here, "adaptive_eager-check"} if threads == 1 else {here}), made_on


def test_the_checks_copies_live_only_inside_the_check_step(monkeypatch, threads):
    """Note [The check's copies are made after the backward]: the copies of what the
    first compiled step writes are made inside that step (after the backward freed the
    activations) and are gone when it returns, never alive through a forward or backward
    (at one thread they were made a step early, beside the next forward: the GPT step's
    peak 1.37x eager's)."""
    import weakref

    from adaptive_eager.runtime import step_check

    where = ["program"]
    made: list = []
    real = step_check.clone_strided

    def spy(t):
        c = real(t)
        made.append((where[0], weakref.ref(c)))
        return c

    monkeypatch.setattr(step_check, "clone_strided", spy)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref.load_state_dict(m.state_dict())
    x, y = torch.randn(8, 16), torch.randn(8, 4)

    def loop(model, opt, steps, after=None):
        for _ in range(steps):
            torch.nn.functional.mse_loss(model(x), y).backward()
            where[0] = "step"
            opt.step()
            where[0] = "program"
            opt.zero_grad()
            if after is not None:
                after()

    alive_after = []
    loop(ref, O.AdamW(ref.parameters(), lr=1e-2), 8)
    opt = O.AdamW(m.parameters(), lr=1e-2)
    with _runtime(_backend([])):
        loop(m, opt, 8, lambda: alive_after.append(sum(r() is not None for _, r in made)))
    assert made and all(w == "step" for w, _ in made), made  # only inside a step
    assert not any(alive_after), alive_after                 # none outlives its step
    assert ae.stats().optimizer_steps_compiled == 8 - 3, _kinds(O.AdamW)
    assert all(torch.allclose(a, b) for a, b in zip(m.parameters(), ref.parameters()))


def test_a_program_ending_while_the_checker_copies_exits_cleanly():
    """Note [A thread in torch's C++ at exit is let finish]: a daemon thread inside an ATen
    call when the interpreter finalizes aborted the process (std::terminate, status 134)
    after the program had finished; the checker thread is let finish its call at exit."""
    import subprocess
    import sys
    import textwrap

    from adaptive_eager.runtime import compiler
    from adaptive_eager.runtime.step_check import BesideCheck

    body = textwrap.dedent("""
        import sys, time, torch
        from adaptive_eager.runtime.compiler import DaemonThread
        t = DaemonThread("t", finish_at_exit=sys.argv[1] == "1")
        x = torch.ones(1 << 24)
        def work():
            for _ in range(40):
                x.clone()
        t.submit(work)
        time.sleep(0.05)
        print("done", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", body, "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stderr[-2000:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        check = BesideCheck()
        assert check.beside  # a checker thread at one torch thread ...
        assert check._thread in compiler._FINISHING  # ... let finish at exit
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("wrong", [0, 1])
def test_a_difference_in_either_half_of_the_comparison_is_found(wrong):
    """Beside the program the comparison is split by bytes between the checker and the
    calling thread (which waits for the verdict anyway): a difference in either half is
    the verdict, and equal halves pass."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        c = BesideCheck()
        assert c.beside
        big, small = torch.randn(4096), torch.randn(16)
        copies = [big.clone(), small.clone()]
        called = c.call(lambda a, b: None, copies, read_only=[])
        assert BesideCheck.verdict(c.compare(called, [big, small], copies, [0, 1], exact=True)) is None
        copies[wrong].add_(1.0)
        problem = BesideCheck.verdict(c.compare(called, [big, small], copies, [0, 1], exact=True))
    finally:
        torch.set_num_threads(before)
    assert problem is not None and f"optimizer step input {wrong}" in problem[0], problem
