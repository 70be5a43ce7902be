"""Layouts a compiler changes: the op is found, named, and the cat of a KV cache compiles.

Inductor traces a region again after its own decompositions; a decomposition that lays
out its result otherwise than eager breaks the region's views (Note [Which op's layout
disagreed], runtime/layouts.py). ``decomposing`` (tests/helpers.py) shows Inductor's
layouts without its code generation.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx as fx

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
from adaptive_eager.fusion.fxgraph import lower
from adaptive_eager.fusion.partition import Region
from adaptive_eager.runtime.layouts import explains_layout, layout_disagreements
from helpers import decomposing, inductor_table as _inductor_table

aten = torch.ops.aten
OPTS = dict(backend=decomposing, compile_after=1, async_compile=False, min_region_work=0,
            adaptive_passthrough=False)


def _cache_attention(q, k_new, cache):
    """A key cache as Hugging Face models start one (a legacy empty tensor), then scores."""
    k = torch.cat([cache, k_new.transpose(1, 2)], dim=-2)  # eager: contiguous
    scores = torch.matmul(q * 0.25, k.transpose(-1, -2))  # views k^T as (B*H, D, S)
    return (scores.softmax(-1) * scores.tanh() + 1.0).sum()


def _cache_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 4, 64, 32, generator=g), torch.randn(4, 64, 4, 32, generator=g),
            torch.tensor([]))


def test_checker_names_cat_that_inductor_lays_out_otherwise():
    g = fx.Graph()
    e, x = g.placeholder("e"), g.placeholder("x")
    t = g.call_function(aten.transpose.int, (x, 1, 2))
    c = g.call_function(aten.cat.default, ([e, t], -2))
    g.output((g.call_function(aten.mul.Tensor, (c, 2.0)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    example = [torch.zeros(0), torch.zeros(2, 8, 4, 16)]
    found = layout_disagreements(gm, example, _inductor_table())
    assert [(d.node, d.op, d.by) for d in found] == [("cat_default", "aten::cat", "compiler")]
    assert found[0].eager_stride == (512, 128, 16, 1) and found[0].compiled_stride == (512, 16, 64, 1)
    assert layout_disagreements(gm, example, {}) == []  # eager's own layouts agree
    assert layout_disagreements(gm, example, None, real=True) == []  # and so does the kernel


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_checker_finds_a_meta_kernel_that_disagrees_with_the_real_one(device):
    # convolution's meta kernel says contiguous; the CPU kernel (which the emulated
    # neuron device runs) keeps a channels_last input's layout (Note [Layouts only the
    # kernel knows], dispatch/meta.py)
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.output((g.call_function(aten.convolution.default,
                              (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    x = torch.zeros(1, 3, 8, 8).to(memory_format=torch.channels_last).to(device)
    found = layout_disagreements(gm, [x, torch.zeros(4, 3, 3, 3, device=device)], None, real=True)
    assert [(d.op, d.by) for d in found] == [("aten::convolution", "kernel")]


def test_cat_with_a_legacy_empty_input_is_lowered_as_a_copy_in_eagers_layout():
    q, k_new, cache = _cache_inputs()
    t = k_new.transpose(1, 2)
    out = torch.cat([cache, t], -2)
    specs = {0: TensorSpec.of(cache), 1: TensorSpec.of(t), 2: TensorSpec.of(out)}
    w = Window({0: cache, 1: t}, (OpNode(aten.cat.default, ([ValueRef(0), ValueRef(1)], -2), (), (2,)),),
               specs, frozenset({2}))
    gm = lower(w, Region((0,), (0, 1), (2,), (), True)).module
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert node.target is aten.clone.default and node.kwargs == {"memory_format": torch.contiguous_format}
    got = gm(cache, t)[0]
    assert torch.equal(got, out) and got.stride() == out.stride()
    assert layout_disagreements(gm, [cache, t], _inductor_table()) == []


def test_kv_cache_attention_compiles_under_inductor_decompositions():
    args = _cache_inputs()
    ref = _cache_attention(*args)
    for _ in range(3):
        with ae.adaptive_eager(**OPTS):
            got = _cache_attention(*args)
        torch.testing.assert_close(got, ref)
    s = ae.stats()
    assert s.compile_failures == 0, s.fallback_ops
    assert s.compiled_calls >= 1 and s.ops_fused > 0


def _relu_transposed(x):
    return torch.clamp_min(x.t().contiguous().t(), 0)  # values of relu, strides of x.t()


def test_a_layout_failure_names_the_op_and_its_line_in_the_report_and_the_log(caplog):
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    table = {aten.relu.default: _relu_transposed}

    def backend(gm, example_inputs):
        with torch.no_grad():
            return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g),
                                decompositions=table)(gm, example_inputs)

    backend.decompositions = table
    x = torch.randn(256, 128)
    opts = dict(OPTS, backend=backend)
    with caplog.at_level(logging.DEBUG, logger="adaptive_eager"):
        for _ in range(3):
            with ae.adaptive_eager(**opts):
                y = (x * 2).relu().view(-1).tanh() + 1  # the view fails on relu's decomposition
            torch.testing.assert_close(y, ((x * 2).relu().view(-1).tanh() + 1))
    s = ae.stats()
    assert s.compile_failures == 1
    assert s.fallback_ops == {"aten::relu": 1, "region": 1}
    assert s.fallback_reasons == {"aten::relu": ("compiler_layout",), "region": ("compile failed",)}
    assert s.fallback_sites["aten::relu"].startswith(__file__)  # the program's line
    logged = [r.getMessage() for r in caplog.records if "layout:" in r.getMessage()]
    assert any("aten::relu" in m and "(128, 1) in eager, (1, 256)" in m for m in logged), logged
    assert "compiler_layout" in ae.report() and "aten::relu" in ae.report()


def test_explains_layout_only_layout_errors():
    assert explains_layout(ValueError("Cannot view a tensor with shape [2] and strides (2,)"))
    assert explains_layout("view size is not compatible with input tensor's size and stride")
    assert not explains_layout(RuntimeError("injected compile failure"))


def test_a_compiled_calls_stride_assertion_names_the_input_recorded_otherwise():
    from adaptive_eager.runtime.cache import RegionEntry
    from adaptive_eager.runtime.compiled import _why
    from adaptive_eager.runtime.layouts import input_disagreement

    x = torch.zeros(1, 32, dtype=torch.int64)
    e = x.expand(4, 32)  # recorded: stride 0 at dim 0
    specs = {0: TensorSpec.of(x), 1: TensorSpec.of(e), 2: TensorSpec.of(e + 1)}
    w = Window({0: x}, (OpNode(aten.expand.default, (ValueRef(0), [4, 32]), (), (1,), is_view=True),
                        OpNode(aten.add.Tensor, (ValueRef(1), 1), (), (2,))), specs, frozenset({2}))
    region = Region((1,), (1,), (2,), (), True)
    ran = torch.zeros(4, 32, dtype=torch.int64)  # what ran: stride 32 at dim 0
    assert input_disagreement(w, region, [e]) is None
    said = input_disagreement(w, region, [ran])
    assert said == "input %1 (aten::expand): got strides (32, 1), recorded (0, 1)", said
    error = AssertionError("expected size 4==4, stride 32==0 at dim=0")
    entry = RegionEntry("k", compiled_for=(specs[1],))
    assert _why(w, region, entry, [ran], error) == \
        " [layout: input %1 (aten::expand): got strides (32, 1), compiled for (0, 1)]"
    assert _why(w, region, entry, [ran], RuntimeError("injected")) == ""
    # compiled for another layout than the recorded one: the call is judged against it
    entry = RegionEntry("k", compiled_for=(TensorSpec.of(ran),))
    assert _why(w, region, entry, [e], error) == \
        " [layout: input %1 (aten::expand): got strides (0, 1), compiled for (32, 1)]"


def test_an_expanded_real_input_is_copied_for_the_first_compiled_call(caplog, monkeypatch):
    # BERT's token_type_ids: a buffer expanded to the batch (stride 0) becomes a real
    # tensor that a later region reads (its embedding's backward). The first compiled call
    # runs on copies of the inputs; copying a stride-0 layout element by element raised
    # "more than one element of the written-to tensor refers to a single memory location",
    # and the whole window ran eagerly (issue 27, item 4).
    from adaptive_eager import _logging

    monkeypatch.setattr(_logging, "_WARNED", set())
    caplog.set_level(logging.WARNING, logger="adaptive_eager")

    def run():
        e = torch.arange(4096.0)[None].expand(64, 4096)  # real, strides (0, 1)
        w = torch.linspace(-1, 1, 64 * 4096).reshape(64, 4096)  # a window worth its capture
        out = []
        for _ in range(6):
            w.mul_(0.5).add_(e.sin() * e)
            out.append(w.sum().item())
        return w, out

    ref = run()
    session.counters().reset()
    with ae.adaptive_eager(**OPTS, warmup=False):
        got = run()
    assert not [r for r in caplog.records if "window failed" in r.getMessage()]
    assert ae.stats().compiled_calls >= 2
    torch.testing.assert_close(got[0], ref[0])
    assert got[1] == ref[1]


def _one_object_per_alias(gm, example_inputs):
    """A backend that returns one object for outputs that alias each other with the same
    layout, as Inductor does for a value and its ``detach``."""
    def run(*args):
        outs = list(gm(*args))
        for i, o in enumerate(outs):
            for p in outs[:i]:
                if o.data_ptr() == p.data_ptr() and o.shape == p.shape and o.stride() == p.stride():
                    outs[i] = p
                    break
        return tuple(outs)
    return run


def test_compiled_outputs_that_alias_stay_distinct_tensors_and_the_next_window_recurs():
    # A window keeps a value and its detach alive, the next one reads both: eager hands it
    # two tensors sharing memory. A backend that returns one object for both made the
    # next window a new one from the first compiled step on (issue 27: Llama, T5).
    from adaptive_eager.runtime import register_backend

    register_backend("test_alias_plain", lambda gm, ex: gm, debugging=True)
    register_backend("test_alias_one_object", _one_object_per_alias, debugging=True)

    def run():
        x = torch.linspace(-1, 1, 512 * 512).reshape(512, 512)
        out = []
        for _ in range(8):
            y = (x * 1.5).exp()
            z = y.detach()
            out.append((y * 0.5).sum().item())
            out.append((y * 2 + z).sum().item())
        return out

    ref = run()
    fused = {}
    for backend in ("test_alias_plain", "test_alias_one_object"):
        session.clear_sessions()
        session.counters().reset()
        with ae.adaptive_eager(**{**OPTS, "backend": backend}, warmup=False):
            assert run() == ref
        fused[backend] = ae.stats().ops_fused
    assert fused["test_alias_plain"] > 0
    assert fused["test_alias_one_object"] == fused["test_alias_plain"], fused
