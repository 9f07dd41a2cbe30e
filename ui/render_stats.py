"""Pure render functions for the statistics panel and the comparison with the autoregressive baseline."""

from __future__ import annotations

from dflash.decode import events as ev
from dflash.decode.stats import TIE_BOUND, diagnose_difference, output_gaps
from dflash.decode.stats import difference_words as stats_difference_words  # the playground's own adds the lossy case
from .render import above, attr, count, finished, run_stats
from .run_state import RunState, as_state


def comparison(run_events: list, base_events: list, dtype: str = "", timed: list | None = None) -> dict:
    """Baseline vs run: tok/s, speedup, whether the outputs are identical, and where they differ the diagnosis
    (`stats.diagnose_difference`: both runs' top-2 gaps there, numerical tie or error). `dtype`: the target's
    ("bfloat16"; anything without a tie bound is kept as "", an unknown dtype). `timed`: the run's request run
    again beside the baseline; the speeds are then its and the baseline's (`live_tokens_per_s` keeps the run's own;
    None without `timed`)."""
    run_ids, base_ids = _output_ids(run_events), _output_ids(base_events)
    live, bs = run_stats(run_events), run_stats(base_events)
    rs = run_stats(timed) if timed is not None else live
    n = min(len(run_ids), len(base_ids))
    dtype = dtype if dtype in TIE_BOUND else ""
    # A stopped baseline is never compared (handlers.compare).
    diag = diagnose_difference(base_ids, output_gaps(base_events), run_ids, output_gaps(run_events), dtype)
    speed = rs["tokens_per_s"] / bs["tokens_per_s"] if bs["tokens_per_s"] > 0 else 0.0
    return {"baseline_tokens_per_s": bs["tokens_per_s"], "run_tokens_per_s": rs["tokens_per_s"], "speedup": speed,
            "live_tokens_per_s": live["tokens_per_s"] if timed is not None else None, "identical": diag is None,
            "first_diff": diag["position"] if diag else None, "n_compared": n, "baseline_ttft_ms": bs["ttft_ms"],
            "lossy": live["lossy"], "diagnosis": diag, "dtype": dtype}


def difference_words(comp: dict) -> str:
    """Why the outputs differ at `comp["first_diff"]`, in words (`dflash.decode.stats.difference_words`; a lossy run's
    difference is expected)."""
    if comp["lossy"]:
        return "expected, the run is lossy (acceptance threshold below 1)"
    return stats_difference_words(comp["diagnosis"], comp["dtype"])


def tie_only(comp: dict) -> bool:
    """The outputs of a lossless run differ, and only where the diagnosis found a numerical tie."""
    diag = comp.get("diagnosis")
    return not comp.get("identical") and not comp.get("lossy") and bool(diag) and diag.get("verdict") == "tie"


def outputs_words(comp: dict) -> tuple[str, str]:
    """(css class, words) for how the outputs compare: identical; identical up to a numerical tie, said neutrally (a
    tie is the low-precision numerics, not DFlash); or a difference, diagnosed."""
    if comp["identical"]:
        return "same", "✓ identical to the target's own output"
    if tie_only(comp):
        return "tie", (f"≈ identical up to a numerical tie at token {comp['first_diff']}: the target's top two tokens "
                       f"were equal in {comp['dtype']}")
    return "diff", f"✗ differs from the target's own output at token {comp['first_diff']}: {difference_words(comp)}"


def _output_ids(events: list) -> list[int]:
    fin = finished(events)
    if fin is not None:
        return list(fin.output_ids)
    return [t for e in events if isinstance(e, ev.Commit) for t in e.token_ids]


def stats_html(run: RunState | list, compare: dict | None = None, hardware: str = "") -> str:
    state = as_state(run)
    if not state.n_events:
        return '<div class="dfl-stats"><p class="dfl-placeholder">Statistics appear here while a run streams.</p></div>'
    s = run_stats(state)
    st = state.started
    draft_share = s["draft_share"] * 100
    items = [
        ("τ (tokens per target step)", f"{s['tau']:.2f}" if above(s["n_verify"], 0) else "–",
         "Mean tokens committed per verify step, bonus/correction token included. 1.00 = no gain. (– : the run ended "
         "with the prompt's own token, before any verify step.)"),
        ("tokens / s", f"{s['tokens_per_s']:.1f}" if above(s["n_output_tokens"], 1) else "–",
         "Decode speed after the first token (– : no token after the first)."),
        ("time to first token", f"{s['ttft_ms']:.0f} ms" if above(s["n_output_tokens"], 0) else "–",
         "Prompt prefill + the first token."),
        ("draft / verify time", f"{draft_share:.0f}% / {100 - draft_share:.0f}%" if s["verify_ms"] else "–",
         f"draft {s['draft_ms']:.0f} ms, verify {s['verify_ms']:.0f} ms in total"),
        ("output tokens", f"{s['n_output_tokens']}",
         f"{count(s['n_verify'], 'target verify step' if st is None or st.has_draft else 'target step')}, "
         f"prompt {count(s['n_prompt_tokens'], 'token')}"),
    ]
    cells = "".join(f'<div class="stat" title="{attr(h)}"><div class="k">{attr(k)}</div><div class="v">{attr(v)}</div></div>'
                    for k, v, h in items)
    badges = []
    if st is not None and not st.has_draft:
        badges.append('<span class="badge badge-info">no draft: autoregressive baseline</span>')
    if s.get("copy_blocks"):
        badges.append(f'<span class="badge badge-info">{attr(s["copy_blocks"])} of {attr(s["n_verify"])} blocks copied from '
                      f'the context (τ {s["copy_tau"]:.2f} there)</span>')
    if s.get("lossy"):
        badges.append(f'<span class="badge badge-lossy">⚠ LOSSY (acceptance threshold &lt; 1): {attr(s["drift_tokens"])} '
                      f'tokens accepted that the target would not have chosen</span>')
    fin = state.finished
    if fin is not None:
        badges.append(f'<span class="badge">{attr(fin.reason)}</span>')
    comp = ""
    if compare:
        css, same = outputs_words(compare)
        why = f' title="{attr(difference_words(compare))}"' if css == "tie" else ""  # the diagnosis, in one wording
        comp = ('<div class="stat-compare" id="compare-result">'
                + _run_rate(compare) + _stat("baseline tokens / s", f"{compare['baseline_tokens_per_s']:.1f}")
                + _stat("speedup", f"{compare['speedup']:.2f}×") +
                f'<div class="stat"><div class="k">outputs</div>'
                f'<div class="v {css}"{why}>{attr(same)}</div></div>'
                f'<p class="cmp-note">Baseline = the same engine without a draft (one token per target step), same prompt and '
                f'settings, {attr(compare["n_compared"])} tokens compared.{_timed_words(compare)}</p></div>')
    hw = f'<p class="hw">{attr(hardware)}</p>' if hardware else ""
    data = (f'<span hidden class="stats-data" data-tau="{s["tau"]:.4f}" data-n-out="{attr(s["n_output_tokens"])}" '
            f'data-n-verify="{attr(s["n_verify"])}" data-reason="{attr(fin.reason if fin else "running")}"></span>')
    return (f'<div class="dfl-stats"><div class="stat-grid">{cells}</div><div class="badges">{"".join(badges)}</div>'
            f'{comp}{hw}{data}</div>')


def _run_rate(compare: dict) -> str:
    """The compared run's tok/s, from which the speedup is computed: beside the baseline's, since the statistics above
    may show another timing of the run (its live one, which also paid for drawing the page)."""
    rate = compare.get("run_tokens_per_s")
    if not isinstance(rate, (int, float)):  # an older trace's comparison
        return ""
    return _stat("run tokens / s (timed)" if compare.get("live_tokens_per_s") is not None else "run tokens / s", f"{rate:.1f}")


def _timed_words(compare: dict) -> str:
    """How the speeds were timed, for a comparison made in this session (a loaded trace does not say)."""
    live = compare.get("live_tokens_per_s")
    if live is None:
        return ""
    return (" Speeds: the run timed again right before the baseline, both with the page redrawn at most once a "
            f"second (live, drawing every frame, the run went at {attr(f'{live:.1f}')} tok/s).")


def _stat(key: str, value: str) -> str:
    return f'<div class="stat"><div class="k">{attr(key)}</div><div class="v">{attr(value)}</div></div>'


def compared_status(comp: dict, timed: bool, repeated: bool) -> str:
    """The status line after Compare (`timed`: the run was timed again beside the baseline; `repeated`: with the
    shown run's output)."""
    same = outputs_words(comp)[1].removesuffix(" to the target's own output")
    # A rerun's block sizes follow timings: in bfloat16 a near-tie can round the other way, and a lossy run accepts
    # other tokens.
    note = "" if repeated else " The timed run's output differed from the shown run's; the speeds are the timed run's."
    return (f"**Compared with autoregressive:** DFlash {comp['run_tokens_per_s']:.1f} tok/s, baseline "
            f"{comp['baseline_tokens_per_s']:.1f} tok/s{' (timed back to back)' if timed else ''}, speedup "
            f"{comp['speedup']:.2f}×, outputs {same}.{note}")
