"""A draft's config.json checked before anything is allocated (dflash.models.draft_check, through `load_draft`): every bad
size is named by its field, its value and what was expected; one that disagrees with the weights is named against
what model.safetensors holds."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.models.draft import CONFIG_NAME, WEIGHTS_NAME, load_draft, save_draft
from dflash.errors import ModelLoadError
import engine_helpers  # noqa: F401  (one CPU thread)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A tiny draft (hidden 64, 1 layer, 4 heads of 16, 2 KV heads, MLP 128, fusing 2 target layers)."""
    path = tmp_path_factory.mktemp("draft")
    save_draft(tiny_draft(tiny_target("llama"), layer_ids=[1, 2]), path)
    return path


def edited(good, tmp_path, change: dict, dflash: dict | None = None):
    config = json.loads((good / CONFIG_NAME).read_text())
    config.update(change)
    config["dflash_config"].update(dflash or {})
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    (tmp_path / WEIGHTS_NAME).write_bytes((good / WEIGHTS_NAME).read_bytes())
    return tmp_path


@pytest.mark.parametrize("change, dflash, says", [
    # Absurd sizes: refused by their bounds, or against the weights' own shapes, before a tensor is allocated
    # (1e9 was torch's "Storage size calculation overflowed"; 16384 x 131072 allocated 25 GB first).
    ({"hidden_size": 10**9}, None, "hidden_size is 1000000000; expected a whole number in [1, 65536]"),
    ({"hidden_size": 16384, "intermediate_size": 131072}, None,
     "config.json has hidden_size 16384, but model.safetensors holds a draft with hidden_size 64"),
    # Sizes that do not match the weights: was "checkpoint keys do not match (Error(s) in loading …:)", cut off.
    ({"hidden_size": 640}, None, "config.json has hidden_size 640, but model.safetensors holds a draft with hidden_size 64"),
    ({"num_hidden_layers": 2}, None, "has num_hidden_layers 2, but model.safetensors holds a draft with num_hidden_layers 1"),
    ({"intermediate_size": 96}, None, "has intermediate_size 96, but model.safetensors holds a draft with intermediate_size 128"),
    ({"num_attention_heads": 8, "head_dim": 8}, None, "has head_dim 8, but model.safetensors holds a draft with head_dim 16"),
    ({}, {"target_layer_ids": [1, 2, 3]}, "has target_layer_ids [1, 2, 3], but model.safetensors fuses 2 target layers"),
    # Values out of range or of the wrong type: was "unsupported operand type(s) for //: 'str' and 'int'" and the like.
    ({"num_hidden_layers": 0}, None, "num_hidden_layers is 0; expected a whole number in [1, 64]"),
    ({"hidden_size": "576"}, None, "hidden_size is '576' (text); expected a whole number in [1, 65536]"),
    ({"block_size": 8.0}, None, "block_size is 8.0 (a fraction); expected a whole number in [2, 1024]"),
    ({"num_key_value_heads": 3}, None, "num_key_value_heads is 3; expected a divisor of num_attention_heads (4)"),
    ({"head_dim": 15}, None, "head_dim is 15; expected an even number"),
    ({}, {"mask_token_id": True}, "mask_token_id is True (a boolean); expected a whole number"),
    ({}, {"target_layer_ids": "1,2"}, "target_layer_ids is '1,2' (text); expected a list of whole numbers"),
])
def test_a_bad_config_is_named_by_its_field_value_and_expectation(good, tmp_path, change, dflash, says):
    with pytest.raises(ModelLoadError) as err:
        load_draft(edited(good, tmp_path, change, dflash))
    message = str(err.value)
    assert message.startswith("draft: ") and says in message and "\n" not in message, message


def test_a_tensor_the_layout_lacks_or_does_not_know_is_named(good, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(good / WEIGHTS_NAME))
    path = edited(good, tmp_path, {})
    save_file({k: v for k, v in state.items() if k != "layers.0.mlp.up_proj.weight"}, str(path / WEIGHTS_NAME))
    with pytest.raises(ModelLoadError, match=r"^draft: model.safetensors lacks layers\.0\.mlp\.up_proj\.weight$"):
        load_draft(path)
    save_file({**state, "embed_tokens.weight": torch.zeros(2, 64)}, str(path / WEIGHTS_NAME))
    with pytest.raises(ModelLoadError, match="has tensors the DFlash layout does not: embed_tokens.weight$"):
        load_draft(path)


def test_the_good_draft_still_loads(good):
    model, vocab = load_draft(good)
    assert model.config.hidden_size == 64 and vocab is None
