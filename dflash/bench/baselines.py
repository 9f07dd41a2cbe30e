"""The baselines a user would pick instead of DFlash, on the same target model object: transformers' own
`generate()` (greedy or sampling) and its prompt-lookup decoding (`prompt_lookup_num_tokens`).

No decoding loop is written here: we call `model.generate` and only time it. A streamer records when tokens
leave generate: its first `put` is the prompt (before the prefill), the second carries the first new token(s)
(after the prefill; with prompt lookup the prefill is merged with the first verification, so it may carry
several tokens), the last one the final tokens. That gives the same TTFT / decode split as the engine's events.
Greedy runs also return the target's top-2 logit gap per output token (from generate's own logits, `output_logits`),
so a difference from the engine's output is diagnosed as a numerical tie or an error like the engine's methods.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dflash.models.target import Target
from dflash.verification.verify import top2_gap


@dataclass
class TimedOutput:
    """What every method of the benchmark returns for one run (engine methods fill it from their events)."""

    output_ids: list[int]
    finish_reason: str  # eos | length | stop | error | …
    ttft_ms: float  # request start → first new token available
    decode_ms: float  # first new token(s) → last token
    total_ms: float  # request start → last token
    decode_tokens: int  # tokens produced inside the decode window (after the first chunk)
    stats: dict = field(default_factory=dict)  # engine methods: dflash.decode.stats.compute_stats; baselines: {}
    message: str = ""
    target_gaps: list[float] | None = None  # greedy: the target's top-2 gap per output token; sampled: None


class _Clock:
    """A transformers streamer that only timestamps each `put` (duck-typed BaseStreamer)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


def hf_generate(target: Target, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | list[int],
                temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                prompt_lookup_num_tokens: int | None = None, max_matching_ngram_size: int = 2) -> TimedOutput:
    """Run transformers' `generate()` on the target's model. EOS: the engine's stop ids (the output keeps the stop
    token, like the engine). Sampling draws from torch's global RNG seeded with `seed` (not the engine's
    per-position noise, so sampled outputs are not comparable token for token)."""
    model = target.model
    target.stop_capture()  # the draft's feature hooks stay idle during generate
    stops = sorted(int(i) for i in stop_ids)
    kwargs: dict = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=temperature > 0.0,
                        eos_token_id=stops or None, pad_token_id=stops[0] if stops else 0, num_beams=1,
                        repetition_penalty=1.0, use_cache=True)
    if temperature > 0.0:
        kwargs.update(temperature=temperature, top_k=top_k if top_k > 0 else None, top_p=top_p)
    else:  # unset the sampling knobs so transformers does not warn that they are ignored; keep the raw logits
        kwargs.update(temperature=None, top_k=None, top_p=None, output_logits=True, return_dict_in_generate=True)
    if prompt_lookup_num_tokens:
        kwargs.update(prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_matching_ngram_size=max_matching_ngram_size)
    ids = torch.tensor([prompt_ids], device=target.device)
    clock = _Clock()
    if temperature > 0.0:
        torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), streamer=clock, **kwargs)
    t_end = time.perf_counter()
    gaps = None
    if temperature == 0.0:  # one [1, V] logits row per new token, as generate chose it
        gaps = top2_gap(torch.cat(out.logits)) if out.logits else []
        out = out.sequences
    new = out[0, len(prompt_ids):].tolist()
    # Batch size 1: generate pads nothing after EOS, but keep the contract explicit (EOS kept, nothing after it).
    cut = next((i for i, t in enumerate(new) if t in set(stops)), None)
    reason = "length"
    if cut is not None:
        new, reason = new[: cut + 1], "eos"
    gaps = gaps[: len(new)] if gaps is not None else None
    puts = clock.times[1:]  # [0] is the prompt
    counts = clock.counts[1:]
    if not puts:
        return TimedOutput(new, "error", 0.0, 0.0, (t_end - t0) * 1000, 0, message="generate produced no token")
    ttft = (puts[0] - t0) * 1000
    last = puts[-1]
    return TimedOutput(new, reason, ttft, (last - puts[0]) * 1000, (last - t0) * 1000,
                       max(len(new) - counts[0], 0), target_gaps=gaps)
