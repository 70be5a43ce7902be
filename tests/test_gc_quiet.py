"""Note [The runtime's imports freeze the heap they grew] (runtime/gc_quiet.py)."""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager.runtime import gc_quiet
from adaptive_eager.runtime.gc_quiet import HeapQuiet


@pytest.fixture(autouse=True)
def _collector_as_it_was():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc_quiet.QUIET.thaw()  # an earlier test's load with a block open in another thread
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def _import_modules(n: int, tag: str) -> None:
    """Put ``n`` new modules in sys.modules (what an import burst does), removed at the end."""
    for i in range(n):
        sys.modules[f"_ae_gc_quiet_{tag}_{i}"] = types.ModuleType(f"m{i}")


@pytest.fixture
def fake_modules():
    yield _import_modules
    for name in [m for m in sys.modules if m.startswith("_ae_gc_quiet_")]:
        del sys.modules[name]


def test_a_burst_puts_off_full_collections_and_freezes_what_it_imported(fake_modules):
    quiet = HeapQuiet(min_modules=5)
    quiet.block_entered()
    before = gc.get_threshold()
    full = []
    cb = lambda phase, info: full.append(info["generation"]) if phase == "start" else None  # noqa: E731
    gc.callbacks.append(cb)
    try:
        with quiet.burst():
            assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > before[2]
            fake_modules(5, "a")
            junk = [[[] for _ in range(50)] for _ in range(4000)]  # promotions: no full collection
            del junk
            assert 2 not in full
    finally:
        gc.callbacks.remove(cb)
    assert gc.get_threshold() == before
    assert quiet.frozen and gc.get_freeze_count() > 0
    quiet.block_left()
    assert not quiet.frozen and gc.get_freeze_count() == 0


def test_a_burst_that_imports_little_or_with_no_block_open_freezes_nothing(fake_modules):
    quiet = HeapQuiet(min_modules=5)
    with quiet.burst():  # a compile landing after the program's block ended
        fake_modules(6, "n")
    assert not quiet.frozen and gc.get_freeze_count() == 0
    quiet.block_entered()
    with quiet.burst():
        fake_modules(4, "b")
    assert not quiet.frozen and gc.get_freeze_count() == 0


def test_nested_bursts_freeze_once_at_the_outermost_end(fake_modules):
    quiet = HeapQuiet(min_modules=5)
    quiet.block_entered()
    with quiet.burst():
        with quiet.burst():
            fake_modules(6, "c")
        assert not quiet.frozen and gc.get_threshold()[2] == gc_quiet._OFF
        quiet.thaw()  # a block's exit while a burst runs: nothing to thaw yet
    assert quiet.frozen
    with quiet.burst():
        quiet.block_left()  # the block's exit while the next burst runs (nothing imported):
    assert not quiet.frozen and gc.get_freeze_count() == 0  # its end thaws, no block open
    quiet.block_entered()
    with quiet.burst():
        fake_modules(6, "c2")
    assert quiet.frozen
    quiet.block_entered()  # another thread's block
    quiet.block_left()     # its exit thaws, whatever else runs
    assert not quiet.frozen and gc.get_freeze_count() == 0
    quiet.block_left()


def test_a_program_that_manages_its_collector_is_left_alone(fake_modules):
    quiet = HeapQuiet(min_modules=1)
    quiet.block_entered()
    gc.disable()
    with quiet.burst():
        fake_modules(3, "d")
    assert not quiet.frozen and gc.get_freeze_count() == 0
    gc.enable()
    gc.freeze()  # the program's own freeze (a pre-fork one)
    theirs = gc.get_freeze_count()
    thresholds = gc.get_threshold()
    with quiet.burst():
        assert gc.get_threshold() == thresholds
        fake_modules(3, "e")
    assert not quiet.frozen and gc.get_freeze_count() >= theirs
    quiet.thaw()
    assert gc.get_freeze_count() >= theirs  # not ours to undo
    gc.unfreeze()
    with quiet.burst():
        gc.set_threshold(500, 5, 5)  # the program's own thresholds, set meanwhile
    assert gc.get_threshold() == (500, 5, 5)


def test_the_outermost_blocks_exit_thaws(fake_modules, monkeypatch):
    monkeypatch.setattr(gc_quiet.QUIET, "min_modules", 3)
    x = torch.randn(64)
    with ae.adaptive_eager(backend="eager"):
        with ae.adaptive_eager(backend="eager"):
            with gc_quiet.QUIET.burst():  # what an artifact load does
                fake_modules(3, "f")
            y = (x * 2).sum()
        assert gc_quiet.QUIET.frozen  # an inner block's exit keeps it
        z = float(y)
    assert not gc_quiet.QUIET.frozen and gc.get_freeze_count() == 0
    assert z == float((x * 2).sum())


def test_a_block_closed_from_another_thread_thaws(fake_modules, monkeypatch):
    """Note [A block is left in the thread that entered it]: the block counts as closed
    where another thread exits it, so the freeze goes with it."""
    import threading

    from adaptive_eager import session

    monkeypatch.setattr(gc_quiet.QUIET, "min_modules", 3)
    block = ae.adaptive_eager(backend="eager")
    block.__enter__()
    with gc_quiet.QUIET.burst():
        fake_modules(3, "g")
    assert gc_quiet.QUIET.frozen
    errors = []

    def leave():
        try:
            block.__exit__(None, None, None)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=leave)
    t.start()
    t.join()
    assert errors and "was exited in thread" in errors[0]
    assert not gc_quiet.QUIET.frozen and gc.get_freeze_count() == 0
    assert session.current_mode() is None  # this thread leaves it at its next use
