"""Fused lossless speculative sampling (Leviathan et al. 2023 / Chen et al. 2023) over a block — Triton.

Specification: `dflash.verification.verify.speculative_verify_batched` (`dflash.verification.verify.rejection_verify` applied to
`dflash.verification.sampling.target_probs(logits, T, top_k, top_p)` per sequence).

One program per target row i (grid = B · (n + 1)), all rows in parallel:
1. p = softmax(filter(logits_i / T)) defined by (max m, normaliser z, support {key >= lo}); never stored.
2. Row i < n: accept draft token x_i iff u_i · q_i(x_i) < p_i(x_i) (float64, as the reference compares Python
   floats); a rejection does `atomic_min(accepted_len[b], i)`.
3. Every row also draws its *candidate* next token in the same pass over the vocabulary:
   argmax(log(max(0, p − q)) + g) — the residual draw, used if row i is the first rejection — falling back to
   argmax(log p + g) when p ≤ q everywhere; the last row (no q) draws the bonus token from p. The host then
   reads the candidate at accepted_len. Also the row's argmax of p (the `target_tokens` of the Outcome).
Computing a candidate for every row costs one extra pass per row but no second launch and no grid sync.
temperature 0 gives the one-hot argmax distribution, as `target_probs` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dflash.kernels._triton_common import (argmax_update, keep_threshold, order_key, pick_block_r, pick_block_v,
                                           row_max_sumexp, scaled_tile)


@triton.jit
def _raw_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        best_val, best_idx = argmax_update(best_val, best_idx, x, offs)
    return best_idx


@triton.jit
def _probs(x, offs, V, lo, m, z, hot, ONEHOT: tl.constexpr):
    """p for scaled values x at offs: exp(x - m) / z on the support, 0 elsewhere (or one-hot at `hot`)."""
    if ONEHOT:
        p = tl.where(offs == hot, 1.0, 0.0)
    else:
        keep = (order_key(x) >= lo) & (offs < V)
        p = tl.where(keep, tl.math.div_rn(tl.exp(x - m), z), 0.0)
    return p


@triton.jit
def _spec_sample_kernel(logits_ptr, stride_lb, stride_lr, q_ptr, stride_qb, stride_qr, noise_ptr, stride_nb,
                        stride_nr, draft_ptr, stride_db, u_ptr, stride_ub, ptok_ptr, cand_ptr, accepted_ptr,
                        V, n_draft, temperature, top_k, top_p,
                        ONEHOT: tl.constexpr, SCALE: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
                        BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    rows = n_draft + 1
    b = pid // rows
    i = pid % rows
    row_ptr = logits_ptr + b.to(tl.int64) * stride_lb + i.to(tl.int64) * stride_lr
    nrow = noise_ptr + b.to(tl.int64) * stride_nb + i.to(tl.int64) * stride_nr
    qrow = q_ptr + b.to(tl.int64) * stride_qb + i.to(tl.int64) * stride_qr
    has_q = i < n_draft

    lo = tl.full([], 0, tl.uint32)
    hot = tl.full([], -1, tl.int32)
    m = tl.full([], 0.0, tl.float32)
    z = tl.full([], 1.0, tl.float32)
    if ONEHOT:
        hot = _raw_argmax(row_ptr, V, BLOCK_V)
    else:
        lo = keep_threshold(row_ptr, V, temperature, top_k, top_p, SCALE, TOP_K, TOP_P, BLOCK_V, BLOCK_R)
        m, z = row_max_sumexp(row_ptr, V, temperature, lo, SCALE, BLOCK_V)

    ninf = float("-inf")
    p_val = tl.full([], ninf, tl.float32)  # running argmax of p
    p_idx = tl.full([], 0, tl.int32)
    r_val = tl.full([], ninf, tl.float32)  # running argmax of log(max(0, p - q)) + g
    r_idx = tl.full([], 0, tl.int32)
    f_val = tl.full([], ninf, tl.float32)  # running argmax of log(p) + g (fallback / bonus)
    f_idx = tl.full([], 0, tl.int32)
    r_pos = tl.full([], 0.0, tl.float32)  # max of the residual: > 0 iff its sum is > 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inside = offs < V
        x = scaled_tile(row_ptr, offs, V, temperature, SCALE)
        p = _probs(x, offs, V, lo, m, z, hot, ONEHOT)
        q = tl.load(qrow + offs, mask=inside & has_q, other=0.0).to(tl.float32)
        g = tl.load(nrow + offs, mask=inside, other=0.0)
        resid = tl.maximum(p - q, 0.0)
        p_val, p_idx = argmax_update(p_val, p_idx, tl.where(inside, p, ninf), offs)
        r_val, r_idx = argmax_update(r_val, r_idx, tl.where(inside, tl.log(resid) + g, ninf), offs)
        f_val, f_idx = argmax_update(f_val, f_idx, tl.where(inside, tl.log(p) + g, ninf), offs)
        r_pos = tl.maximum(r_pos, tl.max(tl.where(inside, resid, 0.0), axis=0))
    tl.store(ptok_ptr + pid, p_idx)
    tl.store(cand_ptr + pid, tl.where(r_pos > 0.0, r_idx, f_idx))

    if has_q:
        tok = tl.load(draft_ptr + b.to(tl.int64) * stride_db + i).to(tl.int32)
        x_tok = scaled_tile(row_ptr, tok, V, temperature, SCALE)
        p_tok = _probs(x_tok, tok, V, lo, m, z, hot, ONEHOT)
        q_tok = tl.load(qrow + tok).to(tl.float32)
        u = tl.load(u_ptr + b.to(tl.int64) * stride_ub + i)
        accept = u * q_tok.to(tl.float64) < p_tok.to(tl.float64)
        if accept == 0:
            tl.atomic_min(accepted_ptr + b, i)


def speculative_verify_batched(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                               temperature: float, top_k: int, top_p: float, uniforms: torch.Tensor,
                               gumbel: torch.Tensor, block_v: int | None = None,
                               num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_tokens [B, n] long, drawn from draft_probs q [B, n, V]; target_logits [B, n+1, V]; uniforms [B, n]
    in [0, 1); gumbel [B, n+1, V]. n >= 1.

    Returns (accepted_len [B], next_token [B], target_tokens [B, n+1]) where target_tokens is the argmax of p
    per row with the emitted next token at accepted_len — exactly the reference's Outcome fields.
    """
    bsz, rows, vocab = target_logits.shape
    n = rows - 1
    if n < 1:
        raise ValueError("speculative_verify needs at least one draft token")
    dev = target_logits.device
    logits = target_logits if target_logits.stride(-1) == 1 else target_logits.contiguous()
    q = draft_probs.to(device=dev).reshape(bsz, n, vocab).contiguous()
    g = gumbel.to(device=dev, dtype=torch.float32).reshape(bsz, rows, vocab).contiguous()
    draft = draft_tokens.to(device=dev, dtype=torch.int64).reshape(bsz, n).contiguous()
    u = uniforms.to(device=dev, dtype=torch.float64).reshape(bsz, n).contiguous()
    ptok = torch.empty(bsz, rows, dtype=torch.int32, device=dev)
    cand = torch.empty(bsz, rows, dtype=torch.int32, device=dev)
    accepted = torch.full((bsz,), n, dtype=torch.int32, device=dev)
    sampling = temperature > 0.0
    bv = pick_block_v(vocab, block_v)
    _spec_sample_kernel[(bsz * rows,)](
        logits, logits.stride(0), logits.stride(1), q, q.stride(0), q.stride(1), g, g.stride(0), g.stride(1),
        draft, draft.stride(0), u, u.stride(0), ptok, cand, accepted, vocab, n,
        float(temperature) if sampling else 1.0, int(top_k), float(top_p),
        ONEHOT=not sampling, SCALE=sampling, TOP_K=sampling and 0 < top_k < vocab, TOP_P=sampling and top_p < 1.0,
        BLOCK_V=bv, BLOCK_R=pick_block_r(bv), num_warps=num_warps,
        enable_fp_fusion=False)
    acc = accepted.long()
    nxt = cand.long().gather(1, acc[:, None]).squeeze(1)
    targets = ptok.long().scatter(1, acc[:, None], nxt[:, None])
    return acc, nxt, targets
