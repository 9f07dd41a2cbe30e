"""Run statistics computed from events — the one function the CLI, benchmark, UI and tests share.

τ (tau) = mean tokens committed per target verify forward, bonus/correction token included (the paper's
"average acceptance length"); the prefill's first token is not counted in τ.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from dflash import events as ev


def compute_stats(events: Iterable[ev.Event]) -> dict[str, Any]:
    run, started, prefill, verify_of = RunningStats(), None, None, {}
    for e in events:
        if isinstance(e, ev.Started):
            started = e
        elif isinstance(e, ev.Prefill) and prefill is None:
            prefill = e
        elif isinstance(e, ev.Verify):
            run.verify(e)
            verify_of[e.block] = e
        elif isinstance(e, ev.Commit):
            run.commit(e, verify_of.get(e.block))
    return run.result(started, prefill)


class RunningStats:
    """The run statistics, kept up to date one event at a time: `compute_stats` folds a whole run through it, and
    a replay (ui/run_state.py) moves it forward and back one frame at a time (`mark` / `restore`)."""

    def __init__(self) -> None:
        self.lengths: list[int] = []  # accepted + 1 per verify step
        self.len_sum = 0
        self.hist: dict[str, int] = {}
        self.block_sizes: list[int] = []
        self.reached: list[int] = []  # [k-1]: verify steps that drafted position k
        self.accepted: list[int] = []  # [k-1]: … and accepted it
        self.draft_ms = self.verify_ms = 0
        self.drift = 0
        self.commits = 0
        self.ttft = self.t_end = 0.0
        self.n_out = 0

    def verify(self, v: ev.Verify) -> None:
        n = v.accepted_len + 1
        self.lengths.append(n)
        self.len_sum += n
        self.hist[str(n)] = self.hist.get(str(n), 0) + 1
        self.block_sizes.append(v.block_size)
        _grow(self.reached, v.block_size - 1)
        _grow(self.accepted, v.block_size - 1)
        for k in range(1, v.block_size):
            self.reached[k - 1] += 1
            self.accepted[k - 1] += v.accepted_len >= k
        self.draft_ms += v.draft_ms
        self.verify_ms += v.verify_ms

    def mark(self, counts: bool) -> tuple:
        """What `restore` needs to take back the next verify (`counts`: with the histogram and per-position counts,
        at most MAX_BLOCK_SIZE entries each) or commit: the scalars and the lengths of the lists that only grow."""
        return (len(self.lengths), self.len_sum, dict(self.hist) if counts else None, list(self.reached) if counts else None,
                list(self.accepted) if counts else None, self.draft_ms, self.verify_ms, self.drift, self.commits, self.ttft,
                self.t_end, self.n_out)

    def restore(self, mark: tuple) -> None:
        (n, self.len_sum, hist, reached, accepted, self.draft_ms, self.verify_ms, self.drift, self.commits, self.ttft,
         self.t_end, self.n_out) = mark
        del self.lengths[n:], self.block_sizes[n:]
        if hist is not None:
            self.hist, self.reached, self.accepted = hist, reached, accepted

    def commit(self, c: ev.Commit, v: ev.Verify | None) -> None:
        self.ttft = c.t_ms if self.commits == 0 else self.ttft
        self.commits += 1
        self.t_end, self.n_out = c.t_ms, c.n_out
        if v is not None:  # relaxed drafts past an EOS inside the block were never emitted
            self.drift += sum(v.relaxed[: len(c.token_ids)])

    def result(self, started: ev.Started | None, prefill: ev.Prefill | None) -> dict[str, Any]:
        decode_ms = max(self.t_end - self.ttft, 0.0)
        spent = self.draft_ms + self.verify_ms
        return {
            "n_prompt_tokens": prefill.n_prompt_tokens if prefill else 0,
            "n_output_tokens": self.n_out,
            "n_verify": len(self.lengths),
            "acceptance_lengths": list(self.lengths),
            "tau": self.len_sum / len(self.lengths) if self.lengths else 0.0,
            "acceptance_histogram": dict(sorted(self.hist.items(), key=lambda kv: int(kv[0]))),
            "per_position_acceptance": [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)],
            "block_sizes": list(self.block_sizes),
            "prefill_ms": prefill.ms if prefill else 0.0,
            "ttft_ms": self.ttft,
            "decode_ms": decode_ms,
            "total_ms": self.t_end,
            "tokens_per_s": (self.n_out - 1) / (decode_ms / 1000) if decode_ms > 0 and self.n_out > 1 else 0.0,
            "draft_ms": self.draft_ms,
            "verify_ms": self.verify_ms,
            "draft_share": self.draft_ms / spent if spent > 0 else 0.0,
            "lossy": bool(started.lossy) if started else False,
            "drift_tokens": self.drift,
        }


def _grow(counts: list[int], n: int) -> None:
    counts.extend([0] * (n - len(counts)))


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


def first_difference(reference: list[int], output: list[int], *, cut_short: bool = False) -> int | None:
    """The one definition of "identical" outputs: the first output position where `output` differs from
    `reference`, or None when they are identical. A length mismatch is a difference at the shorter length,
    unless `output` was cut short (a deadline or a stop): then only the tokens it produced are compared."""
    n = min(len(reference), len(output))
    first = next((i for i in range(n) if reference[i] != output[i]), None)
    if first is None and len(reference) != len(output) and not (cut_short and len(output) < len(reference)):
        first = n
    return first
