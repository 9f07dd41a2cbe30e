"""The rejection rule reproduces the target's distribution.

1. `rejection_verify` alone, small vocabulary, many draws: the first emitted token follows p, the next one
   (given the first draft token was accepted) follows p of the next row; chi-square and TV bounds. Draws of
   the draft's own proposals are checked to *fail* the same test, so the test can tell the difference.
2. The whole engine on a toy Markov target (a real transformers model whose attention output is zeroed, so the
   next-token law depends only on the last token): the 3-token sequences of `verify="rejection"` runs over
   many seeds match the exact product distribution.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dflash.models.draft import DFlashDraftModel, DraftConfig
from dflash.decode.engine import Engine
from dflash.decode.events import Commit, Verify
from dflash.decode.request import Request
from dflash.models.target import Target
from dflash.verification.verify import rejection_verify
import engine_helpers  # noqa: F401  (one CPU thread)


def chi_square_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    stat, df = 0.0, -1
    pooled_obs, pooled_exp = 0.0, 0.0
    for key, p in probs.items():
        e = p * n
        if e < 5:
            pooled_obs += counts.get(key, 0)
            pooled_exp += e
            continue
        stat += (counts.get(key, 0) - e) ** 2 / e
        df += 1
    outside = n - sum(counts.get(k, 0) for k in probs)  # draws where p = 0: impossible under the null
    pooled_obs += outside
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12)
        df += 1
    elif outside:
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def tv(counts: dict, probs: dict, n: int) -> float:
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys)


def random_dist(gen: torch.Generator, rows: int, vocab: int, sharp: float = 1.0) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * sharp, -1).float()


def draw(p: torch.Tensor, q: torch.Tensor, n_draws: int, seed: int):
    """Run rejection_verify n_draws times with fresh noise. p [n+1, V], q [n, V]. Returns per-draw (tokens, x)."""
    gen = torch.Generator().manual_seed(seed)
    n, vocab = q.shape
    xs = torch.stack([torch.multinomial(q[i], n_draws, replacement=True, generator=gen) for i in range(n)], 1)  # [N, n]
    us = torch.rand(n_draws, n, generator=gen).tolist()
    g = -torch.log(-torch.log(torch.rand(n_draws, n + 1, vocab, generator=gen).clamp(1e-20, 1 - 1e-7)))
    out = []
    for k in range(n_draws):
        res = rejection_verify(xs[k], q, p, us[k], g[k])
        out.append(xs[k][: res.accepted_len].tolist() + [res.next_token])
    return out, xs


N = 8_000


@pytest.mark.parametrize("case", ["random", "sparse-target", "draft-equals-target", "draft-off-support"])
def test_rejection_rule_reproduces_target(case):
    vocab, n = 8, 2
    gen = torch.Generator().manual_seed(11)
    p = random_dist(gen, n + 1, vocab, 1.5)
    q = random_dist(gen, n, vocab, 1.5)
    if case == "sparse-target":  # top-k-filtered target: zero mass outside 3 tokens
        keep = torch.zeros_like(p)
        keep.scatter_(1, p.topk(3, -1).indices, 1.0)
        p = p * keep / (p * keep).sum(-1, keepdim=True)
    elif case == "draft-equals-target":
        q = p[:n].clone()
    elif case == "draft-off-support":  # the draft proposes mostly a token the target almost never wants
        bad = int(p[0].argmin())
        q = torch.full((n, vocab), 0.02)
        q[:, bad] = 1.0 - 0.02 * (vocab - 1)
    samples, xs = draw(p, q, N, seed=5)
    assert all(0 <= t < vocab for s in samples for t in s)
    first = Counter(s[0] for s in samples)
    p0 = {v: float(p[0, v]) for v in range(vocab) if p[0, v] > 0}
    assert chi_square_pvalue(first, p0, N) > 1e-3
    assert tv(first, p0, N) < 0.03
    # Given the first draft token was accepted, the second emitted token follows row 1 of p.
    second = [s[1] for s in samples if len(s) > 1]
    p1 = {v: float(p[1, v]) for v in range(vocab) if p[1, v] > 0}
    assert len(second) > 400
    assert chi_square_pvalue(Counter(second), p1, len(second)) > 1e-3
    if case == "draft-equals-target":
        assert all(len(s) == n + 1 for s in samples), "p == q must accept every draft token"
    else:  # power: emitting the draft's own proposals would fail the very same test
        proposals = Counter(xs[:, 0].tolist())
        assert chi_square_pvalue(proposals, p0, N) < 1e-6


def test_rejection_rule_handcrafted():
    """Deterministic cases in the style of transformers' test_speculative_sampling."""
    vocab = 10
    p = torch.zeros(4, vocab)
    p[0, 1] = p[1, 4] = p[2, 8] = p[3, 2] = 1.0  # the target wants 1, 4, 8 (then 2)
    q = torch.zeros(3, vocab)
    q[0, 1] = q[1, 4] = q[2, 5] = 1.0  # the draft proposes 1, 4, 5
    g = torch.zeros(4, vocab)
    res = rejection_verify(torch.tensor([1, 4, 5]), q, p, [0.5, 0.5, 0.5], g)
    assert res.accepted_len == 2 and res.next_token == 8
    res = rejection_verify(torch.tensor([1, 4, 8]), torch.nn.functional.one_hot(torch.tensor([1, 4, 8]), vocab).float(), p,
                           [0.99, 0.99, 0.99], g)
    assert res.accepted_len == 3 and res.next_token == 2  # bonus from the last row


# --- The engine end to end on a toy Markov target ------------------------------------------------------------

V = 5
TEMPERATURE = 1.3


def markov_target() -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=64, max_position_embeddings=64, initializer_range=0.5, eos_token_id=None,
                      bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:  # no attention output: position t's logits depend on token t only
        layer.self_attn.o_proj.weight.data.zero_()
    return Target(model, None, name="markov")


def test_engine_rejection_sampling_matches_markov_sequences():
    target = markov_target()
    with torch.inference_mode():
        trans = torch.softmax(target.model(input_ids=torch.arange(V)[None]).logits[0].double() / TEMPERATURE, -1)
        # The Markov property holds for the real model: logits at a position depend only on its token.
        mixed = torch.softmax(target.model(input_ids=torch.tensor([[3, 1, 4, 0, 2]])).logits[0].double() / TEMPERATURE, -1)
    torch.testing.assert_close(mixed, trans[[3, 1, 4, 0, 2]])
    torch.manual_seed(1)
    draft = DFlashDraftModel(DraftConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, intermediate_size=64, vocab_size=V, num_target_layers=1,
                                         block_size=4, mask_token_id=V - 1))
    engine = Engine(target, draft)
    prompt = (1, 2)
    exact = {(a, b, c): float(trans[prompt[-1], a] * trans[a, b] * trans[b, c])
             for a in range(V) for b in range(V) for c in range(V)}
    runs = 800
    seqs, proposed, verdicts = Counter(), Counter(), Counter()
    for seed in range(runs):
        res = engine.generate(Request(prompt_ids=prompt, max_new_tokens=3, temperature=TEMPERATURE, verify="rejection",
                                      seed=seed, block_size=3))
        assert res.finish_reason == "length"
        seqs[tuple(res.output_ids)] += 1
        first = next(e for e in res.events if isinstance(e, Verify))
        proposed[(res.output_ids[0], *first.draft_tokens)] += 1  # what blindly accepting the draft would emit
        for v in (e for e in res.events if isinstance(e, Verify)):
            verdicts["drafted"] += v.block_size - 1
            verdicts["accepted"] += v.accepted_len
        assert sum(len(c.token_ids) for c in res.events if isinstance(c, Commit)) == 3
    rate = verdicts["accepted"] / verdicts["drafted"]
    assert 0.15 < rate < 0.9, f"both acceptance and rejection must be exercised (acceptance {rate:.2f})"
    assert chi_square_pvalue(seqs, exact, runs) > 1e-3
    assert chi_square_pvalue(proposed, exact, runs) < 1e-6, "the draft's own law must be distinguishable"
    # Marginal of the first token (the prefill's sample) and of the third (committed inside a block).
    for pos in (0, 2):
        marg = Counter(s[pos] for s in seqs.elements())
        law = Counter()
        for s, pr in exact.items():
            law[s[pos]] += pr
        assert chi_square_pvalue(marg, dict(law), runs) > 1e-3


def test_engine_rejection_sampling_with_copied_blocks_matches_markov_sequences():
    """Copying first (lookup_ngram=1) under the rejection rule: every block copies (the prompt holds every token),
    each copy is a point mass q, accepted with probability p(x), the residual is p without x. The sequences must
    still follow the target's law."""
    target = markov_target()
    with torch.inference_mode():
        trans = torch.softmax(target.model(input_ids=torch.arange(V)[None]).logits[0].double() / TEMPERATURE, -1)
    torch.manual_seed(1)
    draft = DFlashDraftModel(DraftConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, intermediate_size=64, vocab_size=V, num_target_layers=1,
                                         block_size=4, mask_token_id=V - 1))
    engine = Engine(target, draft)
    prompt = (0, 1, 2, 3, 4, 2)
    exact = {(a, b, c): float(trans[prompt[-1], a] * trans[a, b] * trans[b, c])
             for a in range(V) for b in range(V) for c in range(V)}
    runs = 800
    seqs, verdicts = Counter(), Counter()
    for seed in range(runs):
        res = engine.generate(Request(prompt_ids=prompt, max_new_tokens=3, temperature=TEMPERATURE, verify="rejection",
                                      seed=seed, block_size=3, adaptive="fixed", lookup_ngram=1))
        seqs[tuple(res.output_ids)] += 1
        for v in (e for e in res.events if isinstance(e, Verify)):
            assert v.source == "copy"
            verdicts["drafted"] += v.block_size - 1
            verdicts["accepted"] += v.accepted_len
    rate = verdicts["accepted"] / verdicts["drafted"]
    assert 0.1 < rate < 0.9, f"both acceptance and rejection must be exercised (acceptance {rate:.2f})"
    assert chi_square_pvalue(seqs, exact, runs) > 1e-3
