"""The DFlash draft in the z-lab checkpoint format: strict loading of hand-written z-lab checkpoints (safetensors
only), save/load round trip, default target layer ids, the hidden_states[j + 1] feature offset, non-causal
attention within a block, and the draft KV cache."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from conftest import tiny_draft, tiny_target
from dflash.models.draft import (CONFIG_NAME, WEIGHTS_NAME, DraftCache, DraftConfig, build_target_layer_ids,
                          extract_context_feature, load_draft, rope_inv_freq, save_draft)
from dflash.errors import ModelLoadError
import engine_helpers  # noqa: F401  (one CPU thread)

# A small config in exactly the layout of z-lab/Qwen3-8B-DFlash-b16's config.json (same keys, small sizes).
HIDDEN, HEADS, KV, HEAD_DIM, INTER, LAYERS, TARGET_LAYERS, VOCAB = 64, 4, 2, 16, 96, 2, 8, 256


def zlab_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "bos_token_id": 151643,
        "dflash_config": {"mask_token_id": 250, "target_layer_ids": [1, 5]},
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "layer_types": ["full_attention"] * LAYERS,
        "max_position_embeddings": 40960,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV,
        "num_target_layers": TARGET_LAYERS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def zlab_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensor names and shapes of a z-lab DFlash checkpoint, written out by hand (not from our module)."""
    gen = torch.Generator().manual_seed(seed)

    def t(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)

    k = 2  # len(target_layer_ids)
    out = {"fc.weight": t(HIDDEN, k * HIDDEN), "hidden_norm.weight": t(HIDDEN), "norm.weight": t(HIDDEN)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        out.update({
            p + "input_layernorm.weight": t(HIDDEN), p + "post_attention_layernorm.weight": t(HIDDEN),
            p + "self_attn.q_proj.weight": t(HEADS * HEAD_DIM, HIDDEN), p + "self_attn.k_proj.weight": t(KV * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": t(KV * HEAD_DIM, HIDDEN), p + "self_attn.o_proj.weight": t(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": t(HEAD_DIM), p + "self_attn.k_norm.weight": t(HEAD_DIM),
            p + "mlp.gate_proj.weight": t(INTER, HIDDEN), p + "mlp.up_proj.weight": t(INTER, HIDDEN),
            p + "mlp.down_proj.weight": t(HIDDEN, INTER),
        })
    return out


def write(directory, config: dict, tensors: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_NAME).write_text(json.dumps(config))
    save_file(tensors, str(directory / WEIGHTS_NAME))


def test_zlab_checkpoint_loads_strictly(tmp_path):
    tensors = zlab_tensors()
    write(tmp_path, zlab_config(), tensors)
    model, vocab = load_draft(tmp_path)
    assert vocab is None
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        HIDDEN, LAYERS, HEADS, KV, HEAD_DIM)
    assert (cfg.block_size, cfg.num_target_layers, cfg.mask_token_id, cfg.target_layer_ids) == (16, TARGET_LAYERS, 250, [1, 5])
    assert cfg.rope_theta == 1_000_000 and cfg.vocab_size == VOCAB
    state = model.state_dict()
    assert set(state) == set(tensors)
    for name, value in tensors.items():
        assert torch.equal(state[name], value.float()), name
    # It runs: context K/V from 2 target layers' features, then one block.
    feats = torch.randn(1, 5, 2 * HIDDEN)
    kv = model.context_kv(feats, torch.arange(5))
    out = model(torch.randn(1, 4, HIDDEN), torch.arange(5, 9), kv)
    assert out.shape == (1, 4, HIDDEN) and torch.isfinite(out).all()


def test_model_prefixed_keys_load(tmp_path):
    write(tmp_path, zlab_config(), {"model." + k: v for k, v in zlab_tensors().items()})
    model, _ = load_draft(tmp_path)
    assert torch.equal(model.state_dict()["fc.weight"], zlab_tensors()["fc.weight"].float())


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_key_mismatch_is_refused(tmp_path, change):
    tensors = zlab_tensors()
    if change == "missing":
        del tensors["layers.1.self_attn.k_norm.weight"]
    elif change == "unexpected":
        tensors["embed_tokens.weight"] = torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)
    else:
        tensors["fc.weight"] = torch.zeros(HIDDEN, 3 * HIDDEN, dtype=torch.bfloat16)
    write(tmp_path, zlab_config(), tensors)
    with pytest.raises((ModelLoadError, RuntimeError)) as err:
        load_draft(tmp_path)
    assert str(tmp_path) not in str(err.value)


def test_only_safetensors(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(json.dumps(zlab_config()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_draft(tmp_path)
    with pytest.raises(ModelLoadError):
        load_draft(tmp_path / "absent")


def test_save_writes_zlab_layout_and_round_trips(tmp_path):
    target = tiny_target("qwen3")
    model = tiny_draft(target, block_size=8, layers=2)
    save_draft(model, tmp_path)
    cfg = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 8 and cfg["num_target_layers"] == target.num_layers
    assert cfg["dflash_config"] == {"mask_token_id": model.config.mask_token_id,
                                    "target_layer_ids": model.config.target_layer_ids}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size"):
        assert key in cfg
    from safetensors import safe_open

    with safe_open(str(tmp_path / WEIGHTS_NAME), "pt") as f:
        names = set(f.keys())
    assert names == set(zlab_tensors_for(layers=2, k=len(model.config.target_layer_ids)))
    loaded, _ = load_draft(tmp_path)
    assert loaded.config == model.config
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value.to(torch.bfloat16).float()), name


def zlab_tensors_for(layers: int, k: int) -> list[str]:
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(layers):
        names += [f"layers.{i}.{n}.weight" for n in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    return names


def test_config_variants_from_other_writers():
    """block_size / num_target_layers inside dflash_config (SGLang accepts both); transformers-5 rope_parameters."""
    d = zlab_config()
    d.pop("block_size")
    d.pop("num_target_layers")
    d["dflash_config"].update(block_size=10, num_target_layers=TARGET_LAYERS)
    cfg = DraftConfig.from_hf_dict(d)
    assert cfg.block_size == 10 and cfg.num_target_layers == TARGET_LAYERS
    d = zlab_config()
    d.pop("rope_theta")
    d.pop("rope_scaling")
    d["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    cfg = DraftConfig.from_hf_dict(d)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling is None
    # LLaMA-3.1 frequency scaling, old layout vs transformers-5 layout: the same RoPE frequencies.
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    old = zlab_config() | {"rope_theta": 500000.0, "rope_scaling": scaling, "head_dim": 128}
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": 500000.0, **scaling}
    inv_old, inv_new = rope_inv_freq(DraftConfig.from_hf_dict(old)), rope_inv_freq(DraftConfig.from_hf_dict(new))
    assert torch.equal(inv_old, inv_new)
    assert not torch.equal(inv_old, rope_inv_freq(DraftConfig.from_hf_dict(old | {"rope_scaling": None})))


@pytest.mark.parametrize("layers,draft_layers,expected", [
    (28, 1, [14]),
    (36, 1, [18]),
    (28, 3, [1, 13, 25]),
    (36, 5, [1, 9, 17, 25, 33]),  # z-lab/Qwen3-8B-DFlash-b16's target_layer_ids
    (30, 1, [15]),  # SmolLM2-135M
    (30, 2, [1, 27]),
    (32, 4, [1, 10, 20, 29]),
])
def test_build_target_layer_ids(layers, draft_layers, expected):
    ids = build_target_layer_ids(layers, draft_layers)
    assert ids == expected
    assert all(0 <= j < layers for j in ids)
    if draft_layers > 1:
        assert ids[0] == 1 and ids[-1] == layers - 3


def test_default_layer_ids_and_bad_ids():
    cfg = DraftConfig(hidden_size=8, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                      intermediate_size=8, vocab_size=16, num_target_layers=28)
    assert cfg.target_layer_ids == [1, 13, 25]
    with pytest.raises(ValueError):
        DraftConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                    intermediate_size=8, vocab_size=16, num_target_layers=4, target_layer_ids=[4])


def test_extract_context_feature_offset():
    """hidden_states[0] is the embedding output; target layer j's feature is hidden_states[j + 1]."""
    hs = tuple(torch.full((1, 3, 2), float(i)) for i in range(9))
    feats = extract_context_feature(hs, [0, 3, 7])
    assert feats.shape == (1, 3, 6)
    assert feats[0, 0].tolist() == [1.0, 1.0, 4.0, 4.0, 8.0, 8.0]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_target_hooks_capture_hidden_states_offset(arch):
    """The Target's forward hooks capture exactly transformers' hidden_states[j + 1], cached forwards included."""
    target = tiny_target(arch, layers=6)
    layers = list(range(target.num_layers - 1))  # the last entry of hidden_states has the final norm applied
    target.set_capture(layers)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.inference_mode():
        out = target.model(input_ids=ids, output_hidden_states=True)
    expected = extract_context_feature(out.hidden_states, layers)
    cache = target.new_cache()
    logits, feats = target.forward(ids[:, :4], cache)
    logits2, feats2 = target.forward(ids[:, 4:], cache)
    torch.testing.assert_close(torch.cat([feats, feats2], 1), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([logits, logits2]), out.logits[0], atol=1e-4, rtol=1e-4)
    # Not the off-by-one neighbour.
    assert not torch.allclose(feats, extract_context_feature(out.hidden_states, [j - 1 for j in layers[1:]] + [0])[:, :4])
    # The rule's layers for a 1- and a 3-layer draft are captured the same way.
    for n in (1, 3):
        chosen = build_target_layer_ids(target.num_layers, n)
        target.set_capture(chosen)
        _, f = target.forward(ids, target.new_cache())
        torch.testing.assert_close(f, extract_context_feature(out.hidden_states, chosen), atol=1e-4, rtol=1e-4)
    _, none = target.forward(ids, target.new_cache(), capture=False)
    assert none is None


def test_draft_is_non_causal_within_a_block_and_reads_the_context():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8)
    feats = torch.randn(1, 6, len(draft.config.target_layer_ids) * target.hidden_size)
    with torch.inference_mode():
        kv = draft.context_kv(feats, torch.arange(6))
        block = target.embed(torch.tensor([[3, 4, 5, 6]]))
        base = draft(block, torch.arange(6, 10), kv)
        later = target.embed(torch.tensor([[3, 4, 5, 99]]))
        changed = draft(later, torch.arange(6, 10), kv)
        other_ctx = draft(block, torch.arange(6, 10), draft.context_kv(feats + 1.0, torch.arange(6)))
    assert not torch.allclose(base[0, 0], changed[0, 0]), "position 0 must see the last block position"
    assert not torch.allclose(base, other_ctx), "the block must attend to the injected context"


def test_draft_cache_append_and_crop():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=8, layers=2)
    k = len(draft.config.target_layer_ids) * target.hidden_size
    cache = DraftCache()
    assert len(cache) == 0
    with torch.inference_mode():
        cache.append(draft.context_kv(torch.randn(1, 5, k), torch.arange(5)))
        cache.append(draft.context_kv(torch.randn(1, 3, k), torch.arange(5, 8)))
    assert len(cache) == 8 and len(cache.kv) == 2
    cache.crop(6)
    assert len(cache) == 6 and all(kk.shape[2] == 6 and vv.shape[2] == 6 for kk, vv in cache.kv)


def test_a_save_cut_short_leaves_the_previous_draft_whole(tmp_path, monkeypatch):
    """Files were written in place: a save cut short (or read while it ran) left a truncated model.safetensors."""
    import safetensors.torch

    target = tiny_target("llama")
    old, new = tiny_draft(target, seed=1), tiny_draft(target, seed=2)
    save_draft(old, tmp_path, vocab_ids=torch.arange(10))
    real = safetensors.torch.save_file

    def killed_mid_write(tensors, filename, metadata=None):  # half the bytes reach the disk, then the process dies
        real(tensors, filename, metadata)
        with open(filename, "r+b") as f:
            f.truncate(f.seek(0, 2) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_draft(new, tmp_path, vocab_ids=torch.arange(20))
    monkeypatch.undo()
    loaded, vocab = load_draft(tmp_path)
    assert all(torch.equal(v, old.state_dict()[k].to(torch.bfloat16).float()) for k, v in loaded.state_dict().items())
    assert torch.equal(vocab, torch.arange(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_NAME, "draft_vocab.safetensors", WEIGHTS_NAME]


def test_a_truncated_weights_file_is_a_load_error(tmp_path):
    save_draft(tiny_draft(tiny_target("llama")), tmp_path)
    with open(tmp_path / WEIGHTS_NAME, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with pytest.raises(ModelLoadError, match=f"^draft: {WEIGHTS_NAME} is unreadable"):
        load_draft(tmp_path)


def test_a_draft_for_a_target_takes_its_layer_shape():
    """One definition for the bench's, the GPU check's, the trace recorder's and `train fit`'s drafts; the GPU check's
    copy took head_dim = hidden / heads, wrong for Qwen3 (head_dim 128, hidden 2560, 32 heads)."""
    from transformers import Qwen3Config

    tc = Qwen3Config(hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                     num_hidden_layers=36, vocab_size=151936)
    cfg = DraftConfig.for_target(tc, 151936, layers=2, block_size=8)
    assert (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (128, 32, 8, 9728)
    assert (cfg.num_hidden_layers, cfg.num_target_layers, cfg.block_size, cfg.mask_token_id) == (2, 36, 8, 16)
    assert DraftConfig.for_target(tc, 12).mask_token_id == 11  # a vocabulary without id 16: its last id
    assert DraftConfig.for_target(tc, 151936, intermediate_size=64).intermediate_size == 64
