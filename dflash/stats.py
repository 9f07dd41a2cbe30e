"""Run statistics computed from events — the one function the CLI, benchmark, UI and tests share.

τ (tau) = mean tokens committed per target verify forward, bonus/correction token included (the paper's
"average acceptance length"); the prefill's first token is not counted in τ.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from dflash import events as ev


def compute_stats(events: Iterable[ev.Event]) -> dict[str, Any]:
    events = list(events)
    verifies = [e for e in events if isinstance(e, ev.Verify)]
    commits = [e for e in events if isinstance(e, ev.Commit)]
    prefill = next((e for e in events if isinstance(e, ev.Prefill)), None)
    lengths = [v.accepted_len + 1 for v in verifies]
    n_out = commits[-1].n_out if commits else 0
    max_drafted = max((v.block_size - 1 for v in verifies), default=0)
    per_position = []
    for k in range(1, max_drafted + 1):
        reached = [v for v in verifies if v.block_size - 1 >= k]
        per_position.append(sum(v.accepted_len >= k for v in reached) / len(reached) if reached else 0.0)
    hist: dict[str, int] = {}
    for n in lengths:
        hist[str(n)] = hist.get(str(n), 0) + 1
    ttft = commits[0].t_ms if commits else 0.0
    t_end = commits[-1].t_ms if commits else 0.0
    decode_ms = max(t_end - ttft, 0.0)
    draft_ms = sum(v.draft_ms for v in verifies)
    verify_ms = sum(v.verify_ms for v in verifies)
    # Drift counts emitted tokens only: relaxed drafts accepted after an EOS inside the block are never emitted.
    n_committed = {c.block: len(c.token_ids) for c in commits}
    relaxed = sum(sum(v.relaxed[: n_committed.get(v.block, 0)]) for v in verifies)
    started = next((e for e in events if isinstance(e, ev.Started)), None)
    return {
        "n_prompt_tokens": prefill.n_prompt_tokens if prefill else 0,
        "n_output_tokens": n_out,
        "n_verify": len(verifies),
        "acceptance_lengths": lengths,
        "tau": statistics.fmean(lengths) if lengths else 0.0,
        "acceptance_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "per_position_acceptance": per_position,
        "block_sizes": [v.block_size for v in verifies],
        "prefill_ms": prefill.ms if prefill else 0.0,
        "ttft_ms": ttft,
        "decode_ms": decode_ms,
        "total_ms": t_end,
        # Decode phase: tokens after the first one, over the time after the first one.
        "tokens_per_s": (n_out - 1) / (decode_ms / 1000) if decode_ms > 0 and n_out > 1 else 0.0,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "draft_share": draft_ms / (draft_ms + verify_ms) if draft_ms + verify_ms > 0 else 0.0,
        "lossy": bool(started.lossy) if started else False,
        "drift_tokens": relaxed,
    }


def speedup(baseline_ms: list[float], method_ms: list[float]) -> dict[str, float]:
    """Speedup = total baseline decode time / total method decode time on the same prompts, plus the spread of
    per-prompt ratios (min, median, max)."""
    ratios = [b / m for b, m in zip(baseline_ms, method_ms) if m > 0]
    total = sum(baseline_ms) / sum(method_ms) if sum(method_ms) > 0 else 0.0
    return {
        "speedup": total,
        "min": min(ratios, default=0.0),
        "median": statistics.median(ratios) if ratios else 0.0,
        "max": max(ratios, default=0.0),
    }
