"""dflash.target: the Target's split forward (decoder, then the LM head through PackedLinear) gives the model's own
logits, for every row and for the last one only."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_target


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_target_forward_split_head_matches_model(arch):
    target = tiny_target(arch, seed=4)
    assert target._split_head
    ids = torch.tensor([[3, 9, 27, 81, 243 % 256, 5, 6, 7]])
    with torch.inference_mode():
        ref = target.model(input_ids=ids).logits[0]
        ref1 = target.model(input_ids=ids, logits_to_keep=1).logits[0]
    logits, _ = target.forward(ids, target.new_cache(), capture=False)
    assert torch.allclose(logits, ref, atol=1e-4)
    last, _ = target.forward(ids, target.new_cache(), last_only=True, capture=False)
    assert torch.equal(last, ref1)
