"""The recurring-window fast path (Note [Recurring windows are matched, not recorded],
dispatch/trace.py): results equal eager, every fast window's key equals the slow path's,
divergences continue on the slow path, and the invariants of the capture study hold."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch.trace import TraceBook

from helpers import assert_same

FORCED = {"backend": "eager", "adaptive_passthrough": False, "warmup": False}


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    """Every fast window of these tests checks its key and floats against window_key."""
    real_init = TraceBook.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        self.verify = True

    monkeypatch.setattr(TraceBook, "__init__", init)


def _steps(step, n, state_fn, per_block=False, **opts):
    """``step(state)`` ``n`` times eagerly and under the runtime, on equal states; the
    outputs of every step (made plain) and the final states."""
    torch.manual_seed(0)
    ref_state = state_fn()
    ref = [step(ref_state) for _ in range(n)]
    torch.manual_seed(0)
    state = state_fn()
    ae.reset_stats()
    out = []
    ctx = ae.adaptive_eager(**{**FORCED, **opts})
    if per_block:
        for _ in range(n):
            with ctx:
                out.append(step(state))
    else:
        with ctx:
            for _ in range(n):
                out.append(step(state))
    return ref, out, ref_state, state


def _chain_state():
    return {"x": torch.randn(16), "y": torch.randn(16)}


def _chain(s, n=20, c=1.0001):
    a = s["x"]
    for _ in range(n):
        a = a * c + s["y"]
    return a.sum().item()


def test_a_recurring_window_is_matched_from_its_fourth_sighting():
    ref, out, _, _ = _steps(_chain, 6, _chain_state)
    assert out == ref
    s = ae.stats()
    # 41 ops per window; windows 1-3 recorded (the third builds the trace: Note [Traces
    # start at the third sighting])
    assert s.fast_ops == 3 * 41 and s.ops_captured == 6 * 41
    assert not s.trace_mismatches
    assert "fast path" in ae.report()


def test_the_fast_path_survives_a_block_per_step():
    ref, out, _, _ = _steps(_chain, 5, _chain_state, per_block=True)
    assert out == ref
    assert ae.stats().fast_ops == 2 * 41


def test_fast_path_off_records_every_op():
    ref, out, _, _ = _steps(_chain, 5, _chain_state, fast_path=False)
    assert out == ref and ae.stats().fast_ops == 0


def _train_step(s):
    loss = F.mse_loss(s["net"](s["x"]), s["t"])
    loss.backward()
    s["opt"].step()
    s["opt"].zero_grad()
    if "sched" in s:
        s["sched"].step()  # the lr changes every other step: lifted floats
    return loss.item()


def test_flush_points_and_counts_equal_the_slow_path():
    def train_state():
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        return {"net": net, "opt": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                "x": torch.randn(32, 8), "t": torch.randn(32, 1)}

    seen = {}
    for fast in (True, False):
        # compiles in step (async_compile=False): whether an optimizer step waits for its
        # compile, and so runs uncaptured (Note [A step waiting for its compile is not
        # captured]), must not depend on a compile thread's timing
        ref, out, ref_state, state = _steps(_train_step, 6, train_state, window_size=24,
                                            fast_path=fast, async_compile=False)
        assert out == ref
        for p, q in zip(ref_state["net"].parameters(), state["net"].parameters()):
            assert_same(p, q, exact=True)
        s = ae.stats()
        seen[fast] = (s.flushes, s.windows, s.ops_captured, s.ops_executed, s.sync_sites)
        assert (s.fast_ops > 0) == fast
    assert seen[True] == seen[False]


def test_mlp_training_with_a_schedule_is_fast_and_bitwise_eager():
    def state_fn():
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        return {"net": net, "opt": opt, "sched": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5),
                "x": torch.randn(8, 16), "t": torch.randn(8, 4)}

    ref, out, ref_state, state = _steps(_train_step, 8, state_fn)
    assert out == ref
    for p, q in zip(ref_state["net"].parameters(), state["net"].parameters()):
        assert_same(p, q, exact=True)
    assert ae.stats().fast_ops > 0


def test_signed_zeros_and_nans_are_constants_by_bits():
    xs = [0.0, -0.0, 0.0, -0.0, float("nan"), float("nan"), 0.0, -0.0]

    def state_fn():
        return {"x": torch.randn(8), "i": 0}

    def step(s):
        c = xs[s["i"] % len(xs)]
        s["i"] += 1
        y = torch.where(s["x"] > 0, s["x"], torch.full_like(s["x"], c))   # baked by bits
        z = torch.div(torch.ones(8), y * 2.0 + c)                        # lifted
        return z.tolist()

    ref, out, _, _ = _steps(step, len(xs), state_fn)
    for a, b in zip(ref, out):
        assert torch.equal(torch.tensor(a), torch.tensor(b)) or str(a) == str(b)
        assert [str(v) for v in a] == [str(v) for v in b]  # inf vs -inf, nan


def test_no_strong_references_to_handles():
    x = torch.randn(8)
    refs = []
    with ae.adaptive_eager(**FORCED):
        for _ in range(4):
            h = x * 2
            refs.append(weakref.ref(h))
            y = h + 1
            del h
            y.sum().item()
        assert ae.stats().fast_ops > 0
    gc.collect()
    assert all(r() is None for r in refs)


def test_dropout_draws_eager_random_numbers():
    def state_fn():
        return {"x": torch.randn(64, 16), "w": torch.randn(16, 16)}

    def step(s):
        h = F.dropout(torch.relu(s["x"] @ s["w"]), 0.3, training=True)
        return (h * 2).sum().item()

    ref, out, _, _ = _steps(step, 6, state_fn)
    assert out == ref
    assert ae.stats().fast_ops > 0


def test_a_diverging_window_continues_on_the_slow_path_and_is_counted():
    def state_fn():
        return {"x": torch.randn(16), "k": 0}

    def step(s):
        s["k"] += 1
        a = s["x"] * 2 + 1
        if s["k"] % 3 == 0:           # a Python branch: another op mid-window
            a = torch.sin(a)
        a = a * 3 - 1
        return a.sum().item()

    ref, out, _, _ = _steps(step, 9, state_fn)
    assert out == ref
    s = ae.stats()
    assert s.fast_ops > 0
    assert any(k.startswith("aten::sin at ") and "test_fastpath.py" in k
               for k in s.trace_mismatches), s.trace_mismatches


def test_shape_changes_and_early_flushes():
    def state_fn():
        return {"k": 0}

    def step(s):
        s["k"] += 1
        n = 8 if s["k"] % 4 else 12   # a new input shape now and then
        x = torch.arange(n, dtype=torch.float32)
        a = x * 0.5 + 1
        if s["k"] % 5 == 0:
            print(end="" if a.tolist() else "")  # an early read: flushes mid-trace
        b = (a * a).sum()
        return b.item()

    ref, out, _, _ = _steps(step, 12, state_fn)
    assert out == ref
    assert ae.stats().fast_ops > 0


def test_an_ending_is_reused_only_with_the_same_live_outputs():
    kept = []

    def state_fn():
        return {"x": torch.randn(8), "k": 0}

    def step(s):
        s["k"] += 1
        h = s["x"] * 2
        y = (h + 1).sum()
        if s["k"] % 3 == 0:
            kept.append(h)        # this time the intermediate stays alive: another key
        del h
        return y.item()

    ref, out, _, _ = _steps(step, 9, state_fn)
    assert out == ref
    assert [t.tolist() for t in kept[3:]] == [t.tolist() for t in kept[:3]]
    assert ae.stats().fast_ops > 0


def test_window_full_flushes_at_the_same_op():
    ref, out, _, _ = _steps(lambda s: _chain(s, n=30), 5, _chain_state, window_size=16)
    assert out == ref
    s = ae.stats()
    assert s.fast_ops > 0 and s.flushes["window_full"] == 5 * (61 // 16)


def test_exported_memory_is_never_deferred():
    w = torch.zeros(4)

    def step(s):
        y = w * 2 + 1
        w.add_(1)
        return y.tolist()

    with ae.adaptive_eager(**FORCED):
        outs = [step(None) for _ in range(3)]
        arr = w.numpy()               # w's memory is read outside the dispatcher from now on
        outs.append(step(None))
        assert arr[0] == w[0].item()  # the add_ ran at once
        outs.append(step(None))
    assert outs == [[1.0] * 4, [3.0] * 4, [5.0] * 4, [7.0] * 4, [9.0] * 4]


def test_a_default_dtype_change_is_seen():
    def step(_):
        a = torch.ones(3) * 0.5           # a factory reading the default dtype
        b = torch.arange(3) * 0.5         # promotion to the default dtype
        return (a + b).dtype, (a + b).tolist()

    old = torch.get_default_dtype()
    try:
        with ae.adaptive_eager(**FORCED):
            outs = [step(None) for _ in range(3)]
            torch.set_default_dtype(torch.float64)
            outs += [step(None) for _ in range(3)]
    finally:
        torch.set_default_dtype(old)
    assert [o[0] for o in outs] == [torch.float32] * 3 + [torch.float64] * 3
    assert all(o[1] == [0.5, 1.0, 1.5] for o in outs)


def test_fake_tensors_and_suspended_take_the_slow_path():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4)
    with ae.adaptive_eager(**FORCED):
        for _ in range(3):
            (x * 2 + 1).sum().item()
        with FakeTensorMode() as fm:
            f = fm.from_tensor(x)
            out = f * 2 + 1          # matches the trace's first ops: must stay fake
            assert type(out).__name__ == "FakeTensor"
        with ae.dispatch.lazy.suspended():
            real = x * 2 + 1
            assert type(real) is torch.Tensor
        assert (x * 2 + 1).sum().item() == pytest.approx((x * 2 + 1).sum().item())


def test_in_place_updates_of_aliased_inputs():
    def state_fn():
        p = torch.randn(8)
        return {"p": p, "g": torch.randn(8)}

    def step(s):
        p = s["p"]
        p.data.add_(s["g"], alpha=-0.1)      # p and p.data: one storage, two inputs
        p.mul_(0.99)
        return (p * p).sum().item()

    ref, out, ref_state, state = _steps(step, 6, state_fn)
    assert out == ref
    assert_same(ref_state["p"], state["p"], exact=True)
    assert ae.stats().fast_ops > 0


def test_strict_mode_raises_at_the_same_line():
    x = torch.randn(4)
    with pytest.raises(ae.StrictModeError) as info:
        with ae.adaptive_eager(strict=True, **FORCED):
            for i in range(4):
                y = x * 2 + 1
                if i == 3:
                    y.tolist()  # a sync strict mode refuses
                y = None
    assert "test_fastpath.py" in str(info.value)


def test_a_failing_window_finishes_like_the_slow_path():
    idx = torch.tensor([0, 1, 2])
    outs = []
    with ae.adaptive_eager(**FORCED):
        for i in range(5):
            if i == 3:
                idx[1] = 99               # a gather index out of range, seen at the flush
            total = torch.zeros(1)
            x = torch.arange(4.0)
            try:
                g = x[idx.clone()]
                total = total + g.sum()
                outs.append(total.item())
            except (IndexError, RuntimeError) as e:
                outs.append(type(e).__name__)
            idx[1] = 1
    assert outs[:3] == [3.0, 3.0, 3.0] and outs[4] == 3.0 and isinstance(outs[3], str)


def test_kernel_layouts_learned_forget_the_traces():
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)

    def step(_):
        with torch.no_grad():
            y = conv(x) * 2
            return y.stride(), y.flatten(1).sum().item()

    ref = [step(None) for _ in range(4)]
    with ae.adaptive_eager(**FORCED):
        out = [step(None) for _ in range(4)]
    assert out == ref


def test_the_neuron_device_takes_the_same_path():
    def state_fn():
        return {"x": torch.randn(4, 16).to("neuron"), "w": torch.randn(16, 16).to("neuron")}

    def step(s):
        h = torch.tanh(s["x"] @ s["w"]) * 2 + 1
        return h.cpu().tolist()

    ref, out, _, _ = _steps(step, 5, state_fn, device="neuron")
    assert out == ref
    assert ae.stats().fast_ops > 0


def test_foreach_optimizer_steps_are_matched():
    def state_fn():
        ps = [torch.nn.Parameter(torch.randn(16)) for _ in range(4)]
        return {"ps": ps, "opt": torch.optim.Adam(ps, lr=1e-2, foreach=True)}

    def step(s):
        loss = sum((p * p).sum() for p in s["ps"])
        loss.backward()
        s["opt"].step()                   # bias corrections: lifted scalar lists
        s["opt"].zero_grad()
        return loss.item()

    ref, out, ref_state, state = _steps(step, 6, state_fn)
    assert out == ref
    for p, q in zip(ref_state["ps"], state["ps"]):
        assert_same(p, q, exact=True)
    assert ae.stats().fast_ops > 0


def test_threads_share_the_traces():
    import threading

    x = torch.randn(16)
    expected = (x * 3 + 2).sum().item()
    results: list = []
    ctx_opts = dict(FORCED)

    def work():
        with ae.adaptive_eager(**ctx_opts):
            for _ in range(6):
                results.append((x * 3 + 2).sum().item())

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 18
    assert ae.stats().fast_ops > 0
    assert session.current_mode() is None


# -- random divergences ----------------------------------------------------------------------
OPS = {
    "mul": lambda a, b: a * 1.5,
    "add": lambda a, b: a + b,
    "sub_s": lambda a, b: a - 0.25,
    "relu": lambda a, b: torch.relu(a),
    "exp": lambda a, b: torch.exp(a * 0.1),
    "view": lambda a, b: a.view(-1, a.shape[-1]).view(a.shape),
    "inplace": lambda a, b: a.clone().add_(b),
    "sum": lambda a, b: a.sum(-1, keepdim=True) + a,
    "cat": lambda a, b: torch.cat([a, b], -1)[..., : a.shape[-1]],
}
DIVERGE = st.sampled_from(["shape", "new_op", "branch", "read", "scalar", "none"])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=st.lists(st.sampled_from(sorted(OPS)), min_size=2, max_size=12),
       events=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 20), DIVERGE), max_size=6),
       window=st.sampled_from([5, 256]))
def test_recurring_windows_diverging_at_random_ops_equal_eager(program, events, window):
    """A program of recurring windows; at random steps and ops it diverges: a new input
    shape, a new op, a Python branch taking another op, an early read, another constant."""
    steps = 10
    plan = {}
    for step_i, at, kind in events:
        plan[(step_i % steps, at % len(program))] = kind

    def run(record):
        torch.manual_seed(0)
        x2, y2 = torch.randn(3, 4), torch.randn(3, 4)
        x3, y3 = torch.randn(2, 5), torch.randn(2, 5)
        out = []
        for k in range(steps):
            a, b = x2, y2
            for j, name in enumerate(program):
                kind = plan.get((k, j), "none")
                if kind == "shape":
                    a, b = x3, y3
                elif kind == "new_op":
                    a = torch.tanh(a)
                elif kind == "read":
                    out.append(round(float(a.sum().item()), 4))
                elif kind == "scalar":
                    a = a * 0.75
                if kind == "branch":
                    a = torch.sigmoid(a)  # instead of the op
                else:
                    a = OPS[name](a, b)
            out.append(a.tolist())
        return out

    ref = run(False)
    with ae.adaptive_eager(window_size=window, **FORCED):
        got = run(True)
    assert got == ref
