"""ui/render.py and ui/replay.py on event streams recorded from real engine runs (tests/ui_support.py) and on
the bundled traces: token markup, inspector grid, statistics, comparison, trace files, frames and CSV."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re

import pytest

from dflash.decode import events as ev
from dflash.decode.events import event_to_dict
from dflash.decode.stats import compute_stats
from tests.ui_support import recorded_runs
from ui import render, render_inspector, render_stats
from ui.replay import (Trace, TraceError, bundled_traces, dumps_trace, events_at, frame_label, frames, load_trace_file,
                       metrics_csv, metrics_rows, parse_trace)


@pytest.fixture(scope="module")
def runs():
    return recorded_runs()


def classes(html: str) -> list[str]:
    return re.findall(r'<span class="tok tok-([a-z]+)[^"]*" title=', html)


def commits(events):
    return [e for e in events if isinstance(e, ev.Commit)]


def verifies(events):
    return [e for e in events if isinstance(e, ev.Verify)]


# -- token stream ------------------------------------------------------------------------------------------------
def test_every_committed_token_gets_one_span_with_its_kind(runs):
    events = runs["mixed"]
    spans = render.token_spans(events, show_rejected=False)
    kinds = [("first" if c.block == 0 else k) for c in commits(events) for k in c.kinds]
    assert [re.search(r"tok-([a-z]+)", s).group(1) for s in spans] == kinds
    assert len(spans) == events[-1].stats["n_output_tokens"] == 40
    assert {"draft", "correction", "bonus", "first"} <= set(kinds)  # the recording exercises every kind


def test_rejected_draft_tokens_are_shown_struck_through_before_each_correction(runs):
    events = runs["mixed"]
    seq = classes(render.token_stream_html(events, show_rejected=True))
    expected_rejected = sum(len(v.draft_tokens) - v.accepted_len for v in verifies(events))
    assert seq.count("rejected") == expected_rejected > 0
    for i, c in enumerate(seq):  # a run of rejected tokens always ends at a correction
        if c == "rejected" and (i + 1 == len(seq) or seq[i + 1] != "rejected"):
            assert seq[i + 1] == "correction"
    assert "tok-rejected" not in render.token_stream_html(events, show_rejected=False)


def test_token_markup_snapshot(runs):
    """The first block of the mixed recording, exactly: prefill token, three accepted drafts, the bonus token."""
    spans = render.token_spans(runs["mixed"], show_rejected=True)
    c1 = commits(runs["mixed"])[1]
    assert c1.kinds == ["draft", "draft", "draft", "bonus"]
    assert spans[1] == ('<span class="tok tok-draft" title="block 1 · output token 1 · draft position 1 · accepted draft '
                        f'token · draft confidence 1.00 · target&#x27;s choice “{c1.texts[0]}” ✓">'
                        f'{render.show_text(c1.texts[0])}</span>')
    assert spans[4] == ('<span class="tok tok-bonus" title="block 1 · output token 4 · bonus token: all 3 drafted tokens '
                        f'accepted, the target adds “{c1.texts[3]}”">{render.show_text(c1.texts[3])}</span>')
    assert spans[0].startswith('<span class="tok tok-first" title="block 0 · output token 0 · the target&#x27;s first token')


def test_hover_text_names_block_position_confidence_and_target_choice(runs):
    events = runs["mixed"]
    v = next(v for v in verifies(events) if v.accepted_len < len(v.draft_tokens))
    html = render.token_stream_html(events)
    assert f"block {v.block} · draft position {v.accepted_len + 1} · rejected draft token" in html
    corr = next(s for s in render.token_spans(events, False) if f"block {v.block} · output token" in s and "tok-correction" in s)
    assert f"target chose “{render.attr(v.target_texts[v.accepted_len])}”" in corr


def test_no_draft_runs_are_labelled_as_target_tokens(runs):
    assert set(classes(render.token_stream_html(runs["baseline"]))) == {"first", "target"}
    legend = render.token_header_html(runs["baseline"])
    assert "no draft: plain autoregressive decoding" in legend and "accepted draft token" not in legend


def test_lossy_acceptances_are_marked(runs):
    events = runs["lossy"]
    relaxed = sum(sum(v.relaxed) for v in verifies(events))
    assert relaxed == events[-1].stats["drift_tokens"] >= 1
    html = render.token_stream_html(events)
    assert html.count("tok-relaxed") == relaxed
    assert html.count("accepted by the LOSSY threshold") == relaxed
    # The legend explains the outline in a lossy run (it did not), and only there.
    label, cue = render.TOKEN_STYLES["relaxed"]
    entry = f'<span class="tok tok-draft tok-relaxed">abc</span> {render.attr(label)} <span class="cue">({cue})</span>'
    assert entry in render.token_header_html(events) and "tok-relaxed" not in render.token_header_html(runs["mixed"])


def test_token_text_is_escaped_and_whitespace_made_visible(runs):
    c = commits(runs["mixed"])[1]
    evil = dataclasses.replace(c, texts=['<script>alert("x")</script>', "a\nb", "\x07", ""])
    events = [runs["mixed"][0], evil]
    html = render.token_stream_html(events)
    assert "<script>" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "a↵\nb" in html and "␇" in html and "∅" in html
    assert render.show_text("x\ty") == "x⇥\ty"
    # Rejected tokens and grid cells show a newline without breaking the line.
    assert render.show_text("a\nb", breaks=False) == "a↵b"
    v = next(v for v in verifies(runs["mixed"]) if v.accepted_len < len(v.draft_tokens))
    nl = dataclasses.replace(v, draft_texts=["\n"] * len(v.draft_texts))
    assert all("\n" not in span for span in render._rejected_spans(nl))


def test_placeholder_and_finish_line():
    assert "Press Generate" in render.token_stream_html([])
    assert render.finish_words(None) == ""


def test_legend_prompt_and_finish_reason(runs):
    head = render.token_header_html(runs["mixed"], show_rejected=True)
    for kind in ("draft", "correction", "bonus", "rejected", "first"):
        label, cue = render.TOKEN_STYLES[kind]
        assert f'<span class="tok tok-{kind}">abc</span> {render.attr(label)} <span class="cue">({cue})</span>' in head
    assert "tok-rejected" not in render.token_header_html(runs["mixed"], show_rejected=False)
    assert "<b>Prompt:</b> Once upon a time" in head
    assert render.finish_words(runs["mixed"][-1]) == "Finished (length): reached max new tokens."


def test_the_stream_only_grows_while_a_run_goes_on(runs):
    """Each value extends the previous one, so Gradio sends only the appended part."""
    events = runs["mixed"]
    prev = ""
    for i, e in enumerate(events):
        if isinstance(e, ev.Commit):
            html = render.token_stream_html(events[: i + 1])
            assert html.startswith(prev)
            prev = html


# -- block inspector ---------------------------------------------------------------------------------------------
def test_inspector_grid_rows_are_denoising_steps_then_the_verdict(runs):
    events = runs["denoise"]
    blocks = render.group_blocks(events)
    info = blocks[1]
    grid = render_inspector.inspector_grid(info)
    assert len(grid) == len(info.steps) + 1 and len(info.steps) >= 2
    n = info.verify.block_size
    # Each drafted position is committed at exactly one step and stays MASK before it.
    for pos in range(1, n):
        kinds = [row[pos]["kind"] for row in grid[:-1]]
        assert kinds.count("new") == 1
        first = kinds.index("new")
        assert set(kinds[:first]) <= {"mask"} and set(kinds[first + 1:]) <= {"old"}
    assert grid[0][0]["kind"] == "anchor" and any(c["kind"] == "mask" for c in grid[0])
    verdict = [c["kind"] for c in grid[-1][1:]]
    a = info.verify.accepted_len
    assert verdict[:a] == ["ok"] * a
    if a < n - 1:
        assert verdict[a] == "bad" and grid[-1][a + 1]["text"] == info.verify.target_texts[a]
        assert set(verdict[a + 1:]) <= {"skip"}


def test_inspector_html_shows_masks_commits_and_the_first_rejection(runs):
    events = runs["denoise"]
    html = render_inspector.inspector_html(events, block=1)
    assert "Block 1:" in html and 'class="cell-mask"' in html and 'class="cell-new"' in html
    assert html.count("<tr class=\"row-step\">") == len(render.group_blocks(events)[1].steps)
    v = render.group_blocks(events)[1].verify
    if v.accepted_len < len(v.draft_tokens):
        assert 'class="v-bad"' in html and "✗" in html
    # No block chosen (or one that doesn't exist): the latest.
    last = max(render.group_blocks(events))
    assert f"Block {last}:" in render_inspector.inspector_html(events)
    assert f"Block {last}:" in render_inspector.inspector_html(events, block=999)
    # …and says so: the block box showed 999 beside the latest block's grid, with nothing to tell them apart.
    assert "Block 999 is not reached at this point of the run" in render_inspector.inspector_html(events, block=999)
    assert "not reached" not in render_inspector.inspector_html(events) + render_inspector.inspector_html(events, block=1)


def test_inspector_verdict_row_matches_verify_events(runs):
    for v in verifies(runs["mixed"]):
        html = render_inspector.inspector_html(runs["mixed"], block=v.block)
        verdict = html.split('class="row-verify"', 1)[1].split("</tr>", 1)[0]
        assert verdict.count('class="v-ok"') == v.accepted_len
        assert verdict.count('class="v-bad"') == (1 if v.accepted_len < len(v.draft_tokens) else 0)
        if v.accepted_len == len(v.draft_tokens):
            assert "(bonus)" in html
    assert "no draft — the target decodes one token" in render_inspector.inspector_html(runs["baseline"], block=3)


def test_block_summary_sentences(runs):
    blocks = render.group_blocks(runs["mixed"])
    full = next(b for b in blocks.values() if b.verify and b.verify.accepted_len == len(b.verify.draft_tokens))
    part = next(b for b in blocks.values() if b.verify and b.verify.accepted_len < len(b.verify.draft_tokens))
    assert f"all {len(full.verify.draft_tokens)} drafted tokens accepted, +1 bonus token" in render_inspector.block_summary(full)
    assert f"rejected at position {part.verify.accepted_len + 1}" in render_inspector.block_summary(part)
    # A run that ends inside the block (EOS, max new tokens) outputs fewer tokens than were verified: the sentence
    # said "→ 3 tokens" where the stream shows 1.
    n = full.verify.accepted_len + 1
    cut = dataclasses.replace(full, commit=dataclasses.replace(full.commit, token_ids=full.commit.token_ids[:1]))
    assert render_inspector.block_summary(cut).endswith(f"→ {n} tokens verified; the answer ended after 1 of them.")
    assert render_inspector.block_summary(full).endswith(f"→ {n} tokens.")
    one = dataclasses.replace(full.verify, draft_tokens=full.verify.draft_tokens[:1], draft_texts=full.verify.draft_texts[:1],
                              accepted_len=0)
    assert "0 of 1 drafted token accepted" in render_inspector.block_summary(dataclasses.replace(full, verify=one, commit=None))
    assert render.count(1, "token") == "1 token" and render.count(0, "position") == "0 positions"


def test_copied_blocks_have_their_own_token_kind_legend_inspector_rows_and_badge(runs):
    """A run that copies from the context (lookup_ngram): accepted copied tokens are `tok-copy` with a hover text
    that says so, the legend explains them, the inspector labels the block's row "copied" and its summary says the
    tokens were copied, and the statistics say how many blocks were copied."""
    events = runs["copy"]
    s = compute_stats(events)
    copied = [v for v in verifies(events) if v.source == ev.COPY]
    assert copied and s["copy_blocks"] == len(copied) < s["n_verify"]  # copied and drafted blocks both
    kinds = [("first" if c.block == 0 else k) for c in commits(events) for k in c.kinds]
    spans = render.token_spans(events, show_rejected=False)
    assert [re.search(r"tok-([a-z]+)", x).group(1) for x in spans] == kinds and "copy" in kinds
    assert "copied from an earlier occurrence in the context" in spans[kinds.index("copy")]
    label, cue = render.TOKEN_STYLES["copy"]
    legend = f'<span class="tok tok-copy">abc</span> {render.attr(label)}'
    assert legend in render.token_header_html(events) and legend not in render.token_header_html(runs["mixed"])
    block = render.group_blocks(events)[copied[0].block]
    summary = render_inspector.block_summary(block)
    assert "copied from the context (no draft pass)" in summary
    html = render_inspector.inspector_html(events, copied[0].block)
    assert '<th scope="row">copied</th>' in html and "step 1/1" not in html
    assert html.count('<td class="cell-copy"') == len(copied[0].draft_tokens) and "cell-new" not in html
    drafted = next(v for v in verifies(events) if v.source == ev.DRAFT and v.draft_tokens)
    assert "copied" not in render_inspector.block_summary(render.group_blocks(events)[drafted.block])
    assert f"{s['copy_blocks']} of {s['n_verify']} blocks copied from the context" in render_stats.stats_html(events)
    assert "blocks copied" not in render_stats.stats_html(runs["mixed"])


# -- statistics and comparison -----------------------------------------------------------------------------------
def test_stats_panel_carries_the_engine_statistics(runs):
    events = runs["mixed"]
    s = compute_stats(events)
    html = render_stats.stats_html(events)
    assert f'data-tau="{s["tau"]:.4f}"' in html and f'data-n-out="{s["n_output_tokens"]}"' in html
    assert f">{s['tau']:.2f}<" in html and "time to first token" in html and "draft / verify time" in html
    assert "LOSSY" not in html
    assert "LOSSY" in render_stats.stats_html(runs["lossy"])
    # Mid-run (no Finished yet) the panel computes the same numbers from the events so far.
    part = events[: len(events) // 2]
    assert f'data-tau="{compute_stats(part)["tau"]:.4f}"' in render_stats.stats_html(part)


def test_comparison_with_the_baseline(runs):
    comp = render_stats.comparison(runs["mixed"], runs["baseline"])
    assert comp["identical"] and comp["first_diff"] is None and comp["n_compared"] == 40
    assert comp["speedup"] == pytest.approx(runs["mixed"][-1].stats["tokens_per_s"] / runs["baseline"][-1].stats["tokens_per_s"])
    html = render_stats.stats_html(runs["mixed"], comp)
    assert "✓ identical" in html and "speedup" in html
    lossy = render_stats.comparison(runs["lossy"], runs["baseline"])
    a, b = runs["lossy"][-1].output_ids, runs["baseline"][-1].output_ids
    first = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
    assert not lossy["identical"] and lossy["first_diff"] == first
    html = render_stats.stats_html(runs["lossy"], lossy).replace("&#x27;", "'")
    assert f"differs from the target's own output at token {first}: expected, the run is lossy" in html


def test_a_comparison_takes_its_speeds_from_the_run_timed_beside_the_baseline(runs):
    """The playground times the run again next to the baseline (both drawn alike): speeds from that timed run, the
    identity from the run shown, the live rate kept and said; without a timed run nothing is said about timing."""
    timed = runs["baseline"]  # any other finished run: its speed must be the one compared
    comp = render_stats.comparison(runs["mixed"], runs["baseline"], timed=timed)
    assert comp["run_tokens_per_s"] == pytest.approx(timed[-1].stats["tokens_per_s"]) and comp["speedup"] == pytest.approx(1.0)
    assert comp["live_tokens_per_s"] == pytest.approx(runs["mixed"][-1].stats["tokens_per_s"])
    assert comp["identical"] and comp["n_compared"] == 40  # the shown run's output against the baseline's
    html = render_stats.stats_html(runs["mixed"], comp)
    assert "timed again right before the baseline" in html and f"the run went at {comp['live_tokens_per_s']:.1f} tok/s" in html
    plain = render_stats.comparison(runs["mixed"], runs["baseline"])  # a loaded trace: its own events only
    assert plain["live_tokens_per_s"] is None and "timed again" not in render_stats.stats_html(runs["mixed"], plain)


def test_a_difference_is_diagnosed_from_both_runs_recorded_gaps(runs):
    """The diagnosis reads the top-2 gaps the two runs recorded at the first difference; a float32 difference is
    never a tie, an unknown dtype is shown as unknown (nothing from a trace's meta reaches the page unchecked)."""
    from dflash.decode.stats import output_gaps

    comp = render_stats.comparison(runs["lossy"], runs["baseline"], "float32")
    d, k = comp["diagnosis"], comp["first_diff"]
    assert d["position"] == k and d["verdict"] == "error" and d["bound"] == 0.0
    assert (d["ref_gap"], d["run_gap"]) == (output_gaps(runs["baseline"])[k], output_gaps(runs["lossy"])[k])
    assert comp["dtype"] == "float32"
    assert render_stats.comparison(runs["mixed"], runs["baseline"], "float32")["diagnosis"] is None
    assert render_stats.comparison(runs["lossy"], runs["baseline"], '<img src=x onerror="alert(1)">')["dtype"] == ""


def _compared(diagnosis: dict | None, dtype: str = "bfloat16", lossy: bool = False) -> dict:
    return {"identical": diagnosis is None, "first_diff": diagnosis and diagnosis["position"], "diagnosis": diagnosis,
            "dtype": dtype, "lossy": lossy, "baseline_tokens_per_s": 10.0, "speedup": 1.5, "n_compared": 4}


def test_difference_words_say_tie_or_bug(runs, monkeypatch):
    from dflash.decode import stats

    monkeypatch.setitem(stats.TIE_BOUND, "bfloat16", 0.25)
    words = render_stats.difference_words

    def diag(ref_gaps, run_gaps, dtype="bfloat16", run=(1, 7)):
        return stats.diagnose_difference([1, 2], ref_gaps, list(run), run_gaps, dtype)

    assert words(_compared(diag([1.0, 0.03], [1.0, 0.05]))) == "numerical tie (top-2 gaps 0.03 / 0.05 ≤ 0.25, bfloat16)"
    assert words(_compared(diag([1.0, 0.9], [1.0, 1.2]))) == "NOT a tie (top-2 gaps 0.9 / 1.2, bound 0.25, bfloat16) — a bug"
    assert words(_compared(diag([1.0, 0.0], [1.0, 0.0], "float32"), "float32")) == (
        "NOT a tie (top-2 gaps 0 / 0, no tie bound, float32) — a bug")
    assert words(_compared(diag([1.0, 0.03], [1.0, 0.05], ""), "")) == (
        "NOT a tie (top-2 gaps 0.03 / 0.05, no tie bound, unknown dtype) — a bug")
    assert words(_compared(diag(None, [1.0, 0.05]))).startswith("not shown to be a tie (no top-2 gaps recorded")
    assert words(_compared(diag([1.0, 0.03], [1.0], run=(1,)))) == "NOT a tie (one output ends there) — a bug"
    assert words(_compared(diag([1.0, 0.9], [1.0, 1.2]), lossy=True)).startswith("expected, the run is lossy")
    html = render_stats.stats_html(runs["mixed"], _compared(diag([1.0, 0.03], [1.0, 0.05])))
    assert "≈ identical up to a numerical tie at token 1" in html  # said neutrally, the diagnosis on hover
    assert 'title="numerical tie (top-2 gaps 0.03 / 0.05 ≤ 0.25, bfloat16)"' in html


# -- traces and replay -------------------------------------------------------------------------------------------
def test_trace_round_trip_and_cli_jsonl(runs):
    t = Trace(runs["mixed"], {"title": "mixed"}, runs["baseline"])
    back = parse_trace(dumps_trace(t))
    assert back.events == runs["mixed"] and back.baseline == runs["baseline"] and back.meta == {"title": "mixed"}
    jsonl = "\n".join(json.dumps(event_to_dict(e)) for e in runs["denoise"])  # `generate --trace` format
    assert parse_trace(jsonl).events == runs["denoise"]


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("{not json", "line 1 is not valid JSON"),
    ('{"format": "dflash-trace", "version": 9, "events": []}', "version 9 is not supported"),
    ('{"format": "dflash-trace", "version": 1, "events": [{"type": "Hack"}]}', "not a DFlash event"),
    ('{"format": "dflash-trace", "version": 1, "events": [{"type": "Prefill", "n_prompt_tokens": 1, "ms": 1}]}',
     "first event must be Started"),
    ('{"format": "dflash-trace", "version": 1, "events": [{"type": "Prefill", "bogus": 1}]}', "missing or unknown fields"),
    ('[1, 2]', "not a DFlash trace"),
])
def test_bad_traces_give_clear_errors(text, message):
    with pytest.raises(TraceError, match=re.escape(message)):
        parse_trace(text)


def test_frames_step_through_draft_steps_and_commits(runs):
    events = runs["denoise"]
    idx = frames(events)
    n_steps = sum(isinstance(e, ev.DraftStep) for e in events)
    assert len(idx) == 1 + n_steps + len(commits(events)) + 1
    assert events_at(events, len(idx) - 1) == events and events_at(events, 999) == events
    assert events_at(events, 0) == events[:1]
    assert "the request starts" in frame_label(events, 0)
    first_step = next(i for i, k in enumerate(idx) if isinstance(events[k], ev.DraftStep))
    assert "DRAFT — denoising step 1 of 3" in frame_label(events, first_step)
    first_verify = next(i for i, k in enumerate(idx) if isinstance(events[k], ev.Commit) and events[k].block == 1)
    assert "block 1, VERIFY → ACCEPT" in frame_label(events, first_verify)
    # A commit cut at the end of the answer has no bonus or correction token: the label did say "+1 target token".
    at = idx[first_verify]
    cut = dataclasses.replace(events[at], token_ids=events[at].token_ids[:1], kinds=[ev.DRAFT])
    label = frame_label(events[:at] + [cut] + events[at + 1:], first_verify)
    assert "1 draft token accepted (the answer ends in this block)" in label and "+1" not in label
    # Rendering any prefix works (replay draws every panel from events_at).
    for f in range(len(idx)):
        part = events_at(events, f)
        render.token_stream_html(part), render_inspector.inspector_html(part), render_stats.stats_html(part)


def test_metrics_csv_has_one_row_per_commit(runs):
    events = runs["mixed"]
    rows = list(csv.DictReader(io.StringIO(metrics_csv(events))))
    assert len(rows) == len(commits(events))
    assert [int(r["accepted"]) for r in rows[1:]] == [v.accepted_len for v in verifies(events)]
    assert rows[-1]["n_out"] == "40" and rows[0]["controller"] == "prefill"
    assert metrics_rows(events)[1]["controller"].startswith("start at")
    # Token kinds as the page names them: the prefill's token is "first" (it said "bonus"), no-draft tokens "target".
    assert rows[0]["kinds"] == "first" and rows[1]["kinds"] == "draft draft draft bonus"
    base = metrics_rows(runs["baseline"])
    assert base[0]["kinds"] == "first" and {r["kinds"] for r in base[1:]} == {"target"}


def test_csv_cells_cannot_start_formulas():
    from ui.replay import history_csv

    out = history_csv([{"a": "=cmd()", "b": "+1", "c": "ok"}], ["a", "b", "c"])
    assert out.splitlines()[1] == "'=cmd(),'+1,ok"


def test_bundled_traces_replay_without_a_model():
    traces = bundled_traces()
    assert 2 <= len(traces) <= 5  # a handful: prose (Paper method), code, maths, copy, the default chain
    for label, path in traces.items():
        t = load_trace_file(path)
        assert isinstance(t.events[0], ev.Started) and isinstance(t.events[-1], ev.Finished)
        assert t.meta["title"] == label and t.meta.get("hardware")
        assert t.events[-1].stats == compute_stats(t.events[:-1])  # stats recomputable from the events
        assert t.events[-1].stats["n_output_tokens"] > 0
        html = render.token_stream_html(t.events)
        assert len(re.findall(r'class="tok tok-(?!rejected)', html)) == t.events[-1].stats["n_output_tokens"]
        if t.baseline:  # lossless runs match the target's own output, or part from it at a diagnosed bfloat16 tie
            dtype = t.meta.get("dtype") or ("bfloat16" if "bfloat16" in t.meta.get("hardware", "") else "")
            comp = render_stats.comparison(t.events, t.baseline, dtype)
            assert comp["identical"] or t.events[0].lossy or comp["diagnosis"]["verdict"] == "tie", (label, comp)


def test_compare_status_line_says_why_the_outputs_differ(tmp_path):
    """Compare with autoregressive on a tiny real engine: identical for an exact run; for a lossy run the first
    difference, said to be expected; the history row follows."""
    from tests.ui_support import tiny_text_engine
    from ui.engines import EngineProvider
    from ui.handlers import CONTROL_KEYS, Playground, defaults

    pg = Playground(EngineProvider({"default": tiny_text_engine(block_size=8)}), export_root=str(tmp_path))

    def compared(**over) -> dict:
        values = {**{k: defaults(8)[k] for k in CONTROL_KEYS}, "prompt": "Once upon a time", "max_new_tokens": 30, **over}
        run = list(pg.generate(values, [], "s"))[-1]
        return list(pg.compare(run["trace"], run["history"], False, "s"))[-1]

    assert "outputs ✓ identical." in compared()["status"]
    lossy = compared(acceptance=0.05, block_size=4)
    comp = render_stats.comparison(lossy["trace"]["replay"].trace.events, lossy["trace"]["replay"].trace.baseline,
                                   "float32")
    k = comp["first_diff"]
    assert k is not None and comp["diagnosis"]["verdict"] == "error"
    assert (f"outputs ✗ differs from the target's own output at token {k}: expected, the run is lossy (acceptance "
            "threshold below 1)"
            in lossy["status"])
    assert lossy["history"][-1]["identical"] == f"✗ at {k}"


def test_a_timed_rerun_whose_output_differed_is_said_in_its_own_sentence():
    """It followed the difference's parenthesis as another one: "… (acceptance threshold below 1). (the timed …"."""
    comp = {"identical": False, "first_diff": 1, "lossy": True, "diagnosis": {}, "dtype": "float32",
            "run_tokens_per_s": 2.0, "baseline_tokens_per_s": 4.0, "speedup": 0.5}
    status = render_stats.compared_status(comp, timed=True, repeated=False)
    assert status.endswith("(acceptance threshold below 1). The timed run's output differed from the shown run's; "
                           "the speeds are the timed run's.")
    assert "differed" not in render_stats.compared_status(comp, timed=True, repeated=True)


def test_copied_blocks_are_described_as_copies_everywhere(runs):
    """Hover text, inspector summary, grid tips, verdict line and key, replay narration and the metrics CSV say a
    copied block was copied from the context (before, several of them called it a draft)."""
    events = runs["copy"]
    vs = [v for v in events if isinstance(v, ev.Verify)]
    copies = [v for v in vs if v.source == ev.COPY]
    rejected = next(v for v in copies if v.accepted_len < len(v.draft_tokens))
    spans = " ".join(render.token_spans(events, show_rejected=True))
    assert f"block {rejected.block} · block position {rejected.accepted_len + 1} · rejected copied token" in spans
    html = render_inspector.inspector_html(events, rejected.block)
    assert "tokens copied from the context (no draft pass) accepted" in html and "rejected: copy " in html
    assert "copied (no draft pass)" in html and "wavy underline</span> = copied from the context" in html
    assert "draft confidence" not in html and " · draft " not in html
    drafted = next(v for v in vs if v.source == ev.DRAFT and v.draft_tokens)
    assert "shading = draft confidence" in render_inspector.inspector_html(events, drafted.block)
    idx = frames(events)
    labels = {events[i].block: frame_label(events, f) for f, i in enumerate(idx)
              if isinstance(events[i], ev.Commit) and events[i].block == rejected.block}
    assert f"{rejected.accepted_len} copied tokens accepted" in labels[rejected.block]
    steps = [frame_label(events, f) for f, i in enumerate(idx) if isinstance(events[i], ev.DraftStep)
             and events[i].block == rejected.block]
    assert steps and all("COPY — " in s and "DRAFT" not in s for s in steps)
    rows = {int(r["block"]): r for r in csv.DictReader(io.StringIO(metrics_csv(events)))}
    assert rows[rejected.block]["source"] == "copy" and rows[rejected.block]["denoising_steps"] == "0"
    assert rows[drafted.block]["source"] == "draft" and rows[drafted.block]["denoising_steps"] == "1"
    assert int(rows[rejected.block]["proposed"]) == len(rejected.draft_tokens)


def test_history_shows_no_lookup_for_a_run_without_a_draft(runs):
    """The engine copies only where a draft runs, so a no-draft run's history row says lookup 0 whatever was asked."""
    from ui.exports import history_row

    events = runs["copy"]
    assert history_row(1, "generate", "default", events)["lookup"] == 1
    st = events[0]
    no_draft = [dataclasses.replace(st, has_draft=False)] + events[1:]
    row = history_row(2, "generate", "default", no_draft)
    assert row["lookup"] == 0 and row["block"] == 1 and row["draft"] == "no"
