"""Smoke tests of the capture core: deferral, flush on observation, binding."""

import torch

import adaptive_eager as ae
from adaptive_eager import session
from adaptive_eager.dispatch import LazyTensor


def test_ops_are_deferred_until_observed():
    with ae.adaptive_eager(backend="eager"):
        y = torch.ones(3) * 2 + 1
        assert isinstance(y, LazyTensor)
        assert y._ae_real is None
        assert y.sum().item() == 9.0
        assert y._ae_real is not None
    c = session.counters()
    assert c.flushes["item"] == 1
    assert any("test_core_smoke.py" in site for site in c.sync_sites)


def test_escaped_handles_are_ordinary_tensors():
    with ae.adaptive_eager(backend="eager"):
        y = torch.arange(4.0) * 2
    assert repr(y) == repr(torch.arange(4.0) * 2)
    assert y.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert torch.equal(y + 1, torch.arange(4.0) * 2 + 1)


def test_inplace_update_of_real_tensor_is_seen_by_print(capsys):
    p = torch.zeros(2)
    with ae.adaptive_eager(backend="eager"):
        p.add_(1)
        print(p)
    assert capsys.readouterr().out.strip() == "tensor([1., 1.])"
