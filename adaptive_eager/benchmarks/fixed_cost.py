"""What ``ADAPTIVE_EAGER=1`` costs a short script that never pays for capture.

``python -m benchmarks.fixed_cost [--rounds N] [--tree PATH ...]``: runs a 20-op script
(``import torch``, a few pointwise ops and reductions twice, one print) as a fresh process,
plain and under ``ADAPTIVE_EAGER=1``, round-robin (interleaved A/B), and prints the median
CPU time (user + system, of the child) of each and the difference, with the load average.
``--tree`` adds a variant per source tree (put first on ``PYTHONPATH``), to compare two
checkouts in one run; without it, the tree this benchmark was imported from is measured
(not whichever copy of the package is installed). Each variant's line also gives the
median of per-round differences and the enabling alone, timed in process (Note [The
fixed cost is read in pairs and in process]). The target (issue 22): <= 50 ms over
plain; measured +277 ms at df9abda (load average 6.8), most of it importing the runtime
(networkx alone ~180 ms); +115 ms once networkx was gone and the compile pipeline was
imported only where capture is decided (load average 10.2; the rest is the dispatch
layer's own modules and the parts of the runtime it imports at module level). With the
window built at the first capture (Note [The window is built at the first capture],
dispatch/mode.py; ``--rounds 11 --tree /work/main --tree .``, load average 7.7-10.2):
+80 -> -9 ms with bytecode cached, +107 -> +21 ms with ``--bytecode none``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

SCRIPT = """\
import torch
x = torch.randn(64, 64)
for i in range(2):
    y = (x * 2 + 1).relu().sum(0).softmax(0) - x.mean()
    z = y.exp().log1p().tanh()
print(float(z.sum()))
"""


# Note [Bytecode is cached, as a user's Python does]
# Python writes each module's compiled bytecode next to its source (__pycache__) on its
# first import and reads it back afterwards, so a user pays for compiling this package's
# ~80 modules once, not per run. This machine's environment sets PYTHONDONTWRITEBYTECODE=1,
# which made every timed run compile them again: ~90 ms of the +111 ms measured at
# eba932d (load average ~7: import of the package 150 ms CPU without bytecode, 56-69 ms
# with). So by default the children run with bytecode written and read (the variable
# removed) after one untimed run of each variant; ``--bytecode none`` measures a process
# that compiles every module it imports, as before.
def _env_for(bytecode: str, env: dict) -> dict:
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if bytecode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _cpu_s(path: str, env: dict) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, path], env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# Note [The fixed cost is read in pairs and in process]
# One fresh process's CPU time moves by +-50-70 ms from run to run on the 2-core machine
# (importing torch alone: 1.34-1.48 s), more than the cost measured, so a difference of
# two medians of 11 runs read +31 ms in one run and +80 ms in the next (2026-12-02). Two
# figures are steadier: the median of the per-round differences (each round's variants
# run back to back, so a slow spell of the machine weighs on both of a pair), and the
# enabling alone, timed inside a process that has imported torch (what ADAPTIVE_EAGER=1
# runs when torch's import ends: the package's imports and entering the runtime; not the
# ops, which the warm-up runs parked, nor exit): 32-36 ms CPU at a1787d1.
ENABLE_SCRIPT = """\
import time
import torch
from adaptive_eager import autoload
t = time.thread_time_ns()
autoload._enable_now()
print(time.thread_time_ns() - t)
"""


def paired_median(plain: list[float], other: list[float]) -> float:
    """The median of per-round differences ``other - plain`` (rounds interleaved).

    Example::

        >>> paired_median([1.0, 2.0, 1.5], [1.1, 2.3, 1.5])
        0.1
    """
    return round(statistics.median(o - p for p, o in zip(plain, other)), 12)


def _enable_ms(env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", ENABLE_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--bytecode", choices=("cached", "none"), default="cached",
                    help="cached: as a user's Python runs (bytecode kept in __pycache__, one "
                         "untimed run first); none: every run compiles the sources "
                         "(PYTHONDONTWRITEBYTECODE=1)")
    ap.add_argument("--tree", action="append", default=[],
                    help="a source tree to run ADAPTIVE_EAGER=1 from (repeatable); default: this one")
    args = ap.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTIVE_EAGER")}
    base = _env_for(args.bytecode, base)
    variants = {"plain": base}
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for tree in args.tree or [here]:
        env = dict(base, ADAPTIVE_EAGER="1")
        if tree:
            env["PYTHONPATH"] = os.path.abspath(tree)
        variants[f"ADAPTIVE_EAGER=1 {tree}".strip()] = env
    times: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "twenty_ops.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        if args.bytecode == "cached":
            for env in variants.values():
                _cpu_s(path, env)  # writes the bytecode; not timed
        for _ in range(args.rounds):
            for name, env in variants.items():
                times[name].append(_cpu_s(path, env))
        enabling = {name: statistics.median(_enable_ms({k: v for k, v in env.items() if k != "ADAPTIVE_EAGER"})
                                            for _ in range(args.rounds))
                    for name, env in variants.items() if name != "plain"}
    plain = statistics.median(times["plain"])
    print(f"20-op script, median CPU of {args.rounds} interleaved runs, bytecode "
          f"{args.bytecode}, load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        med = statistics.median(ts)
        extra = "" if name == "plain" else (
            f"  ({(med - plain) * 1e3:+.0f} ms over plain; paired "
            f"{paired_median(times['plain'], ts) * 1e3:+.0f} ms; enabling in process "
            f"{enabling[name]:.1f} ms)")
        print(f"  {name:<40} {med * 1e3:7.0f} ms{extra}")
    print("  (Note [The fixed cost is read in pairs and in process]: one run's CPU moves by "
          "+-50-70 ms; the paired and in-process figures are the steadier ones)")


if __name__ == "__main__":
    main()
