"""Drafting one block: the draft model + the target's embedding and LM head, with S denoising steps.

S = 1 is the paper's single pass: every masked position gets the draft's choice at once. With S > 1 each step
predicts all still-masked positions and commits those whose confidence reaches the threshold (always at least
the most confident one; all remaining ones at the last step) — LLaDA low-confidence remasking with Fast-dLLM's
threshold. The context K/V are computed once per block and reused across steps.

`Drafter` is the draft model as a `dflash.decode.proposer.Proposer`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dflash.models.draft import DFlashDraftModel, DraftCache
from dflash.decode.attention import summarize
from dflash.decode.events import DRAFT
from dflash.decode.lookup import HintIndex, block_hints
from dflash.models.packed import PackedLinear
from dflash.decode.proposer import Proposal
from dflash.verification.sampling import GUMBEL_DRAFT, gumbel_noise, target_probs


@dataclass
class DraftContext:
    """A request's draft context: the injected K/V of the positions flushed so far, and the target features handed
    over since, as (features [1, T, k*H], first position) — computed in one call just before the next draft pass
    (blocks that drafted nothing, copied ones or blocks of one, queue several)."""

    cache: DraftCache = field(default_factory=DraftCache)
    pending: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    attention_k: int = 0  # > 0: each denoising step records what the draft attends to (dflash.decode.attention)
    hints: HintIndex | None = None  # a hinted draft's lookup of the committed ids (`DraftConfig.hint_ngram`)


class Drafter:
    """The DFlash draft model as a `Proposer`: the block [anchor, MASK × (b-1)] through the draft layers, whose keys
    and values also hold the target's features of every committed position (KV injection)."""

    name = DRAFT
    min_block = 1  # a block of one is a plain target step, which the draft's controller may choose

    def __init__(self, draft: DFlashDraftModel, embed, lm_head_weight: torch.Tensor, vocab_ids: torch.Tensor | None,
                 vocab_size: int, head: PackedLinear | None = None):
        self.draft = draft
        self.embed = embed
        self.lm_head_weight = lm_head_weight  # [V, H] the target's (shared, not copied)
        self.mask_id = draft.config.mask_token_id
        self.vocab_size = vocab_size
        # FR-Spec-style restricted head: only the rows of the target LM head for `vocab_ids` (our extension).
        self.vocab_ids = vocab_ids
        self.head = lm_head_weight if vocab_ids is None else lm_head_weight[vocab_ids.to(lm_head_weight.device)].contiguous()
        # hidden [n, H] → logits [n, Vd]; the target's PackedLinear is shared when the vocabularies are the same
        # (no second packed copy of the head). Rows > 1 are ~2x faster than `hidden @ head.T` on CPU float32.
        self.head_fn = head if (head is not None and vocab_ids is None) else PackedLinear(self.head)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.draft.config.target_layer_ids)

    def new_state(self) -> DraftContext:
        n = self.draft.config.hint_ngram
        return DraftContext(hints=HintIndex(n) if n else None)

    def hint_inputs(self, hints: tuple[list[int], list[int]] | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A hinted draft's hints (`block_hints`: tokens, match lengths) as (the tokens' embeddings [1, b, H], the
        lengths [1, b]); (None, None) for z-lab's draft."""
        if hints is None:
            return None, None
        dev = self.head.device
        return self.embed(torch.tensor([hints[0]], device=dev)).to(self.head.dtype), torch.tensor([hints[1]], device=dev)

    def extend_context(self, state: DraftContext, features: torch.Tensor, start_pos: int) -> None:
        """Queue target features [1, T, k*H] of positions start_pos .. start_pos+T-1 (`flush` injects them)."""
        if features.shape[1]:
            state.pending.append((features, start_pos))

    def flush(self, state: DraftContext) -> DraftCache:
        """Append the injected K/V of the queued features (consecutive positions) to the context cache."""
        if state.pending:
            feats, start = torch.cat([f for f, _ in state.pending], 1), state.pending[0][1]
            state.pending.clear()
            pos = torch.arange(start, start + feats.shape[1], device=feats.device)
            with torch.inference_mode():
                state.cache.append(self.draft.context_kv(feats.to(self.head.dtype), pos))
        return state.cache

    def _full(self, sub: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab logits [n, Vd] to full-vocab logits [n, V] (-inf outside the draft vocab)."""
        if self.vocab_ids is None:
            return sub
        out = sub.new_full((sub.shape[0], self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.vocab_ids.to(sub.device), sub)

    @torch.inference_mode()
    def propose(self, state: DraftContext, seq: list[int], size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal:
        """Draft block positions 1..size-1 after the anchor seq[-1] (`Proposer.propose`). With a sample dict the
        proposals are drawn from the draft's tempered law with per-position noise (rejection rule, S = 1)."""
        t0 = time.perf_counter()
        cache, anchor, start = self.flush(state), seq[-1], len(seq) - 1
        dev = self.head.device
        n = size - 1
        tokens = [anchor] + [self.mask_id] * n
        masked = [False] + [True] * n
        conf = [1.0] + [0.0] * n
        positions = torch.arange(start, start + size, device=dev)
        hints = block_hints(seq, state.hints.find(seq), size) if state.hints else None  # ([b], [b]) or None
        hint_emb, hint_n = self.hint_inputs(hints)
        steps, q = [], None
        for step in range(n_steps):
            ts = time.perf_counter()
            weights = [] if state.attention_k else None  # per layer [1, nh, b, ctx + b] when traced
            emb = self.embed(torch.tensor([tokens], device=dev)).to(self.head.dtype)  # [1, b, H]
            emb = self.draft.block_inputs(emb, hint_emb, hint_n)
            hidden = self.draft(emb, positions, cache.kv, attention=weights)[0, 1:]  # [n, H]
            logits = self._full(self.head_fn(hidden).float())  # [n, V]
            best_l, best_p_l, q = choose(logits, sample, start)  # q: the proposal law (rejection rule) or None
            open_pos = [i for i in range(1, size) if masked[i]]
            commit = commit_positions(open_pos, best_p_l, threshold, last=step == n_steps - 1)
            committed = [False] * size
            for i in commit:
                tokens[i], conf[i], masked[i], committed[i] = best_l[i - 1], best_p_l[i - 1], False, True
            view = [tokens[i] if not masked[i] else best_l[i - 1] for i in range(size)]
            view_conf = [conf[i] if not masked[i] else best_p_l[i - 1] for i in range(size)]
            steps.append({"step": step, "n_steps": n_steps, "start": start, "tokens": view, "confidences": view_conf,
                          "masked": list(masked), "committed": committed, "ms": (time.perf_counter() - ts) * 1000})
            if hints is not None:  # what the copy hints offered each slot (the inspector's hint row)
                steps[-1].update(hints=hints[0], hint_n=hints[1])
            if weights is not None:
                steps[-1]["attention"] = summarize(weights, start, state.attention_k)
            if not any(masked):
                break
        return Proposal(tokens[1:], conf[1:], q, steps, (time.perf_counter() - t0) * 1000)


def choose(logits: torch.Tensor, sample: dict | None, start: int) -> tuple[list[int], list[float], torch.Tensor | None]:
    """Each masked position's proposal from logits [n, V] of block positions start+1 .. start+n: the argmax, or with
    `sample` a draw from the tempered law with per-position noise. Returns (tokens, their probabilities, the law q
    [n, V] or None)."""
    if sample is None:
        best_p, best = torch.softmax(logits, -1).max(-1)
        return best.tolist(), best_p.tolist(), None
    q = target_probs(logits, sample["temperature"], sample["top_k"], sample["top_p"])
    g = gumbel_noise(sample["seed"], list(range(start + 1, start + 1 + logits.shape[0])), logits.shape[-1], GUMBEL_DRAFT,
                     logits.device)
    best = (torch.log(q) + g).argmax(-1)
    return best.tolist(), q.gather(-1, best[:, None]).squeeze(-1).tolist(), q


def commit_positions(open_pos: list[int], conf: list[float], threshold: float, last: bool) -> list[int]:
    """The still-masked block positions a denoising step commits: all at the last step, else those whose confidence
    (conf[i - 1] for position i) reaches the threshold, and at least the most confident one."""
    if last:
        return open_pos
    commit = [i for i in open_pos if conf[i - 1] >= threshold]
    return commit or [max(open_pos, key=lambda i: conf[i - 1])]
