"""dflash.models.packed: the oneDNN pre-packed LM head gives F.linear's results (exactly for one row), follows in-place
changes of the weight, and steps aside for inputs that need a gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash.models.packed import PackedLinear


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


def test_transposed_linear_computes_the_same_product_and_swaps_back_exactly():
    from torch import nn

    from dflash.models.packed import TransposedLinear, layout_of, set_layout

    torch.manual_seed(1)
    block = nn.Sequential(nn.Linear(64, 96, bias=False), nn.ReLU(), nn.Sequential(nn.Linear(96, 64, bias=True)))
    weights = [block[0].weight.detach().clone(), block[2][0].weight.detach().clone()]
    x = torch.randn(1, 8, 64)
    with torch.no_grad():
        ref = block(x)
        assert layout_of(block) == "linear"
        assert set_layout(block, "transposed") == 2 and layout_of(block) == "transposed"
        assert set_layout(block, "transposed") == 0  # idempotent
        assert isinstance(block[0], TransposedLinear) and block[0].weight_t.is_contiguous()
        assert block[0].weight_t.shape == (64, 96)
        assert torch.allclose(block(x), ref, atol=1e-5)
        assert torch.allclose(block(x[:, :1]), ref[:, :1], atol=1e-5)
        assert set_layout(block, "linear") == 2 and layout_of(block) == "linear"
    assert torch.equal(block[0].weight, weights[0]) and torch.equal(block[2][0].weight, weights[1])  # exact round trip
    with pytest.raises(ValueError, match="layout"):
        set_layout(block, "diagonal")


def test_a_layout_switch_holds_both_layouts_and_swaps_pointers():
    from torch import nn

    from dflash.models.packed import LayoutSwitch, TransposedLinear, layout_of

    torch.manual_seed(2)
    block = nn.Sequential(nn.Linear(32, 48, bias=False), nn.GELU(), nn.Sequential(nn.Linear(48, 32)))
    originals = [block[0], block[2][0]]
    x = torch.randn(3, 32)
    with torch.no_grad():
        ref = block(x)
        switch = LayoutSwitch(block)
        assert switch.current == "linear" and len(switch.slots) == 2
        switch.set("transposed")
        assert layout_of(block) == "transposed" and isinstance(block[2][0], TransposedLinear)
        assert torch.allclose(block(x), ref, atol=1e-5)
        built = [block[0], block[2][0]]
        switch.set("linear")
        assert [block[0], block[2][0]] == originals  # the very modules: no copy back
        switch.set("transposed")
        assert [block[0], block[2][0]] == built  # built once
    with pytest.raises(ValueError, match="layout"):
        switch.set("diagonal")


def test_a_target_in_the_transposed_layout_keeps_greedy_dflash_lossless():
    """The layout the host probe may choose changes how the decoder multiplies, not what the engine commits:
    greedy DFlash output still equals the no-draft output token for token (float32)."""
    from dflash.decode.engine import Engine
    from dflash.decode.request import Request
    from dflash.models.target import Target
    from conftest import tiny_draft, tiny_target

    base = tiny_target("llama", seed=3)
    plain = Engine(Target(base.model, None))
    ref = plain.generate(Request(prompt_ids=[5, 9, 2, 7], max_new_tokens=40, use_draft=False)).output_ids
    target = Target(base.model, None, layout="transposed")
    assert target.layout == "transposed"
    engine = Engine(target, tiny_draft(target, block_size=8, seed=4))
    for use_draft in (False, True):
        out = engine.generate(Request(prompt_ids=[5, 9, 2, 7], max_new_tokens=40, use_draft=use_draft)).output_ids
        assert out == ref


@pytest.mark.parametrize("layout", ["linear", "transposed"])
def test_float32_matmuls_compute_the_bfloat16_weights_in_float32_and_put_the_layers_back(layout):
    from torch import nn

    from dflash.models.packed import Float32Matmul, float32_matmuls, set_layout

    torch.manual_seed(2)
    block = nn.Sequential(nn.Linear(64, 96, bias=True), nn.ReLU(), nn.Sequential(nn.Linear(96, 64, bias=False)))
    block = block.to(torch.bfloat16)
    set_layout(block, layout)
    before = [block[0], block[2][0]]
    x = torch.randn(1, 8, 64).to(torch.bfloat16)
    w0 = before[0].weight.float() if layout == "linear" else before[0].weight_t.float().t()
    w1 = before[1].weight.float() if layout == "linear" else before[1].weight_t.float().t()
    want = F.linear(F.relu(F.linear(x.float(), w0, before[0].bias.float()).to(torch.bfloat16)).float(), w1)
    with torch.no_grad(), float32_matmuls(block):
        assert type(block[0]) is Float32Matmul and type(block[2][0]) is Float32Matmul
        got = block(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))  # float32 products, cast back
    assert [block[0], block[2][0]] == before  # the very same modules back in place
    with pytest.raises(RuntimeError), float32_matmuls(block):
        raise RuntimeError("a failed forward")
    assert [block[0], block[2][0]] == before  # … also when the forward raised
