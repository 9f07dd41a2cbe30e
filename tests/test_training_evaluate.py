"""The evaluation's τ is the engine's own τ: the mean of (accepted + 1) over every verify of every prompt."""

import statistics

import pytest

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.decode.events import Verify
from dflash.decode.request import Request
from dflash.training.evaluate import evaluate_draft, summarize
from engine_helpers import OracleDrafter, with_drafter


def test_eval_tau_equals_tau_from_the_engines_events():
    target = tiny_target("llama", seed=3)
    engine = Engine(target, tiny_draft(target, block_size=4))
    prompts = [(5, 6, 7), (40, 41, 42, 43), (9,)]
    # The drafter knows the first prompt's continuation: high τ there, ~1 on the others, so a per-prompt mean
    # of τ and the pooled mean over verifies differ, and only the pooled one is right.
    ref = engine.generate(Request(prompt_ids=prompts[0], max_new_tokens=24, use_draft=False)).output_ids
    with_drafter(engine, OracleDrafter, list(prompts[0]) + ref)
    lengths = []
    for p in prompts:
        events = list(engine.stream(Request(prompt_ids=p, max_new_tokens=24, adaptive="fixed")))  # as eval runs
        lengths += [e.accepted_len + 1 for e in events if isinstance(e, Verify)]
    res = evaluate_draft(engine, prompts, max_new_tokens=24, baseline=True)
    assert res["tau"] == pytest.approx(statistics.fmean(lengths))
    assert res["tau"] > 1.2
    assert res["n_verify"] == len(lengths) == sum(res["histogram"].values())
    assert res["identical"] == 3  # lossless: every greedy output equals the no-draft output
    assert res["tau"] != pytest.approx(statistics.fmean(r["tau"] for r in res["rows"]))


def test_summary_speedup_is_the_ratio_of_per_token_times():
    rows = [{"lengths": [1, 2], "ms_per_token": 10.0, "ar_ms_per_token": 20.0, "identical": True},
            {"lengths": [3], "ms_per_token": 30.0, "ar_ms_per_token": 30.0, "identical": False}]
    s = summarize(rows)
    assert s["tau"] == 2.0 and s["histogram"] == {"1": 1, "2": 1, "3": 1}
    assert s["speedup"] == pytest.approx(50 / 40) and s["identical"] == 1
