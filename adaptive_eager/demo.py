"""The demo: train a model eagerly, then under adaptive eager, and compare.

Random init, random data (no downloads), a fixed number of AdamW steps, the same seed
for both runs. Prints both runs' progress, how far the loss curves are apart, the
speedup (wall and CPU time, with the machine's load average), where the adaptive run's
time went, and the report; ``--plot FILE`` draws the loss curves and the time.
``adaptive-eager demo --help`` for the flags.

Note [The demo's workload]
The default job is a wide MLP classifier (256 -> 4096 -> 4096 -> 10, 17.9M parameters,
batch 8) trained with AdamW: its step is dominated by memory-bound work, AdamW's update
of every parameter and the pointwise ops around the matmuls, which the runtime captures
as one window per step (ended by the optimizer step) and Inductor compiles into one
region (a second one for the steps that read the loss). Both runs use AdamW(foreach=True),
so the speedup is capture and fusion's alone: with torch's CPU default (the single-tensor
loop) the eager run is slower still and the runtime switches the step to the foreach
path (Note [Optimizer steps at the foreach level]), which alone made a 2048-wide step 1.9x
faster. Measured on the 2-core machine, 1 torch thread, load average 3-3.6 (other jobs
running), 300 steps: eager 208 ms a step (144 ms CPU), adaptive 122 ms (81 ms CPU) once
its compiles were ready, 24 s after being queued: 1.7x a step, 1.03x over the whole run
with compiling. Smaller steps gain less: 2048 wide at batch 4, foreach in both, 1.0x wall
(1.27x CPU). The GPT of the benchmarks (``--model gpt``, benchmark (c)'s model) is
matmul-bound at sizes that train in a minute here (d_model 256, batch 4): its one compile
was still in flight after 200 steps (30 s, 57 ms a step eagerly).

Example::

    >>> from adaptive_eager.demo import run_demo
    >>> result = run_demo(steps=2, backend="eager", size="tiny", out=None)  # doctest: +SKIP
    >>> result.max_abs_diff < 1e-3  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, TextIO

import torch
import torch.nn as nn
import torch.nn.functional as F

from .benchmarks.workloads._gpt import GPT
from .reporting import format_report

# model -> size -> dimensions; default steps per model (about 2 minutes on 2 cores)
SIZES: dict[str, dict[str, tuple[int, ...]]] = {
    # (inputs, width, classes, batch)
    "mlp": {"tiny": (16, 32, 4, 4), "small": (256, 4096, 10, 8), "medium": (256, 6144, 10, 8)},
    # (vocab, d_model, layers, heads, seq_len, batch)
    "gpt": {"tiny": (64, 32, 1, 2, 16, 2), "small": (256, 128, 2, 4, 64, 8),
            "medium": (512, 256, 4, 4, 128, 8)},
}
DEFAULT_STEPS = {"mlp": 250, "gpt": 200}  # 1.5-2 minutes for the mlp on 2 cores


@dataclass(frozen=True)
class Job:
    """What both runs train: a model, its optimizer and its loss, from a seed."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[int], torch.Tensor]   # step -> the loss of that step's batch
    title: str


# Note [Batches are tensors of their own]
# Each step's batch is a tensor of its own, as a DataLoader hands them out, not a slice
# ``data[i % n]`` of one tensor: the slice's index is an int baked into the step's window
# key, so each step of a cycle was a window never seen before, the runtime stopped
# capturing after three of them (they looked like one window on changing inputs) and
# nothing compiled (the old demo's "0 regions compiled"; a line in README.md's Limitations).
def build(model: str, size: str, seed: int = 0) -> Job:
    """The job ``model`` (mlp or gpt) at ``size``, made from ``seed``."""
    if model not in SIZES or size not in SIZES[model]:
        raise ValueError(f"no {model!r} of size {size!r}: models {sorted(SIZES)}, sizes "
                         f"{sorted(SIZES.get(model, SIZES['mlp']))}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if model == "mlp":
        n_in, width, classes, batch = SIZES[model][size]
        net: nn.Module = nn.Sequential(nn.Linear(n_in, width), nn.GELU(), nn.Linear(width, width),
                                       nn.GELU(), nn.Linear(width, classes))
        # A noisy linear teacher labels 256 batches: a task the MLP learns over the run
        # (random labels on fewer batches were memorized, the loss 0.0000 from step 100).
        teacher = torch.randn(n_in, classes, generator=gen)
        xs = [torch.randn(batch, n_in, generator=gen) for _ in range(256)]
        ys = [(x @ teacher + 0.5 * torch.randn(batch, classes, generator=gen)).argmax(-1)
              for x in xs]

        def loss(i: int) -> torch.Tensor:
            return F.cross_entropy(net(xs[i % len(xs)]), ys[i % len(ys)])

        title = f"MLP {n_in} -> {width} -> {width} -> {classes} (GELU), batch {batch}"
        lr = 1e-4
    else:
        vocab, d, layers, heads, seq_len, batch = SIZES[model][size]
        net = GPT(vocab, d, layers, heads, seq_len)
        data = [torch.randint(0, vocab, (batch, seq_len + 1), generator=gen) for _ in range(8)]

        def loss(i: int) -> torch.Tensor:
            x = data[i % len(data)]
            logits = net(x[:, :-1])
            return F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))

        title = (f"GPT (vocab {vocab}, d_model {d}, {layers} layers, {heads} heads, "
                 f"seq {seq_len}, batch {batch})")
        lr = 3e-3
    params = sum(p.numel() for p in net.parameters())
    # foreach=True in both runs: the speedup is capture and fusion's alone (Note [The demo's
    # workload]); torch's CPU default is the single-tensor loop, which the runtime would
    # also switch to this path.
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01, foreach=True)
    return Job(net, opt, loss, f"{title}, {params / 1e6:.2f}M parameters, AdamW (foreach)")


def _children_cpu_s() -> float | None:
    """CPU seconds used so far by this process's live children (the compile worker), from
    /proc; None where /proc does not tell."""
    pid = os.getpid()
    try:
        tick = os.sysconf("SC_CLK_TCK")
        kids = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(f.read().split())
        total = 0
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / tick
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class RunResult:
    """One run: its losses, per-step wall and CPU time, totals and the machine's load."""

    losses: tuple[float, ...]
    step_wall: tuple[float, ...]
    step_cpu: tuple[float, ...]       # this process, all its threads
    wall_s: float
    cpu_s: float                      # this process, all its threads
    children_cpu_s: float | None      # its child processes (the compile worker); None: unknown
    load: tuple[float, float]         # 1-minute load average before and after
    ready_step: int | None = None     # first step after every compile was ready (adaptive)
    waiting: tuple[int, ...] = ()     # steps (0-based) that began with a compile in flight

    def median_ms(self, times: tuple[float, ...], start: int) -> float:
        tail = sorted(times[start:] or times)
        return 1e3 * tail[len(tail) // 2]


class Progress:
    """A plain-text progress bar (carriage returns on a terminal, a line every 5 s
    otherwise, so that a log or a pasted output stays short)."""

    def __init__(self, label: str, total: int, out: TextIO | None, width: int = 30):
        self.label, self.total, self.out, self.width = label, total, out, width
        self.tty = bool(out is not None and getattr(out, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.last_line = 0.0

    def update(self, done: int, loss: float | None) -> None:
        if self.out is None:
            return
        now = time.perf_counter()
        final = done == self.total
        if not final and now - self.last_line < (0.1 if self.tty else 5.0):
            return
        self.last_line = now
        filled = self.width * done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        loss_text = "" if loss is None else f" loss {loss:.4f}"
        text = f"{self.label:<14} [{bar}] {done:>4}/{self.total}{loss_text} {now - self.start:6.1f}s"
        self.out.write(("\r" + text) if self.tty else text + "\n")
        if self.tty and final:
            self.out.write("\n")
        self.out.flush()


def _in_flight() -> int:
    from . import session  # noqa: PLC0415

    return session.counters().compiles_in_flight


def _compiles_done() -> bool:
    from . import session  # noqa: PLC0415

    c = session.counters()
    return c.compiles_in_flight == 0 and (c.regions_compiled > 0 or c.regions_from_disk > 0)


def train(job: Job, steps: int, context: Callable[[], ContextManager], label: str,
          out: TextIO | None, log_every: int = 10, adaptive: bool = False) -> RunResult:
    """Train ``job`` for ``steps`` AdamW steps inside ``context()``.

    The loss stays a tensor in the loop and is read (``.item()``) only every ``log_every``
    steps and at the end, as the report's advice recommends. ``adaptive``: note the first
    step that starts after every compile is ready.
    """
    progress = Progress(label, steps, out)
    losses: list[torch.Tensor] = []
    walls: list[float] = []
    cpus: list[float] = []
    shown: float | None = None
    ready: int | None = None
    waiting: list[int] = []
    load0 = os.getloadavg()[0]
    kids0 = _children_cpu_s()
    w0, c0 = time.perf_counter(), time.process_time()
    with context():
        for i in range(steps):
            if adaptive:  # the first step of the last stretch with every compile ready
                ready = (i if ready is None else ready) if _compiles_done() else None
                if _in_flight():
                    waiting.append(i)
            t0, p0 = time.perf_counter(), time.process_time()
            job.optimizer.zero_grad(set_to_none=True)
            loss = job.loss(i)
            loss.backward()
            job.optimizer.step()
            losses.append(loss.detach())
            if (i + 1) % log_every == 0 or i + 1 == steps:
                shown = loss.item()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - p0)
            progress.update(i + 1, shown)
        values = torch.stack(losses).tolist()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    kids1 = _children_cpu_s()
    kids = None if kids0 is None or kids1 is None else kids1 - kids0
    return RunResult(tuple(values), tuple(walls), tuple(cpus), wall, cpu, kids,
                     (load0, os.getloadavg()[0]), ready, tuple(waiting))


@dataclass(frozen=True)
class DemoResult:
    title: str
    options: dict
    threads: int
    eager: RunResult
    adaptive: RunResult
    stats: Any          # adaptive_eager.statistics.Stats of the adaptive run
    report: str

    @property
    def max_abs_diff(self) -> float:
        return max((abs(a - b) for a, b in zip(self.eager.losses, self.adaptive.losses)),
                   default=0.0)

    @property
    def max_rel_diff(self) -> float:
        return max((abs(a - b) / abs(a) if a else abs(b)
                    for a, b in zip(self.eager.losses, self.adaptive.losses)), default=0.0)

    @property
    def agree(self) -> bool:
        return self.max_abs_diff < 1e-3


def run_demo(steps: int | None = None, backend: str = "inductor", size: str = "small",
             out: TextIO | None = sys.stdout, seed: int = 0, model: str = "mlp",
             **options: object) -> DemoResult:
    """Train eager, then under adaptive eager; compare and report (see module docstring)."""
    from . import session  # noqa: PLC0415

    ctx_options = {"backend": backend, **options}
    session.resolve_options(**ctx_options)  # bad options fail before any training
    steps = DEFAULT_STEPS[model] if steps is None else steps
    title = build(model, size, seed).title  # a bad model or size fails here too
    say = (lambda s: (out.write(s + "\n"), out.flush())) if out is not None else (lambda s: None)
    say(f"adaptive-eager demo: {title}; {steps} steps on random data, "
        f"torch threads: {torch.get_num_threads()}, {os.cpu_count()} cores")
    say(f"adaptive eager options: {ctx_options}")
    eager = train(build(model, size, seed), steps, contextlib.nullcontext, "eager", out)
    session.reset_stats()
    adaptive = train(build(model, size, seed), steps,
                     lambda: session.adaptive_eager(**ctx_options), "adaptive eager", out,
                     adaptive=True)
    stats = session.stats()
    return DemoResult(title, ctx_options, torch.get_num_threads(), eager, adaptive, stats,
                      format_report(stats))


SLOW_STEP = 1.3  # issue 22: no adaptive step above this many eager steps, after the first two


def slow_steps(result: "DemoResult", factor: float = SLOW_STEP) -> list[int]:
    """The adaptive run's steps (1-based) after its first two whose wall time is above
    ``factor`` times the eager run's median step."""
    walls = result.eager.step_wall
    median = sorted(walls)[len(walls) // 2] if walls else 0.0
    return [i + 1 for i, t in enumerate(result.adaptive.step_wall) if i >= 2 and t > factor * median]


def record(result: "DemoResult") -> dict:
    """Both runs' per-step times and the figures the summary prints, as plain data
    (``adaptive-eager demo --json FILE`` writes it).

    Example::

        >>> r = run_demo(steps=3, backend="eager", size="tiny", out=None)  # doctest: +SKIP
        >>> sorted(record(r))  # doctest: +SKIP
        ['adaptive', 'eager', 'slow_steps', 'stats', 'threads', 'title']
    """
    def run(r: RunResult) -> dict:
        return {"step_wall_s": list(r.step_wall), "step_cpu_s": list(r.step_cpu),
                "wall_s": r.wall_s, "cpu_s": r.cpu_s, "children_cpu_s": r.children_cpu_s,
                "load": list(r.load), "ready_step": r.ready_step, "losses": list(r.losses),
                "waiting_steps": [i + 1 for i in r.waiting]}

    s = result.stats
    return {"title": result.title, "threads": result.threads, "eager": run(result.eager),
            "adaptive": run(result.adaptive), "slow_steps": slow_steps(result),
            "stats": {"regions_compiled": s.regions_compiled, "regions_from_disk": s.regions_from_disk,
                      "compiles_in_flight": s.compiles_in_flight,
                      "compile_latency_max_s": s.compile_latency_max_s,
                      "compile_latency_first_s": s.compile_latency_first_s,
                      "compiled_calls": s.compiled_calls,
                      "optimizer_steps_compiled": s.optimizer_steps_compiled}}


def waiting_line(result: "DemoResult") -> str:
    """What waiting for compiles cost the program (issue 22, item 4): the adaptive steps
    after the first two that began with a compile in flight, against eager's median."""
    e, a = result.eager, result.adaptive
    steps = [i for i in a.waiting if i >= 2]
    if not steps:
        return "waiting          no step after the first two began with a compile in flight"
    walls = sorted(a.step_wall[i] for i in steps)
    cpus = sorted(a.step_cpu[i] for i in steps)
    wall, cpu = 1e3 * walls[len(walls) // 2], 1e3 * cpus[len(cpus) // 2]
    ew, ec = e.median_ms(e.step_wall, 0), e.median_ms(e.step_cpu, 0)
    return (f"waiting          {len(steps)} step{'' if len(steps) == 1 else 's'} after the first two "
            f"began with a compile in flight: median {wall:.1f} ms wall ({_ratio(wall, ew)} eager's), "
            f"{cpu:.1f} ms CPU ({_ratio(cpu, ec)}; this process, the compile worker not counted)")


def _cpu_text(run: RunResult) -> str:
    if run.children_cpu_s:
        return f"{run.cpu_s:.1f} s CPU (+ {run.children_cpu_s:.1f} s in the compile worker)"
    return f"{run.cpu_s:.1f} s CPU"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def agreement_line(result: DemoResult) -> str:
    """How far apart the loss curves are, and why, truthfully."""
    s = result.stats
    if result.max_abs_diff == 0.0:
        return "loss curves      identical (bit for bit, every step)"
    text = (f"loss curves      max abs diff {result.max_abs_diff:.3g}, max rel diff "
            f"{result.max_rel_diff:.3g}")
    if not result.agree:
        return text + "  (DIFFER: please report this)"
    if s.compiled_calls:
        return text + "  (agree: compiled kernels round differently from eager's)"
    return text + "  (agree, but nothing ran compiled: a difference is a bug, please report it)"


def summarize(result: DemoResult) -> str:
    e, a, s = result.eager, result.adaptive, result.stats
    n = len(e.losses)
    lines = ["", "loss (every few steps)", "  step      eager   adaptive"]
    picks = sorted({0, n - 1, *range(0, n, max(1, n // 8))})
    lines += [f"  {i + 1:>4}  {e.losses[i]:9.5f}  {a.losses[i]:9.5f}" for i in picks]
    lines += ["", agreement_line(result)]
    fused = "-" if s.fused_share is None else f"{100 * s.fused_share:.0f}%"
    lines.append(f"fused            {fused} of the ops run at flushes; regions "
                 f"compiled {s.regions_compiled}"
                 + (f" (+{s.regions_from_disk} from the disk cache)" if s.regions_from_disk else "")
                 + f", compiled calls {s.compiled_calls:,}, "
                 f"compiles in flight at the end {s.compiles_in_flight}")
    cores = os.cpu_count() or 0
    lines.append(f"machine          {result.threads} torch thread{'s' if result.threads > 1 else ''}, "
                 f"{cores} cores, load average "
                 f"{e.load[0]:.1f} -> {e.load[1]:.1f} (eager run), {a.load[0]:.1f} -> "
                 f"{a.load[1]:.1f} (adaptive run)")
    compiling = ""
    if s.regions_compiled or s.compiles_in_flight:
        compiling = (f"  (the adaptive run includes compiling: {s.regions_compiled} ready, "
                     f"{s.compiles_in_flight} in flight at the end")
        compiling += (f"; the first ready {s.compile_latency_first_s:.1f} s after queued, the "
                      f"longest {s.compile_latency_max_s:.1f} s)"
                      if s.regions_compiled else ")")
    a_cpu = a.cpu_s + (a.children_cpu_s or 0.0)
    lines.append(f"whole run        eager {e.wall_s:.1f} s wall, {_cpu_text(e)}; adaptive "
                 f"{a.wall_s:.1f} s wall, {_cpu_text(a)}; speedup {_ratio(e.wall_s, a.wall_s)} "
                 f"wall, {_ratio(e.cpu_s + (e.children_cpu_s or 0.0), a_cpu)} CPU{compiling}")
    if a.ready_step is not None and a.ready_step < n:
        start = a.ready_step
        which = f"steps {start + 1}-{n}, after the compiles were ready"
    else:
        start = n // 2
        which = f"steps {start + 1}-{n}" + ("" if s.regions_compiled else ", nothing compiled")
        if s.compiles_in_flight:
            which += ", compiles still in flight"
    ew, aw = e.median_ms(e.step_wall, start), a.median_ms(a.step_wall, start)
    ec, ac = e.median_ms(e.step_cpu, start), a.median_ms(a.step_cpu, start)
    lines.append(f"per step         eager {ew:.1f} ms wall, {ec:.1f} ms CPU; adaptive {aw:.1f} ms "
                 f"wall, {ac:.1f} ms CPU; speedup {_ratio(ew, aw)} wall, {_ratio(ec, ac)} CPU  "
                 f"(medians of {which})")
    lines.append(waiting_line(result))
    slow = slow_steps(result)
    shown = ", ".join(f"{i} ({1e3 * a.step_wall[i - 1]:.0f} ms)" for i in slow[:8])
    lines.append(f"slow steps       {len(slow)} adaptive step{'' if len(slow) == 1 else 's'} after the "
                 f"first two above {SLOW_STEP}x eager's median step ({e.median_ms(e.step_wall, 0):.1f} ms)"
                 + (f": {shown}" + (", ..." if len(slow) > 8 else "") if slow else ""))
    lines.append("")  # where the time went: in the report, printed next
    return "\n".join(lines)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install "adaptive-eager[plot]"``)."""


def pyplot() -> Any:
    """matplotlib.pyplot, drawing to files; :class:`PlotUnavailable` when not installed."""
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as e:
        raise PlotUnavailable("--plot needs matplotlib: pip install \"adaptive-eager[plot]\" "
                              "(or pip install matplotlib)") from e
    return plt


def plot(result: DemoResult, path: str) -> None:
    """Draw the two loss curves, the step times and where the adaptive run's time went
    into ``path`` (any format matplotlib writes: .png, .svg, .pdf)."""
    plt = pyplot()
    e, a, s = result.eager, result.adaptive, result.stats
    steps = range(1, len(e.losses) + 1)
    fig, (ax_loss, ax_step, ax_time) = plt.subplots(1, 3, figsize=(16, 4.5))
    ax_loss.plot(steps, e.losses, label="eager", linewidth=2.5, alpha=0.6)
    ax_loss.plot(steps, a.losses, label="adaptive eager", linewidth=1, linestyle="--")
    ax_loss.set(title=f"loss (max abs diff {result.max_abs_diff:.3g})", xlabel="step",
                ylabel="loss")
    ax_loss.legend()
    ax_step.plot(steps, [1e3 * t for t in e.step_wall], label="eager", linewidth=0.8)
    ax_step.plot(steps, [1e3 * t for t in a.step_wall], label="adaptive eager", linewidth=0.8)
    if a.ready_step is not None:
        ax_step.axvline(a.ready_step + 1, color="grey", linestyle=":", label="compiles ready")
    ax_step.set(title="time per step (wall)", xlabel="step", ylabel="ms", yscale="log")
    ax_step.legend()
    t = s.time_s
    outside = max(a.wall_s - t["capture"] - s.flush_ns / 1e9, 0.0)
    parts = [("capture", t["capture"]), ("eager replay", t["eager_replay"]),
             ("compiled regions", t["compiled"]), ("runtime", t["runtime"]),
             ("not captured (passed through,\nprogram's Python)", outside)]
    left = 0.0
    for name, secs in parts:
        ax_time.barh(["adaptive"], [secs], left=left, label=name)
        left += secs
    ax_time.barh(["eager"], [e.wall_s], color="grey", label="eager run")
    ax_time.set(title=f"where the time went (wall; compile latency {s.compile_latency_s:.1f} s, "
                      "beside the program)", xlabel="s")
    ax_time.title.set_fontsize(9)
    ax_time.legend(fontsize=7, loc="lower right")
    fig.suptitle(result.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["SIZES", "DEFAULT_STEPS", "Job", "build", "train", "run_demo", "summarize", "plot",
           "record", "slow_steps", "SLOW_STEP",
           "pyplot", "agreement_line", "DemoResult", "RunResult", "PlotUnavailable", "GPT"]
