"""Multi-step denoising of a block (each step predicts the still-masked positions and commits those at or above
the confidence threshold: at least the most confident one, all remaining ones at the last step), checked from
the DraftStep events and an independent recomputation of the draft's predictions from scratch."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.models.draft import extract_context_feature
from dflash.decode.engine import Engine
from dflash.decode.events import DraftStep, Verify
from dflash.decode.request import Request
from engine_helpers import reference_greedy

PROMPT = [8, 16, 32, 64]


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("qwen3", seed=6)
    # A wide, 2-layer draft gives spread confidences, so thresholds split blocks over several steps.
    draft = tiny_draft(target, block_size=8, layers=2, seed=3)
    return target, Engine(target, draft)


def blocks(events) -> dict[int, tuple[list[DraftStep], Verify]]:
    out = {}
    for v in (e for e in events if isinstance(e, Verify)):
        out[v.block] = ([s for s in events if isinstance(s, DraftStep) and s.block == v.block], v)
    return out


def predict(engine: Engine, seq: list[int], start: int, tokens: list[int]) -> tuple[list[int], list[float]]:
    """The draft's argmax and its probability at every block position, recomputed without the engine's caches:
    context = features of seq[:start] from a fresh target forward (hidden_states[j + 1])."""
    target, draft = engine.target, engine.draft
    with torch.inference_mode():
        hs = target.model(input_ids=torch.tensor([seq[:start]]), output_hidden_states=True).hidden_states
        kv = draft.context_kv(extract_context_feature(hs, draft.config.target_layer_ids), torch.arange(start))
        hidden = draft(target.embed(torch.tensor([tokens])), torch.arange(start, start + len(tokens)), kv)[0]
        probs = torch.softmax((hidden @ target.lm_head_weight.T).float(), -1)
    p, best = probs.max(-1)
    return best.tolist(), p.tolist()


def run(engine: Engine, n: int = 16, **kw):
    # A fixed block: the cost policy (the CPU default) sizes blocks by measured time, which no trace comparison survives.
    res = engine.generate(Request(prompt_ids=tuple(PROMPT), max_new_tokens=n, block_size=8, adaptive="fixed", **kw))
    assert res.finish_reason == "length", res.message
    return res


def test_single_step_is_one_pass_of_the_draft(setup):
    target, engine = setup
    res = run(engine, diffusion_steps=1)
    assert res.output_ids == reference_greedy(target, PROMPT, 16)
    seq = PROMPT + res.output_ids
    mask = engine.draft.config.mask_token_id
    for steps, v in blocks(res.events).values():
        assert len(steps) == 1
        s = steps[0]
        b = v.block_size
        assert (s.step, s.n_steps, s.start) == (0, 1, v.start)
        assert s.masked == [False] * b and s.committed == [False] + [True] * (b - 1)
        assert s.tokens[0] == seq[v.start] and s.tokens[1:] == v.draft_tokens
        best, p = predict(engine, seq, v.start, [seq[v.start]] + [mask] * (b - 1))
        assert v.draft_tokens == best[1:]
        assert s.confidences[1:] == pytest.approx(p[1:], abs=1e-4)


@pytest.mark.parametrize("steps,threshold", [(2, 0.5), (4, 0.3), (4, 1.0), (3, 0.05)])
def test_multi_step_commits_each_position_once(setup, steps, threshold):
    target, engine = setup
    res = run(engine, diffusion_steps=steps, confidence_threshold=threshold)
    assert res.output_ids == reference_greedy(target, PROMPT, 16)
    seq = PROMPT + res.output_ids
    mask = engine.draft.config.mask_token_id
    multi = grouped = 0
    for events, v in blocks(res.events).values():
        b = v.block_size
        assert 1 <= len(events) <= steps, "never more draft passes than steps"
        multi += len(events) > 1
        open_before = [False] + [True] * (b - 1)
        fixed: dict[int, int] = {}
        for s in events:
            assert s.n_steps == steps and s.start == v.start
            assert not s.committed[0] and not s.masked[0]
            # The prediction of this pass, recomputed with the tokens committed so far filled in.
            inputs = [seq[v.start]] + [fixed.get(i, mask) for i in range(1, b)]
            best, p = predict(engine, seq, v.start, inputs)
            newly = [i for i in range(b) if s.committed[i]]
            assert newly and all(open_before[i] for i in newly), "commit only still-masked positions"
            for i in range(1, b):
                if i in fixed:
                    assert s.tokens[i] == fixed[i], "a committed token never changes"
                else:
                    assert s.tokens[i] == best[i] and s.confidences[i] == pytest.approx(p[i], abs=1e-4)
            last = s.step == steps - 1
            candidates = [i for i in range(1, b) if open_before[i]]
            if not last:
                grouped += len(newly) > 1
                above = [i for i in candidates if p[i] >= threshold]
                if above:
                    assert sorted(newly) == above
                else:  # nothing confident enough: exactly the single most confident one
                    assert newly == [max(candidates, key=lambda i: p[i])]
            else:
                assert sorted(newly) == candidates, "the last step commits everything left"
            for i in newly:
                fixed[i] = s.tokens[i]
            open_before = [open_before[i] and not s.committed[i] for i in range(b)]
            assert s.masked == open_before
        assert not any(open_before), "every position committed by step S at the latest"
        assert sorted(fixed) == list(range(1, b)), "each position committed exactly once"
        assert [fixed[i] for i in range(1, b)] == v.draft_tokens
    if threshold >= 0.3:
        assert multi > 0, "some block must take more than one pass"
    if threshold == 0.3:
        assert grouped > 0, "some step must commit several confident positions at once"


def test_threshold_one_commits_one_position_per_step(setup):
    _, engine = setup
    res = run(engine, diffusion_steps=4, confidence_threshold=1.0)
    for events, v in blocks(res.events).values():
        assert len(events) == min(4, v.block_size - 1)
        for s in events[:-1]:
            assert sum(s.committed) == 1


def test_low_threshold_equals_single_pass(setup):
    """With every confidence above the threshold, S > 1 stops after one pass and drafts exactly as S = 1."""
    _, engine = setup
    one = run(engine, diffusion_steps=1)
    many = run(engine, diffusion_steps=4, confidence_threshold=1e-9)

    def trace(res):
        return [(v.start, v.block_size, v.draft_tokens, v.accepted_len) for v in res.events if isinstance(v, Verify)]

    assert trace(many) == trace(one)
    for events, _ in blocks(many.events).values():
        assert len(events) == 1 and events[0].n_steps == 4 and not any(events[0].masked)


def test_no_draft_steps_without_a_draft_or_for_blocks_of_one(setup):
    _, engine = setup
    base = engine.generate(Request(prompt_ids=tuple(PROMPT), max_new_tokens=6, use_draft=False, diffusion_steps=4))
    assert not any(isinstance(e, DraftStep) for e in base.events)
    ones = engine.generate(Request(prompt_ids=tuple(PROMPT), max_new_tokens=6, block_size=1, diffusion_steps=4,
                                   adaptive="fixed"))
    assert not any(isinstance(e, DraftStep) for e in ones.events)
    assert ones.output_ids == base.output_ids


def test_a_step_commits_what_reaches_the_threshold_at_least_the_best_and_everything_at_the_last():
    from dflash.decode.drafter import commit_positions

    conf = [0.95, 0.2, 0.91, 0.5]  # positions 1..4
    assert commit_positions([1, 2, 3, 4], conf, 0.9, last=False) == [1, 3]
    assert commit_positions([2, 4], conf, 0.9, last=False) == [4]  # none reaches it: the most confident one
    assert commit_positions([2, 4], conf, 0.9, last=True) == [2, 4]
