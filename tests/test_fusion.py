"""Structural tests of the partitioner: which nodes fuse, in which order regions run."""

import contextlib

import torch

from adaptive_eager.fusion.graph import build_dag, storage_groups
from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
from adaptive_eager.fusion.partition import partition
from adaptive_eager.fusion.policy import DefaultCost, OpSupport
from adaptive_eager.fusion.signature import region_key, window_key

aten = torch.ops.aten
N = 1 << 16
R = ValueRef


def _window(nodes, inputs, outputs, alias_root=None):
    """Specs by running the nodes eagerly (test helper)."""
    env = dict(inputs)
    from adaptive_eager.runtime.executor import run_node
    for n in nodes:
        run_node(n, env)
    specs = {v: TensorSpec.of(t) for v, t in env.items()}
    return Window(inputs, tuple(nodes), specs, frozenset(outputs), alias_root or {})


def _plan(w, cost=None):
    return partition(w, storage_groups(w), OpSupport(), cost or DefaultCost())


def _op(target, args, outs, mutates=(), kwargs=()):
    return OpNode(target, tuple(args), tuple(kwargs), tuple(outs), tuple(mutates))


def test_pointwise_chain_is_one_region():
    x = torch.randn(N)
    w = _window([_op(aten.mul.Tensor, (R(0), 2.0), (1,)), _op(aten.add.Tensor, (R(1), 1.0), (2,)),
                 _op(aten.relu.default, (R(2),), (3,)), _op(aten.sigmoid.default, (R(3),), (4,))],
                {0: x}, {4})
    p = _plan(w)
    assert [(r.nodes, r.fused) for r in p.steps] == [((0, 1, 2, 3), True)]
    assert p.steps[0].inputs == (0,) and p.steps[0].outputs == (4,)  # dead 1..3 not outputs


def test_matmul_keeps_prologue_and_epilogue():
    a, b, bias = torch.randn(256, 256), torch.randn(256, 256), torch.randn(256)
    w = _window([_op(aten.mul.Tensor, (R(0), 0.5), (3,)), _op(aten.mm.default, (R(3), R(1)), (4,)),
                 _op(aten.add.Tensor, (R(4), R(2)), (5,)), _op(aten.gelu.default, (R(5),), (6,))],
                {0: a, 1: b, 2: bias}, {6})
    assert [(r.nodes, r.fused) for r in _plan(w).steps] == [((0, 1, 2, 3), True)]


def test_unsupported_op_splits_region_but_independent_ops_still_fuse():
    x = torch.randn(N)
    # nonzero reads mul's result: the one-op region {0} closes (too little to fuse) and stays
    # eager; add/exp/mul after it fuse, the last one reading nonzero's result.
    w = _window([_op(aten.mul.Tensor, (R(0), 2.0), (1,)), _op(aten.nonzero.default, (R(1),), (2,)),
                 _op(aten.add.Tensor, (R(1), 1.0), (3,)), _op(aten.exp.default, (R(3),), (4,)),
                 _op(aten.mul.Tensor, (R(2), 3), (5,))],
                {0: x}, {4, 5})
    steps = _plan(w).steps
    assert [(r.nodes, r.fused) for r in steps] == [((0,), False), ((1,), False),
                                                   ((2, 3, 4), True)]
    assert steps[1].reason == "data_dependent"


def test_factories_run_before_the_region_when_the_backend_says_so():
    # Note [Factories outside Inductor regions]: arange feeding an embedding is fused by
    # default, and stays out of the region under Inductor's support policy.
    w_emb = torch.randn(4096, 64)
    nodes = [_op(aten.arange.default, (256,), (1,), kwargs=(("device", torch.device("cpu")),)),
             _op(aten.embedding.default, (R(0), R(1)), (2,)),
             _op(aten.mul.Tensor, (R(2), 2.0), (3,)), _op(aten.relu.default, (R(3),), (4,))]
    w = _window(nodes, {0: w_emb}, {4})
    assert [(r.nodes, r.fused) for r in _plan(w).steps] == [((0, 1, 2, 3), True)]
    from adaptive_eager.runtime.backends import backend_support

    steps = partition(w, storage_groups(w), backend_support("inductor"), DefaultCost()).steps
    assert [(r.nodes, r.fused) for r in steps] == [((0,), False), ((1, 2, 3), True)]
    assert steps[0].reason == "factory" and 1 in steps[1].inputs


def test_dependent_eager_op_closes_region_and_order_is_kept():
    x = torch.randn(N)
    w = _window([_op(aten.mul.Tensor, (R(0), 2.0), (1,)), _op(aten.add.Tensor, (R(1), 1.0), (2,)),
                 _op(aten.nonzero.default, (R(2),), (3,)),
                 _op(aten.mul.Tensor, (R(2), 3.0), (4,)), _op(aten.exp.default, (R(4),), (5,))],
                {0: x}, {3, 5})
    steps = _plan(w).steps
    assert [(r.nodes, r.fused) for r in steps] == [((0, 1), True), ((2,), False), ((3, 4), True)]
    assert steps[0].outputs == (2,)


def test_convexity_every_edge_runs_forward():
    x = torch.randn(N)
    support = OpSupport(deny=frozenset({"aten::neg"}))  # neg plays the unsupported op
    nodes = [_op(aten.mul.Tensor, (R(0), 2.0), (1,)), _op(aten.neg.default, (R(1),), (2,)),
             _op(aten.add.Tensor, (R(1), R(2)), (3,)), _op(aten.neg.default, (R(0),), (4,)),
             _op(aten.exp.default, (R(1),), (5,)), _op(aten.add.Tensor, (R(5), R(4)), (6,)),
             _op(aten.mul.Tensor, (R(6), R(3)), (7,))]
    w = _window(nodes, {0: x}, {7})
    p = partition(w, storage_groups(w), support, DefaultCost())
    dag = build_dag(w, storage_groups(w))
    pos = {i: s for s, r in enumerate(p.steps) for i in r.nodes}
    assert sorted(pos) == list(range(len(nodes)))
    for a, b in dag.edges:  # steps in order: nothing leaves a region and comes back
        assert pos[a] <= pos[b]
    assert [r.fused for r in p.steps].count(True) >= 1


def test_mutation_of_aliased_real_inputs_keeps_program_order():
    p = torch.randn(N)
    pd = p.data  # a second real input sharing p's storage
    w_nodes = [_op(aten.mul.Tensor, (R(0), 2.0), (2,)),           # reads p
               _op(aten.nonzero.default, (R(2),), (3,)),             # eager
               _op(aten.add_.Tensor, (R(1), 1.0), (1,), (1,)),        # writes p.data
               _op(aten.mul.Tensor, (R(0), 3.0), (4,))]               # reads p again
    w = Window({0: p, 1: pd}, tuple(w_nodes),
               {i: TensorSpec.of(p) for i in range(5)}, frozenset({3, 4}))
    assert storage_groups(w) == {0: 0, 1: 0}
    dag = build_dag(w, storage_groups(w))
    assert dag.has_edge(0, 2) and dag.has_edge(2, 3)


def test_tiny_regions_stay_eager_by_cost():
    x = torch.randn(32)
    w = _window([_op(aten.mul.Tensor, (R(0), 2.0), (1,)), _op(aten.add.Tensor, (R(1), 1.0), (2,))],
                {0: x}, {2})
    (r,) = _plan(w).steps
    assert not r.fused and r.reason == "too_small"


def test_keys_ignore_lifted_scalars_but_not_baked_ones():
    x = torch.randn(N)

    def win(lr, lo):
        return _window([_op(aten.mul.Tensor, (R(0), lr), (1,)),
                        _op(aten.clamp.default, (R(1), lo), (2,))], {0: x}, {2})
    k1, f1 = window_key(win(0.1, 0.0), {0: 0})
    k2, f2 = window_key(win(0.2, 0.0), {0: 0})
    k3, _ = window_key(win(0.2, 0.5), {0: 0})
    assert k1 == k2 and f1 == [0.1] and f2 == [0.2] and k1 != k3
    w = win(0.1, 0.0)
    r1 = region_key(w, (0, 1), (0,), (2,), {0: 0})
    w2 = win(0.3, 0.0)
    assert r1 == region_key(w2, (0, 1), (0,), (2,), {0: 0})


# -- Note [Lifted scalars keep eager's rounding] (fusion/scalars.py) ---------------------
import pytest  # noqa: E402

import adaptive_eager as ae  # noqa: E402
from adaptive_eager.fusion.scalars import LIFT_RULES, lift_rule  # noqa: E402
from helpers import mode  # noqa: E402


def _updates(ps, gs, ts, lr):
    """One step of every rewritten form: alpha, value, foreach alpha and value lists."""
    out = []
    for p, g, t in zip(ps, gs, ts):
        p.add_(g, alpha=-lr)
        p.sub_(t, alpha=lr * 0.5)
        out.append(torch.add(p, g, alpha=lr) + torch.sub(p, t, alpha=lr))
        p.addcmul_(g, t, value=-lr * 0.1)
        p.addcdiv_(g, t.abs() + 1, value=-lr * 0.2)
    torch._foreach_add_(ps, gs, alpha=-lr)
    torch._foreach_sub_(ps, ts, alpha=lr)
    torch._foreach_addcmul_(ps, gs, ts, [lr * (i + 1) for i in range(len(ps))])
    torch._foreach_addcmul_(ps, gs, ts, -lr)
    torch._foreach_addcdiv_(ps, gs, [t.abs() + 1 for t in ts], [-lr] * len(ps))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_lifted_scalars_round_as_eager(dtype):
    """Regions holding every rewritten op, run by the eager backend with a new learning rate
    each step (so the floats are lifted, not baked), equal eager bit for bit; in bfloat16
    the floats are baked (not lifted), so the rate is constant for the window to recur."""
    varying = dtype in (torch.float32, torch.float64)
    def run(runtime):
        torch.manual_seed(0)
        ps = [torch.randn(n).to(dtype) for n in (1, 7, 33, 4099)]
        gs = [torch.randn_like(p) for p in ps]
        ts = [torch.randn_like(p) for p in ps]
        outs = []
        with mode(min_region_work=0) if runtime else contextlib.nullcontext():
            for step in range(6):
                outs += _updates(ps, gs, ts, 1e-3 * (step + 1 if varying else 1))
                outs.append(torch.stack([p.sum() for p in ps]).clone())
                outs[-1].tolist()  # a read ends the window each step: it recurs
        return ps, outs
    ae.reset_stats()
    eager, got = run(False), run(True)
    s = ae.stats()
    assert s.ops_fused > 0 and s.compiled_calls > 0, ae.report()
    for a, b in zip(eager[0] + eager[1], got[0] + got[1]):
        assert torch.equal(a, b), (a - b).abs().max()


def test_low_precision_alpha_is_not_lifted():
    """float16/bfloat16: no rewrite rounds as eager's kernels do, so the float is baked."""
    from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef
    aten = torch.ops.aten
    for dtype, lifted in ((torch.float32, True), (torch.bfloat16, False), (torch.float16, False)):
        spec = TensorSpec((4,), (1,), 0, dtype, torch.device("cpu"))
        node = OpNode(aten.add.Tensor, (ValueRef(0), ValueRef(1)), (("alpha", 0.5),), (2,))
        assert (lift_rule(node, {0: spec, 1: spec, 2: spec}) is not None) == lifted, dtype
    assert LIFT_RULES[(aten.add.Tensor, "alpha")].rewrite


def test_targets_gathered_from_an_input_are_checked_on_the_input():
    """``yb = Y[idx]`` feeding nll_loss: yb's values are elements of Y, so the region is
    checked on Y and not cut before the loss (issue 26: the cut split a training step in
    two, and the second half read views of parameters it updates)."""
    logits, y, idx = torch.randn(64, 10), torch.randint(0, 10, (1024,)), torch.randint(0, 1024, (64,))
    w = _window([_op(aten.index.Tensor, (R(1), [R(2)]), (3,)),
                 _op(aten.log_softmax.int, (R(0), 1), (4,)),
                 _op(aten.nll_loss_forward.default, (R(4), R(3), None, 1, -100), (5, 6))],
                {0: logits, 1: y, 2: idx}, {5})
    (r,) = _plan(w, DefaultCost(min_work=0, call_us=0.0)).steps
    assert r.fused and r.nodes == (0, 1, 2)
    assert (1, 0, 10, -100) in r.index_checks and (2, -1024, 1024, None) in r.index_checks


def _split_step(w_input, view_node):
    """A step cut in two by an eager op: the second half reads ``view_node``'s result (a
    view of W, made before it) and updates W in place (an optimizer step)."""
    x = torch.randn(256, 256)
    nodes = [view_node,                                              # %2 = view of W
             _op(aten.mm.default, (R(1), R(2)), (3,)),                # forward
             _op(aten.nonzero.default, (R(3),), (4,)),                # eager: cuts the step
             _op(aten.mm.default, (R(3), R(2)), (5,)),                # backward reads W.t()
             _op(aten.mul_.Tensor, (R(0), 0.9), (0,), (0,)),          # W updated
             _op(aten.add.Tensor, (R(5), R(0)), (6,))]                # reads W after
    return _window(nodes, {0: w_input, 1: x}, {4, 6}, {2: 0} if view_node.is_view else {})


def test_a_view_made_before_a_region_that_writes_its_base_is_rebuilt_inside():
    """Note [Aliased inputs are rebuilt as views]: the region takes W alone and runs the
    recorded ``t`` first; its graph computes what the nodes compute in order."""
    W = torch.randn(256, 256)
    w = _split_step(W, OpNode(aten.t.default, (R(0),), (), (2,), (), True))
    steps = _plan(w).steps
    last = steps[-1]
    assert last.fused and last.nodes == (3, 4, 5), steps
    assert last.inputs == (3, 0) and last.mutated == (0,)
    assert [n.target for n in last.derived] == [aten.t.default]
    from adaptive_eager.fusion.fxgraph import lower
    from adaptive_eager.runtime.executor import run_node
    env = {0: W.clone(), 1: w.inputs[1]}
    for n in w.nodes:
        run_node(n, env)
    W2 = W.clone()
    env2 = {0: W2, 1: w.inputs[1]}
    run_node(w.nodes[0], env2), run_node(w.nodes[1], env2)
    (out,) = torch.compile(lower(w, last).module, backend="aot_eager")(env2[3], W2, torch.tensor(0.9))
    assert torch.equal(out, env[6]) and torch.equal(W2, env[0])


def test_real_inputs_that_are_permutations_of_one_another_are_rebuilt():
    W = torch.randn(256, 256)
    w = _split_step(W, OpNode(aten.t.default, (R(0),), (), (2,), (), True))
    w = Window({0: W, 1: w.inputs[1], 2: W.t()}, w.nodes[1:], w.specs, w.outputs)  # W.t() real
    last = _plan(w).steps[-1]
    assert last.fused and last.inputs == (3, 2), last  # W.t() is the base, read first
    assert [(n.target, n.args, n.outputs) for n in last.derived] == \
        [(aten.permute.default, (R(2), [1, 0]), (0,))]


def test_overlapping_slices_one_written_stay_eager_and_say_which():
    W, x = torch.randn(512, 256), torch.randn(256, 256)
    nodes = [_op(aten.mm.default, (R(1), R(2)), (3,)), _op(aten.nonzero.default, (R(3),), (4,)),
             _op(aten.mm.default, (R(3), R(2)), (5,)), _op(aten.mul_.Tensor, (R(0), 0.9), (0,), (0,)),
             _op(aten.add.Tensor, (R(5), R(0)), (6,))]
    w = _window(nodes, {0: W[:256], 1: x, 2: W[1:257]}, {4, 6})
    last = _plan(w).steps[-1]
    assert not last.fused and last.reason.startswith("aliased_inputs: "), last
    assert last.reason == "aliased_inputs: a 256x256 float32 tensor at offset 256, a 256x256 " \
                          "float32 tensor share storage; aten::mul_.Tensor writes it", last.reason


def _sliced(start):
    """A batch sliced from a real tensor at ``start``, then computed on."""
    X = torch.randn(1024, 256)
    return _window([_op(aten.slice.Tensor, (R(0), 0, start, start + 64), (1,)),
                    _op(aten.mul.Tensor, (R(1), 2.0), (2,)), _op(aten.relu.default, (R(2),), (3,))],
                   {0: X}, {3}, {1: 0})


def test_a_moving_slice_is_one_window_and_one_region():
    """Note [View offsets are inputs]: the start is not in the window key, the slice runs
    just before the region, and the region is keyed without its input's offset."""
    w8, w64 = _sliced(8), _sliced(64)
    assert window_key(w8, storage_groups(w8))[0] == window_key(w64, storage_groups(w64))[0]
    p8, p64 = _plan(w8), _plan(w64)
    assert [(r.nodes, r.fused, r.reason) for r in p8.steps] == \
        [((0,), False, "offset_view"), ((1, 2), True, "")]
    assert p8.steps[1].inputs == (1,) and p8.steps[1].key == p64.steps[1].key
    # a shorter last batch is another window
    w_end = _window([_op(aten.slice.Tensor, (R(0), 0, 1000, 1064), (1,))], {0: torch.randn(1024, 4)},
                    {1}, {1: 0})
    w_mid = _window([_op(aten.slice.Tensor, (R(0), 0, 900, 964), (1,))], {0: torch.randn(1024, 4)},
                    {1}, {1: 0})
    assert window_key(w_end, storage_groups(w_end))[0] != window_key(w_mid, storage_groups(w_mid))[0]


def test_offsets_stay_in_the_key_where_inputs_share_storage():
    X = torch.randn(1024, 256)
    w = _window([_op(aten.add.Tensor, (R(0), R(1)), (2,)), _op(aten.mul.Tensor, (R(2), 2.0), (3,))],
                {0: X[:64], 1: X[8:72]}, {3})
    w2 = _window([_op(aten.add.Tensor, (R(0), R(1)), (2,)), _op(aten.mul.Tensor, (R(2), 2.0), (3,))],
                 {0: X[:64], 1: X[16:80]}, {3})
    assert _plan(w).steps[0].key != _plan(w2).steps[0].key
