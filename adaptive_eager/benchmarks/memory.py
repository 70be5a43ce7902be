"""Peak memory, eager against adaptive eager: ``python -m benchmarks.memory``.

Each (workload, mode) runs in a fresh subprocess. The program's state is built first; then
the process's peak resident set is reset (``/proc/self/clear_refs``, Linux) and the
workload runs; the row is the peak above the resident set at the start of the run (MiB).
Large blocks are mmap'd (``MALLOC_MMAP_THRESHOLD_=131072``), so the resident set follows
the live tensors rather than what glibc's heap keeps cached. On the emulated neuron device
the row is also the device's own
``torch.neuron.max_memory_allocated()`` (bytes of device tensors, like CUDA's counter).

Workloads:

* ``gpt``: a GPT training step (4 blocks, d=512, batch 16 x 255, AdamW), one warm-up step
  then three steps (issue 20's case).
* ``pointwise``: ``x = x * 1.0001 + 0.0001`` over a 4 MiB tensor, 300 steps, read with
  ``.item()`` every 50.
* ``neuron-mlp``: an MLP trained with AdamW on the emulated neuron device, 20 steps
  (device memory counters).
* ``adamw-step``: the optimizer step alone: AdamW over the GPT's parameters (49.6 MiB),
  fresh grads each step, six warm-up steps (the step is compiled by then with ``sync``)
  then three steps.

Modes: ``eager``; ``adaptive`` (default options); ``forced`` (capture forced:
``adaptive_passthrough=False, warmup=False``, ``backend="eager"``, so nothing compiles
and every window is replayed); ``forced-aot`` (the same with ``aot_eager`` and
synchronous compiles: windows run as compiled regions); ``no-step`` and ``no-verify``
(default options, the compiled optimizer step off, or first compiled calls unchecked);
``sync`` (default options, synchronous compiles: what compiles is ready before the
measured steps); ``torch-compile`` (``gpt`` only: ``torch.compile(model)`` and
``torch.compile(opt.step)``, no adaptive eager; its compiles land in the warm-up step).
Each row also gives the process's peak resident set over its whole life (imports, build,
warm-up and measured steps: issue 20's first measure). Adaptive rows say when Inductor's runtime was first loaded into the
process during the measured steps (Note [Where the GPT step's extra memory comes from]).

Example::

    python -m benchmarks.memory                      # every workload and mode
    python -m benchmarks.memory --workloads pointwise --modes eager,forced
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable

# Note [Where the GPT step's extra memory comes from]
# The ``gpt`` row under default options peaked 1.12x eager's (+632 against +563 MiB), 1.23x
# with ``sync``. Measured per phase (the peak and resident set of forward, backward, step,
# zero_grad and read of each step, the peak reset at each) and by toggling features, the
# excess was a resident set that grew step after step and stayed, not a transient:
# - AdamW's step, traced under a capturing mode, kept AdamW's ``torch.tensor(1.0)`` (its CPU
#   step counters) as a handle among its constants: the compile worker refused the job and
#   the step compiled in the program's process, Inductor's lowering and code generation
#   included: the resident set after a step grew to +135 MiB over eager's by the fifth
#   step, +70 MiB since. Now traced off the mode stack, it compiles in the worker
#   (dispatch/optim_compile.py); ``sync`` 1.23x -> 1.12x.
# - A step's compile in flight kept the real grads of the step it was traced at as examples,
#   beside the next step's: one gradient-sized list (Note [A step's compile holds no
#   gradient]; emulated neuron MLP: device peak 19.0 -> 13.0 MiB, eager 13.0).
# What is left (+67 MiB, 2026-12-02, with the region cache and Inductor's caches warm; with
# both fresh, ``ADAPTIVE_EAGER_CACHE_DIR=off`` and a new ``TORCHINDUCTOR_CACHE_DIR``, fewer
# artifacts land in the measured steps: adaptive 1.09x, sync 1.11x, process 1.06-1.07x): running any Inductor artifact in the program loads
# Inductor's loader (``CompiledArtifact.load``: torch._inductor.compile_fx and what it
# imports, 591 modules, +45.2 MiB resident past the torch._dynamo that ``torch.optim``
# already imports in eager), about 15 MiB of loaded artifacts and their state, and ~10 MiB
# of the runtime's own tables (``backend="eager"``, default options: +7 to +11 MiB after
# five steps). A fixed cost, whatever the model's size: over the process's life the row
# peaks at 1.07x eager's (1103-1104 against 1031 MiB). ``torch-compile`` (the model and the
# step compiled by hand) peaks at 1.03x eager's in the measured steps, having loaded all of
# Inductor in its warm-up, and at 1.17x then 1.09x over its life (1204, then 1123 MiB with
# Inductor's caches warm).
# The compiled step's tensors are not a cause: its Inductor code is one in-place kernel over
# (params, grads, moments) with no buffers. Its first call is checked on copies of every
# input (params, grads and AdamW's two moments: ~4x the parameters, +207 MiB for a moment
# in that step), after the activations are freed: it does not move this peak.
# Until the step is compiled, a captured step ran with ``foreach=True`` (dispatch/optim.py),
# whose list intermediates hold one parameter-sized copy where torch's CPU default (the
# single-tensor step) holds one parameter's: ``adamw-step`` peaked +114.9 MiB with its
# compile not ready in the measured steps (``no-verify``), against eager's +57.4. The switch
# now keeps the single-tensor step where its lists could pass the process's peak (Note [The
# foreach switch never raises the peak]): +70.9-71.4 MiB (adaptive +57.5, eager's). In the GPT step that copy comes after
# the activations are freed and does not move the peak.
WORKLOADS = ("gpt", "pointwise", "neuron-mlp", "adamw-step")
MODES = ("eager", "adaptive", "forced", "forced-aot", "no-step", "no-verify", "sync", "torch-compile")
_OPTIONS: dict[str, dict[str, Any]] = {
    "adaptive": {},
    "no-step": {"optimizer_step": False},  # default options, the compiled optimizer step off
    "no-verify": {"verify_compiled": False},  # default options, first compiled calls unchecked
    "sync": {"async_compile": False},  # default options, compiles ready when submitted
    "forced": {"adaptive_passthrough": False, "warmup": False, "backend": "eager"},
    "forced-aot": {"adaptive_passthrough": False, "warmup": False, "backend": "aot_eager",
                   "async_compile": False},
}


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Reset the process's peak resident set (VmHWM) to its current one (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def _gpt(compiled: bool = False) -> tuple[Callable[[], float], Any]:
    import torch

    from .workloads._gpt import GPT

    torch.manual_seed(0)
    model = GPT(vocab=512, d=512, n_layers=4, n_heads=8, max_t=256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [torch.randint(0, 512, (16, 256)) for _ in range(4)]
    # torch-compile: the model and the step compiled by hand (torch.compile's recipe)
    forward = torch.compile(model) if compiled else model
    opt_step = torch.compile(opt.step) if compiled else opt.step

    def step(i: int) -> float:
        b = data[i % len(data)]
        x, y = b[:, :-1], b[:, 1:]
        logits = forward(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), y.reshape(-1))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, {"warmup": 1, "steps": 3}


def _pointwise() -> tuple[Callable[[], float], Any]:
    import torch

    torch.manual_seed(0)
    x0 = torch.rand(1 << 20)
    state = {"x": x0}

    def step(i: int) -> float:
        x = state["x"]
        for k in range(50):
            x = x * 1.0001 + 0.0001
        state["x"] = x
        return x[0].item()

    return step, {"warmup": 0, "steps": 6}


def _neuron_mlp() -> tuple[Callable[[], float], Any]:
    import torch

    from adaptive_eager import neuron_sim

    neuron_sim.enable(launch_latency_us=0.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(512, 256).to("neuron"), torch.randn(512, 256).to("neuron"))
               for _ in range(4)]

    def step(i: int) -> float:
        x, y = batches[i % len(batches)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, {"warmup": 2, "steps": 20}


def _adamw_step() -> tuple[Callable[[], float], Any]:
    import torch

    from .workloads._gpt import GPT

    torch.manual_seed(0)
    params = list(GPT(vocab=512, d=512, n_layers=4, n_heads=8, max_t=256).parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step(i: int) -> float:
        for p in params:
            p.grad = torch.full_like(p, 1e-3 * (i + 1))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return params[0][0, 0].item()

    return step, {"warmup": 6, "steps": 3}


_BUILD = {"gpt": _gpt, "pointwise": _pointwise, "neuron-mlp": _neuron_mlp, "adamw-step": _adamw_step}


def _inductor_loaded() -> bool:
    import sys

    return "torch._inductor.codecache" in sys.modules


def run_one(workload: str, mode: str) -> dict[str, Any]:
    """Run one (workload, mode) in this process: peak MiB above the start, and results."""
    import contextlib

    import torch

    torch.set_num_threads(1)
    if mode == "torch-compile" and workload != "gpt":
        raise SystemExit(f"mode torch-compile: gpt only, not {workload}")
    step, counts = _gpt(compiled=True) if mode == "torch-compile" else _BUILD[workload]()
    neuron = workload.startswith("neuron")
    if mode in ("eager", "torch-compile"):
        ctx: Any = contextlib.nullcontext()
    else:
        import adaptive_eager as ae

        opts = dict(_OPTIONS[mode])
        if neuron:
            opts["device"] = "neuron"
            if "backend" not in opts:
                opts["backend"] = "aot_eager"  # Inductor's first compile outlasts the run
        ctx = ae.adaptive_eager(**opts)
    losses = []
    with ctx:
        for i in range(counts["warmup"]):
            losses.append(step(i))
        if neuron:
            torch.neuron.reset_peak_memory_stats()
            dev_start = torch.neuron.memory_allocated()
        loaded = _inductor_loaded()
        before = status_kib("VmHWM")  # the process's peak so far (imports, build, warm-up)
        reset_peak()
        start = status_kib("VmRSS")
        for i in range(counts["warmup"], counts["warmup"] + counts["steps"]):
            losses.append(step(i))
        peak = status_kib("VmHWM")
    out: dict[str, Any] = {"workload": workload, "mode": mode, "peak_mib": (peak - start) / 1024,
                           "process_peak_mib": max(before, peak) / 1024, "losses": losses}
    if neuron:
        out["device_peak_mib"] = (torch.neuron.max_memory_allocated() - dev_start) / 2**20
    if mode not in ("eager", "torch-compile"):
        import adaptive_eager as ae

        st = ae.stats()
        out["replay_peak_mib"] = getattr(st, "replay_peak_bytes", 0) / 2**20
        out["fused"] = st.ops_fused
        out["steps_compiled"] = st.optimizer_steps_compiled
        out["inductor_loaded_in_run"] = not loaded and _inductor_loaded()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--one", nargs=2, metavar=("WORKLOAD", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--json", default="", help="write the rows as JSON to this path")
    a = p.parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(run_one(*a.one)))
        return 0
    rows = []
    for w in a.workloads.split(","):
        for m in a.modes.split(","):
            if w not in _BUILD or m not in MODES:
                p.error(f"unknown workload or mode: {w!r} / {m!r}")
            if m == "torch-compile" and w != "gpt":
                print(f"{w:12s} {m:13s} skipped (torch-compile: gpt only)")
                continue
            # Large blocks mmap'd and returned on free: the resident set follows the live
            # tensors instead of what glibc's heap keeps cached (its threshold otherwise
            # grows with the first frees, and a freed tensor stays resident).
            env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
            r = subprocess.run([sys.executable, "-m", "adaptive_eager.benchmarks.memory", "--one", w, m],
                               capture_output=True, text=True, env=env)
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if r.returncode != 0 or line is None:
                print(f"{w:12s} {m:13s} FAILED (rc {r.returncode}): {r.stderr.strip()[-400:]}")
                continue
            row = json.loads(line[7:])
            rows.append(row)
            base = next((x for x in rows if x["workload"] == w and x["mode"] == "eager"), None)
            ratio = f"{row['peak_mib'] / base['peak_mib']:.2f}x" if base and base["peak_mib"] > 0 else "-"
            same = "" if base is None else \
                ("  losses equal" if row["losses"] == base["losses"] else
                 f"  losses differ (max {max(abs(u - v) for u, v in zip(row['losses'], base['losses'])):.1e})")
            dev = f"  device peak {row['device_peak_mib']:8.1f} MiB" if "device_peak_mib" in row else ""
            rep = f"  replay peak {row['replay_peak_mib']:7.1f} MiB" if "replay_peak_mib" in row else ""
            ind = "  Inductor runtime loaded in the run" if row.get("inductor_loaded_in_run") else ""
            whole = f"  process peak {row['process_peak_mib']:7.0f} MiB" + \
                (f" ({row['process_peak_mib'] / base['process_peak_mib']:.2f}x)" if base else "")
            print(f"{w:12s} {m:13s} peak +{row['peak_mib']:8.1f} MiB ({ratio}){whole}{dev}{rep}{same}{ind}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
