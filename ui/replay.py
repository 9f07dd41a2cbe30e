"""Traces: save, load and step through recorded runs without a model.

A trace is the list of engine events of one run plus a little metadata, stored as
`{"format": "dflash-trace", "version": 2, "meta": {...}, "events": [event dicts]}` (version 2 added what the draft
attends to, `DraftStep.attention`; version 1 traces load as they are). The CLI's
`generate --trace` JSON-lines file (one event per line) loads too; every field is checked on the way in
(ui/trace_schema.py). A replay *frame* is a point where the picture changes: the start, each denoising step, each
commit (prefill's first token, each verified block) and the end. A `Replay` decodes a trace once and keeps the
view state of its current frame, so moving to the next or previous frame costs only the events in between.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash.decode import events as ev
from dflash.decode.events import event_to_dict
from dflash.loading.registry import ASSETS
from dflash.decode.request import DEFAULT_MIN_BLOCK, DEFAULTS
from .controls import FIELDS
from .render import count, run_stats, token_class
from .run_state import RunState
from .trace_schema import (MAX_RUN_EVENTS, MAX_TRACE_BYTES, MAX_TRACE_EVENTS, JsonProblem, TraceError, check_event,
                           check_meta, check_run, decode_json, line_of, shown)

TRACE_FORMAT, TRACE_VERSION = "dflash-trace", 3
READ_VERSIONS = (1, 2, 3)  # 1: before DraftStep.attention; 2: before DraftStep.hints. Older traces have none
TRACES_DIR = ASSETS / "traces"


@dataclass
class Trace:
    events: list  # one run's events, Started first
    meta: dict[str, Any] = field(default_factory=dict)  # title, model, hardware, recorded, note …
    baseline: list | None = None  # the no-draft run of the same request, when compared


# -- (de)serialisation -----------------------------------------------------------------------------------------
def trace_dict(trace: Trace) -> dict[str, Any]:
    d = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "meta": dict(trace.meta),
         "events": [event_to_dict(e) for e in trace.events]}
    if trace.baseline:
        d["baseline"] = [event_to_dict(e) for e in trace.baseline]
    return d


def dumps_trace(trace: Trace) -> str:
    return json.dumps(trace_dict(trace), ensure_ascii=False, separators=(",", ":"))


def parse_trace(text: str) -> Trace:
    """Our JSON trace or the CLI's JSON lines → Trace. Raises TraceError with a short, safe message that names
    the place (`events[12] (Verify)`, `line 13 (Verify)`) and the field."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"trace: the file is larger than {MAX_TRACE_BYTES // 2**20} MB")
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors on Windows write
    if not text.strip():
        raise TraceError("trace: the file is empty")
    data = decode_json(text)  # lines are counted in the file as it is: blank lines before the first event count
    if isinstance(data, dict) and data.get("format") == TRACE_FORMAT:
        if data.get("version") not in READ_VERSIONS or type(data.get("version")) is not int:
            raise TraceError(f"trace: version {shown(data.get('version'))} is not supported "
                             f"(expected {' or '.join(map(str, READ_VERSIONS))})")
        raw, meta, base_raw = data.get("events"), data.get("meta") or {}, data.get("baseline")
        if not isinstance(raw, list) or not isinstance(meta, dict) or not isinstance(base_raw, (list, type(None))):
            raise TraceError("trace: 'events' and 'baseline' must be lists and 'meta' an object")
        meta = check_meta(meta)
        places = [f"events[{i}]" for i in range(len(raw))]
        base_places = [f"baseline[{i}]" for i in range(len(base_raw or []))]
    elif isinstance(data, dict) and "type" in data:  # a one-line JSON-lines file
        where = f"line {line_of(text, len(text) - len(text.lstrip()))}"
        raw, places, meta, base_raw, base_places = [data], [where], {}, None, []
    elif isinstance(data, JsonProblem) and not (data.more or _looks_like_lines(text)):
        raise TraceError(f"trace: line {data.line} is not valid JSON ({data.reason})")
    elif isinstance(data, JsonProblem):
        raw, places = _json_lines(text)
        meta, base_raw, base_places = {}, None, []
    else:
        raise TraceError("trace: not a DFlash trace (expected a dflash-trace JSON file or the CLI's --trace JSON lines)")
    for what, run in (("run", raw), ("baseline", base_raw or [])):
        if len(run) > MAX_RUN_EVENTS:
            raise TraceError(f"trace: the {what} has more than {MAX_RUN_EVENTS} events")
    if len(raw) + len(base_raw or []) > MAX_TRACE_EVENTS:
        raise TraceError(f"trace: more than {MAX_TRACE_EVENTS} events")
    events = _run(raw, places, "event")
    baseline = _run(base_raw, base_places, "baseline event") if base_raw else None
    return Trace(events, meta, baseline)


def _looks_like_lines(text: str) -> bool:
    """Whether a text that is not one JSON value reads as JSON lines, whose errors are then each line's own: its
    first two lines with text both start an object (a document laid out on lines has its keys on the second)."""
    firsts = [line.lstrip()[:1] for line in itertools.islice(filter(str.strip, text.split("\n")), 2)]
    return firsts == ["{", "{"]


def _json_lines(text: str) -> tuple[list, list[str]]:
    """The CLI's JSON lines: one event a line, blank lines skipped (and not counted against the limit). Split at
    "\n" only, as JSON counts lines: text may hold other line separators (U+2028) inside its strings."""
    raw, places = [], []
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(raw) == MAX_TRACE_EVENTS:
            raise TraceError(f"trace: more than {MAX_TRACE_EVENTS} lines")
        d = decode_json(line)
        if isinstance(d, JsonProblem):
            raise TraceError(f"trace: line {i} is not valid JSON ({d.reason})")
        raw.append(d)
        places.append(f"line {i}")
    return raw, places


def _run(raw: list, places: list[str], what: str) -> list[ev.Event]:
    return check_run([check_event(d, where) for d, where in zip(raw, places)], places, what)


def load_trace_file(path: str | Path) -> Trace:
    p = Path(path)
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise TraceError(f"trace: the file is larger than {MAX_TRACE_BYTES // 2**20} MB")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"trace: line {line} is not UTF-8 text") from None
    return parse_trace(text)


def bundled_traces(directory: Path = TRACES_DIR) -> dict[str, Path]:
    """Label → path of the traces shipped in assets/traces (label from meta.title, else the file name)."""
    out: dict[str, Path] = {}
    for p in sorted(directory.glob("*.json")):
        try:
            meta = json.loads(p.read_text(encoding="utf-8")).get("meta", {})
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        out[str(meta.get("title") or p.stem)] = p
    return out


def speed_words(trace: Trace) -> str:
    """A trace's measured speed for the trace list: its tokens per second and, with its no-draft baseline, the
    speedup, saying so where DFlash was the slower of the two."""
    rate = run_stats(trace.events)["tokens_per_s"]
    base = run_stats(trace.baseline)["tokens_per_s"] if trace.baseline else 0.0
    if base <= 0:
        return f"{rate:.1f} tok/s"
    x = rate / base
    return f"{rate:.1f} tok/s, {x:.2f}× plain decoding" + (" (DFlash slower here)" if x < 1 else "")


def bundled_choices(directory: Path = TRACES_DIR) -> list[tuple[str, str]]:
    """(name shown, label) of each bundled trace for the trace list: its label and measured speed (`speed_words`);
    a trace that does not load is listed by its label alone (loading it names the problem)."""
    out = []
    for label, path in bundled_traces(directory).items():
        try:
            words = speed_words(load_trace_file(path))
        except (TraceError, OSError):
            words = ""
        out.append((f"{label} · {words}" if words else label, label))
    return out


def recorded_controls(trace: Trace, max_new_cap: int) -> dict[str, Any]:
    """The controls a trace was recorded with (its Started request, which the engine accepted: trace_schema), by
    control name (ui/controls.FIELDS), so that Generate runs it again; max new tokens within the playground's cap."""
    st = next((e for e in trace.events if isinstance(e, ev.Started)), None)
    if st is None:
        return {}
    req = {f: st.request.get(f, DEFAULTS[f]) for f in FIELDS.values()}
    values = {key: req[f] for key, f in FIELDS.items()} | {"max_new_tokens": min(req["max_new_tokens"], max_new_cap)}
    block, trained = req["block_size"] or st.trained_block_size, st.trained_block_size
    if block:  # the sizes as the engine filled them in (None: the trained size; a minimum above the block lowered)
        values.update(block_size=block, max_block=max(req["max_block_size"] or trained or block, block),
                      min_block=min(req["min_block_size"] or DEFAULT_MIN_BLOCK, block))
    else:  # a run without a draft: its block sizes mean nothing
        del values["block_size"], values["min_block"], values["max_block"]
    return values


# -- frames ------------------------------------------------------------------------------------------------------
def frames(events: list) -> list[int]:
    """Event indices that end a replay frame: Started, every DraftStep, every Commit, and Finished."""
    return [i for i, e in enumerate(events) if isinstance(e, (ev.Started, ev.DraftStep, ev.Commit, ev.Finished))]


def events_at(events: list, frame: int) -> list:
    idx = frames(events)
    if not idx:
        return list(events)
    frame = max(0, min(int(frame), len(idx) - 1))
    return list(events[: idx[frame] + 1])


def frame_label(events: list, frame: int) -> str:
    idx = frames(events)
    if not idx:
        return "empty trace"
    frame = max(0, min(int(frame), len(idx) - 1))
    e = events[idx[frame]]
    size = next((d for d in events if isinstance(d, ev.BlockSize) and d.block == getattr(e, "block", None)), None)
    return describe_frame(e, frame, len(idx), size.source if size else ev.DRAFT)


def describe_frame(e: ev.Event, frame: int, n_frames: int, source: str = ev.DRAFT) -> str:
    """The sentence under the replay slider for frame `frame` (0-based) of `n_frames`, which ends at event `e`
    (`source`: who proposed the block of `e`, drafted or copied from the context)."""
    head = f"Frame {frame}/{n_frames - 1}: "  # as the Frame slider counts: 0 = the request starts
    if isinstance(e, ev.Started):
        return head + "the request starts (prompt only)"
    if isinstance(e, ev.DraftStep):
        if source == ev.COPY:
            return head + f"block {e.block}, COPY — {count(sum(e.committed), 'token')} copied from the context (no draft pass)"
        n_masked = sum(e.masked[1:])
        return head + (f"block {e.block}, DRAFT — denoising step {e.step + 1} of {e.n_steps}: "
                       f"{count(sum(e.committed), 'position')} committed, {n_masked} still masked")
    if isinstance(e, ev.Commit):
        if e.block == 0:
            return head + "prefill — the target reads the prompt and picks the first token"
        kinds, who = e.kinds, ("copied", ev.COPY) if source == ev.COPY else ("draft", ev.DRAFT)
        target = "correction" if ev.CORRECTION in kinds else "target token" if ev.BONUS in kinds else ""
        added = f", +1 {target}" if target else " (the answer ends in this block)"  # tokens past its end are not kept
        return head + (f"block {e.block}, VERIFY → ACCEPT: {count(kinds.count(who[1]), who[0] + ' token')} accepted"
                       f"{added} ({count(e.n_out, 'token')} so far)")
    if isinstance(e, ev.Finished):
        return head + f"finished ({e.reason})"
    return head + type(e).__name__


class Replay:
    """One session's trace, decoded once, and the view state of its current frame.

    Moving to a neighbouring frame adds (forward) or takes back (backward) only the events between the two, so a
    step costs its own events and a jump its distance. Handlers of one session can run at once (Play and Next):
    hold `lock` from `seek` until the frame is drawn. The server's TraceStore (ui/trace_store.py) may `release` it to
    free memory: every later use raises TraceError with the store's message.
    """

    def __init__(self, trace: Trace):
        self._trace: Trace | None = trace
        self.ends = frames(trace.events) or [len(trace.events) - 1]  # the event index that ends each frame
        self.n_blocks = max((e.block for e in trace.events if isinstance(e, ev.Commit)), default=0)
        self.lock = threading.Lock()
        self.processed = 0  # events added to or taken back from the view state so far
        self._state, self._next = RunState(undoable=True), 0  # the state holds events[:_next]
        self._baseline: RunState | None = None
        self.on_use: Callable[[], None] | None = None  # the holding store's: this trace is in use now
        self.released: str | None = None  # why the trace was let go (the message a user gets)

    @property
    def trace(self) -> Trace:
        if self.released is not None:
            raise TraceError(self.released)
        if self.on_use is not None:
            self.on_use()
        return self._trace

    def release(self, message: str) -> None:
        """Let go of the trace and the view state (their memory); later uses raise TraceError(message)."""
        with self.lock:
            self.released = message
            self._trace, self._state, self._baseline = None, None, None

    @property
    def n_frames(self) -> int:
        return len(self.ends) if self.trace else 0

    def clamp(self, frame: int) -> int:
        return max(0, min(frame, self.n_frames - 1))

    def seek(self, frame: int) -> RunState:
        end = self.ends[self.clamp(frame)] + 1
        while self._next > end:
            self._state.undo()
            self._next -= 1
            self.processed += 1
        for e in self.trace.events[self._next : end]:
            self._state.add(e)
            self.processed += 1
        self._next = max(self._next, end)
        return self._state

    def baseline_state(self) -> RunState | None:
        if self.trace.baseline and self._baseline is None:
            self._baseline = RunState.of(self.trace.baseline)
        return self._baseline

    def last_event(self, frame: int) -> ev.Event:
        return self.trace.events[self.ends[self.clamp(frame)]]

    def label(self, frame: int) -> str:
        """The frame's sentence (`describe_frame`); seeks there, so call it holding `lock`."""
        frame = self.clamp(frame)
        e = self.last_event(frame)
        info = self.seek(frame).blocks.get(getattr(e, "block", None))
        return describe_frame(e, frame, self.n_frames, info.size.source if info and info.size else ev.DRAFT)


# -- CSV exports -------------------------------------------------------------------------------------------------
METRIC_COLUMNS = ["block", "source", "start", "block_size", "proposed", "accepted", "committed", "kinds", "draft_ms", "verify_ms",
                  "t_ms", "n_out", "denoising_steps", "controller"]


def metrics_rows(events: list) -> list[dict[str, Any]]:
    sizes = {e.block: e for e in events if isinstance(e, ev.BlockSize)}
    steps: dict[int, int] = {}
    for e in events:
        if isinstance(e, ev.DraftStep):
            steps[e.block] = steps.get(e.block, 0) + 1
    verifies = {e.block: e for e in events if isinstance(e, ev.Verify)}
    has_draft = next((bool(e.has_draft) for e in events if isinstance(e, ev.Started)), True)
    rows = []
    for c in (e for e in events if isinstance(e, ev.Commit)):
        v = verifies.get(c.block)
        copied = v is not None and v.source == ev.COPY  # proposed by copying: no draft pass, no denoising step
        rows.append({"block": c.block, "source": v.source if v else "", "start": v.start if v else "",
                     "block_size": v.block_size if v else "", "proposed": len(v.draft_tokens) if v else 0,
                     "accepted": v.accepted_len if v else 0,
                     "committed": len(c.token_ids),  # the kinds as the page names them (first, target …)
                     "kinds": " ".join(token_class(k, c.block, has_draft) for k in c.kinds),
                     "draft_ms": round(v.draft_ms, 3) if v else 0.0, "verify_ms": round(v.verify_ms, 3) if v else 0.0,
                     "t_ms": round(c.t_ms, 3), "n_out": c.n_out, "denoising_steps": 0 if copied else steps.get(c.block, 0),
                     "controller": sizes[c.block].reason if c.block in sizes else ("prefill" if c.block == 0 else "")})
    return rows


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        # Neutralise spreadsheet formulas in text cells (values starting with = + - @).
        w.writerow({k: ("'" + v if isinstance(v, str) and v[:1] in ("=", "+", "-", "@") else v) for k, v in r.items()})
    return buf.getvalue()


def metrics_csv(events: list) -> str:
    return _csv(metrics_rows(events), METRIC_COLUMNS)


def history_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    return _csv(rows, columns)
