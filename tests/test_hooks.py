"""The hooks registry (Note [The hooks registry], adaptive_eager/hooks.py): every
process-wide patch is a row, installed once, undone exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading

import torch

import adaptive_eager
from adaptive_eager import hooks
from adaptive_eager.hooks import HOOKS, MARK, Hook, Patch, Registry

# Runs in a fresh interpreter: the originals are read before anything is patched.
_FRESH = textwrap.dedent("""
    import signal, sys, threading
    import torch
    import adaptive_eager as ae
    from adaptive_eager.hooks import HOOKS, MARK, Patch
    from adaptive_eager.dispatch import observe, opaque, kernel_state, interrupts
    from adaptive_eager.runtime import compiler
    from adaptive_eager import process
    from adaptive_eager.hooks import _locate

    from adaptive_eager.neuron_sim import _storage

    rows = [*observe.ROWS, *(r for r in opaque.ROWS if isinstance(r, Patch)),
            *kernel_state.rows(lambda *a: None), *compiler.RNG_ROWS, process.THREAD_START,
            *_storage.ROWS]

    def state():
        out = {}
        for r in rows:
            try:
                obj = _locate(r)
            except (ImportError, AttributeError):
                continue
            own = vars(obj) if isinstance(obj, type) else None
            out[r.key] = (r.attr in own if own is not None else True,
                          own.get(r.attr) if own is not None else getattr(obj, r.attr, None))
        return out

    before = state()
    handler = signal.getsignal(signal.SIGINT)
    if sys.argv[1] == "guard-first":
        compiler.guard_rng_setters()
    ae.enable(backend="eager")
    _storage.install()  # the emulated device's storage rows (one adds an attribute)
    x = torch.ones(3) * 2
    assert x.tolist() == [2.0, 2.0, 2.0]
    compiler.guard_rng_setters()
    installed = {r.key: getattr(_locate(r), r.attr) for r in HOOKS.rows() if isinstance(r, Patch)}
    # set_rng_state is wrapped once: its wrapper's original is torch's function itself
    for mod in (torch, torch.random):
        fn = vars(mod)["set_rng_state"]
        assert getattr(fn, MARK).__module__ == "torch.random", fn
        assert not hasattr(getattr(fn, MARK), MARK)
    # every wrapper carries the one marker, pointing at a non-wrapper
    for key, value in installed.items():
        raw = vars(_locate(next(r for r in HOOKS.rows() if r.key == key))).get(key[1], value)
        if HOOKS.original(*key) is not None and not isinstance(raw, property):
            assert getattr(raw, MARK) is HOOKS.original(*key), key
            assert not hasattr(getattr(raw, MARK), MARK), key
    assert signal.getsignal(signal.SIGINT) is interrupts._on_signal  # enable() holds a block
    n = len(HOOKS.rows())
    ae.enable(backend="eager")
    observe.install(); opaque.install(); kernel_state.install(lambda *a: None)
    compiler.guard_rng_setters()
    assert len(HOOKS.rows()) == n
    assert all(getattr(_locate(HOOKS.rows()[i]), HOOKS.rows()[i].attr) is installed[k]
               for i, k in enumerate(installed))  # installing again changed nothing
    ae.disable()
    assert signal.getsignal(signal.SIGINT) is handler
    HOOKS.uninstall()
    after = state()
    bad = [k for k in before if before[k][0] != after[k][0] or before[k][1] is not after[k][1]]
    assert not bad, bad
    left = [r.group for r in HOOKS.rows()]
    assert left == ["fork"], left  # os.register_at_fork cannot be undone
    print("ok", len(installed))
""")


def _fresh(order: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTIVE_EAGER_")
           or k == "ADAPTIVE_EAGER_CACHE_DIR"}
    env.pop("ADAPTIVE_EAGER", None)
    out = subprocess.run([sys.executable, "-c", _FRESH, order], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_uninstall_restores_every_original_and_install_twice_is_a_no_op():
    out = _fresh("session-first")
    assert out.startswith("ok")
    assert int(out.split()[1]) >= 63  # reads, opaque calls, setters, rng guards, Thread.start,
    # the emulated device's storage


def test_set_rng_state_is_wrapped_once_whichever_layer_installs_first():
    assert _fresh("guard-first").startswith("ok")


def test_a_covering_row_replaces_the_covered_one_and_gives_it_back():
    class Box:
        def f(self) -> str:
            return "f"

    calls: list[str] = []

    def layer(tag: str):
        def make(fn):
            def wrapper(*a):
                calls.append(tag)
                return fn(*a)
            return wrapper
        return make

    reg = Registry()
    guard = Patch("guard", "Box", "f", layer("guard"), find=lambda: Box)
    full = Patch("full", "Box", "f", layer("full"), covers=("guard",), find=lambda: Box)
    original = Box.__dict__["f"]
    reg.install([guard])
    reg.install([full])
    assert Box().f() == "f" and calls == ["full"]  # one wrapper, not two
    assert getattr(Box.__dict__["f"], MARK) is original
    reg.uninstall("full")
    calls.clear()
    assert Box().f() == "f" and calls == ["guard"]  # the guard is still wanted
    reg.uninstall()
    assert Box.__dict__["f"] is original


def test_an_inherited_attribute_is_deleted_not_shadowed_on_uninstall():
    class Base:
        def g(self) -> int:
            return 1

    class Child(Base):
        pass

    reg = Registry()
    row = Patch("t", "Child", "g", lambda fn: (lambda self: fn(self) + 1), find=lambda: Child)
    reg.install([row])
    assert Child().g() == 2 and "g" in vars(Child)
    assert reg.original("Child", "g") is Base.g
    reg.uninstall(row)
    assert "g" not in vars(Child) and Child.g is Base.g


def test_a_patch_the_program_made_over_ours_is_left_in_place():
    class Box:
        def f(self) -> str:
            return "f"

    reg = Registry()
    row = Patch("t", "Box", "f", lambda fn: (lambda self: fn(self).upper()), find=lambda: Box)
    reg.install([row])

    def programs(self) -> str:
        return "mine"

    Box.f = programs
    reg.uninstall()
    assert Box.f is programs and not reg.installed(row)


def test_installs_from_many_threads_wrap_once():
    class Box:
        def f(self) -> int:
            return 0

    reg = Registry()
    made: list[int] = []

    def make(fn):
        made.append(1)
        return lambda self: fn(self) + 1

    rows = [Patch("t", "Box", "f", make, find=lambda: Box)]
    threads = [threading.Thread(target=reg.install, args=(rows,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and Box().f() == 1


def test_hooks_with_a_token_and_without_one():
    added: list[str] = []
    row = Hook("t", "x", lambda: added.append("on") or "token", lambda tok: added.append(tok))
    none = Hook("t", "nothing to do here", lambda: None, lambda tok: added.append("never"))
    reg = Registry()
    reg.install([row, none, row])
    assert added == ["on"] and reg.installed(row) and not reg.installed(none)
    reg.uninstall("t")
    assert added == ["on", "token"] and not reg.installed(row)


def test_the_table_of_groups_names_every_group_in_use():
    with adaptive_eager.adaptive_eager(backend="eager"):
        (torch.ones(2) * 2).tolist()
        groups = {r.group for r in HOOKS.rows()}
    documented = set(re.findall(r"^\| ([a-z-]+) +\|", hooks.__doc__, re.M))
    assert groups <= documented, groups - documented
    assert {"reads", "opaque", "setters", "fork", "optim-steps"} <= groups
    assert {"sigint", "module-calls", "thread-start", "rng-guard"} <= documented


def test_reads_pay_no_registry_on_the_call():
    # The installed read wrapper is a plain closure set on torch.Tensor: nothing of the
    # registry runs per call (the marker is an attribute, read only by original()).
    with adaptive_eager.adaptive_eager(backend="eager"):
        pass
    item = vars(torch.Tensor)["item"]
    assert getattr(item, MARK) is torch._C.TensorBase.item
    assert "HOOKS" not in item.__code__.co_names and "HOOKS" not in item.__code__.co_freevars


def test_a_fork_while_another_thread_installs_leaves_the_child_able_to_install():
    if not hasattr(os, "fork"):
        return
    reg = Registry()

    class Box:
        def f(self) -> int:
            return 0

    reg.install([Patch("t", "Box", "f", lambda fn: (lambda self: 1), find=lambda: Box)])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with reg._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        import signal

        signal.alarm(20)  # a lock held for good would hang the child: SIGALRM ends it
        try:
            reg.uninstall("t")
            os._exit(0 if Box().f() == 0 else 1)
        finally:
            os._exit(2)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
