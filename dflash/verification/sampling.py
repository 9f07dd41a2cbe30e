"""Pure sampling functions: logits processing and per-position seeded noise.

Noise is derived from (seed, absolute position, stream), never from a global RNG: a DFlash run and a
target-only run with the same seed draw the *same* noise at each output position, so with the lossless
*match* rule they emit the same tokens (an exact test of losslessness).
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
# Streams of independent noise at one position.
GUMBEL_TARGET = 0  # the target's own sample (match rule, bonus/residual draws)
UNIFORM_ACCEPT = 1  # the u in "accept if u < p/q" (rejection rule)
GUMBEL_DRAFT = 2  # the draft's sample (rejection rule)


_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)


def _i64(c: int) -> int:
    """A 64-bit pattern as the signed int64 torch stores."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic: mask off the copied sign bits)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix64_(x: torch.Tensor) -> torch.Tensor:
    """`_splitmix64` elementwise, in place, on an int64 tensor (int64 arithmetic wraps: it is arithmetic mod 2^64;
    in place because the [rows, vocab] temporaries would cost as much as the arithmetic)."""
    x.add_(_i64(_GAMMA))
    x.bitwise_xor_(_shr(x, 30)).mul_(_i64(_MIX1))
    x.bitwise_xor_(_shr(x, 27)).mul_(_i64(_MIX2))
    return x.bitwise_xor_(_shr(x, 31))


def position_seed(seed: int, position: int, stream: int = GUMBEL_TARGET) -> int:
    """A 63-bit seed that depends only on (seed, absolute position, stream)."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ position) ^ stream) >> 1


def gumbel_noise(seed: int, positions: list[int], vocab: int, stream: int = GUMBEL_TARGET,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(positions), vocab] float32 Gumbel(0,1) noise, row i from (seed, positions[i], stream), on `device`.

    Counter-based: entry [i, j] is the j-th output of a SplitMix64 stream seeded with position_seed(...), computed
    on `device` with integer ops, so a block costs a few elementwise kernels and no host-to-device copy of
    vocabulary-sized noise. The 24-bit uniforms are the same bits on every device; the Gumbel transform is one
    float32 log pair (a device's libm may round it one ulp differently).
    """
    keys = torch.tensor([_i64(position_seed(seed, pos, stream)) for pos in positions], dtype=torch.int64, device=device)
    state = torch.arange(vocab, dtype=torch.int64, device=device).mul_(_i64(_GAMMA)).add(keys[:, None])  # [R, V]
    u = _shr(_splitmix64_(state), 40).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24))  # in (0, 1): never 0 or 1
    return u.log_().neg_().log_().neg_()


def uniform_noise(seed: int, positions: list[int], stream: int = UNIFORM_ACCEPT) -> list[float]:
    """One uniform in (0, 1) per position: entry 0 of the stream `gumbel_noise` draws from, in plain Python."""
    return [((_splitmix64(position_seed(seed, pos, stream)) >> 40) + 0.5) / (1 << 24) for pos in positions]


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask logits outside the top-k / top-p support with -inf. logits: [..., V] (float32). top_k=0: off.

    top-k keeps every value >= the k-th largest; top-p then keeps a token iff the mass of the tokens strictly more
    likely than it is below top_p (always at least one). Tokens with equal logits are kept or dropped together, so
    the order a sort puts them in never matters (bfloat16 logits tie often) and the Triton kernels
    (dflash/kernels/_triton_common.py) implement the same rule without sorting.
    """
    out = logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # [..., 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # [..., V]
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass ahead of each position in the sorted order
        # a run of equal logits takes the mass ahead of its first member: the mass strictly above each of them
        first = torch.searchsorted(-sorted_logits.contiguous(), -sorted_logits.contiguous(), side="left")
        drop_sorted = before.gather(-1, first) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution p after temperature, top-k and top-p. temperature 0 → one-hot argmax."""
    logits = logits.float()
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)


def sample_with_noise(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                      gumbel: torch.Tensor | None) -> torch.Tensor:
    """Gumbel-max sampling: argmax(filtered logits / T + g) ~ softmax(filtered logits / T). [..., V] → [...].

    temperature 0 (or no noise) is plain argmax and consumes no randomness.
    """
    logits = logits.float()
    if temperature == 0.0 or gumbel is None:
        return logits.argmax(-1)
    return (filter_logits(logits / temperature, top_k, top_p) + gumbel).argmax(-1)
