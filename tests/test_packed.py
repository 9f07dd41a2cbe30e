"""dflash.packed: the oneDNN pre-packed LM head gives F.linear's results (exactly for one row), follows in-place
changes of the weight, and steps aside for inputs that need a gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash.packed import PackedLinear


def test_packed_head_matches_linear():
    torch.manual_seed(0)
    w = torch.randn(1000, 64)
    head = PackedLinear(w)
    x = torch.randn(16, 64)
    assert torch.allclose(head(x), F.linear(x, w), atol=1e-4)
    assert torch.equal(head(x[:1]), F.linear(x[:1], w))  # one row: exactly the plain path (autoregressive steps)
    assert torch.equal(head(x[None])[0], head(x))  # [1, T, H] like [T, H]
    head.enabled = False
    assert torch.equal(head(x), F.linear(x, w))
    head.enabled = True
    with torch.no_grad():
        w.mul_(2.0)  # modified in place: the packed copy is rebuilt
    assert torch.allclose(head(x), F.linear(x, w), atol=2e-4)
    g = torch.randn(4, 64, requires_grad=True)
    head(g).sum().backward()  # needs a gradient: plain path
    assert g.grad is not None
