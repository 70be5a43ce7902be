"""torch.optim steps at the foreach level (Note [Optimizer steps at the foreach level],
Note [Scalar lists are lifted too]): equal to the program's own path, recurring, compiled
as one region, and the program's choices and optimizer API left intact."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import adaptive_eager as ae
from helpers import assert_optimizer_states_equal
from adaptive_eager.dispatch.optim import FOREACH_EQUAL

O = torch.optim
# (class, kwargs): every class FOREACH_EQUAL claims, with the options that change its path
CASES = [
    (O.Adam, dict(lr=1e-3)), (O.Adam, dict(lr=1e-3, weight_decay=0.1, amsgrad=True)),
    (O.AdamW, dict(lr=1e-3)), (O.AdamW, dict(lr=1e-3, amsgrad=True, maximize=True)),
    (O.SGD, dict(lr=0.1)), (O.SGD, dict(lr=0.1, momentum=0.9)),
    (O.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    (O.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1)),
    (O.RMSprop, dict(lr=1e-2)), (O.RMSprop, dict(lr=1e-2, momentum=0.9, centered=True)),
    (O.Adagrad, dict(lr=1e-2)), (O.Adagrad, dict(lr=1e-2, weight_decay=0.1, lr_decay=0.01)),
    (O.Adamax, dict(lr=1e-2)), (O.Adadelta, dict(lr=1.0)), (O.Rprop, dict(lr=1e-2)),
]
_IDS = [f"{c.__name__}-{'-'.join(k for k in kw if k != 'lr') or 'plain'}" for c, kw in CASES]
# Large enough for the cost model to fuse a momentum update (Note [Capture must cost less
# than the work]), odd sizes and a 1-element tensor included.
_SHAPES = [(256, 64), (64,), (65, 17), (1,), (512,), (9, 9, 9)]


def _params(n: int = 12, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(_SHAPES[i % len(_SHAPES)], generator=gen, dtype=dtype).requires_grad_()
            for i in range(n)]


def _train(cls, kw, steps: int, foreach, ctx=None, dtype=torch.float32, none_every: int = 0,
           misses: list | None = None):
    """``steps`` steps with a changing lr and fresh grads (None for some, some steps)."""
    ps = _params(dtype=dtype)
    opt = cls(ps, foreach=foreach, **kw)
    sched = O.lr_scheduler.LambdaLR(opt, lambda s: 0.5 + 0.5 * (s % 7) / 7)
    gen = torch.Generator().manual_seed(1)
    with ctx if ctx is not None else contextlib.nullcontext():
        for s in range(steps):
            for i, p in enumerate(ps):
                skip = none_every and (i + s) % none_every == 0
                p.grad = None if skip else torch.randn(p.shape, generator=gen, dtype=dtype)
            opt.step()
            sched.step()
            if misses is not None:
                misses.append(ae.stats().meta_misses)
    return ps, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls,kw", CASES, ids=_IDS)
def test_torch_foreach_path_is_bitwise_the_single_tensor_path(cls, kw, dtype):
    """What FOREACH_EQUAL claims, checked against the installed torch."""
    assert cls in FOREACH_EQUAL
    a, oa = _train(cls, kw, 30, False, dtype=dtype, none_every=5)
    b, ob = _train(cls, kw, 30, True, dtype=dtype, none_every=5)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert_optimizer_states_equal(oa, ob, groups=False)  # their foreach flags differ, by construction


def _runtime(**kw):
    # The step captured op by op at the foreach level (the path a step takes when it is not
    # one compiled function: tests/test_optim_compile.py tests that one)
    opts = dict(backend="aot_eager", adaptive_passthrough=False, async_compile=False,
                optimizer_step=False)
    opts.update(kw)
    return ae.adaptive_eager(**opts)


@pytest.mark.parametrize("cls,kw", CASES, ids=_IDS)
def test_steps_run_at_foreach_level_and_equal_eager_when_replayed(cls, kw):
    """Nothing compiles (compile_after high): the runtime replays the foreach step, which
    is bitwise the program's own (single-tensor) eager step."""
    ref, oref = _train(cls, kw, 12, None, none_every=5)
    ae.reset_stats()
    out, oout = _train(cls, kw, 12, None, ctx=_runtime(compile_after=1000), none_every=5)
    assert ae.stats().optimizer_steps_foreach == 12
    for x, y in zip(ref, out):
        assert torch.equal(x, y)
    assert_optimizer_states_equal(oref, oout)
    assert all(g["foreach"] is None for g in oout.param_groups)


@pytest.mark.parametrize("cls,kw", CASES, ids=_IDS)
def test_compiled_foreach_steps_within_rounding_of_eager(cls, kw):
    """50 steps with a changing lr: the step's window recurs, compiles once, and stays
    within 1e-6 of the program's eager path (compiled code rounds differently)."""
    ref, oref = _train(cls, kw, 50, None)
    ae.reset_stats()
    misses: list = []
    out, oout = _train(cls, kw, 50, None, ctx=_runtime(min_region_work=0), misses=misses)
    s = ae.stats()
    for x, y in zip(ref, out):  # relative to each tensor's scale (entries near 0 included)
        assert (y - x).abs().max() <= 1e-6 * x.abs().max(), (y - x).abs().max()
    assert_optimizer_states_equal(oref, oout, exact=False)
    assert s.compile_failures == 0
    # the step's ops are keyed once (the first steps make the state), not once per lr value
    assert misses[10] == misses[-1], misses
    if s.ops_captured > 50:  # more than one op a step (plain SGD is one foreach op)
        assert s.cache_hits >= 45, (s.cache_hits, s.cache_misses)   # lr changes: still hits
        assert 1 <= s.regions_compiled <= 2


def test_explicit_foreach_false_and_fused_are_respected():
    ae.reset_stats()
    out, opt = _train(O.AdamW, dict(lr=1e-3), 5, False, ctx=_runtime(compile_after=1000))
    assert ae.stats().optimizer_steps_foreach == 0
    assert opt.param_groups[0]["foreach"] is False
    ref, _ = _train(O.AdamW, dict(lr=1e-3), 5, False)
    for x, y in zip(ref, out):
        assert torch.equal(x, y)
    ps = _params()
    fused = O.Adam(ps, lr=1e-3, fused=True)
    for p in ps:
        p.grad = torch.ones_like(p)
    with _runtime(compile_after=1000):
        fused.step()
    assert fused.param_groups[0]["foreach"] is None and fused.param_groups[0]["fused"] is True
    assert ae.stats().optimizer_steps_foreach == 0


def test_not_switched_outside_the_runtime_nor_for_unlisted_optimizers():
    ae.reset_stats()
    with _runtime(compile_after=1000):
        pass  # the hooks are installed now
    _train(O.AdamW, dict(lr=1e-3), 3, None)
    _train(O.NAdam, dict(lr=1e-3), 3, None, ctx=_runtime(compile_after=1000))

    class MyAdam(O.Adam):
        pass

    _train(MyAdam, dict(lr=1e-3), 3, None, ctx=_runtime(compile_after=1000))
    assert ae.stats().optimizer_steps_foreach == 0


def test_half_precision_groups_are_not_switched():
    ae.reset_stats()
    _train(O.SGD, dict(lr=0.1, momentum=0.9), 3, None, ctx=_runtime(compile_after=1000),
           dtype=torch.bfloat16)
    assert ae.stats().optimizer_steps_foreach == 0


def test_a_100_tensor_adamw_step_is_one_compiled_region():
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(128 if i % 2 else 96, 64, generator=gen).requires_grad_() for i in range(100)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = O.AdamW(ps, lr=1e-3, weight_decay=0.01)
    ae.reset_stats()
    with _runtime():
        opt.step()  # makes the state (200 zeros_like)
        ae.reset_stats()
        for s in range(8):
            opt.param_groups[0]["lr"] = 1e-3 / (s + 1)
            opt.step()
        st = ae.stats()
    assert st.regions_compiled == 1, st
    assert st.cache_hits >= 5, st   # a first sighting, a compile, then every step a hit
    assert st.ops_captured == 8 * 8, st.ops_captured  # 8 foreach ops, not ~1,200 single-tensor ones
    assert "optimizer steps" in ae.report()


def test_state_dict_round_trip_schedulers_hooks_and_new_groups():
    """The optimizer API around a switched step: state_dict shows the program's own
    foreach=None, load_state_dict continues identically, a param group added mid-run, a
    user's step hooks, zero_grad and clip_grad_norm_ before the step."""
    def train(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        extra = torch.nn.Linear(4, 4)
        opt = O.Adam(model.parameters(), lr=1e-2)
        sched = O.lr_scheduler.StepLR(opt, 2, gamma=0.5)
        seen = []
        opt.register_step_pre_hook(lambda o, a, k: seen.append(len(o.param_groups)))
        with ctx if ctx is not None else contextlib.nullcontext():
            for s in range(8):
                if s == 4:
                    opt.add_param_group({"params": extra.parameters(), "lr": 1e-3})
                x = torch.randn(8, 16)
                loss = extra(model(x)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                sched.step()
                if s == 5:
                    saved = copy.deepcopy(opt.state_dict())
            fresh = O.Adam(list(model.parameters()), lr=1e-2)
            fresh.add_param_group({"params": extra.parameters(), "lr": 1e-3})
            fresh.load_state_dict(saved)
            x = torch.randn(8, 16)
            fresh.zero_grad()
            extra(model(x)).pow(2).mean().backward()
            fresh.step()
        return [p.detach().clone() for p in (*model.parameters(), *extra.parameters())], saved, seen

    ref, saved_ref, seen_ref = train(None)
    ae.reset_stats()
    out, saved_out, seen_out = train(_runtime(compile_after=1000))
    assert ae.stats().optimizer_steps_foreach == 9
    for x, y in zip(ref, out):
        assert torch.equal(x, y)
    assert saved_out["param_groups"] == saved_ref["param_groups"]
    assert all(g["foreach"] is None for g in saved_out["param_groups"])
    assert seen_out == seen_ref


def test_a_step_that_raises_leaves_foreach_unset():
    ps = _params(2)
    opt = O.SGD(ps, lr=0.1, momentum=0.9)

    def boom(*_):
        raise RuntimeError("from the program's hook")

    for p in ps:
        p.grad = torch.ones_like(p)
    handle = opt.register_step_pre_hook(boom)
    with pytest.raises(RuntimeError, match="program's hook"):
        with _runtime(compile_after=1000):
            opt.step()
    handle.remove()
    assert opt.param_groups[0]["foreach"] is None


def test_neuron_adamw_step_is_one_launch():
    from adaptive_eager import neuron_sim

    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(128, 64, generator=gen).to("neuron").requires_grad_() for _ in range(20)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen).to("neuron")
    ref = [p.detach().cpu().clone() for p in ps]
    ref_ps = [r.clone().requires_grad_() for r in ref]
    for r, p in zip(ref_ps, ps):
        r.grad = p.grad.cpu()
    opt = O.AdamW(ps, lr=1e-3)
    opt_ref = O.AdamW(ref_ps, lr=1e-3, foreach=True)
    with _runtime(device="neuron", backend="inductor"):
        for s in range(5):
            opt.param_groups[0]["lr"] = opt_ref.param_groups[0]["lr"] = 1e-3 / (s + 1)
            neuron_sim.reset_launch_count()
            opt.step()
            opt_ref.step()
            launches = neuron_sim.launch_count()
    assert launches <= 3, launches
    for r, p in zip(ref_ps, ps):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-6, atol=1e-7)


def test_the_foreach_switch_never_raises_the_peak(monkeypatch):
    """Note [The foreach switch never raises the peak]: a group whose multi-tensor lists
    could pass the process's peak keeps torch's single-tensor step (counted, reported);
    small groups, lists within 1/32 of the resident set and platforms that cannot tell
    switch; values are eager's either way."""
    from adaptive_eager.dispatch import optim

    def group_opt(n):
        p = torch.nn.Parameter(torch.ones(n))
        p.grad = torch.ones(n)
        return O.AdamW([p], lr=0.1)

    big, small = group_opt(1 << 19), group_opt(1 << 10)  # 2 MiB, 4 KiB
    no_room = lambda: (32 << 20, 32 << 20)  # noqa: E731 - at its peak, 32 MiB resident
    assert optim.use_foreach(big, resident=no_room) is None
    assert big.param_groups[0]["foreach"] is None
    assert optim.use_foreach(small, resident=no_room) == small.param_groups
    for got in (None, (32 << 20, 36 << 20), (128 << 20, 128 << 20)):  # unknown, room, 1/32
        switched = optim.use_foreach(big, resident=lambda: got)
        assert switched == big.param_groups, got
        optim.restore(switched)
    # in a capturing runtime, with no headroom: single-tensor steps, eager's values
    monkeypatch.setattr(optim, "resident_bytes", no_room)
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(512, 512, generator=gen).requires_grad_() for _ in range(2)]
    ref = [p.detach().clone().requires_grad_() for p in ps]
    grads = [[torch.randn(512, 512, generator=gen) for _ in ps] for _ in range(4)]
    for params, ctx in ((ref, contextlib.nullcontext()), (ps, _runtime(compile_after=1000))):
        opt = O.AdamW(params, lr=1e-2)
        ae.reset_stats()
        with ctx:
            for gs in grads:
                for p, g in zip(params, gs):
                    p.grad = g.clone()
                opt.step()
        assert opt.param_groups[0]["foreach"] is None
    s = ae.stats()
    assert s.optimizer_steps_foreach_kept == 4 and s.optimizer_steps_foreach == 0, s
    assert "4 left single-tensor: its lists could have raised the process's peak memory" in ae.report()
    assert all(torch.equal(a, b) for a, b in zip(ps, ref))
