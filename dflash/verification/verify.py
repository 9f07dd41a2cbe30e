"""Pure verification rules: greedy/sampled *match* and *rejection* (lossless), *relaxed* (opt-in,
lossy). No model, no cache, no global RNG: noise comes in as tensors.

Shapes: a block verifies `n` drafted tokens with `n + 1` target rows — row i is the target's distribution for
the position of draft token i; the last row gives the bonus token when every draft token is accepted.

Devices: every tensor a rule creates is on the device of the target logits (or probabilities); draft tokens,
draft probabilities and noise on another device are moved there, as the Triton kernels' wrappers do.

These functions are also the specification of the Triton kernels in the top-level `kernels` package (the
batched forms at the end are what the kernels compute); `dflash.verification.verify_dispatch` picks one or the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dflash.verification.sampling import filter_logits, target_probs


@dataclass(frozen=True)
class Outcome:
    accepted_len: int  # length of the accepted prefix of the draft
    next_token: int  # the target's token appended after it (correction, or bonus when all accepted)
    target_tokens: list[int]  # the target's own choice at each of the n + 1 positions
    relaxed: list[bool]  # per accepted draft token: accepted only because of the acceptance threshold


def check_draft_ids(draft_tokens: torch.Tensor, vocab: int) -> None:
    """ValueError unless every id is in [0, vocab); one device→host copy."""
    if draft_tokens.numel():
        lo, hi = torch.stack(torch.aminmax(draft_tokens)).tolist()
        if lo < 0 or hi >= vocab:
            raise ValueError(f"draft token id out of range [0, {vocab})")


# The gap recorded where there is no runner-up (a vocabulary of one, every other logit -inf) or no defined gap (NaN
# logits): the largest float32, a finite number so that traces stay valid JSON, and so large that it is never
# within a tie bound (an unknown margin must never be called a numerical tie).
NO_GAP = float(torch.finfo(torch.float32).max)


def top2_gap(logits: torch.Tensor) -> list[float]:
    """The target's margin per row: top-1 minus top-2 logit, logits [n, V] → n non-negative floats (NO_GAP where
    undefined). One `topk(2)` on the logits' device and one device→host copy."""
    if logits.shape[-1] < 2:
        return [NO_GAP] * logits.shape[0]
    top = logits.float().topk(2, dim=-1).values  # [n, 2]
    gap = torch.nan_to_num(top[:, 0] - top[:, 1], nan=NO_GAP, posinf=NO_GAP)  # [n]
    return gap.tolist()


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
    dev = target_logits.device
    draft_tokens = draft_tokens.to(dev)
    n = draft_tokens.shape[0]
    vocab = target_logits.shape[-1]
    check_draft_ids(draft_tokens, vocab)
    logits = target_logits.float()
    scaled = logits if temperature == 0.0 else filter_logits(logits / temperature, top_k, top_p)  # [n+1, V]
    sampled = temperature > 0.0 and gumbel is not None
    choice = (scaled + gumbel.to(dev)).argmax(-1) if sampled else scaled.argmax(-1)  # [n+1]
    exact = (draft_tokens == choice[:n])  # [n]
    relaxed = torch.zeros(n, dtype=torch.bool, device=dev)
    if acceptance_threshold < 1.0 and n:
        # log p(x) - log max p >= log a, computed on logits (softmax normaliser cancels).
        gap = scaled[:n].gather(-1, draft_tokens[:, None]).squeeze(-1) - scaled[:n].max(-1).values  # [n]
        relaxed = (~exact) & (gap >= math.log(acceptance_threshold))
    rows = choice.shape[0]  # n + 1, or more with no draft (the target's own tokens at every row)
    flat = torch.cat([(exact | relaxed).long(), choice, relaxed.long()]).tolist()  # [n ok, rows targets, n relaxed]: one copy
    ok, targets, rel = flat[:n], flat[n: n + rows], flat[n + rows:]
    accepted_len = next((i for i, good in enumerate(ok) if not good), n)
    return Outcome(accepted_len, targets[accepted_len], targets, [bool(v) for v in rel[:accepted_len]])


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
    dev = target_probs.device
    n = draft_tokens.shape[0]
    vocab = target_probs.shape[-1]
    draft_tokens = draft_tokens.to(dev)
    check_draft_ids(draft_tokens, vocab)
    p = target_probs.float()
    q = draft_probs.to(device=dev, dtype=torch.float32)
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
    next_token = int((torch.log(row) + gumbel[accepted_len].to(dev)).argmax())
    targets = p.argmax(-1).tolist()
    targets[accepted_len] = next_token
    return Outcome(accepted_len, next_token, targets, [False] * accepted_len)


def speculative_verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                       temperature: float, top_k: int, top_p: float, uniforms: list[float] | torch.Tensor,
                       gumbel: torch.Tensor) -> Outcome:
    """The rejection rule from the target's logits: p = target_probs(logits, T, top_k, top_p), then `rejection_verify`.

    draft_tokens [n] drawn from draft_probs q [n, V]; target_logits [n+1, V]; uniforms n floats; gumbel [n+1, V].
    """
    p = target_probs(target_logits, temperature, top_k, top_p)
    u = uniforms.tolist() if isinstance(uniforms, torch.Tensor) else list(uniforms)
    return rejection_verify(draft_tokens, draft_probs, p, u, gumbel)


# -- batched forms: B independent sequences, the kernels' interface -----------------------------------------------
def match_verify_batched(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0,
                         top_k: int = 0, top_p: float = 1.0, gumbel: torch.Tensor | None = None,
                         acceptance_threshold: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, n], [B, n+1, V], gumbel [B, n+1, V] | None → (accepted_len [B], next_token [B], target_tokens [B, n+1],
    relaxed [B, n] bool; False past accepted_len), on the logits' device."""
    bsz, rows, _ = target_logits.shape
    outs = [match_verify(draft_tokens[b], target_logits[b], temperature, top_k, top_p,
                         None if gumbel is None else gumbel[b], acceptance_threshold) for b in range(bsz)]
    relaxed = [o.relaxed + [False] * (rows - 1 - o.accepted_len) for o in outs]
    return _stacked(outs, target_logits.device, rows) + (
        torch.tensor(relaxed, dtype=torch.bool, device=target_logits.device).reshape(bsz, rows - 1),)


def speculative_verify_batched(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                               temperature: float, top_k: int, top_p: float, uniforms: torch.Tensor,
                               gumbel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, n], q [B, n, V], [B, n+1, V], uniforms [B, n], gumbel [B, n+1, V] → (accepted_len [B], next_token [B],
    target_tokens [B, n+1]), on the logits' device."""
    bsz, rows, _ = target_logits.shape
    outs = [speculative_verify(draft_tokens[b], draft_probs[b], target_logits[b], temperature, top_k, top_p,
                               uniforms[b], gumbel[b]) for b in range(bsz)]
    return _stacked(outs, target_logits.device, rows)


def _stacked(outs: list[Outcome], device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted_len [B], next_token [B], target_tokens [B, rows]) long tensors on `device`."""
    def long(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return (long([o.accepted_len for o in outs]), long([o.next_token for o in outs]),
            long([o.target_tokens for o in outs]).reshape(len(outs), rows))
