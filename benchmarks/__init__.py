"""Checkout shim: the benchmark suite ships inside the package, as
``adaptive_eager.benchmarks`` (so ``adaptive-eager bench`` works from any install).

This package only points its search path there, so that ``python -m benchmarks`` and
``python -m benchmarks.overhead`` keep working from a source checkout. It is not
installed (pyproject.toml packages ``adaptive_eager*`` only).
"""

import os

__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "adaptive_eager", "benchmarks")]
