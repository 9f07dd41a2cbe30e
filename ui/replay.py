"""Traces: save, load and step through recorded runs without a model.

A trace is the list of engine events of one run plus a little metadata, stored as
`{"format": "dflash-trace", "version": 1, "meta": {...}, "events": [event dicts]}`. The CLI's
`generate --trace` JSON-lines file (one event per line) loads too. A replay *frame* is a point where the
picture changes: the start, each denoising step, each commit (prefill's first token, each verified block) and
the end; rendering frame k = the pure render functions applied to the events up to that frame.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash import events as ev
from dflash.events import event_from_dict, event_to_dict

TRACE_FORMAT, TRACE_VERSION = "dflash-trace", 1
MAX_TRACE_BYTES = 20 * 1024 * 1024
MAX_TRACE_EVENTS = 200_000
TRACES_DIR = Path(__file__).resolve().parent.parent / "assets" / "traces"


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message is safe to show."""


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


def _event(d: Any, where: str) -> ev.Event:
    if not isinstance(d, dict) or d.get("type") not in ev.EVENT_TYPES:
        kind = d.get("type") if isinstance(d, dict) else type(d).__name__
        raise TraceError(f"trace: {where} is not a DFlash event (type {str(kind)[:40]!r})")
    try:
        return event_from_dict(d)
    except TypeError:
        raise TraceError(f"trace: {where} has missing or unknown fields for a {d['type']} event") from None


def parse_trace(text: str) -> Trace:
    """Our JSON trace or the CLI's JSON lines → (events, meta). Raises TraceError with a short, safe message."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"trace: the file is larger than {MAX_TRACE_BYTES // 2**20} MB")
    text = text.strip()
    if not text:
        raise TraceError("trace: the file is empty")
    try:
        data = json.loads(text)
        lines = None
    except json.JSONDecodeError:
        data, lines = None, text.splitlines()
    if isinstance(data, dict) and data.get("format") == TRACE_FORMAT:
        if data.get("version") != TRACE_VERSION:
            raise TraceError(f"trace: version {str(data.get('version'))[:10]} is not supported (expected {TRACE_VERSION})")
        raw, meta, base_raw = data.get("events"), data.get("meta") or {}, data.get("baseline")
        if not isinstance(raw, list) or not isinstance(meta, dict) or not isinstance(base_raw, (list, type(None))):
            raise TraceError("trace: 'events' and 'baseline' must be lists and 'meta' an object")
    elif isinstance(data, dict) and "type" in data:  # a one-line JSON-lines file
        raw, meta, base_raw = [data], {}, None
    elif lines is not None:
        raw, meta, base_raw = [], {}, None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                raw.append(json.loads(line))
            except json.JSONDecodeError:
                raise TraceError(f"trace: line {i} is not valid JSON") from None
    else:
        raise TraceError("trace: not a DFlash trace (expected a dflash-trace JSON file or the CLI's --trace JSON lines)")
    if len(raw) + len(base_raw or []) > MAX_TRACE_EVENTS:
        raise TraceError(f"trace: more than {MAX_TRACE_EVENTS} events")
    events = _run(raw, "event")
    baseline = _run(base_raw, "baseline event") if base_raw else None
    meta = {str(k)[:40]: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return Trace(events, meta, baseline)


def _run(raw: list, what: str) -> list[ev.Event]:
    events = [_event(d, f"{what} {i}") for i, d in enumerate(raw)]
    if not events or not isinstance(events[0], ev.Started):
        raise TraceError(f"trace: the first {what} must be Started")
    if any(isinstance(e, ev.Started) for e in events[1:]):
        raise TraceError("trace: holds more than one run")
    if any(isinstance(e, ev.Finished) for e in events[:-1]):
        raise TraceError("trace: events after Finished")
    return events


def load_trace_file(path: str | Path) -> Trace:
    p = Path(path)
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise TraceError(f"trace: the file is larger than {MAX_TRACE_BYTES // 2**20} MB")
    try:
        return parse_trace(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TraceError("trace: the file is not UTF-8 text") from None


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
    head = f"Frame {frame + 1}/{len(idx)}: "
    if isinstance(e, ev.Started):
        return head + "the request starts (prompt only)"
    if isinstance(e, ev.DraftStep):
        n_masked = sum(e.masked[1:])
        return head + (f"block {e.block}, DRAFT — denoising step {e.step + 1} of {e.n_steps}: "
                       f"{sum(e.committed)} positions committed, {n_masked} still masked")
    if isinstance(e, ev.Commit):
        if e.block == 0:
            return head + "prefill — the target reads the prompt and picks the first token"
        kinds = e.kinds
        return head + (f"block {e.block}, VERIFY → ACCEPT: {kinds.count(ev.DRAFT)} draft tokens accepted, "
                       f"+1 {'correction' if ev.CORRECTION in kinds else 'target token'} ({e.n_out} tokens so far)")
    if isinstance(e, ev.Finished):
        return head + f"finished ({e.reason})"
    return head + type(e).__name__


# -- CSV exports -------------------------------------------------------------------------------------------------
METRIC_COLUMNS = ["block", "start", "block_size", "drafted", "accepted", "committed", "kinds", "draft_ms", "verify_ms",
                  "t_ms", "n_out", "denoising_steps", "controller"]


def metrics_rows(events: list) -> list[dict[str, Any]]:
    sizes = {e.block: e for e in events if isinstance(e, ev.BlockSize)}
    steps: dict[int, int] = {}
    for e in events:
        if isinstance(e, ev.DraftStep):
            steps[e.block] = steps.get(e.block, 0) + 1
    verifies = {e.block: e for e in events if isinstance(e, ev.Verify)}
    rows = []
    for c in (e for e in events if isinstance(e, ev.Commit)):
        v = verifies.get(c.block)
        rows.append({"block": c.block, "start": v.start if v else "", "block_size": v.block_size if v else "",
                     "drafted": len(v.draft_tokens) if v else 0, "accepted": v.accepted_len if v else 0,
                     "committed": len(c.token_ids), "kinds": " ".join(c.kinds),
                     "draft_ms": round(v.draft_ms, 3) if v else 0.0, "verify_ms": round(v.verify_ms, 3) if v else 0.0,
                     "t_ms": round(c.t_ms, 3), "n_out": c.n_out, "denoising_steps": steps.get(c.block, 0),
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
