"""Pure pieces of the training objective (position-weighted cross-entropy on masked block positions), unit-tested
on hand-made tensors.

A training block mirrors inference: position 0 is a clean anchor token (a real response token), positions
1..b-1 are MASK (or, with partial masking, some of them are revealed), and the block sees the target's features
only for positions strictly before the anchor.
"""

from __future__ import annotations

import math

import torch

from dflash.decode.lookup import block_hints, match_table


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/γ) for block positions k = 1..b-1 (the paper's eq. 4). Shape [b-1]."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def default_gamma(block_size: int) -> float:
    """γ = 7 for blocks of 16, 5 for 10, 4 for 8 (paper §A.1); interpolated elsewhere."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    return table.get(block_size, max(1.0, 0.44 * block_size))


def sample_anchors(prompt_len: int, seq_len: int, block_size: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Up to n distinct anchor positions inside the response with a full block of labels after them.

    Anchor a ∈ [prompt_len, seq_len - block_size]: the anchor is a response token (at inference it is the last
    committed token, never a prompt token), labels are a+1 .. a+b-1 (all inside the sequence). Sorted, [<=n].
    """
    lo, hi = prompt_len, seq_len - block_size
    if hi < lo:
        return torch.empty(0, dtype=torch.long)
    count = hi - lo + 1
    pick = torch.randperm(count, generator=generator)[: min(n, count)]
    return (pick + lo).sort().values


def block_attention_mask(anchors: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """Boolean mask [Nq, ctx_len + Nq] (True = may attend) for blocks packed one after another.

    Query rows of block i see context keys j < anchors[i] (strictly before the anchor) and the keys of their own
    block (bidirectional inside the block), nothing of other blocks.
    """
    nb = anchors.shape[0]
    nq = nb * block_size
    block_of = torch.arange(nq) // block_size  # [Nq]
    ctx_ok = torch.arange(ctx_len)[None, :] < anchors[block_of][:, None]  # [Nq, ctx]
    own = block_of[:, None] == block_of[None, :]  # [Nq, Nq]
    return torch.cat([ctx_ok, own], dim=1)


def on_policy_prefix(agree: torch.Tensor) -> torch.Tensor:
    """Which block positions have a label that is the target's own continuation from the anchor, [nb, b] bool.

    agree [nb, b]: the recorded token at each block position equals the target's prediction there (always true
    for regenerated data). A teacher-forced label at position k is the target's prediction given the *recorded*
    tokens before it, so it continues the target's own greedy path only while positions 1..k-1 all agree; after
    the first disagreement it answers a context the drafted block never has. Positions 0 and 1 are always valid.
    """
    ok = torch.ones_like(agree, dtype=torch.bool)
    ok[:, 2:] = agree[:, 1:-1].long().cumprod(-1).bool()
    return ok


def partial_mask(n_blocks: int, block_size: int, prob: float, generator: torch.Generator) -> torch.Tensor:
    """Which block positions are masked, [n_blocks, block_size] bool. Position 0 (anchor) is never masked.

    With probability `prob` a block is only partly masked: a random fraction r ~ U(0, 1) of positions 1..b-1 is
    revealed (at least one stays masked), so multi-step denoising learns to use committed positions.
    """
    masked = torch.ones(n_blocks, block_size, dtype=torch.bool)
    masked[:, 0] = False
    partial = torch.rand(n_blocks, generator=generator) < prob
    for i in torch.nonzero(partial).flatten().tolist():
        r = float(torch.rand(1, generator=generator))
        reveal = torch.rand(block_size - 1, generator=generator) < r
        if bool(reveal.all()):
            reveal[int(torch.randint(0, block_size - 1, (1,), generator=generator))] = False
        masked[i, 1:] = ~reveal
    return masked


def weighted_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor,
                  teacher_logits: torch.Tensor | None = None, kl_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Position-weighted cross-entropy (+ optional KL(teacher ‖ draft)) over the valid positions.

    logits [N, V] draft logits; labels [N] (index into the same vocabulary, -1 = not in the vocabulary);
    weights [N] per-position weight; valid [N] bool (masked positions with a label); teacher_logits [N, V].
    Returns (loss, metrics). The normaliser is the total weight of the valid positions.
    """
    w = weights * valid.float()
    denom = w.sum().clamp(min=1e-6)
    logp = torch.log_softmax(logits.float(), -1)
    ok = labels >= 0
    nll = -logp.gather(-1, labels.clamp(min=0)[:, None]).squeeze(-1) * ok.float()
    ce = (nll * w).sum() / denom
    loss = ce
    metrics = {"ce": float(ce.detach())}
    if teacher_logits is not None and kl_weight > 0:
        t_logp = torch.log_softmax(teacher_logits.float(), -1)
        kl = (t_logp.exp() * (t_logp - logp)).sum(-1)  # [N]
        kl = (kl * w).sum() / denom
        loss = loss + kl_weight * kl
        metrics["kl"] = float(kl.detach())
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & valid
        metrics["acc"] = float(hit.sum()) / max(1, int(valid.sum()))
    if not math.isfinite(float(loss.detach())):
        raise FloatingPointError("training loss is not finite")
    return loss, metrics


def cosine_lr(step: int, total: int, peak: float, warmup_frac: float = 0.04, floor: float = 0.0) -> float:
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return peak * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def block_embeds(draft, embed: torch.Tensor, hints: AnchorHints | None, seq, anchors: torch.Tensor,
                 inputs: torch.Tensor) -> torch.Tensor:
    """The input of blocks `inputs` [nb, b] (token ids) at `anchors` of `seq`: their embeddings [nb*b, H] (`embed`
    [V, H], the target's), plus a hinted draft's hints (`hints` None: z-lab's draft)."""
    x = embed[inputs.flatten()]
    if hints is None:
        return x
    hint_ids, hint_n = hints(seq, anchors, inputs.shape[1])  # [nb, b] each
    return draft.block_inputs(x, embed[hint_ids.flatten()], hint_n.flatten())


class AnchorHints:
    """A hinted draft's copy hints at the anchors of stored sequences, as the engine computes them at inference
    (`dflash.decode.lookup.block_hints` over the ids up to the anchor). Each sequence's match table is computed
    once (keyed by the sequence object, which the corpus keeps)."""

    def __init__(self, n_max: int):
        self.n_max, self.tables = n_max, {}

    def __call__(self, seq, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(hinted token ids [nb, b], match lengths [nb, b]) for blocks at `anchors` [nb] of `seq`."""
        key = id(seq)
        if key not in self.tables:
            ids = seq["ids"].tolist()
            self.tables[key] = (ids, match_table(ids, self.n_max))
        ids, table = self.tables[key]
        rows = [block_hints(ids[: a + 1], table[a], block_size) for a in anchors.tolist()]
        return (torch.tensor([r[0] for r in rows], dtype=torch.long).view(-1, block_size),
                torch.tensor([r[1] for r in rows], dtype=torch.long).view(-1, block_size))
