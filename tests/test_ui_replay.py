"""ui/replay.py, ui/trace_schema.py and ui/run_state.py on hostile and real traces: every field of an uploaded trace
is checked for type and range when it is parsed (a named error, never markup), every value that reaches the page
is escaped, the running state equals a rebuild from the first event, and a replay frame processes only its own
events."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest

from dflash.decode import events as ev
from dflash.decode.stats import compute_stats
from tests.ui_support import recorded_runs
from ui import render, render_inspector, render_stats
from ui.engines import EngineProvider
from ui.handlers import Playground, Settings, view
from ui.replay import (MAX_RUN_EVENTS, MAX_TRACE_EVENTS, TRACES_DIR, TraceError, bundled_traces, events_at, frames,
                       load_trace_file, parse_trace)
from ui.run_state import RunState

MARKUP = '<img src=x onerror="alert(1)">'


@pytest.fixture(scope="module")
def runs():
    return recorded_runs()


@pytest.fixture(scope="module")
def code_doc() -> dict:
    """The bundled 'code' trace as a JSON document: 2 denoising steps per block, with its baseline."""
    return json.loads((TRACES_DIR / "code.json").read_text(encoding="utf-8"))


@pytest.fixture
def playground(tmp_path):
    return Playground(EngineProvider({}), Settings(play_delay_s=0.0), export_root=str(tmp_path / "exports"))


def index_of(doc: dict, kind: str, nth: int = 0, key: str = "events") -> int:
    return [i for i, d in enumerate(doc[key]) if d["type"] == kind][nth]


def tampered(doc: dict, kind: str, field: str, value, nth: int = 0, key: str = "events") -> tuple[str, str]:
    """(the document as JSON with one field of one event replaced, the place the error must name)."""
    d = copy.deepcopy(doc)
    i = index_of(d, kind, nth, key)
    d[key][i][field] = value
    return json.dumps(d), f"{key}[{i}] ({kind})"


def refused(text: str) -> str:
    with pytest.raises(TraceError) as info:
        parse_trace(text)
    message = str(info.value)
    assert not re.search(r"[<>&]", message), message  # never markup in the message the page shows
    return message


# -- every field is checked ------------------------------------------------------------------------------------
HOSTILE = [
    ("BlockSize", "size", MARKUP, "'size' must be an integer in [1, 64], got text of 30 characters"),
    ("BlockSize", "size", -4, "'size' must be an integer in [1, 64], got -4"),
    ("BlockSize", "size", 10**30, "'size' must be an integer in [1, 64], got a very large number"),
    ("BlockSize", "block", 2.5, "'block' must be an integer in [0, 4096], got 2.5"),
    ("BlockSize", "reason", ["x"], "'reason' must be text"),
    ("DraftStep", "n_steps", 10**9, "'n_steps' must be an integer in [1, 16]"),
    ("DraftStep", "step", "0", "'step' must be an integer"),
    ("DraftStep", "start", -1, "'start' must be an integer in [0, "),
    ("Verify", "accepted_len", True, "'accepted_len' must be an integer"),
    ("Verify", "accepted_len", 40, "'accepted_len' must be at most the number of drafted tokens"),
    ("Verify", "draft_ms", math.nan, "'draft_ms' must be a finite number in [0, "),
    ("Verify", "verify_ms", math.inf, "'verify_ms' must be a finite number in [0, "),
    ("Verify", "block_size", 10**6, "'block_size' must be an integer in [1, 64]"),
    ("Verify", "draft_texts", [MARKUP], "'draft_texts' must have one entry per drafted token"),
    ("Verify", "target_tokens", [1, 2], "'target_tokens' must have one entry per drafted token, plus one"),
    ("Prefill", "ms", -1.0, "'ms' must be a finite number in [0, "),
    ("Prefill", "n_prompt_tokens", MARKUP, "'n_prompt_tokens' must be an integer"),
    ("Commit", "kinds", [MARKUP], "'kinds' must be a list of draft or copy or correction or bonus"),
    ("BlockSize", "source", MARKUP, "'source' must be one of draft, copy, got text of 30 characters"),
    ("Verify", "source", 1, "'source' must be one of draft, copy, got 1"),
    ("Commit", "texts", "abc", "'texts' must be a list of text"),
    ("Commit", "token_ids", [-1], "'token_ids' must be a list of integers in [0, "),
    ("Commit", "n_out", 10**12, "'n_out' must be an integer in [0, 4096]"),
    ("Commit", "t_ms", math.inf, "'t_ms' must be a finite number"),
    ("Commit", "confidences", [math.nan], "'confidences' must be a list of finite numbers in [-1.0, 1.0]"),
    ("Commit", "target_gaps", ["0.5"], "'target_gaps' must be a list of finite numbers in [0.0, 3.403e+38], at most 64"),
    ("Commit", "target_gaps", [math.nan], "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", [math.inf], "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", [-0.5], "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", [True], "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", [0.5] * 10**5, "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", MARKUP, "'target_gaps' must be a list of finite numbers in [0.0, "),
    ("Commit", "target_gaps", [0.5, 0.5], "'target_gaps' must be empty or have one entry per token"),
    ("Started", "has_draft", "yes", "'has_draft' must be true or false"),
    ("Started", "request", MARKUP, "'request' must be an object"),
    ("Started", "trained_block_size", 10**9, "'trained_block_size' must be an integer in [1, 64]"),
    ("Started", "prompt_ids", [1.5], "'prompt_ids' must be a list of integers"),
    ("Started", "mask_token_id", -5, "'mask_token_id' must be an integer in [0, "),
    ("Finished", "reason", MARKUP, "'reason' must be one of eos, length, stop, cancelled, timeout, error"),
    ("Finished", "output_ids", "x", "'output_ids' must be a list of integers"),
    ("Finished", "message", {"a": 1}, "'message' must be text"),
    ("Finished", "stats", {"tau": MARKUP}, "'stats' does not match the run's events"),
    ("Finished", "stats", [], "'stats' must be an object"),
]


@pytest.mark.parametrize("kind, field, value, message", HOSTILE, ids=[f"{k}.{f}={str(v)[:12]}" for k, f, v, _ in HOSTILE])
def test_every_field_is_checked_for_type_and_range(code_doc, kind, field, value, message):
    text, where = tampered(code_doc, kind, field, value)
    got = refused(text)
    assert got.startswith(f"trace: {where}: ") and message in got


def test_baseline_events_are_checked_too(code_doc):
    text, where = tampered(code_doc, "Verify", "block_size", "8", key="baseline")
    assert where.startswith("baseline[")
    assert refused(text).startswith(f"trace: {where}: 'block_size' must be an integer")


def test_request_fields_are_checked_by_the_request_rules(code_doc):
    request = dict(code_doc["events"][0]["request"], block_size=MARKUP)
    text, where = tampered(code_doc, "Started", "request", request)
    assert refused(text).startswith(f"trace: {where}: 'request.block_size' must be an integer in [1, 64], got text")
    request = dict(code_doc["events"][0]["request"], **{MARKUP: 1})
    text, _ = tampered(code_doc, "Started", "request", request)
    assert "'request' has unknown fields" in refused(text)


def test_a_trace_recorded_with_a_block_below_the_minimum_still_loads(code_doc):
    """The engine once lowered the minimum to such a block (today's Request refuses it): those traces stay readable."""
    doc = copy.deepcopy(code_doc)
    doc["events"][0]["request"] = dict(doc["events"][0]["request"], block_size=1, min_block_size=2)
    assert parse_trace(json.dumps(doc))


def test_json_lines_errors_name_the_line(code_doc):
    lines = [json.dumps(d) for d in code_doc["events"]]
    i = index_of(code_doc, "BlockSize", 2)
    bad = dict(code_doc["events"][i], size=MARKUP)
    lines[i] = json.dumps(bad)
    assert refused("\n".join(lines)).startswith(f"trace: line {i + 1} (BlockSize): 'size' must be an integer")


@pytest.mark.parametrize("text, message", [
    ('{"format": "dflash-trace", "version": 1, "events": [' + "1" * 5000 + "]}",
     "trace: line 1 is not valid JSON (a number of more than 4300 digits)"),
    ("[" * 100_000 + "]" * 100_000, "trace: line 1 is not valid JSON (nested more than 100 levels deep)"),
    ('{"format": "dflash-trace", "version": 1, "meta": {"title": "' + "x" * 5000 + '"}, "events": []}',
     "'meta.title' must be text of at most 1000 characters"),
])
def test_unreadable_numbers_deep_nesting_and_long_meta_are_named_errors(text, message):
    assert message in refused(text)


def test_errors_name_the_real_line_and_reason(code_doc):
    """Before, the text was stripped first (blank lines before the first event shifted every line number to 1) and
    any decoding failure read "line 1 is not valid JSON"."""
    lines = [json.dumps(d) for d in code_doc["events"]]
    blank = "\n" * 200_000
    assert len(parse_trace(blank + "\n".join(lines)).events) == len(lines)  # blank lines are not counted as events
    assert len(parse_trace(blank + lines[0] + "\n" + blank).events) == 1
    lines[3] = "[" * 100_000 + "]" * 100_000
    assert refused(blank + "\n".join(lines)) == "trace: line 200004 is not valid JSON (nested more than 100 levels deep)"
    lines[3] = lines[3][:50]
    assert refused(blank + "\n".join(lines)).startswith("trace: line 200004 is not valid JSON (expecting")
    lines[0] = lines[0][:-1]  # the first line broken: the same message, not "not a DFlash trace"
    assert refused(blank + "\n".join(lines)).startswith("trace: line 200001 is not valid JSON (expecting")
    pretty = json.dumps(code_doc, indent=1).splitlines()
    pretty[40] = pretty[40].replace(",", ";", 1)
    assert refused("\n".join(pretty)).startswith("trace: line 41 is not valid JSON (expecting")
    bad_event = dict(code_doc["events"][0], type="Nope")
    assert refused(blank + json.dumps(bad_event)).startswith("trace: line 200001 is not a DFlash event")


def test_a_byte_order_mark_and_line_separators_in_strings_are_read(code_doc, tmp_path):
    doc = copy.deepcopy(code_doc)
    doc["meta"]["note"] = "two\u2028lines"  # a separator str.splitlines() would cut at
    path = tmp_path / "bom.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8-sig")
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf" and load_trace_file(path).meta["note"] == "two\u2028lines"
    doc["events"][0]["prompt_text"] = "a\u2028b"
    path.write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in doc["events"]), encoding="utf-8-sig")
    assert load_trace_file(path).events[0].prompt_text == "a\u2028b"  # JSON lines with a BOM
    path.write_bytes(b"\n\n" + json.dumps(doc["events"][0]).encode() + b"\n\xff\n")
    with pytest.raises(TraceError, match=r"^trace: line 4 is not UTF-8 text$"):
        load_trace_file(path)


def test_events_must_keep_the_order_of_a_run(code_doc):
    d = copy.deepcopy(code_doc)
    v, c = index_of(d, "Verify"), index_of(d, "Commit", 1)
    d["events"][v], d["events"][c] = d["events"][c], d["events"][v]  # block 1's Commit before its Verify
    assert f"trace: events[{v}] (Commit): comes out of order" in refused(json.dumps(d))
    d = copy.deepcopy(code_doc)
    c = index_of(d, "Commit", 1)
    d["events"].insert(c + 1, d["events"][c])  # block 1 committed twice
    assert f"trace: events[{c + 1}] (Commit): comes out of order" in refused(json.dumps(d))


def test_uploads_are_bounded_by_named_limits(code_doc):
    d = copy.deepcopy(code_doc)
    d["events"] = d["events"][:2] + [d["events"][1]] * MAX_RUN_EVENTS
    assert f"the run has more than {MAX_RUN_EVENTS} events" in refused(json.dumps(d))
    lines = "\n".join(["{}"] * (MAX_TRACE_EVENTS + 1))
    assert f"more than {MAX_TRACE_EVENTS} lines" in refused(lines)
    assert MAX_RUN_EVENTS < MAX_TRACE_EVENTS <= 200_000


def test_every_event_field_has_a_rule():
    from ui.trace_schema import FIELD_RULES

    for name, cls in ev.EVENT_TYPES.items():
        assert set(FIELD_RULES[name]) == {f.name for f in dataclasses.fields(cls)}, name


def test_recorded_runs_and_bundled_traces_pass_the_checks(runs):
    from ui.replay import Trace, dumps_trace

    for events in runs.values():
        assert parse_trace(dumps_trace(Trace(events, {}))).events == events
    for path in bundled_traces().values():
        assert load_trace_file(path).events


def test_traces_with_and_without_target_gaps_load(runs, code_doc):
    """New greedy traces carry the target's top-2 gaps and keep them; traces recorded before the gaps load with
    none (and a Commit may leave them empty, as a sampled run does)."""
    from ui.replay import Trace, dumps_trace

    commits = [e for e in parse_trace(dumps_trace(Trace(runs["mixed"], {}))).events if isinstance(e, ev.Commit)]
    assert all(len(c.target_gaps) == len(c.token_ids) > 0 for c in commits)
    assert not any("target_gaps" in d for d in code_doc["events"])  # recorded before the gaps
    old = [e for e in parse_trace(json.dumps(code_doc)).events if isinstance(e, ev.Commit)]
    assert old and all(c.target_gaps == [] for c in old)
    text, _ = tampered(code_doc, "Commit", "target_gaps", [0.0])
    assert next(e for e in parse_trace(text).events if isinstance(e, ev.Commit)).target_gaps == [0.0]


# -- everything that reaches the page is escaped -----------------------------------------------------------------
def with_markup_in_every_string(doc: dict, markup: str = MARKUP) -> dict:
    """Markup prepended to every free-text field of every event and of the meta (kinds and finish reasons are
    names from a fixed list, checked above)."""
    d = copy.deepcopy(doc)
    d["meta"] = {k: markup for k in ("title", "note", "hardware", "model", "recorded")}
    for key in ("events", "baseline"):
        for e in d[key]:
            for f, v in e.items():
                if f in ("type", "kinds") or (e["type"] == "Finished" and f == "reason"):
                    continue
                if isinstance(v, str):
                    e[f] = markup + v
                elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                    e[f] = [markup + x for x in v]
            if e["type"] == "Started":
                e["request"]["prompt"] = markup + e["request"]["prompt"]
    return d


def strings_in(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in strings_in(v)]
    return []


def test_markup_in_every_string_field_is_escaped_in_every_panel_of_every_frame(code_doc, playground, tmp_path):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(with_markup_in_every_string(code_doc)), encoding="utf-8")
    loaded = playground.load_upload(str(path), True)
    assert "<img" not in loaded["status"] and "&lt;img" in loaded["status"]
    state = loaded["trace"]
    n = len(frames(state["replay"].trace.events))
    outs = [loaded] + [playground.show_frame(state, f, b, s) for f in range(n) for b, s in ((0, True), (f % 5, False))]
    for out in outs:
        for key in ("legend", "tokens", "inspector", "stats", "status", "replay_label"):
            assert "<img" not in out.get(key, ""), (key, out.get(key))
        for key in ("block_length", "histogram", "positions", "throughput"):
            if key in out:  # plotly draws a few tags (b, i, a …) in annotations and hover text
                texts = strings_in(out[key].to_plotly_json())
                assert not any("<img" in s or "<a " in s for s in texts), key
    final = playground.show_frame(state, n - 1, 0, True)
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in final["tokens"]
    assert "&lt;img" in final["inspector"] and "&lt;img" in final["legend"]
    notes = [a["text"] for a in final["block_length"].to_plotly_json()["layout"]["annotations"]]
    hover = final["block_length"].to_plotly_json()["data"][0]["hovertext"]
    assert all("&lt;img" in h for h in hover) and all("<" not in t for t in notes)


def test_render_escapes_values_it_did_not_make(runs):
    """Defence in depth, below the parser: values of the wrong kind still come out as text."""
    events = runs["denoise"]
    c = next(i for i, e in enumerate(events) if isinstance(e, ev.Commit) and e.block == 1)
    odd = 'x" onmouseover="alert(1)'
    evil = list(events)
    evil[c] = dataclasses.replace(events[c], kinds=[odd] * len(events[c].kinds))
    html = render.token_stream_html(evil[: c + 1])
    assert "onmouseover" not in html and 'class="tok tok-' in html
    s = next(i for i, e in enumerate(events) if isinstance(e, ev.DraftStep))
    evil[s] = dataclasses.replace(events[s], n_steps=MARKUP)
    assert "<img" not in render_inspector.inspector_html(evil[: s + 1], block=1)
    fin = events[-1]
    stats = dict(fin.stats, n_output_tokens=MARKUP, n_verify=MARKUP)
    assert "<img" not in render_stats.stats_html(events[:-1] + [dataclasses.replace(fin, stats=stats)])


# -- running state and the cost of a frame -----------------------------------------------------------------------
def all_runs(runs) -> list[list]:
    out = list(runs.values())
    for path in bundled_traces().values():
        t = load_trace_file(path)
        out += [t.events] + ([t.baseline] if t.baseline else [])
    return out


def test_running_statistics_equal_compute_stats_on_every_prefix(runs):
    for events in all_runs(runs):
        state = RunState()
        for i, e in enumerate(events):
            state.add(e)
            if not isinstance(e, ev.Finished):
                assert state.stats() == compute_stats(events[: i + 1]), i
        assert state.stats() == events[-1].stats


def test_undo_takes_back_exactly_one_event(runs):
    """Stepping back (`undo`) leaves the state a fold of the shorter prefix would build, field by field."""
    fields = ("n_events", "started", "prefill", "finished", "blocks", "latest_block", "verifies", "commits", "max_size",
              "size_changes", "positions")
    for events in all_runs(runs):
        state = RunState(undoable=True)
        for e in events:
            state.add(e)
        for n in range(len(events) - 1, -1, -1):
            state.undo()
            want = RunState.of(events[:n])
            assert {f: getattr(state, f) for f in fields} == {f: getattr(want, f) for f in fields}, n
            assert state.stats() == want.stats() and render.token_spans(state) == render.token_spans(want), n


def test_a_replay_frame_processes_only_its_own_events(code_doc, playground, tmp_path):
    """Stepping through a loaded trace, forward and back, adds or takes back only the events between the two
    frames: a frame's work is its own events, whatever its index (before, every frame decoded and re-rendered
    the whole trace up to it)."""
    path = tmp_path / "code.json"
    path.write_text(json.dumps(code_doc), encoding="utf-8")
    state = playground.load_upload(str(path), True)["trace"]
    replay = state["replay"]
    events = replay.trace.events
    assert isinstance(events[0], ev.Started)  # decoded once, at the upload
    idx = frames(events)
    assert len(idx) > 60
    for f in range(len(idx) - 2, -1, -1):  # from the last frame (shown at load) back to the first
        before = replay.processed
        out = playground.step(state, f + 1, -1, 0, True)
        assert out["replay"] == f and replay.processed - before == idx[f + 1] - idx[f], f
    for f in range(1, len(idx)):
        before = replay.processed
        out = playground.step(state, f - 1, 1, 0, True)
        assert out["replay"] == f and replay.processed - before == idx[f] - idx[f - 1], f
    playground.show_frame(state, 0, 0, True)
    before = replay.processed
    outs = list(playground.play(state, 0, 0, True, "session"))
    assert [o["replay"] for o in outs] == list(range(len(idx)))
    assert replay.processed - before == idx[-1] - idx[0]  # each event once


def test_incremental_frames_equal_a_rebuild_from_the_first_event(code_doc, playground, tmp_path):
    path = tmp_path / "code.json"
    path.write_text(json.dumps(code_doc), encoding="utf-8")
    loaded = playground.load_upload(str(path), True)
    state = loaded["trace"]
    trace = state["replay"].trace
    n = len(frames(trace.events))
    comp = state["compare"]
    order = list(range(n)) + [n // 2, 3, n - 1, 0, n // 3]  # forward, then jumps back and forth
    for f in order:
        for block, show in ((0, True), (2, False)):
            got = playground.show_frame(state, f, block, show)
            shown = events_at(trace.events, f)
            done = shown[-1] is trace.events[-1] and isinstance(shown[-1], ev.Finished)
            want = view(shown, show, block or None, trace.baseline if done else None, comp if done else None,
                        state.get("hardware", ""))
            for key in ("legend", "tokens", "inspector", "stats"):
                assert got[key] == want[key], (f, key)
            for key in ("block_length", "histogram", "positions", "throughput"):
                assert got[key].to_plotly_json() == want[key].to_plotly_json(), (f, key)


def test_a_trace_names_its_measured_speed_and_says_where_dflash_was_slower(code_doc):
    """The trace list's words: tokens per second, the speedup over the trace's own baseline, and "slower" below 1."""
    from ui.replay import bundled_choices, speed_words

    trace = parse_trace(json.dumps(code_doc))
    run, base = trace.events[-1].stats["tokens_per_s"], trace.baseline[-1].stats["tokens_per_s"]
    words = speed_words(trace)
    assert words.startswith(f"{run:.1f} tok/s, {run / base:.2f}× plain decoding")
    assert words.endswith("(DFlash slower here)") == (run < base)
    swapped = dataclasses.replace(trace, events=trace.baseline, baseline=trace.events)  # the other way round
    assert speed_words(swapped).endswith("(DFlash slower here)") == (base < run)
    assert speed_words(dataclasses.replace(trace, baseline=None)) == f"{run:.1f} tok/s"
    choices = bundled_choices()
    assert [label for _, label in choices] == list(bundled_traces())  # the values stay the labels (the API's)
    assert all(shown.startswith(label + " · ") and "tok/s" in shown for shown, label in choices)


def test_a_trace_sets_the_controls_it_was_recorded_with(code_doc):
    from ui.replay import recorded_controls

    values = recorded_controls(parse_trace(json.dumps(code_doc)), max_new_cap=512)
    request = code_doc["events"][0]["request"]
    assert values["prompt"] == request["prompt"] and values["steps"] == 2 and values["confidence"] == 0.5
    assert values["block_size"] == values["max_block"] == 8 and values["max_new_tokens"] == request["max_new_tokens"]
    assert recorded_controls(parse_trace(json.dumps(code_doc)), max_new_cap=16)["max_new_tokens"] == 16
    old = copy.deepcopy(code_doc)  # recorded before a block below the minimum was refused: the engine lowered it
    old["events"][0]["request"].update(block_size=2, min_block_size=4, max_block_size=None)
    values = recorded_controls(parse_trace(json.dumps(old)), max_new_cap=512)
    assert (values["min_block"], values["block_size"], values["max_block"]) == (2, 2, 8)  # the trained size
