"""The seed article's API (`DFlashConfig`, `DFlashModel`) on the real default target with a random draft."""

import pytest

from dflash import DFlashConfig, DFlashModel, Engine, ValidationError
from dflash.draft import save_draft
from dflash.target import Target
from tests.engine_helpers import random_default_draft


def test_config_validates_like_the_request():
    with pytest.raises(ValidationError, match="acceptance_threshold"):
        DFlashConfig(acceptance_threshold=1.5)
    with pytest.raises(ValidationError, match="adaptive"):
        DFlashConfig(adaptive="tcp")
    with pytest.raises(ValidationError, match="lookup_ngram"):
        DFlashConfig(lookup_ngram=-1)
    assert DFlashConfig(lookup_ngram=2).request(prompt="x").lookup_ngram == 2
    assert DFlashConfig(block_size=8, max_block_size=32).policy() == "slow-start"
    assert DFlashConfig(block_size=8).policy() == "auto"  # the engine's default: cost on a CPU, fixed on a GPU


@pytest.mark.slow
def test_article_api_on_the_default_target(tmp_path):
    from dflash.registry import SMOLLM2_GGUF
    from dflash.load import load_target_model

    model, tokenizer = load_target_model(SMOLLM2_GGUF)
    draft = random_default_draft(Target(model, tokenizer), block_size=8)
    save_draft(draft, tmp_path / "draft")
    exact = DFlashModel(DFlashConfig(draft_model_name=str(tmp_path / "draft"), block_size=4, max_block_size=8,
                                     diffusion_steps=2), model, tokenizer)
    text = exact.generate("What is 2 + 2?", max_new_tokens=12)
    assert isinstance(text, str) and text
    assert not exact.last_result.stats["lossy"]
    baseline = exact.engine.generate(exact.config.request(prompt="What is 2 + 2?", max_new_tokens=12, use_draft=False))
    assert exact.last_result.output_ids == baseline.output_ids  # threshold 1.0: lossless
    lossy = DFlashModel(DFlashConfig(draft_model_name=str(tmp_path / "draft"), acceptance_threshold=0.9), exact.engine)
    lossy.generate("What is 2 + 2?", max_new_tokens=12, temperature=0.7, top_p=0.9)
    assert lossy.last_result.stats["lossy"]
    assert isinstance(lossy.engine, Engine)


def test_options_given_per_call_override_the_config(engine):
    """generate(..., block_size=2, lookup_ngram=1) on a model whose config sets both: the call's values win (before,
    a TypeError about a keyword given twice); an unknown option is a ValidationError naming it."""
    model = DFlashModel(DFlashConfig(block_size=4, lookup_ngram=2), engine)
    model.generate("", prompt_ids=(5, 6, 7, 5, 6), max_new_tokens=6, block_size=2, lookup_ngram=1)
    request = model.last_result.events[0].request
    assert request["block_size"] == 2 and request["lookup_ngram"] == 1
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4)
    assert model.last_result.events[0].request["block_size"] == 4  # the config's again
    with pytest.raises(ValidationError, match="block_sise"):
        model.generate("x", block_sise=2)
