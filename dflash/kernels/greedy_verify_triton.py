"""Fused *match* verification (greedy, or the target's own Gumbel-max sample) over a whole block — Triton.

Specification: `dflash.verification.verify.match_verify_batched` (`dflash.verification.verify.match_verify` per sequence).

One program per target row (grid = B · (n + 1)): it streams the row of logits once over the vocabulary
(tiles of BLOCK_V) keeping a running argmax — no softmax is ever materialised — and compares the result
with the draft token of that row. A mismatch does `atomic_min(accepted_len[b], row)`, so after the launch
`accepted_len[b]` is the first mismatch (or n) and the target's token there is `choice[b, accepted_len[b]]`:
the correction, or the bonus token when every draft token matched. With temperature > 0 the row is divided by
the temperature (IEEE `div_rn`), filtered by top-k/top-p (`_triton_common.keep_threshold`, extra passes only
when those are on) and the per-position Gumbel noise is added before the argmax. The relaxed (lossy, opt-in)
rule accepts x when scaled(x) − max(scaled) ≥ log(a).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dflash.kernels._triton_common import argmax_update, keep_threshold, order_key, pick_block_r, pick_block_v, scaled_tile


@triton.jit
def _match_verify_kernel(logits_ptr, stride_lb, stride_lr, noise_ptr, stride_nb, stride_nr, draft_ptr, stride_db,
                         choice_ptr, accepted_ptr, relaxed_ptr, V, n_draft, temperature, top_k, top_p, log_a,
                         SCALE: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, NOISE: tl.constexpr,
                         RELAX: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    rows = n_draft + 1
    b = pid // rows
    i = pid % rows
    row_ptr = logits_ptr + b.to(tl.int64) * stride_lb + i.to(tl.int64) * stride_lr
    lo = keep_threshold(row_ptr, V, temperature, top_k, top_p, SCALE, TOP_K, TOP_P, BLOCK_V, BLOCK_R)

    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    row_max = tl.full([], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = scaled_tile(row_ptr, offs, V, temperature, SCALE)
        if TOP_K or TOP_P:
            x = tl.where(order_key(x) >= lo, x, float("-inf"))
        row_max = tl.maximum(row_max, tl.max(x, axis=0))
        v = x
        if NOISE:
            nrow = noise_ptr + b.to(tl.int64) * stride_nb + i.to(tl.int64) * stride_nr
            v = x + tl.load(nrow + offs, mask=offs < V, other=0.0)
        best_val, best_idx = argmax_update(best_val, best_idx, v, offs)
    tl.store(choice_ptr + pid, best_idx)

    if i < n_draft:
        tok = tl.load(draft_ptr + b.to(tl.int64) * stride_db + i).to(tl.int32)
        bad = tok != best_idx
        if RELAX:
            sx = scaled_tile(row_ptr, tok, V, temperature, SCALE)
            if TOP_K or TOP_P:
                sx = tl.where(order_key(sx) >= lo, sx, float("-inf"))
            relaxed = bad & ((sx - row_max) >= log_a)
            tl.store(relaxed_ptr + b * n_draft + i, relaxed.to(tl.int8))
            bad = bad & (sx - row_max < log_a)
        if bad:
            tl.atomic_min(accepted_ptr + b, i)


def match_verify_batched(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0,
                         top_k: int = 0, top_p: float = 1.0, gumbel: torch.Tensor | None = None,
                         acceptance_threshold: float = 1.0, block_v: int | None = None,
                         num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_tokens [B, n] long; target_logits [B, n+1, V] (any float dtype); gumbel [B, n+1, V] or None.

    Returns (accepted_len [B], next_token [B], target_tokens [B, n+1], relaxed [B, n] bool, False past
    accepted_len), on the logits' device. Token ids are assumed valid (the dispatcher checks them).
    """
    bsz, rows, vocab = target_logits.shape
    n = rows - 1
    dev = target_logits.device
    logits = target_logits if target_logits.stride(-1) == 1 else target_logits.contiguous()
    draft = draft_tokens.to(device=dev, dtype=torch.int64).reshape(bsz, n).contiguous()
    if n == 0:
        draft = torch.zeros(bsz, 1, dtype=torch.int64, device=dev)  # never read; a real pointer for the launch
    sampling = temperature > 0.0
    noise = gumbel is not None and sampling
    g = gumbel.to(device=dev, dtype=torch.float32).contiguous() if noise else logits  # dummy pointer when unused
    relax = acceptance_threshold < 1.0 and n > 0
    choice = torch.empty(bsz, rows, dtype=torch.int32, device=dev)
    accepted = torch.full((bsz,), n, dtype=torch.int32, device=dev)
    relaxed = torch.zeros(bsz, max(n, 1), dtype=torch.int8, device=dev)
    grid = (bsz * rows,)
    bv = pick_block_v(vocab, block_v)
    _match_verify_kernel[grid](
        logits, logits.stride(0), logits.stride(1), g, g.stride(0), g.stride(1), draft, max(n, 1),
        choice, accepted, relaxed, vocab, n, float(temperature) if sampling else 1.0, int(top_k), float(top_p),
        math.log(acceptance_threshold) if relax else 0.0,
        SCALE=sampling, TOP_K=sampling and 0 < top_k < vocab, TOP_P=sampling and top_p < 1.0, NOISE=noise,
        RELAX=relax, BLOCK_V=bv, BLOCK_R=pick_block_r(bv), num_warps=num_warps,
        enable_fp_fusion=False)
    acc = accepted.long()
    choice = choice.long()
    nxt = choice.gather(1, acc[:, None]).squeeze(1)
    inside = torch.arange(n, device=dev)[None, :] < acc[:, None]  # relaxed flags only count inside the accepted prefix
    return acc, nxt, choice, relaxed[:, :n].bool() & inside
