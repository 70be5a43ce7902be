"""What a process's first compile and first artifact load run (issue 22, items 2-3):
Note [Only the picked ISA's own checks run] (runtime/compile_worker.py)."""

from __future__ import annotations

import platform

import pytest
import torch

from adaptive_eager.hooks import HOOKS
from adaptive_eager.runtime.compile_worker import VEC_ISA_ROW, trusted_vec_isa

x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISAs only")


@x86
def test_a_trusted_pick_checks_only_the_first_allowed_isa_and_picks_as_inductor_does():
    from torch._inductor import config, cpu_vec_isa

    with trusted_vec_isa(True):
        pass  # the registry's row installed (it calls Inductor's own function outside a block)
    original = HOOKS.original("torch._inductor.cpu_vec_isa", "valid_vec_isa_list")
    checked: list = []
    bool_of = cpu_vec_isa.VecISA.__bool__

    def spy(isa):
        checked.append(str(isa))
        return bool_of(isa)

    with pytest.MonkeyPatch.context() as mp:
        for cls in {type(i) for i in cpu_vec_isa.supported_vec_isa_list}:
            mp.setattr(cls, "__bool__", spy)
        with trusted_vec_isa(True):
            assert HOOKS.installed(VEC_ISA_ROW)
            picked = cpu_vec_isa.pick_vec_isa()
    flags = cpu_vec_isa.x86_isa_checker()
    allowed = [str(i) for i in cpu_vec_isa.supported_vec_isa_list
               if all(f in flags for f in str(i).split())]
    if not allowed:
        pytest.skip("this CPU allows no vector ISA")
    assert checked == [allowed[0]]                             # the others: neither built nor probed
    with config.patch({"cpp.vec_isa_ok": True}):               # Inductor's own pick, trusted as above
        assert str(picked) == str(original()[0])
        after = cpu_vec_isa.valid_vec_isa_list()              # after the block: Inductor's own list
        assert [str(i) for i in after] == [str(i) for i in original()]


@x86
def test_a_user_choice_keeps_inductors_own_list(monkeypatch):
    from torch._inductor import cpu_vec_isa

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    with trusted_vec_isa(True):
        original = HOOKS.original("torch._inductor.cpu_vec_isa", "valid_vec_isa_list")
        assert cpu_vec_isa.valid_vec_isa_list() == original()


@x86
def test_the_trusted_list_is_a_registry_row_cut_only_on_the_thread_in_the_block():
    import threading

    from torch._inductor import cpu_vec_isa

    with trusted_vec_isa(True):
        original = HOOKS.original("torch._inductor.cpu_vec_isa", "valid_vec_isa_list")
        assert original is not None and cpu_vec_isa.valid_vec_isa_list.__ae_wrapped__ is original
        here = cpu_vec_isa.valid_vec_isa_list()
        there: list = []
        t = threading.Thread(target=lambda: there.append(cpu_vec_isa.valid_vec_isa_list()))
        t.start()
        t.join()
    if not here:
        pytest.skip("this CPU allows no vector ISA")
    assert len(here) == 1 and there == [original()]             # another thread: Inductor's own
    HOOKS.uninstall("vec-isa")
    assert cpu_vec_isa.valid_vec_isa_list is original           # undone: exactly Inductor's


@x86
def test_a_verdict_still_coming_is_waited_for_where_inductor_asks():
    """Note [The worker's probe runs beside its first compile]: the list waits for the
    probe's verdict, is the picked ISA alone when it passed, Inductor's own otherwise."""
    import threading

    from adaptive_eager.runtime.compile_worker import _trusting

    from torch._inductor import cpu_vec_isa

    with trusted_vec_isa(True):
        original = HOOKS.original("torch._inductor.cpu_vec_isa", "valid_vec_isa_list")
    if not original():
        pytest.skip("this CPU allows no vector ISA")
    release = threading.Event()
    asked: list = []

    def verdict(ok):
        def wait():
            asked.append(ok)
            assert release.wait(30)
            return ok
        return wait

    got: list = []

    def compile_like(ok):
        with _trusting(verdict(ok)):
            got.append([str(i) for i in cpu_vec_isa.valid_vec_isa_list()])

    t = threading.Thread(target=compile_like, args=(True,))
    t.start()
    t.join(0.3)
    assert t.is_alive() and asked == [True] and got == []     # waiting for the probe
    release.set()
    t.join(30)
    assert got == [[str(original()[0])]]                       # passed: the picked ISA alone
    for failed in (False, None):                               # failed, or no verdict: Inductor's own
        got.clear()
        compile_like(failed)
        assert got == [[str(i) for i in original()]]


def test_pattern_tables_wait_for_a_graph_they_can_match():
    """Note [Pattern tables wait for a graph they can match]: a graph without a matrix
    product or randperm is compiled with Inductor's joint-graph pattern tables unloaded;
    any other graph loads them as before."""
    from torch._inductor.fx_passes import joint_graph
    from torch.fx.experimental.proxy_tensor import make_fx

    from adaptive_eager.runtime.compile_worker import _may_match_patterns, _patterns_deferred

    x = torch.randn(4, 4)
    pointwise = make_fx(lambda a: ((a * 2).relu().sum(0), a.sin()))(x)
    product = make_fx(lambda a: (a @ a,))(x)
    batched = make_fx(lambda a: (torch.bmm(a[None], a[None]).softmax(-1),))(x)
    assert not _may_match_patterns(pointwise)
    assert _may_match_patterns(product) and _may_match_patterns(batched)
    original = joint_graph.lazy_init
    with _patterns_deferred(pointwise):
        assert joint_graph.lazy_init is not original
        joint_graph.lazy_init(None)                           # loads nothing
    assert joint_graph.lazy_init is original                  # put back
    with _patterns_deferred(product):
        assert joint_graph.lazy_init is original              # loaded as before


def _busy_modules(tmp_path, prefix, n, ms):
    """``n`` modules that each spend ``ms`` of CPU when imported."""
    for i in range(n):
        (tmp_path / f"{prefix}{i}.py").write_text(
            "import time\n_end = time.thread_time() + %f\nwhile time.thread_time() < _end:\n    pass\n" % (ms / 1e3))
    return [f"{prefix}{i}" for i in range(n)]


def test_paced_imports_sleep_in_proportion_until_ready(tmp_path, monkeypatch):
    """Note [The loader's warm-up is paced while the worker compiles]: the pacing thread's
    imports are followed by pauses owed in proportion to their CPU (``share``), each at
    most MAX_PAUSE_S; once ``ready()`` holds no pause is taken; other threads' imports are
    never paused."""
    import importlib
    import sys
    import threading
    import time

    from adaptive_eager.runtime.pacing import MAX_PAUSE_S, paced

    monkeypatch.syspath_prepend(str(tmp_path))
    names = _busy_modules(tmp_path, "ae_paced_", 12, 10)
    c0 = time.thread_time()
    with paced(lambda: False, share=0.5) as pacer:
        for name in names:
            importlib.import_module(name)
    spent = time.thread_time() - c0
    # owed: CPU x (1 - share) / share, paid at each later import; the last one's is left owed
    assert spent - 0.03 - MAX_PAUSE_S <= pacer.paused_s <= spent + MAX_PAUSE_S, (pacer.paused_s, spent)
    assert pacer.paused_s > 0.05

    names = _busy_modules(tmp_path, "ae_ready_", 4, 10)
    with paced(lambda: True, share=0.5) as pacer:
        for name in names:
            importlib.import_module(name)
    assert pacer.paused_s == 0 and pacer.done

    names = _busy_modules(tmp_path, "ae_other_", 4, 10)
    with paced(lambda: False, share=0.1) as pacer:
        t = threading.Thread(target=lambda: [importlib.import_module(n) for n in names])
        t.start()
        t.join()
    assert pacer.paused_s == 0 and all(n in sys.modules for n in names)
    from adaptive_eager.hooks import HOOKS
    from adaptive_eager.runtime.pacing import IMPORTS_ROW

    assert not HOOKS.installed(IMPORTS_ROW)  # undone after the block
    assert not any(type(f).__name__ == "_Finder" for f in sys.meta_path)


def test_a_paced_thread_pauses_without_the_global_import_lock(tmp_path, monkeypatch):
    """Note [A paced import pauses without the import lock]: importlib holds the global
    import lock while it asks each finder, so a paced thread that slept in our finder made
    every other thread's new import wait for its pause (a thread importing 60 new modules
    beside it waited 1,083 ms in all). Now another thread's imports wait for none of it."""
    import importlib
    import threading
    import time

    from adaptive_eager.runtime.pacing import paced

    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = _busy_modules(tmp_path, "ae_paced_", 30, 4)
    wanted = _busy_modules(tmp_path, "ae_wanted_", 30, 0)
    started, pauses = threading.Event(), []

    def load():
        with paced(lambda: False, share=0.2) as pacer:
            started.set()
            for name in loaded:
                importlib.import_module(name)
        pauses.append(pacer.paused_s)

    t = threading.Thread(target=load)
    t.start()
    started.wait()
    waited = 0.0
    for name in wanted:
        t0 = time.perf_counter()
        importlib.import_module(name)
        waited += time.perf_counter() - t0
        time.sleep(0.01)
    t.join()
    assert pauses[0] > 0.2, pauses  # it did pause while this thread imported
    assert waited < pauses[0] / 4, (waited, pauses)


def test_the_worker_is_held_only_while_the_paced_thread_runs(tmp_path, monkeypatch):
    """Note [The worker waits while the loader runs]: ``hold(True)`` when the paced thread
    runs, ``hold(False)`` before each pause, once ready and at the block's end; and the
    worker's holder stops its process group only where the cores are short."""
    import importlib
    import os
    import subprocess
    import sys
    import time

    from adaptive_eager.runtime import compile_worker
    from adaptive_eager.runtime.pacing import paced
    from adaptive_eager.runtime.worker_pacing import WorkerPacer

    monkeypatch.syspath_prepend(str(tmp_path))
    held = []
    names = _busy_modules(tmp_path, "ae_held_", 8, 10)
    with paced(lambda: False, share=0.5, hold=held.append) as pacer:
        for name in names:
            importlib.import_module(name)
    assert held[0] is True and held[-1] is False and pacer.paused_s > 0
    assert all(a != b for a, b in zip(held, held[1:]))  # alternating: never twice the same
    assert held.count(False) >= 2  # a pause, and the end

    held.clear()
    ready = []
    names = _busy_modules(tmp_path, "ae_held_ready_", 4, 10)
    with paced(lambda: bool(ready), share=0.5, hold=held.append):
        importlib.import_module(names[0])
        ready.append(1)
        for name in names[1:]:
            importlib.import_module(name)
        assert held[-1] is False  # released once ready, before the block ends
    assert held[-1] is False

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
        pacer = WorkerPacer(proc.pid, cores=2)
        assert compile_worker._holder(pacer, 2) is None  # a core for each
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        hold = compile_worker._holder(pacer, 1)
        hold(True)
        time.sleep(0.1)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "T"
        hold(False)
        time.sleep(0.1)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] != "T"
    finally:
        proc.kill()
        proc.wait()


def test_torch_key_hashing_is_paced_on_the_paced_thread_only(monkeypatch):
    """Note [The loader's warm-up is paced while the worker compiles]: inside the block,
    once codecache is imported, each package torch_key hashes is a pacing check; the row
    is undone after the block."""
    import torch._inductor.codecache as codecache

    from adaptive_eager.hooks import HOOKS
    from adaptive_eager.runtime import pacing
    from adaptive_eager.runtime.pacing import paced

    original = codecache.build_code_hash
    checks = []
    with paced(lambda: False, share=0.5) as pacer:
        monkeypatch.setattr(pacer, "check", lambda: checks.append(1))
        pacing.pace_hashing()
        assert HOOKS.installed(pacing.HASH_ROW)
        codecache.build_code_hash([__import__("os").path.dirname(pacing.__file__)], "", __import__("hashlib").sha256())
    assert checks  # one check per package hashed
    assert codecache.build_code_hash is original


def test_the_workers_isa_probe_runs_beside_only_with_a_core_free(monkeypatch):
    """Note [The worker's probe runs beside its first compile]: beside the compile (a
    thread of its own) only when the cores outnumber the program's threads by two (the
    worker's core and the probe's); otherwise it runs at once on the calling thread."""
    import os
    import threading

    from adaptive_eager.runtime import inductor_setup

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)), raising=False)
    assert not inductor_setup.probe_beside(1) and inductor_setup.probe_beside(0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert inductor_setup.probe_beside(6) and not inductor_setup.probe_beside(7)
    where = []
    monkeypatch.setattr(inductor_setup, "probe_picked_isa",
                        lambda: where.append(threading.current_thread().name) or True)
    assert inductor_setup._ProbeBeside(beside=False)() is True
    assert inductor_setup._ProbeBeside(beside=True)() is True
    assert where == [threading.current_thread().name, "adaptive_eager-isa-probe"], where
