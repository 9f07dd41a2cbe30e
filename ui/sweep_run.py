"""The Sweep tab's behaviour (ui/sweep_tab.py lays it out and wires it): the form checked into a SweepSpec (a bad
value names its control), the estimated time against the server's limit, the sweep run with a progress line and the
chart redrawn per finished cell, the cells' table, the exports, a reloaded sweep, and the control values of a cell.

Cells a session measured are kept in its state under the preset, the numerics and the spec's key, and read back by
a later sweep with the same key (dflash.bench.sweep.run_sweep's `done`) instead of being measured again.
"""

from __future__ import annotations

import dataclasses
import html
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dflash.bench.sweep import (CellResult, SweepSpec, best_cell, conditions, load_sweep, run_sweep, sweep_result,
                                to_csv)
from dflash.decode.request import Request
from dflash.errors import ValidationError
from dflash.loading.zerogpu import zero_gpu
from . import render, torch_thread
from .controls import FIELDS
from .engines import dtype_name, wait_until_free
from .exports import prune
from .live import hardware
from .sessions import GENERATION
from .sweep_form import (BASE_KEYS, CONTROL_OF, FORM_LABELS, STORED_SWEEPS, duration, engine_costs, estimate_words,
                         form_spec, known_costs)

METRICS = {"speedup": "Speedup over no draft", "tau": "τ (tokens per verify)", "tok_s": "Tokens/s"}
TABLE_COLUMNS = ["cell", "τ", "τ q25–q75", "tok/s", "tok/s q25–q75", "speedup", "speedup q25–q75", "n", "identical",
                 "ties", "drift tokens", "mark"]


def progress_html(done: int, total: int, message: str) -> str:
    """The sweep's progress bar and line (`message` escaped)."""
    return (f'<div class="dfl-sweep-progress"><progress max="{max(total, 1)}" value="{min(done, total)}" '
            f'aria-label="Sweep progress"></progress> <span>{html.escape(message)}</span></div>')


# -- views of a result -----------------------------------------------------------------------------------------
def cell_label(setting: dict) -> str:
    return " · ".join(f"{k}={v}" for k, v in setting.items())


def _spread(q: tuple) -> str:
    return f"{q[1]:.2f}–{q[2]:.2f}"


def table_rows(result: dict | None) -> list[list[Any]]:
    """One row per cell: the medians, their spread (q25–q75), the sample count and the output checks; "best" and
    "default" marks."""
    if not result:
        return []
    rows = []
    for d in result.get("cells", []):
        c = CellResult.from_dict(d)
        mark = " ".join(m for m, k in (("best", result.get("best")), ("default", result.get("default"))) if k == c.key)
        rows.append([cell_label(c.setting), round(c.tau[0], 2), _spread(c.tau), round(c.tok_s[0], 1), _spread(c.tok_s),
                     round(c.speedup[0], 2), _spread(c.speedup), c.n, "✓" if c.identical else "✗", c.ties,
                     c.drift_tokens, mark])
    return rows


def figure(result: dict | None, metric: Any = "speedup") -> Any:
    """The chart of `result` (None: nothing yet): plotly, so that a hover gives each cell's numbers."""
    from .sweep_chart import sweep_chart

    return sweep_chart(result, metric)


def pick_choices(result: dict | None) -> list[tuple[str, str]]:
    """The cells to apply: (label with its speedup, cell key)."""
    cells = [CellResult.from_dict(d) for d in (result or {}).get("cells", [])]
    return [(f"{cell_label(c.setting)} — {c.speedup[0]:.2f}×", c.key) for c in cells]


def result_views(result: dict | None, metric: Any) -> dict[str, Any]:
    import gradio as gr

    choices = pick_choices(result)
    best = (result or {}).get("best")
    pick = best if best in {k for _, k in choices} else (choices[0][1] if choices else None)
    return {"sweep_plot": figure(result, metric), "sweep_table": table_rows(result), "sweep_result": result,
            "sweep_pick": gr.update(choices=choices, value=pick)}


def write_sweep_files(root: Path, result: dict, max_age_s: float, max_bytes: int | None) -> dict[str, str]:
    """The sweep's JSON and CSV in a fresh export folder (names fixed: no user text in a path), pruned as the
    other exports are (ui/exports.py)."""
    d = Path(tempfile.mkdtemp(prefix="run-sweep-", dir=root))
    (d / "dflash-sweep.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (d / "dflash-sweep.csv").write_text(to_csv(result), encoding="utf-8")
    prune(root, max_age_s, max_bytes, keep=d)
    return {"sweep_json": str(d / "dflash-sweep.json"), "sweep_csv": str(d / "dflash-sweep.csv")}


def read_sweep_file(path: Any) -> dict:
    """An uploaded sweep JSON, validated (ValidationError naming the file's control)."""
    if not path or not isinstance(path, str):
        raise ValidationError("Sweep file", "upload a sweep JSON file first")
    try:
        return load_sweep(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValidationError("Sweep file", "is not UTF-8 text") from None
    except ValueError as exc:
        raise ValidationError("Sweep file", str(exc).splitlines()[0][:300]) from None


def cell_controls(result: dict | None, key: Any, offered_numerics: list[str], min_block: Any,
                  max_block: Any) -> tuple[dict[str, Any], str]:
    """(control → value, a note) that set the playground to the cell `key` of `result`: its setting over the
    sweep's base; min / max block size widened to hold its block size; numerics only where this page offers them."""
    cells = {d.get("key"): d for d in (result or {}).get("cells", [])}
    if not cells:
        raise ValidationError("Cell", "run or load a sweep first")
    if key not in cells:
        raise ValidationError("Cell", "pick one of the sweep's cells")
    setting = CellResult.from_dict(cells[key]).setting
    merged = {**(result.get("spec") or {}).get("base", {}), **setting}
    values = {CONTROL_OF[k]: v for k, v in merged.items() if k in CONTROL_OF}
    note = ""
    if "numerics" in values and values["numerics"] not in offered_numerics:
        note = f" (numerics {render.md_text(str(values.pop('numerics')))} is not offered here: left as it is)"
    size = values.get("block_size")
    if isinstance(size, int) and size > 0:
        for k, pick in (("min_block", min), ("max_block", max)):
            bound = min_block if k == "min_block" else max_block
            values[k] = pick(int(bound), size) if isinstance(bound, (int, float)) else size
    return values, f"**Applied:** {render.md_text(cell_label(setting))}{note}."


def describe(preset: str, engine: Any) -> tuple[dict, dict]:
    """(models, host) of a sweep's document, as `python -m dflash sweep` writes them (dflash.bench.machine), with
    the hardware line the playground shows."""
    from dflash.bench.machine import machine_info

    t = engine.target
    models = {"name": engine.name, "preset": preset, "target": t.name,
              "draft": engine.name if engine.drafter is not None else None, "dtype": dtype_name(engine),
              "device": t.device.type, "trained_block_size": engine.trained_block_size}
    return models, {**machine_info(str(t.device)), "hardware": hardware(engine)}


class SweepRunner:
    """The sweep's handlers over a Playground (its engines, settings, Stop flags and export folder)."""

    def __init__(self, pg: Any):
        self.pg = pg

    def plan(self, form: dict, page: dict) -> tuple[SweepSpec, dict, dict]:
        """(spec, models, numerics → engine) for the form and the page's controls `page`: the form checked first,
        then the preset (and the numerics a dtype axis asks for) loaded under the visitor rules, and the spec bound to
        the models and the host (its key changes with them). ValidationError names the control."""
        if zero_gpu():
            raise ValidationError("Sweep", "runs on a dedicated machine only; use `python -m dflash sweep` there")
        checked = self.pg.make_request({**{k: page.get(k) for k in BASE_KEYS if k in FIELDS}, "prompt": "x",
                                        "max_new_tokens": 1})  # the page's own values, named as on the page
        base = {FIELDS[k]: getattr(checked, FIELDS[k]) for k in BASE_KEYS if k in FIELDS}
        spec = form_spec(form, base, self.pg.settings.max_new_tokens)
        preset, provider = page.get("preset"), self.pg.engines
        own = provider.get(preset, visitor=True)
        offered = provider.numerics(preset)[1] or [dtype_name(own)]
        swept = dict(spec.axes).get("dtype")
        for i, (name, values) in enumerate(spec.axes, start=1):
            bad = [v for v in values if name == "dtype" and v not in offered]
            if bad:
                raise ValidationError(f"{FORM_LABELS[f'values_{i}']} (dtype)",
                                      f"this server offers {', '.join(offered)}, not {', '.join(map(str, bad))}")
        page_dtype = page.get("numerics") or None
        probe = Request(prompt=spec.prompts[0], max_new_tokens=1)
        engines = {d: provider.for_request(preset, probe, d or page_dtype)[0] for d in (swept or (None,))}
        models, host = describe(preset, engines.get(None) or own)
        return dataclasses.replace(spec, conditions=conditions(models, host)), {"models": models, "host": host}, engines

    def costs(self, engines: dict, cancel: threading.Event) -> tuple[float, float]:
        """The slowest (step, verify) of the sweep's engines."""
        for engine in engines.values():
            if known_costs(engine) is None:
                wait_until_free(engine, cancel, self.pg.settings.deadline_s)
        found = [engine_costs(e) for e in engines.values()]
        return max(c[0] for c in found), max(c[1] for c in found)

    def estimate(self, form: dict, page: dict) -> str:
        """The estimate line for the form as it stands (never raises: a bad value's message, or what is unknown)."""
        try:
            spec = form_spec(form, {}, self.pg.settings.max_new_tokens)
        except ValidationError as exc:
            return f"**{render.md_text(exc.param)}:** {render.md_text(exc.message)}"
        preset = page.get("preset")
        costs = known_costs(self.pg.engines.loaded(preset) if isinstance(preset, str) else None)
        if costs is None:
            return (f"{len(spec.cells())} cells: the time is estimated when the sweep starts (this host's step costs "
                    "are timed first).")
        return estimate_words(spec, costs, self.pg.settings.sweep_max_s)[0]

    def run(self, form: dict, page: dict, store: dict | None, metric: Any, session: str,
            ticket: Any = None) -> Iterator[dict[str, Any]]:
        """The sweep of the form, streamed: its progress, and per finished cell the chart, the table, the cells to
        apply and the session's store of measured cells; last, the exports. Stop keeps the finished cells."""
        if not self.pg.runs.take_admission(session, ticket):
            yield {"sweep_progress": progress_html(0, 1, "Stopped by the user before it started: nothing was run.")}
            return
        yield {"sweep_progress": progress_html(0, 1, "Checking the sweep and loading the model…")}
        spec, described, engines = self.plan(form, page)
        store = dict(store) if isinstance(store, dict) else {}
        stored = dict(store.get(spec.key(), {}))  # this session's cells of the same spec, models and host
        cancel = self.pg.runs.begin(session, GENERATION)  # Stop (either button) reaches it; a replay waits
        try:
            yield {"sweep_progress": progress_html(0, 1, "Timing this host's steps for the estimate…")}
            words, ok = estimate_words(spec, self.costs(engines, cancel), self.pg.settings.sweep_max_s, skip=stored)
            yield {"sweep_estimate": words}
            if not ok:
                raise ValidationError("Sweep", f"the estimated time is more than this server's limit of "
                                               f"{duration(self.pg.settings.sweep_max_s)}: use fewer values, prompts, "
                                               "repeats or new tokens")
            yield from self._cells(spec, described, engines, (store, stored), metric, cancel)
        finally:
            self.pg.runs.end(session, cancel)

    def _cells(self, spec: SweepSpec, described: dict, engines: dict, stores: tuple[dict, dict], metric: Any,
               cancel: threading.Event) -> Iterator[dict[str, Any]]:
        """Run the sweep (read-back cells first-class), each finished cell added to the session's store."""
        (store, stored), key = stores, spec.key()
        done = {k: CellResult.from_dict(d) for k, d in stored.items()}
        first = next(iter(engines.values()))
        for engine in engines.values():
            wait_until_free(engine, cancel, self.pg.settings.deadline_s)
        steps = torch_thread.Steps(run_sweep(lambda d: engines.get(d) or first, spec, done=done,
                                             should_stop=cancel.is_set))
        cells: dict[str, CellResult] = {}
        start, result = time.monotonic(), None
        try:
            for p in steps:
                out: dict[str, Any] = {"sweep_progress": progress_html(p.done, p.total, f"{p.message}…")}
                if p.cell is not None:
                    cells[p.cell.key] = p.cell
                    stored[p.cell.key] = p.cell.to_dict()
                    store = {**{k: v for k, v in store.items() if k != key}, key: dict(stored)}
                    store = dict(list(store.items())[-STORED_SWEEPS:])  # the latest specs only
                    result = sweep_result(spec, list(cells.values()), **described)
                    out.update(result_views(result, metric), sweep_done=store)
                yield out
        finally:
            steps.close()
        yield self._ended(spec, result, metric, (len(cells), sum(k in done for k in cells)), cancel.is_set(), start)

    def _ended(self, spec: SweepSpec, result: dict | None, metric: Any, counts: tuple[int, int], stopped: bool,
               start: float) -> dict[str, Any]:
        """The last update (the whole result again, for an API client's one reply) and the exports."""
        (n, read_back), total = counts, len(spec.cells())
        again = f" ({read_back} read back from this session)" if read_back else ""
        words = (f"Stopped: {n} of {total} cells measured{again}, kept" if stopped else
                 f"Finished: {n} cells{again} in {duration(time.monotonic() - start)}")
        best = best_cell(result) if result else None
        if best is not None:
            c = CellResult.from_dict(next(d for d in result["cells"] if d.get("key") == best))
            words += f". Best lossless cell: {cell_label(c.setting)}, {c.speedup[0]:.2f}× over no draft"
        out: dict[str, Any] = {"sweep_progress": progress_html(n, total, words + ".")}
        return {**out, **result_views(result, metric), **self.exports(result)} if result else out

    def exports(self, result: dict) -> dict[str, str]:
        s = self.pg.settings
        return write_sweep_files(self.pg.export_root, result, s.export_max_age_s, int(s.exports_mb * 2**20))

    def reload(self, path: Any, metric: Any) -> dict[str, Any]:
        """An uploaded sweep shown as a finished one (its chart, table and cells to apply), with its exports."""
        result = read_sweep_file(path)
        n = len(result.get("cells", []))
        models = ", ".join(f"{k} {v}" for k, v in (result.get("models") or {}).items())
        message = f"Loaded a sweep of {n} cells" + (f" ({models})" if models else "") + "."
        return {**result_views(result, metric), **self.exports(result), "sweep_progress": progress_html(n, n, message)}
