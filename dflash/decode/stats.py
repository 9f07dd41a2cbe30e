"""Run statistics computed from events — the one function the CLI, benchmark, UI and tests share.

τ (tau) = mean tokens committed per target verify forward, bonus/correction token included (the paper's
"average acceptance length"); the prefill's first token is not counted in τ. A step counts accepted + 1 as verified,
also where the run ends inside its block (EOS, a stop id, max_new_tokens) and some of those tokens are not output —
as the reference implementation counts its acceptance lengths — so on a short run τ can exceed
(output tokens − 1) / verify steps by up to (block size − 1) / verify steps.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

from dflash.decode import events as ev


# Statistics added after traces were first recorded: an older trace's Finished.stats lacks them (ui/trace_schema.py).
LATER_STATS = ("copy_blocks", "copy_tau", "proposers")


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
        self.proposed: list[int] = []  # [k-1]: verify steps that drafted position k
        self.accepted: list[int] = []  # [k-1]: … and accepted it
        self.draft_ms = self.verify_ms = 0
        self.by_source: dict[str, list[int]] = {}  # proposer → [blocks verified, their lengths' sum]
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
        _grow(self.proposed, v.block_size - 1)
        _grow(self.accepted, v.block_size - 1)
        for k in range(1, v.block_size):
            self.proposed[k - 1] += 1
            self.accepted[k - 1] += v.accepted_len >= k
        self.draft_ms += v.draft_ms
        self.verify_ms += v.verify_ms
        counts = self.by_source.setdefault(v.source, [0, 0])
        counts[0] += 1
        counts[1] += n

    def mark(self, counts: bool) -> tuple:
        """What `restore` needs to take back the next verify (`counts`: with the histogram and per-position counts,
        at most MAX_BLOCK_SIZE entries each) or commit: the scalars and the lengths of the lists that only grow."""
        return (len(self.lengths), self.len_sum, dict(self.hist) if counts else None, list(self.proposed) if counts else None,
                list(self.accepted) if counts else None, self.draft_ms, self.verify_ms, self.drift, self.commits, self.ttft,
                self.t_end, self.n_out, {k: list(c) for k, c in self.by_source.items()})

    def restore(self, mark: tuple) -> None:
        (n, self.len_sum, hist, proposed, accepted, self.draft_ms, self.verify_ms, self.drift, self.commits, self.ttft,
         self.t_end, self.n_out, by_source) = mark
        self.by_source = {k: list(c) for k, c in by_source.items()}  # the mark stays as it was, for another restore
        del self.lengths[n:], self.block_sizes[n:]
        if hist is not None:
            self.hist, self.proposed, self.accepted = hist, proposed, accepted

    def commit(self, c: ev.Commit, v: ev.Verify | None) -> None:
        self.ttft = c.t_ms if self.commits == 0 else self.ttft
        self.commits += 1
        self.t_end, self.n_out = c.t_ms, c.n_out
        if v is not None:  # relaxed drafts past an EOS inside the block were never emitted
            self.drift += sum(v.relaxed[: len(c.token_ids)])

    def result(self, started: ev.Started | None, prefill: ev.Prefill | None) -> dict[str, Any]:
        decode_ms = max(self.t_end - self.ttft, 0.0)
        copy_n, copy_sum = self.by_source.get(ev.COPY, (0, 0))
        spent = self.draft_ms + self.verify_ms
        return {
            "n_prompt_tokens": prefill.n_prompt_tokens if prefill else 0,
            "n_output_tokens": self.n_out,
            "n_verify": len(self.lengths),
            "acceptance_lengths": list(self.lengths),
            "tau": self.len_sum / len(self.lengths) if self.lengths else 0.0,
            "acceptance_histogram": dict(sorted(self.hist.items(), key=lambda kv: int(kv[0]))),
            "per_position_acceptance": [a / r if r else 0.0 for a, r in zip(self.accepted, self.proposed)],
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
            "proposers": {k: {"blocks": n, "tau": total / n} for k, (n, total) in sorted(self.by_source.items())},
            "copy_blocks": copy_n,  # blocks copied from the context (Request.lookup_ngram); the rest were drafted
            "copy_tau": copy_sum / copy_n if copy_n else 0.0,  # τ over the copied blocks alone
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


# The tie bounds per dtype: the largest top-2 logit gap at which a multi-token verify and the one-token step may pick
# different argmaxes from rounding alone. If the two computations' logits differ by at most d each, a position where
# one picks x and the other y has, in each run, top-1 minus top-2 <= |l(x) - l(y)| <= 2d; so the bound is 2 × the
# largest per-logit difference measured, rounded up (`tie_bound_from`). float32 stays the exact mode: its bound 0
# makes every float32 difference an error.
# Measured by `python -m dflash.bench.profile logit-drift` (the "suggested_bound" of its output); the measurement is
# committed in results/numerics/logit-drift.json (bfloat16 on SmolLM2-135M, CPU: largest per-logit difference 0.875
# between the 8-token verify and the one-token step, over 188 positions x 49,152 logits), and a test keeps the
# constant equal to it. Re-measure on another host or model with the same command.
BFLOAT16_TIE_BOUND = 1.8
FLOAT16_TIE_BOUND = 0.0  # not measured (no CPU path runs float16): every float16 difference counts as an error
# int4 (dflash.models.lean): float32 activations, int4 decoder weights, a bfloat16 head. Measured the same way
# (results/numerics/logit-drift-int4.json) the verify's logits equalled the step's bit for bit on an AMX Xeon; the
# products whose rounding may still follow the row count on another CPU are bfloat16 ones (the head, the int4
# kernel's inputs), so bfloat16's bound holds for it.
INT4_TIE_BOUND = BFLOAT16_TIE_BOUND
TIE_BOUND = {"float32": 0.0, "bfloat16": BFLOAT16_TIE_BOUND, "float16": FLOAT16_TIE_BOUND, "int4": INT4_TIE_BOUND}


def tie_bound_from(max_abs_diff: float) -> float:
    """The tie bound a measured drift gives: 2 × the largest per-logit difference, rounded up to two significant
    digits (0.0123 → 0.025)."""
    x = 2.0 * max_abs_diff
    if not x > 0.0:
        return 0.0
    exp = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(round(x / 10.0**exp, 9))}e{exp}")  # round(): 0.14 / 0.01 is 14.000000000000002


def diagnose_difference(ref_ids: list[int], ref_gaps: list[float] | None, run_ids: list[int],
                        run_gaps: list[float] | None, dtype: str, cut_short: bool = False) -> dict | None:
    """Why `run_ids` differs from the reference (no-draft) output: None when identical (`first_difference`), else
    the first differing position, both tokens, both runs' top-2 logit gaps there (`Commit.target_gaps`; None when
    not recorded), the dtype's tie bound (`TIE_BOUND`; None for another dtype) and the verdict: "tie" when both
    gaps are known and at most a positive bound (rounding can flip such an argmax), else "error". A difference
    in length only is an "error"."""
    pos = first_difference(ref_ids, run_ids, cut_short=cut_short)
    if pos is None:
        return None

    def at(values: list | None) -> float | int | None:
        return values[pos] if values is not None and pos < len(values) else None

    ref_gap, run_gap, bound = at(ref_gaps), at(run_gaps), TIE_BOUND.get(dtype)
    tie = (at(ref_ids) is not None and at(run_ids) is not None and ref_gap is not None and run_gap is not None
           and bound is not None and bound > 0.0 and max(ref_gap, run_gap) <= bound)
    return {"position": pos, "ref_token": at(ref_ids), "run_token": at(run_ids), "ref_gap": ref_gap, "run_gap": run_gap,
            "bound": bound, "verdict": "tie" if tie else "error"}


def difference_words(diag: dict, dtype: str = "") -> str:
    """A `diagnose_difference` result in words: a numerical tie (both top-2 gaps within the dtype's bound), not a
    tie (a bug), or not decidable (gaps not recorded). A lossy run's difference is its callers' to word."""
    if diag["ref_token"] is None or diag["run_token"] is None:
        return "NOT a tie (one output ends there) — a bug"
    if diag["ref_gap"] is None or diag["run_gap"] is None:
        return "not shown to be a tie (no top-2 gaps recorded: sampling with top-k / top-p, or an older record)"
    gaps, dtype = f"top-2 gaps {diag['ref_gap']:.3g} / {diag['run_gap']:.3g}", dtype or "unknown dtype"
    if diag["verdict"] == "tie":
        return f"numerical tie ({gaps} ≤ {diag['bound']:.3g}, {dtype})"
    bound = f"bound {diag['bound']:.3g}" if diag["bound"] else "no tie bound"  # float32 is exact; unmeasured; unknown
    return f"NOT a tie ({gaps}, {bound}, {dtype}) — a bug"


def output_gaps(events: Iterable[ev.Event]) -> list[float] | None:
    """The target's top-2 gap per output token, from the run's Commits; None when a Commit with tokens has none
    (sampling with top-k / top-p, or a trace recorded before the gaps were)."""
    gaps: list[float] = []
    for e in events:
        if isinstance(e, ev.Commit) and e.token_ids:
            if len(e.target_gaps) != len(e.token_ids):
                return None
            gaps += e.target_gaps
    return gaps
