"""Pure verification rules: greedy/sampled *match* and *rejection* (lossless), *relaxed* (opt-in,
lossy). No model, no cache, no global RNG: noise comes in as tensors.

Shapes: a block verifies `n` drafted tokens with `n + 1` target rows — row i is the target's distribution for
the position of draft token i; the last row gives the bonus token when every draft token is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dflash.sampling import filter_logits


@dataclass(frozen=True)
class Outcome:
    accepted_len: int  # length of the accepted prefix of the draft
    next_token: int  # the target's token appended after it (correction, or bonus when all accepted)
    target_tokens: list[int]  # the target's own choice at each of the n + 1 positions
    relaxed: list[bool]  # per accepted draft token: accepted only because of the acceptance threshold


def _check_ids(draft_tokens: torch.Tensor, vocab: int) -> None:
    if draft_tokens.numel() and (int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= vocab):
        raise ValueError(f"draft token id out of range [0, {vocab})")


def match_verify(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    gumbel: torch.Tensor | None = None,
    acceptance_threshold: float = 1.0,
) -> Outcome:
    """Accept draft tokens while they equal the target's own choice (argmax, or Gumbel-max sample).

    draft_tokens: [n] long; target_logits: [n+1, V]; gumbel: [n+1, V] noise (temperature > 0) or None.
    Lossless whatever the draft proposes: every emitted token is the target's own choice given an identical
    prefix, except where `acceptance_threshold` < 1 relaxes it (lossy, opt-in): then a draft token x is also
    accepted when p(x) >= a * max_v p(v) under the (tempered, filtered) target distribution.
    """
    n = draft_tokens.shape[0]
    vocab = target_logits.shape[-1]
    _check_ids(draft_tokens, vocab)
    logits = target_logits.float()
    scaled = logits if temperature == 0.0 else filter_logits(logits / temperature, top_k, top_p)  # [n+1, V]
    choice = scaled.argmax(-1) if (temperature == 0.0 or gumbel is None) else (scaled + gumbel).argmax(-1)  # [n+1]
    exact = (draft_tokens == choice[:n])  # [n]
    relaxed = torch.zeros(n, dtype=torch.bool)
    if acceptance_threshold < 1.0 and n:
        # log p(x) - log max p >= log a, computed on logits (softmax normaliser cancels).
        gap = scaled[:n].gather(-1, draft_tokens[:, None]).squeeze(-1) - scaled[:n].max(-1).values  # [n]
        relaxed = (~exact) & (gap >= math.log(acceptance_threshold))
    ok = (exact | relaxed).tolist()
    accepted_len = next((i for i, good in enumerate(ok) if not good), n)
    targets = choice.tolist()
    return Outcome(accepted_len, targets[accepted_len], targets, relaxed[:accepted_len].tolist())


def rejection_verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: list[float],
    gumbel: torch.Tensor,
) -> Outcome:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    draft_tokens [n] were sampled from draft_probs q [n, V]; target_probs p [n+1, V]; uniforms: n floats in
    [0, 1); gumbel [n+1, V] for the residual / bonus draw. Accept x_i with probability min(1, p(x_i)/q(x_i));
    at the first rejection draw from norm(max(0, p - q)); after a full block draw the bonus from p.
    The emitted tokens are distributed exactly as the target's own samples.
    """
    n = draft_tokens.shape[0]
    vocab = target_probs.shape[-1]
    _check_ids(draft_tokens, vocab)
    p = target_probs.float()
    q = draft_probs.float()
    idx = draft_tokens[:, None]
    p_x = p[:n].gather(-1, idx).squeeze(-1).tolist()  # [n]
    q_x = q.gather(-1, idx).squeeze(-1).tolist()
    accepted_len = n
    for i in range(n):
        # u < p/q  <=>  u * q < p  (q(x) > 0 because x was drawn from q).
        if not uniforms[i] * q_x[i] < p_x[i]:
            accepted_len = i
            break
    if accepted_len < n:
        residual = (p[accepted_len] - q[accepted_len]).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q exactly: any rejection is measure-zero; fall back to p
            residual = p[accepted_len]
        row = residual
    else:
        row = p[n]
    next_token = int((torch.log(row) + gumbel[accepted_len]).argmax())
    targets = p.argmax(-1).tolist()
    targets[accepted_len] = next_token
    return Outcome(accepted_len, next_token, targets, [False] * accepted_len)
