"""What a process's first compiled region costs: the worker's first compile, the first load.

``python -m benchmarks.first_region [--inductor-cache DIR]`` (default: a fresh empty one)

1. compiles a small pointwise-and-reduction graph in the compile worker
   (``compile_worker.compile_in_worker``) and prints the wall time from queued to ready,
   the worker's own CPU and that of its finished children (g++: Inductor's vector ISA probe,
   Note [Only the picked vector ISA is probed], and the kernel's build);
2. in fresh processes, loads the saved artifact with and without
   ``compile_worker.warm_loader()`` first (Note [The loader is warmed while the worker
   compiles]) and prints the load's CPU on its thread, its children's, and the warm-up's.

Figures come with the load average: on a loaded machine, wall times mostly measure the
scheduler; the CPU figures are what to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_COMPILE = r"""
import os, sys, time
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from adaptive_eager.runtime import compile_worker as cw
x = torch.randn(4096, 256)
gm = make_fx(lambda a, b: ((a * 2 + b).relu().sum(0), torch.nn.functional.gelu(a) * b))(x, x)
gm.meta[cw.THREADS_META] = torch.get_num_threads()
t0 = time.perf_counter()
fn = cw.compile_in_worker(gm, [x, x])
wall = time.perf_counter() - t0
with open(f"/proc/{cw._WORKER._proc.pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
tick = os.sysconf("SC_CLK_TCK")
own, kids = (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick
ref = ((x * 2 + x).relu().sum(0), torch.nn.functional.gelu(x) * x)
assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fn(x, x), ref))
open(sys.argv[1], "wb").write(getattr(fn, cw.ARTIFACT_BYTES))
print(f"  first compile in the worker: {wall:.1f} s queued -> ready; worker CPU {own:.1f} s, "
      f"its g++ and probes {kids:.1f} s (ISA verdict {getattr(fn, cw.ISA_PROBED, None)})")
"""

_LOAD = r"""
import resource, sys, time
import torch
import torch._dynamo  # the runtime imports it where capture is decided
from adaptive_eager.runtime import compile_worker as cw
def kids():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime
data = open(sys.argv[1], "rb").read()
warm = ""
if sys.argv[2] == "warm":
    c0 = time.thread_time()
    cw.warm_loader()
    warm = f" (after a warm-up of {time.thread_time() - c0:.2f} s CPU)"
c0, k0 = time.thread_time(), kids()
with cw.trusted_vec_isa(True):
    fn = cw.load_artifact(data)
c1, k1 = time.thread_time(), kids()
fn2 = cw.load_artifact(data)
print(f"  first load{warm}: {c1 - c0:.2f} s thread CPU, {k1 - k0:.2f} s children; "
      f"the next load {1e3 * (time.thread_time() - c1):.0f} ms")
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inductor-cache", default=None, help="TORCHINDUCTOR_CACHE_DIR (default: fresh)")
    args = ap.parse_args(argv)
    cache = args.inductor_cache or tempfile.mkdtemp(prefix="ae-first-region-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    env.pop("ADAPTIVE_EAGER", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    print(f"first region: Inductor cache {cache}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as d:
        art = os.path.join(d, "artifact.bin")
        # cwd: the worker runs ``python -c``, which puts the working folder first on sys.path
        subprocess.run([sys.executable, "-c", _COMPILE, art], env=env, check=True, cwd=root)
        for how in ("cold", "warm"):
            subprocess.run([sys.executable, "-c", _LOAD, art, how], env=env, check=True, cwd=root)
    print(f"  load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
