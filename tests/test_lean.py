"""The lean decoding step (dflash.models.lean) against transformers on tiny random Llamas: float32 to rounding,
bfloat16 close, int4 (Q4_1 blocks) against the float32 model of the same dequantized weights; cache crops after a
partial acceptance; and greedy DFlash output through it equal to its own no-draft output."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dflash.decode.engine import Engine
from dflash.decode.request import Request
from dflash.models.gguf_blocks import read_q4_linears
from dflash.models.lean import KVCache, LeanTarget, lean_supported
from tests.conftest import tiny_draft, tiny_target
from tests.test_gguf_blocks import write_tiny_gguf

LAYERS = [0, 2, 3]  # the features a draft would read: a middle layer's output and the last one's (after the norm)


def _pair(dtype=torch.float32, **kw):
    """(transformers' Target, LeanTarget) over copies of one tiny random Llama, capturing LAYERS."""
    hf = tiny_target("llama", **kw)
    ref = type(hf)(copy.deepcopy(hf.model), None, dtype=dtype)
    lean = LeanTarget(copy.deepcopy(hf.model), None, dtype=dtype)
    for t in (ref, lean):
        t.set_capture(LAYERS)
    return ref, lean


def _forwards(target, chunks, crops):
    """Logits and features of each forward over `chunks` of ids, the cache cropped to `crops[i]` after forward i."""
    cache, out = target.new_cache(), []
    for ids, crop in zip(chunks, crops, strict=True):
        out.append(target.forward(torch.tensor([ids]), cache))
        if crop is not None:
            target.crop(cache, crop)
    return out, target.cache_len(cache)


# A prompt of 11, a verify of 8 of which 3 are kept (cache cropped to 11 + 3), a verify of 5, then one-token steps.
CHUNKS = [list(range(3, 14)), [20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34], [40], [41]]
CROPS = [None, 14, None, None, None]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 0.15)])
def test_the_lean_step_matches_transformers_through_prefill_verifies_and_crops(dtype, tol):
    ref, lean = _pair(dtype)
    (want, n_ref), (got, n_lean) = _forwards(ref, CHUNKS, CROPS), _forwards(lean, CHUNKS, CROPS)
    assert n_ref == n_lean == 11 + 3 + 5 + 2
    for (lw, fw), (lg, fg) in zip(want, got, strict=True):
        assert lg.dtype == torch.float32 and lg.shape == lw.shape and fg.shape == fw.shape
        assert (lg - lw).abs().max().item() < tol * max(1.0, lw.abs().max().item())
        assert (fg.float() - fw.float()).abs().max().item() < tol * max(1.0, fw.float().abs().max().item())


def test_last_only_and_no_capture_return_what_they_say():
    ref, lean = _pair()
    cache = lean.new_cache()
    logits, feats = lean.forward(torch.tensor([CHUNKS[0]]), cache, last_only=True, capture=False)
    assert logits.shape == (1, 256) and feats is None
    full, _ = ref.forward(torch.tensor([CHUNKS[0]]), ref.new_cache())
    assert torch.allclose(logits, full[-1:], atol=2e-5)


def test_the_cache_grows_past_its_first_capacity():
    cache = KVCache(layers=2, kv_heads=1, head_dim=4, dtype=torch.float32, capacity=4)
    cache.k[:, :, :3] = 1.0
    cache.length = 3
    cache.reserve(9)
    assert cache.k.shape[2] == 16 and cache.k[:, :, :3].eq(1.0).all() and cache.length == 3
    cache.crop(5)  # never longer than what it holds
    assert cache.length == 3


def test_int4_runs_the_gguf_blocks_as_the_float32_model_of_their_dequantized_weights(tmp_path):
    """A tiny Llama whose linear weights are replaced by their Q4_1 round trip (from a GGUF written the way
    llama.cpp writes one): the int4 LeanTarget's logits follow that float32 model within bfloat16 rounding."""
    hf = tiny_target("llama", layers=2)
    model = hf.model
    weights, names = {}, {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                          "ffn_down": "mlp.down_proj"}
    for i, layer in enumerate(model.model.layers):
        for gguf_name, module in names.items():
            weights[f"blk.{i}.{gguf_name}.weight"] = layer.get_submodule(module).weight.detach().numpy().astype(np.float32)
    write_tiny_gguf(tmp_path / "t.gguf", weights)
    q4 = read_q4_linears(tmp_path / "t.gguf", 4, 2)
    lookup = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
              "ffn_down": "down"}
    with torch.no_grad():  # the float32 reference: the same model with exactly the GGUF's weights
        for i, layer in enumerate(model.model.layers):
            for gguf_name, module in names.items():
                layer.get_submodule(module).weight.copy_(q4[i][lookup[gguf_name]].dequantize())
    ref = type(hf)(copy.deepcopy(model), None, dtype=torch.float32)
    fast = LeanTarget(copy.deepcopy(model), None, dtype=torch.bfloat16, q4=q4)
    rounded = LeanTarget(copy.deepcopy(model), None, dtype=torch.bfloat16)  # the same weights rounded to bfloat16
    assert fast.numerics == "int4" and fast.layout == "lean-int4" and ref.numerics == "float32"
    assert rounded.numerics == "bfloat16"
    runs = {}
    for name, t in (("ref", ref), ("int4", fast), ("bf16", rounded)):
        t.set_capture([0])
        runs[name] = torch.cat([logits for logits, _ in _forwards(t, CHUNKS, CROPS)[0]])
    err = {name: (runs[name] - runs["ref"]).norm() / runs["ref"].norm() for name in ("int4", "bf16")}
    # bfloat16 activations are the only rounding left: int4's error is of bfloat16's size, not a weight's misread
    assert err["int4"] < 0.05 and err["int4"] <= 2 * err["bf16"], err
    assert (runs["int4"].argmax(-1) == runs["ref"].argmax(-1)).float().mean().item() >= 0.8


def test_greedy_dflash_through_the_lean_step_equals_its_own_no_draft_output():
    _, lean = _pair()
    engine = Engine(lean, tiny_draft(lean))
    for prompt in ([5, 6, 7], [100, 3, 9, 44, 2]):
        req = dict(prompt_ids=tuple(prompt), max_new_tokens=24)
        base = engine.generate(Request(use_draft=False, **req))
        for block in (2, 4, 8):
            assert engine.generate(Request(block_size=block, **req)).output_ids == base.output_ids
        sampled = [engine.generate(Request(temperature=0.8, seed=5, use_draft=d, block_size=4, **req)).output_ids
                   for d in (False, True)]
        assert sampled[0] == sampled[1]


def test_only_plain_llamas_take_the_lean_step():
    llama = tiny_target("llama").model.config
    assert lean_supported(llama)
    assert not lean_supported(tiny_target("qwen3").model.config)
    biased = copy.deepcopy(llama)
    biased.attention_bias = True
    assert not lean_supported(biased)
