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


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int, stream: int = GUMBEL_TARGET) -> int:
    """A 63-bit seed that depends only on (seed, absolute position, stream)."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ position) ^ stream) >> 1


def position_generator(seed: int, position: int, stream: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(position_seed(seed, position, stream))
    return gen


def gumbel_noise(seed: int, positions: list[int], vocab: int, stream: int = GUMBEL_TARGET, device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(positions), vocab] float32 Gumbel(0,1) noise, row i from (seed, positions[i], stream), on `device`.

    Drawn with CPU generators, then moved: the same (seed, position) gives the same noise on every device.
    """
    rows = []
    for pos in positions:
        u = torch.rand(vocab, generator=position_generator(seed, pos, stream, "cpu"), dtype=torch.float32)
        rows.append(-torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7))))
    return torch.stack(rows).to(device) if rows else torch.empty(0, vocab, device=device)


def uniform_noise(seed: int, positions: list[int], stream: int = UNIFORM_ACCEPT) -> list[float]:
    return [float(torch.rand(1, generator=position_generator(seed, pos, stream, "cpu"))) for pos in positions]


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask logits outside the top-k / top-p support with -inf. logits: [..., V] (float32). top_k=0: off.

    top-p keeps the smallest set of most likely tokens whose mass reaches top_p (always at least one).
    """
    out = logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # [..., 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p  # mass before this token already enough
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution p after temperature, top-k and top-p. temperature 0 → one-hot argmax."""
    logits = logits.float()
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)


def sample_with_noise(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gumbel: torch.Tensor | None) -> torch.Tensor:
    """Gumbel-max sampling: argmax(filtered logits / T + g) ~ softmax(filtered logits / T). [..., V] → [...].

    temperature 0 (or no noise) is plain argmax and consumes no randomness.
    """
    logits = logits.float()
    if temperature == 0.0 or gumbel is None:
        return logits.argmax(-1)
    return (filter_logits(logits / temperature, top_k, top_p) + gumbel).argmax(-1)
