"""KV caches and rollback (both caches cropped back to the committed length after each block).

A `Target` subclass re-checks every cached forward against a fresh no-cache forward over the sequence the
cache is supposed to hold, and a `Drafter` subclass re-checks the draft's context K/V against features
recomputed from scratch (transformers' hidden_states[j + 1]). Both pass through to the real code. A drafter
written against the `Proposer` protocol alone checks what the engine feeds any proposer's context.
"""

from __future__ import annotations

import pytest
import torch

import dflash.decode.engine as engine_mod
from conftest import tiny_draft, tiny_target
from dflash.models.draft import extract_context_feature
from dflash.decode.drafter import Drafter
from dflash.decode.engine import Engine
from dflash.decode.events import DRAFT, Commit, Verify
from dflash.decode.proposer import Proposal, Proposer
from dflash.decode.request import Request
from dflash.models.target import Target
from engine_helpers import RandomController, reference_greedy, reference_sample


class CheckedTarget(Target):
    """Records (cache length before, tokens) per forward and compares logits/features with a fresh forward."""

    def __init__(self, model):
        super().__init__(model, None, name="checked")
        self.calls: list[tuple[int, list[int]]] = []
        self.seq: list[int] = []  # what the cache holds after the last forward
        self.last_cache = None

    def fresh(self, seq: list[int]):
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        return out.logits[0].float(), out.hidden_states

    def forward(self, ids, cache, last_only=False, capture=True):
        before = self.cache_len(cache)
        if before == 0:
            self.seq = []
        assert before <= len(self.seq)
        self.seq = self.seq[:before] + ids[0].tolist()
        self.calls.append((before, ids[0].tolist()))
        self.last_cache = cache
        logits, feats = super().forward(ids, cache, last_only, capture)
        assert self.cache_len(cache) == len(self.seq)
        ref_logits, hs = self.fresh(self.seq)
        t = ids.shape[1]
        expected = ref_logits[-1:] if last_only else ref_logits[-t:]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        if feats is not None:
            torch.testing.assert_close(feats, extract_context_feature(hs, self.layer_ids)[:, -t:], atol=1e-3, rtol=1e-4)
        return logits, feats


class CheckedDrafter(Drafter):
    """Before each proposal: the draft cache holds exactly the context K/V of positions 0 .. start-1."""

    def __init__(self, target: CheckedTarget, draft):
        super().__init__(draft, target.embed, target.lm_head_weight, None, target.vocab_size)
        self.target = target
        self.checked = 0

    def propose(self, state, seq, size, n_steps, threshold, sample):
        start, cache = len(seq) - 1, self.flush(state)
        assert len(cache) == start, f"draft cache holds {len(cache)} positions, expected {start}"
        assert Target.cache_len(self.target.last_cache) == start  # the target cache was cropped to match
        seq = self.target.seq[:start]  # committed tokens before the anchor (the anchor is not cached yet)
        _, hs = self.target.fresh(seq)
        feats = extract_context_feature(hs, self.target.layer_ids)
        with torch.inference_mode():
            expected = self.draft.context_kv(feats, torch.arange(start))
        for (k, v), (ek, ev) in zip(cache.kv, expected):
            torch.testing.assert_close(k, ek, atol=1e-3, rtol=1e-3)
            torch.testing.assert_close(v, ev, atol=1e-3, rtol=1e-3)
        self.checked += 1
        return super().propose(state, seq, size, n_steps, threshold, sample)


@pytest.fixture(scope="module")
def checked():
    target = CheckedTarget(tiny_target("qwen3", seed=5).model)
    draft = tiny_draft(target, block_size=16)
    engine = Engine(target, draft, drafter=CheckedDrafter(target, draft))
    return target, engine


def check_run(target: CheckedTarget, prompt: list[int], res) -> None:
    """Before every verify the target cache holds all committed tokens but the newest (the block's anchor)."""
    verifies = [e for e in res.events if isinstance(e, Verify)]
    assert len(target.calls) == 1 + len(verifies)
    assert target.calls[0] == (0, prompt)  # prefill
    n_out = 0
    out = res.output_ids
    for (before, ids), v in zip(target.calls[1:], verifies):
        n_out = sum(len(c.token_ids) for c in res.events if isinstance(c, Commit) and c.block < v.block)
        assert before == v.start == len(prompt) + n_out - 1
        assert ids[0] == (prompt + out)[v.start]
        assert ids[1:] == v.draft_tokens
    last = verifies[-1] if verifies else None
    if last is not None:  # after the last step the cache was cropped to the anchor + accepted drafts
        assert Target.cache_len(target.last_cache) == last.start + last.accepted_len + 1


@pytest.mark.parametrize("block,steps", [(4, 1), (16, 2)])
def test_caches_track_committed_tokens(checked, block, steps):
    target, engine = checked
    prompt = [7, 1, 200, 33]
    target.calls.clear()
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=20, block_size=block, diffusion_steps=steps))
    assert res.finish_reason == "length", res.message
    assert res.output_ids == reference_greedy(target, prompt, 20)
    check_run(target, prompt, res)
    assert engine.drafter.checked > 0


def test_caches_with_changing_block_sizes(checked, monkeypatch):
    """Random schedules including blocks of size 1 (no drafting): the draft context must not lose positions."""
    target, engine = checked
    monkeypatch.setattr(engine_mod, "make_controller", lambda policy, size, lo, hi: RandomController(3, hi))
    prompt = [2, 9]
    target.calls.clear()
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=30))
    assert res.finish_reason == "length", res.message
    sizes = [e.block_size for e in res.events if isinstance(e, Verify)]
    assert 1 in sizes and max(sizes) > 2
    assert res.output_ids == reference_greedy(target, prompt, 30)
    check_run(target, prompt, res)


def test_sampled_rejection_run_keeps_caches_consistent(checked):
    target, engine = checked
    prompt = [5, 4, 3]
    target.calls.clear()
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=16, block_size=6, temperature=1.0,
                                  verify="rejection", seed=3))
    assert res.finish_reason == "length" and len(res.output_ids) == 16
    check_run(target, prompt, res)


def test_no_state_leaks_between_requests():
    """A, B, A on one engine: each matches its own reference and A's second run replays its first exactly."""
    target = tiny_target("llama", seed=2)
    engine = Engine(target, tiny_draft(target, block_size=8))
    a = Request(prompt_ids=(10, 20, 30), max_new_tokens=18, block_size=5, adaptive="fixed")  # timing-free block sizes
    b = Request(prompt_ids=(99, 98, 97, 96, 95, 94, 93), max_new_tokens=12, temperature=0.9, top_k=40, seed=4)
    first = engine.generate(a)
    second = engine.generate(b)
    again = engine.generate(a)
    assert first.output_ids == reference_greedy(target, [10, 20, 30], 18)
    assert second.output_ids == reference_sample(target, list(b.prompt_ids), 12, 0.9, 40, 1.0, 4)
    assert again.output_ids == first.output_ids

    def trace(res):
        return [(v.start, v.block_size, v.draft_tokens, v.target_tokens, v.accepted_len) for v in res.events
                if isinstance(v, Verify)]

    assert trace(again) == trace(first)
    assert again.stats["acceptance_lengths"] == first.stats["acceptance_lengths"]


class PositionsDrafter:
    """A drafter written against the `Proposer` protocol alone (no `Drafter` base, no draft model): its state is the
    list of absolute positions whose target features it was given, and it proposes `full[t]` at t."""

    name, min_block = DRAFT, 1

    def __init__(self, full: list[int], feature_width: int, layers: tuple[int, ...] = ()):
        self.full, self.width, self.layers = full, feature_width, layers
        self.seen: list[tuple[list[int], int]] = []  # (cache, start) at each proposal

    def new_state(self) -> list[int]:
        return []

    def extend_context(self, cache: list[int], features: torch.Tensor, start_pos: int) -> None:
        assert features.shape[0] == 1 and features.shape[2] == self.width  # [1, T, k*H]
        cache.extend(range(start_pos, start_pos + features.shape[1]))

    def propose(self, cache, seq, size, n_steps, threshold, sample) -> Proposal:
        start = len(seq) - 1
        self.seen.append((list(cache), start))
        tokens = [self.full[t] for t in range(start + 1, start + size)]
        return Proposal(tokens, [1.0] * len(tokens), None, [], 0.0)


def test_a_drafter_plugs_in_through_the_engine():
    """Passed to `Engine(..., drafter=)`: before each block its cache holds positions 0 .. start-1, each once."""
    target = tiny_target("llama", seed=4)
    draft = tiny_draft(target, block_size=6)
    prompt = [3, 1, 4, 1, 5]
    ref = reference_greedy(target, prompt, 24)
    drafter = PositionsDrafter(prompt + ref + [0] * 8, len(draft.config.target_layer_ids) * target.hidden_size,
                               tuple(draft.config.target_layer_ids))
    assert isinstance(drafter, Proposer)
    engine = Engine(target, draft, drafter=drafter)
    assert engine.drafter is drafter
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=24))
    assert res.finish_reason == "length", res.message
    assert res.output_ids == ref
    verifies = [e for e in res.events if isinstance(e, Verify)]
    assert verifies and all(v.accepted_len == v.block_size - 1 for v in verifies)  # it proposed the target's tokens
    assert [start for _, start in drafter.seen] == [v.start for v in verifies]
    assert all(cache == list(range(start)) for cache, start in drafter.seen)
    engine.use_drafter(None)  # back to the drafter over the draft model
    assert isinstance(engine.drafter, Drafter)
    assert engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=24)).output_ids == ref


def test_a_drafter_needs_a_draft_model():
    target = tiny_target("llama", seed=4)
    drafter = PositionsDrafter([], 0)
    with pytest.raises(ValueError, match="drafter"):
        Engine(target, drafter=drafter)
    with pytest.raises(ValueError, match="drafter"):
        Engine(target).use_drafter(drafter)
