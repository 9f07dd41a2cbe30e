"""Evaluate a draft with the real loop: τ, the acceptance histogram and (optionally) the speed against the
no-draft loop, interleaved per prompt in one process. Used by `train eval` and the training-curve script.

τ here is the engine's own: the mean over every verify forward of all prompts of (accepted drafts + 1), read
from each run's `compute_stats` (the same numbers the CLI, benchmark and playground show).
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable, Sequence

from dflash.decode.engine import Engine
from dflash.decode.request import Request
from dflash.decode.stats import speedup


def prompt_request(prompt: str | Sequence[int], **kw) -> Request:
    """A text prompt (chat template applied by the engine) or token ids as they are."""
    return Request(prompt=prompt, **kw) if isinstance(prompt, str) else Request(prompt_ids=tuple(prompt), **kw)


def _per_token_ms(stats: dict) -> float:
    """Decode time per token after the first (the first token comes from the prefill in both loops)."""
    return stats["decode_ms"] / max(stats["n_output_tokens"] - 1, 1)


def evaluate_draft(engine: Engine, prompts: Iterable[str | Sequence[int]], max_new_tokens: int = 128,
                   block_size: int | None = None, steps: int = 1, baseline: bool = True,
                   on_prompt: Callable[[dict], None] | None = None, temperature: float = 0.0, seed: int = 0) -> dict:
    """DFlash on every prompt (and the no-draft loop right after it when `baseline`): greedy, or sampled at
    `temperature` with the engine's default (lossless, seeded) rule, so sampled outputs are comparable too.
    Returns the summary plus per-prompt `rows`."""
    # A fixed block and no copying: τ measures the draft alone at its block size.
    kw = dict(max_new_tokens=max_new_tokens, block_size=block_size, diffusion_steps=steps, temperature=temperature,
              seed=seed, adaptive="fixed", lookup_ngram=0)
    prompts = list(prompts)
    if prompts:  # warm-up: first-call allocations are not timed
        engine.generate(prompt_request(prompts[0], max_new_tokens=4))
    rows = []
    for prompt in prompts:
        d = engine.generate(prompt_request(prompt, **kw))
        row = {"tau": d.stats["tau"], "lengths": d.stats["acceptance_lengths"], "n": d.stats["n_output_tokens"],
               "ms_per_token": _per_token_ms(d.stats)}
        if baseline:
            a = engine.generate(prompt_request(prompt, use_draft=False, **kw))
            row.update(ar_n=a.stats["n_output_tokens"], ar_ms_per_token=_per_token_ms(a.stats),
                       identical=a.output_ids == d.output_ids)
        rows.append(row)
        if on_prompt:
            on_prompt(row)
    return summarize(rows) | {"rows": rows}


def summarize(rows: list[dict]) -> dict:
    lengths = [x for r in rows for x in r["lengths"]]
    hist = {str(k): lengths.count(k) for k in sorted(set(lengths))}
    out = {"n_prompts": len(rows), "n_verify": len(lengths), "tau": statistics.fmean(lengths) if lengths else 0.0,
           "histogram": hist}
    if rows and "identical" in rows[0]:
        sp = speedup([r["ar_ms_per_token"] for r in rows], [r["ms_per_token"] for r in rows])
        out.update(speedup=sp["speedup"], speedup_spread=sp, identical=sum(r["identical"] for r in rows))
    return out
