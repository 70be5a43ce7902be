"""Debugging like eager: print/repr of lazy values shows eager's exact text, and a
debugger stopped inside the block prints eager's values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import adaptive_eager as ae
from adaptive_eager.dispatch import LazyTensor

from helpers import mode

CASES = {
    "float": lambda: torch.arange(6.).reshape(2, 3) * 1.5,
    "grad_fn": lambda: torch.ones(2, 3, requires_grad=True) * 2,
    "leaf_requires_grad": lambda: torch.zeros(3, requires_grad=True),
    "sum_backward": lambda: (torch.ones(3, requires_grad=True) * 2).sum(),
    "view_grad_fn": lambda: (torch.ones(4, requires_grad=True) * 3).view(2, 2).t(),
    "int": lambda: torch.arange(10) * 3,
    "bool": lambda: torch.arange(5) > 2,
    "bf16": lambda: torch.ones(3, dtype=torch.bfloat16) / 3,
    "float64": lambda: torch.arange(3, dtype=torch.float64) / 7,
    "scalar": lambda: torch.tensor(3.0) * 2,
    "empty": lambda: torch.ones(0, 3) * 2,
    "large_summarized": lambda: torch.arange(3000.).reshape(30, 100) / 7,
    "3d": lambda: torch.arange(24.).reshape(2, 3, 4) - 10,
    "nan_inf": lambda: torch.tensor([1.0, 0.0, -1.0]) / 0,
    "sci": lambda: torch.tensor([1e-8, 1e8, 3.0]) * 1,
    "log_softmax": lambda: F.log_softmax(torch.ones(2, 3, requires_grad=True) * 2, -1),
    "complex": lambda: torch.ones(2, dtype=torch.cfloat) * (1 + 2j),
    "nested_list": lambda: [torch.ones(2) * 2, {"a": torch.zeros(1) + 1}],
}


@pytest.mark.parametrize("name", list(CASES))
def test_print_and_repr_match_eager(name, capsys):
    make = CASES[name]
    torch.manual_seed(0)
    expected = make()
    exp_repr, exp_str = repr(expected), str(expected)
    print(expected)
    exp_print = capsys.readouterr().out
    torch.manual_seed(0)
    with mode():
        got = make()
        # ("scalar": ops on 0-dim real tensors run at once, Note [Host scalars run now])
        if name not in ("leaf_requires_grad", "nested_list", "complex", "scalar"):
            assert isinstance(got, LazyTensor)
        assert repr(got) == exp_repr
        assert str(got) == exp_str
        print(got)
        assert capsys.readouterr().out == exp_print
    assert repr(got) == exp_repr  # and after the block


def test_repr_of_unbound_handle_flushes_and_binds():
    with mode():
        y = torch.ones(2) * 2
        assert y._ae_real is None
        repr(y)
        assert y._ae_real is not None


SCRIPT = textwrap.dedent("""
    import torch
    import adaptive_eager as ae

    def program():
        torch.manual_seed(0)
        w = torch.ones(3, requires_grad=True)
        x = (torch.randn(3) + w * 2).relu()
        buf = torch.zeros(3)
        buf.add_(x.detach())
        breakpoint()
        return x

    print("=== eager", flush=True)
    program()
    print("=== adaptive eager", flush=True)
    with ae.adaptive_eager(backend="eager", adaptive_passthrough=False):
        program()
    print("=== done", flush=True)
""")


def test_pdb_prints_eager_values(tmp_path):
    """``python prog.py`` stops at breakpoint() (pdb), reads ``p x`` ... ``c`` from
    stdin; what pdb prints inside the block equals what it prints eagerly."""
    path = tmp_path / "prog.py"
    path.write_text(SCRIPT)
    cmds = "p x\np buf\np x.sum().item()\nc\n"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONBREAKPOINT="pdb.set_trace",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(path)], input=cmds * 2, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "=== done" in out, out
    eager = out.split("=== eager\n", 1)[1].split("=== adaptive eager\n", 1)[0]
    lazy = out.split("=== adaptive eager\n", 1)[1].split("=== done", 1)[0]
    assert "(Pdb) tensor(" in eager and "grad_fn=<ReluBackward0>" in eager, out
    assert lazy == eager, out
