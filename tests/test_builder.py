"""The window builder, the flush object and the executor contract (issue 23, part A).

Structural tests: one owner writes the open window (WindowBuilder), the flush is an
object with its collaborators passed in, executors are called in one form and answer
with one result type, backends are frozen data, fallback reasons are values.
"""

import ast
import threading
from pathlib import Path

import pytest
import torch

import adaptive_eager as ae
from adaptive_eager import config
from adaptive_eager.dispatch.builder import WindowBuilder
from adaptive_eager.dispatch.flush import Flush
from adaptive_eager.dispatch.match import FIRST
from adaptive_eager.dispatch.meta import MetaMemo, Uncapturable
from adaptive_eager.dispatch.mode import AdaptiveEagerMode
from adaptive_eager.dispatch.optable import OpTable
from adaptive_eager.dispatch.recorder import Recorder
from adaptive_eager.dispatch.release import BoundHandles
from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
from adaptive_eager.reasons import Fallback, R
from adaptive_eager.runtime import Counters, EagerExecutor, Executor
from adaptive_eager.runtime.backends import (Backend, backend_entry, for_device, register_backend,
                                             unregister_backend)
from adaptive_eager.runtime.compiled import CompiledExecutor
from adaptive_eager.statistics import snapshot

from helpers import assert_same

aten = torch.ops.aten
ROOT = Path(ae.__file__).parent


def _writes_of(path: Path, names: tuple[str, ...]) -> list[str]:
    """Assignments to, and mutating calls on, attributes of ``names`` in ``path`` (code
    and the code it generates, as string literals)."""
    text = path.read_text()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                while isinstance(t, ast.Subscript):
                    t = t.value
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in names:
                    found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in names:
                for verb in (" = ", ".append(", "] = ", ".setdefault("):
                    if f"{name}." in node.value and verb in node.value.split(f"{name}.", 1)[1][:40]:
                        found.append(f"{path.name}:{node.lineno}: {node.value.strip()}")
                        break
    return found


def test_only_the_builder_writes_the_open_window():
    # match.py generates the checks; the code that appends a matched node is the builder's
    # (Note [The builder writes its own fields]); the flush and the trace only read it.
    for rel in ("dispatch/match.py", "dispatch/trace.py", "dispatch/flush.py", "dispatch/mode.py"):
        assert _writes_of(ROOT / rel, ("rec", "recorder", "builder")) == [], rel
    assert _writes_of(ROOT / "dispatch/builder.py", ("rec",)), "the check itself finds writes"


def test_a_matched_window_leaves_the_builder_as_recording_does():
    def step(x):
        return ((x * 2 + 1) * 3).sum()

    x = torch.arange(8.0)
    ae.reset_stats()
    with ae.adaptive_eager(backend="eager", adaptive_passthrough=False, warmup=False) as _:
        outs = [step(x).item() for _ in range(5)]
    assert ae.stats().fast_ops > 0  # windows 4 and 5 were matched
    assert outs == [step(x).item()] * 5


def test_first_use_refuses_what_add_input_refuses():
    memo = MetaMemo(64)
    for t in (torch.randn(3, dtype=torch.complex64).conj(), torch.randn(3)._neg_view(),
              torch.randn(4, 4).to_sparse()):
        with pytest.raises(Uncapturable):
            WindowBuilder(torch.device("cpu"), memo, owner=None).add_input(t)
        b = WindowBuilder(torch.device("cpu"), memo, owner=None)
        stride = t.stride() if t.layout == torch.strided else ()
        e = (FIRST, 0, t.shape, stride, 0, t.dtype, t.device, None)
        assert not WindowBuilder.first_use(b, t, e, WindowBuilder.pending())
    # and accepts what it numbers, once (the second use reuses the value id)
    x = torch.ones(3)
    b = WindowBuilder(torch.device("cpu"), memo, owner=None)
    e = (FIRST, 0, x.shape, x.stride(), 0, x.dtype, x.device, None)
    pending = WindowBuilder.pending()
    assert WindowBuilder.first_use(b, x, e, pending)
    b.add_inputs(pending)
    assert b.add_input(x) == 0 and not WindowBuilder.first_use(b, x, e, WindowBuilder.pending())


def test_the_flush_is_an_object_with_its_collaborators():
    memo, counters, lock = MetaMemo(64), Counters(), threading.RLock()
    rec = Recorder(torch.device("cpu"), memo, owner=None)
    x = torch.arange(4.0)
    y = rec.record(aten.mul.Tensor, OpTable().traits(aten.mul.Tensor), (x, 2.0), {})
    flush = Flush(lock=lock, builder=rec, executor=EagerExecutor(), counters=counters, memo=memo,
                  traces=None, table=OpTable(), bound=BoundHandles(counters), strict=False)
    verdict = flush.flush(R.EXPLICIT_SYNC, "here")
    assert verdict.ops == 1 and len(rec) == 0 and counters.windows == 1
    assert_same(y._ae_real, x * 2)
    assert flush.flush(R.EXPLICIT_SYNC, "here") is None  # nothing pending: nothing ran


class _OneForm(Executor):
    """An executor that declares ``known`` without a default: called in one form only."""

    def __init__(self):
        self.calls = []

    def run(self, window, known):
        self.calls.append(known)
        return EagerExecutor().run(window, known)


def test_executors_are_called_in_one_form_and_the_policy_gets_the_verdict():
    ex = _OneForm()
    mode = AdaptiveEagerMode(config.resolve(backend="eager"), ex, Counters())
    noted = []
    mode.policy.note = noted.append
    with mode:
        y = torch.ones(3) * 2
        mode.flush(R.EXPLICIT_SYNC)
    assert ex.calls == [None]
    assert [v.ops for v in noted] == [2]
    assert_same(y, torch.full((3,), 2.0))


def test_one_result_type_a_sighting_only_from_executors_that_key_windows():
    x = torch.ones(4)
    spec = TensorSpec.of(x)
    w = lambda: Window({0: x}, (OpNode(aten.add.Tensor, (ValueRef(0), ValueRef(0)), (), (1,)),),  # noqa: E731
                       {0: spec, 1: spec}, frozenset({1}))
    assert EagerExecutor().run(w(), None).sighting is None
    ex = CompiledExecutor(config.resolve(backend="eager"), Counters())
    try:
        first, again = ex.run(w(), None).sighting, ex.run(w(), None).sighting
    finally:
        ex.close()
    assert not first.recurred and again.recurred and first.key == again.key
    assert again.groups == {0: 0}


def test_backends_are_frozen_data_and_neuron_is_not_special_cased():
    entry = backend_entry("neuron")
    assert isinstance(entry, Backend) and entry.native_devices == {"neuron"}
    with pytest.raises(Exception):
        entry.debugging = True  # frozen
    fn = lambda gm, example_inputs: gm  # noqa: E731
    try:
        register_backend("native_here", fn, native_devices={"neuron"})
        register_backend("cpu_only", fn)
        # neuron_sim is enabled for the suite (conftest): a CPU backend runs on CPU views
        assert for_device("native_here", "neuron") is fn
        assert for_device("cpu_only", "neuron") is not fn
        assert for_device("cpu_only", "cpu") is fn
    finally:
        unregister_backend("native_here")
        unregister_backend("cpu_only")
    with pytest.raises(ValueError, match="built in"):
        unregister_backend("eager")
    with pytest.raises(ValueError, match="unknown adaptive_eager backend 'nope'"):
        backend_entry("nope")


def test_fallback_reasons_are_values_and_the_report_text_is_unchanged():
    c = Counters()
    c.note_fallback("aten::nonzero", R.DATA_DEPENDENT, "prog.py:3 (f)")
    c.note_fallback("aten::nonzero", R.DATA_DEPENDENT)
    c.note_fallback("region", "compile_failed")
    assert c.fallback_ops == {Fallback("aten::nonzero", R.DATA_DEPENDENT): 2,
                              Fallback("region", "compile_failed"): 1}
    assert sorted(map(str, c.fallback_ops)) == ["aten::nonzero: data_dependent", "region: compile_failed"]
    s = snapshot(c)
    assert s.fallback_ops == {"aten::nonzero": 2, "region": 1}
    assert s.fallback_reasons["aten::nonzero"] == (R.DATA_DEPENDENT,)
