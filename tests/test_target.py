"""dflash.models.target: the Target's split forward (decoder, then the LM head through PackedLinear) gives the model's own
logits, for every row and for the last one only."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_target

from dflash.models.target import Target


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


def test_features_are_transformers_hidden_states_the_last_layer_after_the_final_norm():
    target = tiny_target("llama", seed=4)  # 4 layers
    ids = torch.tensor([[3, 9, 27, 81, 5, 6, 7]])
    with torch.inference_mode():
        hs = target.model(input_ids=ids, output_hidden_states=True).hidden_states  # [embeddings, layer 0, ..., normed]
    raw = {}
    hook = target.model.model.layers[3].register_forward_hook(lambda _m, _i, out: raw.setdefault("l3", out))
    target.set_capture([0, 2, 3])
    _, feats = target.forward(ids, target.new_cache())
    hook.remove()
    torch.testing.assert_close(feats, torch.cat([hs[1], hs[3], hs[4]], -1))
    last = raw["l3"][0] if isinstance(raw["l3"], tuple) else raw["l3"]
    assert not torch.allclose(last, hs[4], atol=1e-3)  # the last decoder layer's own output is not what is fused


def test_long_forwards_of_a_low_precision_target_run_their_matmuls_in_float32():
    """float32_from_rows (set from the host probe): a forward of at least that many tokens (a prefill) runs the
    decoder's linear layers as Float32Matmul; shorter ones (a verify) and float32 targets never do."""
    from dflash.models.packed import Float32Matmul

    model = tiny_target("llama", seed=0).model
    seen = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda m, _: seen.append(type(m.up_proj)))
    tg = Target(model, None, dtype=torch.bfloat16, float32_from_rows=6)
    cache = tg.new_cache()
    long_logits, _ = tg.forward(torch.arange(6)[None] + 3, cache, last_only=True)
    tg.forward(torch.tensor([[7, 8]]), cache)
    assert seen == [Float32Matmul, torch.nn.Linear] and cache.get_seq_length() == 8
    plain = Target(model, None, dtype=torch.bfloat16)
    ref, _ = plain.forward(torch.arange(6)[None] + 3, plain.new_cache(), last_only=True)
    assert torch.allclose(long_logits, ref, atol=0.5) and int(long_logits.argmax()) == int(ref.argmax())
    assert Target(tiny_target("llama", seed=0).model, None, dtype=torch.float32, float32_from_rows=6).float32_from_rows == 0
