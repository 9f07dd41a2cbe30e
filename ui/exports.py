"""Run history rows and the files a user can download (trace JSON, per-block metrics CSV, history CSV).

Files go into a fresh directory under Gradio's upload folder with fixed names made of numbers only: no user
text ever reaches a path. Directories older than an hour are removed at the next export.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import render
from .replay import Trace, dumps_trace, history_csv, metrics_csv

HISTORY_COLUMNS = ["run", "source", "preset", "draft", "block", "steps", "conf thr", "accept thr", "adaptive", "lookup",
                   "temperature", "top_p", "max new", "seed", "tokens", "τ", "tok/s", "TTFT ms", "draft share",
                   "finish", "baseline tok/s", "speedup", "identical"]


LOADED_SOURCES = ("bundled", "upload")  # where a loaded trace came from: its exports' name


def write_exports(root: Path, trace: Trace, history: list | None, run_id: int | str,
                  max_age_s: float = 3600.0, max_bytes: int | None = None) -> dict[str, Any]:
    """The download buttons' files for the trace shown: `run_id` a run's number, or the source of a loaded trace
    ("bundled", "upload"); `history` None leaves the history's file as it is (a loaded trace is not a run).
    Older exports go past `max_age_s`, and the oldest first while the folder holds more than `max_bytes`."""
    if not isinstance(run_id, int) and run_id not in LOADED_SOURCES:  # never text from a request in a file name
        raise ValueError(f"run_id must be a run number or one of {LOADED_SOURCES}, got {run_id!r}")
    d = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    name = f"run{int(run_id)}" if isinstance(run_id, int) else run_id
    trace_path = d / f"dflash-{name}-trace.json"
    metrics_path = d / f"dflash-{name}-metrics.csv"
    trace_path.write_text(dumps_trace(trace), encoding="utf-8")
    metrics_path.write_text(metrics_csv(trace.events), encoding="utf-8")
    out = {"export_trace": str(trace_path), "export_metrics": str(metrics_path)}
    if history is not None:
        history_path = d / "dflash-history.csv"
        history_path.write_text(history_csv(history, HISTORY_COLUMNS), encoding="utf-8")
        out["export_history"] = str(history_path)
    prune(root, max_age_s, max_bytes, keep=d)
    return out


def prune(root: Path, max_age_s: float, max_bytes: int | None = None, keep: Path | None = None) -> None:
    """Remove the export folders older than `max_age_s`, then the oldest while all hold more than `max_bytes`
    (never `keep`, the one just written: its buttons point at it). Each load of a 20 MB trace writes ~20 MB here."""
    cutoff, kept = time.time() - max_age_s, []
    for d in root.glob("run-*"):
        try:
            made = d.stat().st_mtime
            if made < cutoff:
                shutil.rmtree(d, ignore_errors=True)
            else:
                kept.append((made, sum(f.stat().st_size for f in d.iterdir()), d))
        except OSError:  # removed meanwhile by another session's prune
            pass
    total = sum(size for _, size, _ in kept)
    for _, size, d in sorted(kept, key=lambda k: k[0]):
        if max_bytes is None or total <= max_bytes:
            return
        if d != keep:
            shutil.rmtree(d, ignore_errors=True)
            total -= size


def history_row(run_id: int, source: str, preset: Any, events: list) -> dict[str, Any]:
    st = render.started(events)
    r = st.request if st else {}
    s = render.run_stats(events)
    fin = render.finished(events)
    has_draft = bool(st and st.has_draft)
    return {"run": run_id, "source": source, "preset": str(preset), "draft": "yes" if has_draft else "no",
            "block": (r.get("block_size") or (st.trained_block_size if st else "")) if has_draft else 1,
            "steps": r.get("diffusion_steps", ""), "conf thr": r.get("confidence_threshold", ""),
            "accept thr": r.get("acceptance_threshold", ""), "adaptive": r.get("adaptive", ""),
            "lookup": r.get("lookup_ngram", 0) if has_draft else 0,  # the engine copies only where a draft runs
            "temperature": r.get("temperature", ""), "top_p": r.get("top_p", ""), "max new": r.get("max_new_tokens", ""),
            "seed": r.get("seed", ""), "tokens": s["n_output_tokens"], "τ": round(s["tau"], 2),
            "tok/s": round(s["tokens_per_s"], 2), "TTFT ms": round(s["ttft_ms"]), "draft share": round(s["draft_share"], 2),
            "finish": fin.reason if fin else "", "baseline tok/s": "", "speedup": "", "identical": ""}


def next_run_id(history: list | None) -> int:
    """The session's next run number: its runs are numbered on their own, whatever other sessions run."""
    return max((r["run"] for r in history or [] if isinstance(r.get("run"), int)), default=0) + 1


def with_row(history: list | None, row: dict[str, Any], limit: int) -> list:
    """A copy of the history with `row` added, keeping the latest `limit` rows: the whole history is sent back and
    written to a new CSV at every run, so an unbounded one would make each run of a long session cost more (memory,
    traffic, the export folder's disk) without end."""
    return (list(history or []) + [row])[-limit:]


def with_comparison(history: list | None, run_id: int, comp: dict, events: list | None = None) -> list:
    """A copy of the history with the compared run's row completed (baseline speed, speedup, identical); `events`:
    the run now shown in its place (the timed repeat), whose row replaces the old one's statistics first."""
    history = [dict(r) for r in history or []]
    for r in history:
        if r.get("run") == run_id and r.get("source") == "run":
            if events is not None:
                r.update(history_row(run_id, "run", r.get("preset", ""), events))
            r.update({"tok/s": round(comp["run_tokens_per_s"], 2),  # the timed run's, as the speedup's
                      "baseline tok/s": round(comp["baseline_tokens_per_s"], 2), "speedup": round(comp["speedup"], 2),
                      "identical": "✓" if comp["identical"] else
                      f"✗ at {comp['first_diff']}" + (" (tie)" if comp["diagnosis"]["verdict"] == "tie" else "")})
    return history


def history_table(history: list) -> list[list[Any]]:
    """The rows as the table shows them: a speedup as "1.00×" (a bare 1 read as a count); the CSV keeps numbers."""
    return [[_shown(c, r.get(c, "")) for c in HISTORY_COLUMNS] for r in history]


def _shown(column: str, value: Any) -> Any:
    return f"{value:.2f}×" if column == "speedup" and isinstance(value, (int, float)) and not isinstance(value, bool) else value
