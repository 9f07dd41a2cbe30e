"""Engines with text for the playground tests: the tiny random models of conftest.py plus a real character
tokenizer (so prompts are text, as in the app), and the real default target with a random draft sized for it.

No downloads. The character tokenizer maps each of 256 ids to one printable character; it is a genuine
`tokenizers` BPE model with no merges, so encode/decode round-trip exactly.
"""

from __future__ import annotations

import torch

from dflash.draft import DFlashDraftModel, DraftConfig
from dflash.engine import Engine
from dflash.target import Target
from tests.conftest import VOCAB, tiny_draft, tiny_target


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = ["<unk>", "\n"] + [chr(c) for c in range(32, 127)] + [chr(c) for c in range(161, 256) if c != 173]
    chars += [chr(c) for c in range(0x391, 0x3CA) if chr(c).isalpha()]  # Greek to fill up the vocabulary
    chars = chars[:VOCAB]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def tiny_text_engine(block_size: int = 8, seed: int = 0, name: str = "tiny") -> Engine:
    """A tiny random Llama target with a character tokenizer and a tiny random DFlash draft."""
    base = tiny_target("llama", seed=seed)
    target = Target(base.model, char_tokenizer(), name=name)
    return Engine(target, tiny_draft(target, block_size=block_size, seed=seed + 1), name=name)


def default_target():
    """The real default target (SmolLM2-135M-Instruct, float32 on CPU)."""
    from dflash.registry import SMOLLM2_GGUF
    from dflash.target import load_target_model

    model, tokenizer = load_target_model(SMOLLM2_GGUF)
    return Target(model, tokenizer, name="default")


def random_default_draft(target: Target, block_size: int = 16, layers: int = 1, seed: int = 0) -> DFlashDraftModel:
    """A random draft with the default draft's shape (hidden 576, 9/3 heads, head_dim 64, mask id 16)."""
    torch.manual_seed(seed)
    cfg = DraftConfig(hidden_size=target.hidden_size, num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, intermediate_size=1536, vocab_size=target.vocab_size, num_target_layers=target.num_layers,
                      block_size=block_size, mask_token_id=16)
    return DFlashDraftModel(cfg)
