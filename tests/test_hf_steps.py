"""The optimizer step of Hugging Face training loops under the runtime (issue 27).

Two things the HF zoo showed about the compiled optimizer step (Note [The optimizer step as
one compiled unit], dispatch/optim_compile.py):

- accelerate's ``AcceleratedOptimizer.step`` (so every ``transformers.Trainer`` step)
  calls ``optimizer.step(closure)`` with ``closure=None``: that is no closure, and the
  step stays a candidate;
- a flush inside a step's timed span (a window full, a step counter's ``.item()``) runs
  the program's earlier work, which is not the step's cost (Note [A step compiles once it
  has cost enough]): HF Llama's step was traced at its 5th step because the backward's
  window ran inside it, and the windows around it warmed up again.
"""

from __future__ import annotations

import contextlib

import torch

import adaptive_eager as ae
from adaptive_eager import session

CHEAP = "AdamW|eager: cheaper so far than a compile (optimizer_step_after_ms)"


def _kinds() -> dict[str, int]:
    return dict(ae.stats().optimizer_step_kinds)


def test_a_step_called_with_no_closure_is_compiled_and_equals_eager():
    """``opt.step(None)``, as accelerate calls it, runs compiled (it was "a closure")."""
    def run(block: bool) -> torch.Tensor:
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(64))
        opt = torch.optim.AdamW([p], lr=1e-2)
        ctx = ae.adaptive_eager(backend="eager", async_compile=False, optimizer_step_after_ms=0) \
            if block else contextlib.nullcontext()
        with ctx:
            for i in range(6):
                p.grad = torch.full((64,), 0.1 * (i + 1))
                opt.step(None)
        return p.detach().clone()

    session.clear_sessions()
    ae.reset_stats()
    ref = run(False)
    got = run(True)
    kinds = _kinds()
    assert not any("closure" in k for k in kinds), kinds
    assert kinds.get("AdamW|compiled steps", 0) >= 1, kinds
    assert torch.equal(got, ref)


def test_work_flushed_inside_a_step_is_not_charged_to_the_step():
    """Each step's pending matmuls (tens of ms) run at a flush inside the step (at its
    pre-hook, or where the window is full a few ops into it); the step itself costs a few ms, so over eight steps
    it stays under the 100 ms threshold and is never traced (charged with the matmuls, it
    was past it by the 6th step)."""
    session.clear_sessions()
    ae.reset_stats()
    torch.manual_seed(0)
    a = torch.randn(768, 768) / 768 ** 0.5
    p = torch.nn.Parameter(torch.zeros(768))
    opt = torch.optim.AdamW([p], lr=1e-3)
    ref_p = torch.nn.Parameter(torch.zeros(768))
    ref_opt = torch.optim.AdamW([ref_p], lr=1e-3)
    for _ in range(8):
        ref_p.grad = (a @ a @ a @ a).sum(0)
        ref_opt.step()
    with ae.adaptive_eager(backend="eager", async_compile=False, adaptive_passthrough=False,
                           optimizer_step_after_ms=100, window_size=5):
        for _ in range(8):
            p.grad = (a @ a @ a @ a).sum(0)  # pending until a flush inside the step
            opt.step()
    kinds = _kinds()
    # in the steps: where the window before a step that waits for its compile is flushed
    # (Note [A step waiting for its compile is not captured]), or at a full window
    flushes = ae.stats().flushes
    assert flushes.get("window_full", 0) + flushes.get("optimizer_step", 0) >= 8, flushes
    assert kinds.get(CHEAP) == 8 and "AdamW|signatures" not in kinds, kinds
    assert torch.equal(p.detach(), ref_p.detach())


def test_one_parameter_foreach_step_cut_by_full_windows_equals_eager():
    """A foreach op over one tensor returns a one-element list whose element is its one
    output value: the generated replay stored the list itself, and the next op got
    ``[[t]]`` (or a handle was bound to a list) wherever a full window cut the step."""
    def run(window_size: int | None) -> torch.Tensor:
        torch.manual_seed(0)
        a = torch.randn(64, 64) / 8
        p = torch.nn.Parameter(torch.zeros(64))
        opt = torch.optim.AdamW([p], lr=1e-3)
        session.clear_sessions()
        block = contextlib.nullcontext() if window_size is None else ae.adaptive_eager(
            backend="eager", async_compile=False, adaptive_passthrough=False, window_size=window_size,
            optimizer_step=False)  # the step captured at the foreach level, not compiled whole
        with block:
            for _ in range(5):
                p.grad = (a @ a @ a).sum(0)
                opt.step()
        return p.detach().clone()

    ref = run(None)
    for size in (4, 5, 6, 7):
        assert torch.equal(run(size), ref), size
