"""Drafting one block: the draft model + the target's embedding and LM head, with S denoising steps.

S = 1 is the paper's single pass: every masked position gets the draft's choice at once. With S > 1 each step
predicts all still-masked positions and commits those whose confidence reaches the threshold (always at least
the most confident one; all remaining ones at the last step) — LLaDA low-confidence remasking with Fast-dLLM's
threshold. The context K/V are computed once per block and reused across steps.

`DraftProposer` is what the engine needs from a drafter; `Drafter` is the one built from a DFlash draft model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from dflash.draft import DFlashDraftModel, DraftCache
from dflash.packed import PackedLinear
from dflash.sampling import GUMBEL_DRAFT, gumbel_noise, target_probs


@dataclass
class Proposal:
    tokens: list[int]  # [b - 1] proposals for block positions 1 .. b-1
    confidences: list[float]  # draft probability of each proposal when it was committed
    q: torch.Tensor | None  # [b - 1, V] the draft's sampling law (rejection rule only)
    steps: list[dict]  # one dict per denoising step (fields of events.DraftStep)
    ms: float


@runtime_checkable
class DraftProposer(Protocol):
    """What the engine asks of a drafter, per request: a fresh context cache, the target's features of committed
    positions (each position once, in order, only positions before the next block's anchor), and block proposals.
    The cache is opaque to the engine, which never crops it: rejected positions never reach it."""

    def new_cache(self) -> Any:
        """An empty context cache for one request."""
        ...

    def extend_context(self, cache: Any, features: torch.Tensor, start_pos: int) -> None:
        """Add target features [1, T, k*H] of absolute positions start_pos .. start_pos+T-1 to `cache`."""
        ...

    def propose(self, cache: Any, anchor: int, start: int, size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal:
        """Proposals for block positions 1 .. size-1 after `anchor` at absolute position `start` (see `Drafter`)."""
        ...


class Drafter:
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

    def new_cache(self) -> DraftCache:
        return DraftCache()

    def extend_context(self, cache: DraftCache, features: torch.Tensor, start_pos: int) -> None:
        """Append injected K/V for target features [1, T, k*H] at positions start_pos .. start_pos+T-1."""
        if features.shape[1] == 0:
            return
        pos = torch.arange(start_pos, start_pos + features.shape[1], device=features.device)
        with torch.inference_mode():
            cache.append(self.draft.context_kv(features.to(self.head.dtype), pos))

    def _full(self, sub: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab logits [n, Vd] to full-vocab logits [n, V] (-inf outside the draft vocab)."""
        if self.vocab_ids is None:
            return sub
        out = sub.new_full((sub.shape[0], self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.vocab_ids.to(sub.device), sub)

    @torch.inference_mode()
    def propose(self, cache: DraftCache, anchor: int, start: int, size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal:
        """Draft block positions 1..size-1 after `anchor` (at absolute position `start`).

        sample: None → argmax proposals (greedy and the match rule); else {temperature, top_k, top_p, seed} →
        proposals drawn from the draft's tempered law with per-position noise (rejection rule, S = 1).
        """
        t0 = time.perf_counter()
        dev = self.head.device
        n = size - 1
        tokens = [anchor] + [self.mask_id] * n
        masked = [False] + [True] * n
        conf = [1.0] + [0.0] * n
        positions = torch.arange(start, start + size, device=dev)
        steps, q = [], None
        for step in range(n_steps):
            ts = time.perf_counter()
            emb = self.embed(torch.tensor([tokens], device=dev))  # [1, b, H]
            hidden = self.draft(emb.to(self.head.dtype), positions, cache.kv)[0, 1:]  # [n, H]
            logits = self._full(self.head_fn(hidden).float())  # [n, V]
            probs = torch.softmax(logits, -1)
            if sample is None:
                best_p, best = probs.max(-1)
            else:
                q = target_probs(logits, sample["temperature"], sample["top_k"], sample["top_p"])
                g = gumbel_noise(sample["seed"], list(range(start + 1, start + size)), logits.shape[-1], GUMBEL_DRAFT, dev)
                best = (torch.log(q) + g).argmax(-1)
                best_p = q.gather(-1, best[:, None]).squeeze(-1)
            best_l, best_p_l = best.tolist(), best_p.tolist()
            open_pos = [i for i in range(1, size) if masked[i]]
            if step == n_steps - 1:
                commit = open_pos
            else:
                commit = [i for i in open_pos if best_p_l[i - 1] >= threshold]
                if not commit:
                    commit = [max(open_pos, key=lambda i: best_p_l[i - 1])]
            committed = [False] * size
            for i in commit:
                tokens[i], conf[i], masked[i], committed[i] = best_l[i - 1], best_p_l[i - 1], False, True
            view = [tokens[i] if not masked[i] else best_l[i - 1] for i in range(size)]
            view_conf = [conf[i] if not masked[i] else best_p_l[i - 1] for i in range(size)]
            steps.append({"step": step, "n_steps": n_steps, "start": start, "tokens": view, "confidences": view_conf,
                          "masked": list(masked), "committed": committed, "ms": (time.perf_counter() - ts) * 1000})
            if not any(masked):
                break
        return Proposal(tokens[1:], conf[1:], q, steps, (time.perf_counter() - t0) * 1000)


class ScriptedDrafter(Drafter):
    """A diagnostic drafter that proposes a known token for each absolute position (`token_at`), while its context
    handling (the draft model's K/V cache) stays that of `base`. With the target's own output as the script
    (`OracleDrafter`) every block is accepted whole, which runs the multi-token accept path and the cache crops
    that an untrained draft never reaches: the tests and scripts/gpu_check.py use it for that."""

    def __init__(self, base: Drafter, full_sequence: list[int]):
        super().__init__(base.draft, base.embed, base.lm_head_weight, base.vocab_ids, base.vocab_size)
        self.full = list(full_sequence)  # prompt + the continuation to propose
        self.calls: list[tuple[int, int, int]] = []  # (start, size, len(cache)) per propose

    def reference(self, t: int) -> int:
        return self.full[t] if t < len(self.full) else 0

    def token_at(self, t: int) -> int:
        raise NotImplementedError

    def propose(self, cache: DraftCache, anchor: int, start: int, size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal:
        self.calls.append((start, size, len(cache)))
        tokens = [self.token_at(t) for t in range(start + 1, start + size)]
        step = {"step": 0, "n_steps": n_steps, "start": start, "tokens": [anchor] + tokens,
                "confidences": [1.0] * size, "masked": [False] * size, "committed": [False] + [True] * (size - 1),
                "ms": 0.0}
        return Proposal(tokens, [1.0] * len(tokens), None, [step], 0.0)


class OracleDrafter(ScriptedDrafter):
    """Always proposes the scripted continuation (give it the target's own output: every block is accepted)."""

    def token_at(self, t: int) -> int:
        return self.reference(t)
