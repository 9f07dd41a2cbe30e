"""The PyTorch specification of every kernel in this package.

Each Triton kernel must return what these functions return (tokens exactly; the only tolerated differences
are float32 rounding at exact ties and at the top-p boundary, see `_triton_common`). They are the engine's
code path on CPU, so they *are* `dflash.verify` — called, not copied — with the batched forms tests use.
"""

from __future__ import annotations

import torch

from dflash import verify as _verify
from dflash.sampling import target_probs
from dflash.verify import Outcome


def match_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, gumbel: torch.Tensor | None = None, acceptance_threshold: float = 1.0) -> Outcome:
    """draft_tokens [n], target_logits [n+1, V], gumbel [n+1, V] | None → Outcome (`dflash.verify.match_verify`)."""
    return _verify.match_verify(draft_tokens, target_logits, temperature, top_k, top_p, gumbel, acceptance_threshold)


def speculative_verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                       temperature: float, top_k: int, top_p: float, uniforms: list[float] | torch.Tensor,
                       gumbel: torch.Tensor) -> Outcome:
    """The rejection rule from logits: p = target_probs(logits, T, top_k, top_p), then `rejection_verify`.

    draft_tokens [n] drawn from draft_probs q [n, V]; target_logits [n+1, V]; uniforms n floats; gumbel [n+1, V].
    """
    p = target_probs(target_logits, temperature, top_k, top_p)
    u = uniforms.tolist() if isinstance(uniforms, torch.Tensor) else list(uniforms)
    return _verify.rejection_verify(draft_tokens, draft_probs, p, u, gumbel)


def match_verify_batched(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0,
                         top_k: int = 0, top_p: float = 1.0, gumbel: torch.Tensor | None = None,
                         acceptance_threshold: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, n], [B, n+1, V], gumbel [B, n+1, V] | None → (accepted_len [B], next_token [B], target_tokens [B, n+1],
    relaxed [B, n] bool; False past accepted_len)."""
    bsz, rows, _ = target_logits.shape
    n = rows - 1
    acc, nxt, targets, relaxed = [], [], [], torch.zeros(bsz, n, dtype=torch.bool)
    for b in range(bsz):
        out = match_verify(draft_tokens[b], target_logits[b], temperature, top_k, top_p,
                           None if gumbel is None else gumbel[b], acceptance_threshold)
        acc.append(out.accepted_len)
        nxt.append(out.next_token)
        targets.append(out.target_tokens)
        relaxed[b, : out.accepted_len] = torch.tensor(out.relaxed, dtype=torch.bool)
    return torch.tensor(acc), torch.tensor(nxt), torch.tensor(targets).reshape(bsz, rows), relaxed


def speculative_verify_batched(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                               temperature: float, top_k: int, top_p: float, uniforms: torch.Tensor,
                               gumbel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, n], q [B, n, V], [B, n+1, V], uniforms [B, n], gumbel [B, n+1, V] → (accepted_len [B], next_token [B],
    target_tokens [B, n+1])."""
    bsz, rows, _ = target_logits.shape
    acc, nxt, targets = [], [], []
    for b in range(bsz):
        out = speculative_verify(draft_tokens[b], draft_probs[b], target_logits[b], temperature, top_k, top_p,
                                 uniforms[b], gumbel[b])
        acc.append(out.accepted_len)
        nxt.append(out.next_token)
        targets.append(out.target_tokens)
    return torch.tensor(acc), torch.tensor(nxt), torch.tensor(targets).reshape(bsz, rows)
