"""Losslessness of the engine: DFlash output == the target's own output.

Greedy runs are compared with transformers' own greedy `generate`; seeded sampling with a plain no-cache
loop using the same per-position noise. Drafts: the random tiny draft, an oracle (always right) and an
adversary (always wrong), so every block is partly, fully and never accepted.
"""

from __future__ import annotations

import random

import pytest
import torch

import dflash.decode.engine as engine_mod
from conftest import tiny_draft, tiny_target
from dflash.decode.adaptive import POLICIES
from dflash.decode.engine import Engine
from dflash.decode.events import BONUS, COPY, CORRECTION, DRAFT, BlockSize, Commit, Started, Verify
from dflash.decode.lookup import copied_span, find
from dflash.decode.request import Request
from engine_helpers import (RandomController, AdversarialDrafter, OracleDrafter, commits, reference_greedy, reference_sample,
                            with_drafter)

ARCHS = ("llama", "qwen3")
DRAFTERS = {"random": None, "oracle": OracleDrafter, "adversarial": AdversarialDrafter}
BLOCKS = (1, 2, 4, 16)
# (prompt, max_new_tokens): one-token prompt, short and long prompts; 1 token (prefill only), a few, several blocks.
CASES = [([42], 1), ([1, 2, 3], 7), ([200, 17, 45, 9, 88, 120, 3, 54, 61, 7, 250], 33)]


@pytest.fixture(scope="module")
def models():
    out = {}
    for arch in ARCHS:
        target = tiny_target(arch)
        out[arch] = (target, Engine(target, tiny_draft(target, block_size=16)))
    return out


_refs: dict = {}


def ref(target, arch: str, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    key = (arch, tuple(prompt), n, eos)
    if key not in _refs:
        _refs[key] = reference_greedy(target, prompt, n, eos)
    return _refs[key]


def run(engine: Engine, drafter: str, prompt: list[int], reference: list[int], **kw):
    """A run proposed by `drafter` alone (no copying from the context unless lookup_ngram is given)."""
    with_drafter(engine, DRAFTERS[drafter], prompt + reference + [0] * 32)
    return engine.generate(Request(prompt_ids=tuple(prompt), **{"lookup_ngram": 0, **kw}))


def verifies(events) -> list[Verify]:
    return [e for e in events if isinstance(e, Verify)]


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_target_only(models, arch, drafter, block):
    target, engine = models[arch]
    for prompt, n in CASES:
        expected = ref(target, arch, prompt, n)
        res = run(engine, drafter, prompt, expected, max_new_tokens=n, block_size=block, adaptive="fixed")
        assert res.finish_reason == "length" and res.message == ""
        assert res.output_ids == expected, (prompt, n)
        assert commits(res.events) == expected
        vs = verifies(res.events)
        assert all(v.block_size <= block for v in vs)
        if drafter == "oracle":  # every drafted token accepted (vLLM's draft == target sanity check)
            assert all(v.accepted_len == v.block_size - 1 for v in vs)
            if block > 1 and n > 1:
                assert res.stats["tau"] >= 0.98 * min(block, n - 1) * (len(vs) - 1) / len(vs)
        if drafter == "adversarial":  # nothing accepted, one token per target forward, output still exact
            assert all(v.accepted_len == 0 for v in vs)
            assert len(vs) == n - 1


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_with_eos(models, arch, drafter):
    """A real EOS mid-output: the run stops at it (included), for every block size."""
    target, _ = models[arch]
    prompt = [1, 2, 3]
    free = ref(target, arch, prompt, 40)
    k = next(i for i in range(8, 40) if free[i] not in free[:i])  # EOS = a token first emitted mid-way
    eos = free[k]
    eos_target = tiny_target(arch, eos=eos)  # same seed → same weights, now with an EOS id
    engine = Engine(eos_target, tiny_draft(eos_target, block_size=16))
    expected = reference_greedy(eos_target, prompt, 40, eos)
    assert expected == free[: k + 1]
    for block in BLOCKS:
        res = run(engine, drafter, prompt, free, max_new_tokens=40, block_size=block)
        assert res.output_ids == expected, block
        assert res.finish_reason == "eos"


def test_eos_inside_block_is_last_token(models):
    """Tokens the verifier accepts after an EOS inside a block are never emitted, nor reported as committed."""
    target, _ = models["llama"]
    prompt = [1, 2, 3]
    free = ref(target, "llama", prompt, 40)
    k = next(i for i in range(5, 40) if free[i] not in free[:i] and i % 15 not in (0, 14))
    eos = free[k]
    eos_target = tiny_target("llama", eos=eos)
    engine = Engine(eos_target, tiny_draft(eos_target, block_size=16))
    # The oracle proposes the EOS-free continuation, so the block holding EOS is accepted past it.
    res = run(engine, "oracle", prompt, free, max_new_tokens=40, block_size=16)
    assert res.finish_reason == "eos"
    assert res.output_ids == free[: k + 1] and res.output_ids[-1] == eos
    last = verifies(res.events)[-1]
    assert last.accepted_len > 0
    accepted = [t for t, ok in zip(last.draft_tokens, last.accepted) if ok]
    assert eos in accepted and accepted.index(eos) < len(accepted) - 1, "EOS must sit inside the accepted run"
    last_commit = [e for e in res.events if isinstance(e, Commit)][-1]
    assert last_commit.token_ids[-1] == eos
    assert len(last_commit.token_ids) < last.accepted_len + 1
    assert res.stats["n_output_tokens"] == k + 1


@pytest.mark.parametrize("drafter", ["random", "oracle"])
@pytest.mark.parametrize("arch", ARCHS)
def test_mask_token_id_in_output_is_kept(models, arch, drafter):
    """A real output token equal to the draft's mask id survives (regression of upstream dflash 7d2ea1e)."""
    target, _ = models[arch]
    prompt = [5, 6, 7]
    expected = ref(target, arch, prompt, 20)
    mask_id = expected[3]
    engine = Engine(target, tiny_draft(target, block_size=16, mask_id=mask_id))
    res = run(engine, drafter, prompt, expected, max_new_tokens=20, block_size=8)
    assert next(e for e in res.events if isinstance(e, Started)).mask_token_id == mask_id
    assert res.output_ids == expected
    assert mask_id in res.output_ids


SAMPLING = [("llama", dict(temperature=0.8, top_p=0.9, top_k=0, seed=1)),
            ("qwen3", dict(temperature=1.0, top_p=1.0, top_k=20, seed=2)),
            ("llama", dict(temperature=0.5, top_p=0.95, top_k=50, seed=12345)),
            ("qwen3", dict(temperature=2.0, top_p=1.0, top_k=0, seed=7))]


def _sampling_id(p) -> str:
    return p if isinstance(p, str) else "-".join(f"{k}{v}" for k, v in p.items())


@pytest.mark.parametrize("arch,params", SAMPLING, ids=_sampling_id)
def test_seeded_sampling_match_equals_target_only(models, arch, params):
    target, engine = models[arch]
    prompt = [9, 8, 7, 6]
    n = 12
    expected = reference_sample(target, prompt, n, params["temperature"], params["top_k"], params["top_p"], params["seed"])
    assert expected != reference_sample(target, prompt, n, params["temperature"], params["top_k"], params["top_p"],
                                        params["seed"] + 1), "different seeds should give different samples"
    base = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=n, use_draft=False, **params))
    assert base.output_ids == expected
    for drafter, block in (("random", 4), ("oracle", 16), ("adversarial", 3)):
        res = run(engine, drafter, prompt, expected, max_new_tokens=n, block_size=block, verify="match", **params)
        assert res.output_ids == expected, (drafter, block)
        if drafter == "oracle":
            assert all(v.accepted_len == v.block_size - 1 for v in verifies(res.events))


@pytest.mark.parametrize("steps", [1, 2, 4])
@pytest.mark.parametrize("policy", POLICIES)
def test_adaptive_and_denoising_knobs_are_lossless(models, policy, steps):
    """Controller policy, denoising steps and confidence threshold change only how tokens are drafted."""
    rng = random.Random(f"{policy}-{steps}")
    arch = ARCHS[(POLICIES.index(policy) + steps) % 2]
    target, engine = models[arch]
    prompt = [rng.randrange(250) for _ in range(rng.randint(1, 6))]
    n = 24
    expected = ref(target, arch, prompt, n)
    for drafter in ("random", "oracle"):
        lo = rng.randint(1, 4)
        hi = rng.randint(max(lo, 2), 16)
        res = run(engine, drafter, prompt, expected, max_new_tokens=n, adaptive=policy, diffusion_steps=steps,
                  confidence_threshold=rng.uniform(0.01, 1.0), acceptance_threshold=1.0, min_block_size=lo,
                  max_block_size=hi, block_size=rng.randint(lo, hi))
        assert res.output_ids == expected, (arch, drafter, lo, hi)
        for v in verifies(res.events):  # within bounds, except the last block clipped to the tokens left
            left = n - sum(len(c.token_ids) for c in res.events if isinstance(c, Commit) and c.block < v.block)
            assert lo <= v.block_size <= hi or v.block_size == left + 1 < lo
        assert res.stats["lossy"] is False and res.stats["drift_tokens"] == 0


@pytest.mark.parametrize("seed,arch", [(0, "llama"), (1, "qwen3")])
def test_random_block_schedules_do_not_change_output(models, monkeypatch, seed, arch):
    """Seeded random schedules (sizes 1..16 at every step) give the target's own output: the controller cannot
    change which tokens are emitted."""
    monkeypatch.setattr(engine_mod, "make_controller", lambda policy, size, lo, hi: RandomController(seed, hi))
    target, engine = models[arch]
    prompt = [3 + seed, 1, 4, 1, 5]
    expected = ref(target, arch, prompt, 30)
    for drafter in DRAFTERS:
        res = run(engine, drafter, prompt, expected, max_new_tokens=30, diffusion_steps=1 + seed)
        assert res.output_ids == expected, drafter
        assert len({v.block_size for v in verifies(res.events)}) > 1


def test_exact_max_new_tokens_when_last_block_overshoots(models):
    target, engine = models["llama"]
    prompt = [11, 12]
    for n in (2, 3, 16, 17, 18):
        expected = ref(target, "llama", prompt, n)
        res = run(engine, "oracle", prompt, expected, max_new_tokens=n, block_size=16)
        assert res.output_ids == expected and len(res.output_ids) == n
        assert res.finish_reason == "length"
        kinds = [k for e in res.events if isinstance(e, Commit) for k in e.kinds]
        assert len(kinds) == n and kinds[0] == BONUS


def test_commit_kinds(models):
    """Accepted drafts are 'draft', the target's token after a rejection 'correction', after a full block 'bonus'."""
    target, engine = models["qwen3"]
    prompt = [4, 4, 4]
    expected = ref(target, "qwen3", prompt, 10)
    for drafter, tail in (("oracle", BONUS), ("adversarial", CORRECTION)):
        res = run(engine, drafter, prompt, expected, max_new_tokens=10, block_size=3)
        for c in (e for e in res.events if isinstance(e, Commit) and e.block > 0):
            v = next(x for x in res.events if isinstance(x, Verify) and x.block == c.block)
            assert c.kinds[: v.accepted_len] == [DRAFT] * min(v.accepted_len, len(c.kinds))
            if len(c.token_ids) == v.accepted_len + 1:
                assert c.kinds[-1] == tail


def test_relaxed_acceptance_deviates_only_where_threshold_met(models):
    """a < 1 (lossy, opt-in): every emitted token is the target's argmax given the emitted prefix, except
    relaxed ones, which meet p(x) >= a * max p; the lossy flag and the drift count say so."""
    a = 0.01
    for arch in ARCHS:
        target, engine = models[arch]
        prompt = [1, 2, 3]
        with_drafter(engine, None, [])
        res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=40, block_size=8, acceptance_threshold=a))
        assert res.stats["lossy"] is True and next(e for e in res.events if isinstance(e, Started)).lossy
        seq = prompt + res.output_ids
        with torch.inference_mode():
            logits = target.model(input_ids=torch.tensor([seq])).logits[0].float()
        probs = torch.softmax(logits, -1)
        differs = 0
        for i, tok in enumerate(res.output_ids):
            p = probs[len(prompt) + i - 1]
            if tok != int(p.argmax()):
                differs += 1
                assert float(p[tok]) >= a * float(p.max()) * (1 - 1e-4), (arch, i)
        assert differs > 0, "the test needs at least one relaxed acceptance"
        assert res.stats["drift_tokens"] == differs


def test_relaxed_drift_ignores_tokens_cut_after_eos():
    """Relaxed drafts accepted after an EOS inside a block are never emitted and must not count as drift."""
    prompt, eos, a = [2, 3, 3], 255, 0.001
    target = tiny_target("llama", eos=eos)
    engine = Engine(target, tiny_draft(target, block_size=16))
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=30, block_size=8, acceptance_threshold=a))
    assert res.finish_reason == "eos"
    last = verifies(res.events)[-1]
    cut = last.accepted_len + 1 - len([e for e in res.events if isinstance(e, Commit)][-1].token_ids)
    assert cut > 0 and any(last.relaxed[-cut:]), "the case needs relaxed tokens accepted after the EOS"
    seq = prompt + res.output_ids
    with torch.inference_mode():
        own = target.model(input_ids=torch.tensor([seq])).logits[0].argmax(-1).tolist()
    differs = sum(tok != own[len(prompt) - 1 + i] for i, tok in enumerate(res.output_ids))
    assert res.stats["drift_tokens"] == differs


# -- the target's top-2 gap per committed token (what tells a numerical tie from an error) --------------------------
def reference_gaps(target, seq: list[int], n_prompt: int) -> list[float]:
    """Top-1 minus top-2 logit predicting each output token of `seq`, from one no-cache forward over it."""
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([seq])).logits[0, n_prompt - 1 : len(seq) - 1].float()
    ranked = logits.sort(-1, descending=True).values
    return (ranked[:, 0] - ranked[:, 1]).tolist()


@pytest.mark.parametrize("drafter", [*DRAFTERS, "no draft"])
def test_every_greedy_commit_carries_the_targets_gap_per_token(models, drafter):
    """Accepted drafts, corrections, bonus tokens and the prefill's token each get the target's own margin at
    their position: the rows 0..a of the verify that committed them (truncated with the tokens at the end)."""
    target, engine = models["llama"]
    prompt = [200, 17, 45, 9, 88]
    expected = ref(target, "llama", prompt, 23)
    res = run(engine, drafter if drafter in DRAFTERS else "random", prompt, expected, max_new_tokens=23,
              block_size=4, use_draft=drafter != "no draft")  # 23: the last block is cut by the length limit
    commits_ = [e for e in res.events if isinstance(e, Commit)]
    assert all(len(c.target_gaps) == len(c.token_ids) for c in commits_)
    gaps = [g for c in commits_ for g in c.target_gaps]
    assert gaps == pytest.approx(reference_gaps(target, prompt + res.output_ids, len(prompt)), abs=1e-4)
    assert all(g >= 0 for g in gaps)
    if drafter == "oracle":
        assert any(len(c.token_ids) > 1 for c in commits_), "the case needs accepted drafts"


def test_sampled_commits_carry_the_margin_of_the_noisy_scores(models):
    """A sampled token (match rule, no top-k / top-p) is the argmax of logits + T·noise at its position: its margin
    is that sum's top-2 gap, recomputed here from one teacher-forced forward of the output. The rejection rule and
    top-p sampling keep none (their tokens are not such an argmax alone)."""
    from dflash.verification.sampling import GUMBEL_TARGET, gumbel_noise
    from dflash.verification.verify import top2_gap

    _, engine = models["qwen3"]
    with_drafter(engine, None, [])
    prompt, t = [3, 1, 4], 0.8
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=12, block_size=4, temperature=t, seed=2))
    gaps = [g for c in res.events if isinstance(c, Commit) for g in c.target_gaps]
    seq = prompt + res.output_ids
    logits, _ = engine.target.forward(torch.tensor([seq[:-1]]), engine.target.new_cache(), capture=False)
    rows = logits[len(prompt) - 1:].float()  # [n_out, V]: the row that chose output token j
    positions = list(range(len(prompt), len(seq)))
    scores = rows + t * gumbel_noise(2, positions, rows.shape[-1], GUMBEL_TARGET)
    assert scores.argmax(-1).tolist() == res.output_ids
    assert gaps == pytest.approx(top2_gap(scores), abs=1e-3)
    for extra in ({"verify": "rejection"}, {"top_p": 0.9}):
        other = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=12, block_size=4, temperature=t, seed=2,
                                        **extra))
        assert all(c.target_gaps == [] for c in other.events if isinstance(c, Commit))


def test_a_draft_fusing_the_last_layer_is_lossless():
    target = tiny_target("llama")  # 4 layers: 3 is the last, fused after the final norm (transformers' convention)
    engine = Engine(target, tiny_draft(target, layer_ids=[1, 3]))
    prompt, n = [200, 17, 45, 9, 88], 20
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=n, block_size=4, adaptive="fixed"))
    assert res.output_ids == reference_greedy(target, prompt, n)
    assert any(isinstance(e, Verify) and e.draft_tokens for e in res.events)  # the draft ran on those features


@pytest.mark.parametrize("ngram,policy,arch,seed", [(1, "fixed", "llama", 0), (2, "cost", "qwen3", 2),
                                                    (3, "slow-start", "qwen3", 2), (1, "cost", "qwen3", 1)])
def test_copying_from_the_context_is_lossless_and_copies_exactly_where_the_ngram_recurs(models, ngram, policy, arch,
                                                                                      seed):
    """lookup_ngram > 0: a block whose anchor ends an n-gram seen earlier proposes the span that followed it (the
    drafter is not asked), every other block is drafted; the output stays the target's own. Each verify's source
    and proposal are checked against the final sequence, so a context shifted by one position fails. (The seeds
    pick prompts whose greedy continuation on the tiny model repeats n-grams, so that copies happen.)"""
    target, engine = models[arch]
    rng = random.Random(seed)
    prompt = [rng.randrange(250) for _ in range(6)] * 2
    n = 40
    expected = ref(target, arch, prompt, n)
    seq = prompt + expected
    total = 0
    for drafter in ("random", "adversarial", "oracle"):
        res = run(engine, drafter, prompt, expected, max_new_tokens=n, lookup_ngram=ngram, adaptive=policy,
                  block_size=4, min_block_size=1)
        assert res.output_ids == expected, drafter
        sizes = {e.block: e for e in res.events if isinstance(e, BlockSize)}
        commits = {e.block: e for e in res.events if isinstance(e, Commit)}
        copied = 0
        for v in verifies(res.events):
            ctx = seq[: v.start + 1]
            j = find(ctx, ngram)
            if not v.draft_tokens:  # where a copy exists, only a block clipped to the one token left proposes
                assert j is None or "clipped" in sizes[v.block].reason, (drafter, v.block)  # nothing (min_block_size 1
                j = None  # is the draft's controller's: a copied block holds at least one token)
            assert sizes[v.block].source == v.source == (COPY if j is not None else DRAFT), (drafter, v.block)
            if j is not None:
                copied += 1
                assert v.draft_tokens == copied_span(ctx, j, len(v.draft_tokens))
                assert v.draft_ms == 0.0 and "copy from the context" in sizes[v.block].reason
            kinds = commits[v.block].kinds
            assert kinds[: v.accepted_len] == [v.source] * min(v.accepted_len, len(kinds))
        assert res.stats["copy_blocks"] == copied, drafter
        per = {name: [v.accepted_len + 1 for v in verifies(res.events) if v.source == name] for name in (COPY, DRAFT)}
        assert res.stats["proposers"] == {k: {"blocks": len(v), "tau": sum(v) / len(v)} for k, v in per.items() if v}
        total += copied
    assert total > 0  # (an oracle's blocks are all accepted, so its anchors may skip every recurring n-gram)


def test_copying_keeps_seeded_sampling_and_the_rejection_rule_exact(models):
    """Match rule: the same tokens as the target's own seeded sample. Rejection rule: a copy's law is a point mass,
    so its tokens are accepted with probability p(x) (tested for the distribution in test_engine_distribution)."""
    target, engine = models["llama"]
    prompt = [9, 8, 7, 9, 8, 7, 9, 8]
    params = dict(temperature=0.7, top_k=0, top_p=1.0, seed=3)
    expected = reference_sample(target, prompt, 16, **params)
    res = run(engine, "random", prompt, expected, max_new_tokens=16, block_size=4, lookup_ngram=1, **params)
    assert res.output_ids == expected and res.stats["copy_blocks"] > 0
    rej = run(engine, "random", prompt, expected, max_new_tokens=16, block_size=4, lookup_ngram=1, verify="rejection",
              **params)
    assert len(rej.output_ids) == 16 and rej.stats["copy_blocks"] > 0


def test_without_the_draft_lookup_is_ignored(models):
    target, engine = models["qwen3"]
    prompt = [4, 4, 4, 4]
    res = engine.generate(Request(prompt_ids=tuple(prompt), max_new_tokens=8, use_draft=False, lookup_ngram=1))
    assert res.output_ids == ref(target, "qwen3", prompt, 8) and res.stats["copy_blocks"] == 0
    assert all(v.source == DRAFT and not v.draft_tokens for v in verifies(res.events))
