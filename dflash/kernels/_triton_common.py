"""Triton building blocks shared by the verification kernels: one row of logits at a time.

Top-k / top-p without sorting. A float32 value maps to a uint32 *order key* that sorts like the float
(`order_key`), so a threshold on values is a threshold on keys, found 4 bits at a time from the most
significant bit (radix select, 8 passes over the row, 16 candidate thresholds per pass). The row stays in L2,
so on a GPU the passes cost microseconds; they run only when top-k / top-p are on.

Semantics mirror `dflash.verification.sampling.filter_logits` (the specification):
- top-k keeps every value >= the k-th largest (ties at the k-th value are all kept, as `x < kth` drops);
- top-p, after top-k, keeps a token iff the softmax mass of the tokens *strictly* above it is < top_p (tied
  values are kept or dropped together, as there). The only difference left is where that mass is within
  float32 rounding of top_p (a different summation order).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scaled_tile(row_ptr, offs, V, temperature, SCALE: tl.constexpr):
    """logits[offs] / temperature in float32 (-inf outside the row). div_rn: IEEE division like torch on CPU."""
    x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temperature)
    return x


@triton.jit
def order_key(x):
    """float32 → uint32 with the same order (−0.0 folded into +0.0; NaN sorts outside the finite range)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.uint32, bitcast=True)
    sign = tl.full(bits.shape, 0x80000000, tl.uint32)
    ones = tl.full(bits.shape, 0xFFFFFFFF, tl.uint32)
    return tl.where((bits & sign) != 0, bits ^ ones, bits | sign)


@triton.jit
def topk_key(row_ptr, V, temperature, k, SCALE: tl.constexpr, BLOCK_R: tl.constexpr):
    """Order key of the k-th largest scaled value (duplicates counted): keep iff key >= result.

    Radix select, 4 bits per pass (8 passes): each pass counts the values >= each of 16 candidate keys
    ([16, BLOCK_R] compares per tile) and keeps the largest candidate whose count is still >= k.
    """
    digits = tl.arange(0, 16).to(tl.uint32)
    ans = tl.full([], 0, tl.uint32)
    shift = tl.full([], 28, tl.int32)
    for _ in range(8):
        cands = ans | (digits << shift.to(tl.uint32))  # [16], non-decreasing
        counts = tl.zeros([16], tl.int32)
        for start in range(0, V, BLOCK_R):
            offs = start + tl.arange(0, BLOCK_R)
            key = order_key(scaled_tile(row_ptr, offs, V, temperature, SCALE))
            hit = (key[None, :] >= cands[:, None]) & (offs < V)[None, :]
            counts += tl.sum(hit.to(tl.int32), axis=1)
        digit = tl.sum(((counts >= k) & (digits > 0)).to(tl.uint32), axis=0)  # counts fall with the digit
        ans = ans | (digit << shift.to(tl.uint32))
        shift = shift - 4
    return ans


@triton.jit
def row_max_sumexp(row_ptr, V, temperature, lo, SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """(max, sum of exp(x - max)) over the kept values (key >= lo) of the scaled row."""
    m = tl.full([], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = scaled_tile(row_ptr, offs, V, temperature, SCALE)
        keep = (order_key(x) >= lo) & (offs < V)
        m = tl.maximum(m, tl.max(tl.where(keep, x, float("-inf")), axis=0))
    z = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = scaled_tile(row_ptr, offs, V, temperature, SCALE)
        keep = (order_key(x) >= lo) & (offs < V)
        z += tl.sum(tl.where(keep, tl.exp(x - m), 0.0), axis=0)
    return m, z


@triton.jit
def topp_key(row_ptr, V, temperature, top_p, lo, m, z, SCALE: tl.constexpr, BLOCK_R: tl.constexpr):
    """Largest key K whose strictly-greater kept mass is >= top_p: keep iff key > result (and key >= lo).

    Same radix search as `topk_key`, on the softmax mass above each candidate instead of a count.
    """
    target = top_p * z
    digits = tl.arange(0, 16).to(tl.uint32)
    ans = tl.full([], 0, tl.uint32)
    shift = tl.full([], 28, tl.int32)
    for _ in range(8):
        cands = ans | (digits << shift.to(tl.uint32))
        mass = tl.zeros([16], tl.float32)
        for start in range(0, V, BLOCK_R):
            offs = start + tl.arange(0, BLOCK_R)
            x = scaled_tile(row_ptr, offs, V, temperature, SCALE)
            key = order_key(x)
            e = tl.where((key >= lo) & (offs < V), tl.exp(x - m), 0.0)
            mass += tl.sum(tl.where(key[None, :] > cands[:, None], e[None, :], 0.0), axis=1)
        digit = tl.sum(((mass >= target) & (digits > 0)).to(tl.uint32), axis=0)
        ans = ans | (digit << shift.to(tl.uint32))
        shift = shift - 4
    return ans


@triton.jit
def keep_threshold(row_ptr, V, temperature, top_k, top_p, SCALE: tl.constexpr, TOP_K: tl.constexpr,
                   TOP_P: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr):
    """The order key `lo` such that the filtered support of the row is exactly {key >= lo}."""
    lo = tl.full([], 0, tl.uint32)
    if TOP_K:
        lo = topk_key(row_ptr, V, temperature, top_k, SCALE, BLOCK_R)
    if TOP_P:
        m, z = row_max_sumexp(row_ptr, V, temperature, lo, SCALE, BLOCK_V)
        kp = topp_key(row_ptr, V, temperature, top_p, lo, m, z, SCALE, BLOCK_R)
        lo = tl.maximum(lo, kp + 1)
    return lo


@triton.jit
def argmax_update(best_val, best_idx, vals, offs):
    """Running argmax over tiles; the first index wins ties (torch.argmax semantics)."""
    tile_max = tl.max(vals, axis=0)
    tile_idx = tl.min(tl.where(vals == tile_max, offs, 2147483647), axis=0)
    better = tile_max > best_val
    return tl.where(better, tile_max, best_val), tl.where(better, tile_idx, best_idx)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pick_block_r(block_v: int) -> int:
    """Tile width of the radix passes ([16, BLOCK_R] compares per tile: keep it register-sized)."""
    return min(block_v, 256)


def pick_block_v(vocab: int, block_v: int | None = None) -> int:
    """Tile width over the vocabulary: a power of two, at most 2048 (one tile for small vocabularies)."""
    if block_v is not None:
        return block_v
    return max(16, min(2048, next_pow2(vocab)))
