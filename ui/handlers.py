"""The playground's behaviour, independent of the page layout: run a request and render its events as they
arrive, stop, compare with the no-draft baseline, replay traces, keep the run history and write exports.

Handlers return dicts keyed by view names (see `VIEW_KEYS`); ui/wiring.py maps them onto components, with
`gr.skip()` for the keys a yield leaves out. Every picture comes from ui/render.py and ui/plots.py applied to
the engine's events — the same functions replay a saved trace. A session's trace lives in its gr.State as a
`Replay` (decoded once; moving forward a frame costs only that frame's events).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import tempfile
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from dflash.decode import events as ev
from dflash.decode.engine import Engine
from dflash.errors import DFlashError, ValidationError
from dflash.decode.request import DEFAULTS, Request
from dflash.loading.zerogpu import zero_gpu
from . import gpu, plots, render, text, torch_thread
from .controls import CHECKBOXES, FIELDS, WHOLE, in_step_mode, records_attention, shown_rejected, whole
from .engines import EngineProvider, dtype_name, wait_until_free
from .exports import history_row, history_table, next_run_id, with_comparison, with_row, write_exports
from .modes import PAPER, mode_values
from .live import FrameThrottle, RunLook, dtype_of, final_status, hardware, live_status
from .race import playback
from .render_inspector import inspector_html
from .render_stats import comparison, compared_status, stats_html
from .replay import (Replay, Trace, TraceError, bundled_traces, events_at, frame_label, frames, load_trace_file,
                     speed_words)
from .run_state import RunState, as_state
from .sessions import GENERATION, REPLAY, SessionRuns
from .trace_store import TraceStore, dropped_message

USER_ERRORS = (DFlashError, TraceError)  # messages written for users; shown as they are

VIEW_KEYS = ("legend", "tokens", "inspector", "block_length", "histogram", "positions", "throughput", "stats", "status")

CONTROL_KEYS = ("prompt", "preset", "block_size", "steps", "confidence", "acceptance", "lookup", "adaptive",
                "min_block", "max_block", "temperature", "top_p", "max_new_tokens", "seed", "show_rejected", "step_mode",
                "numerics", "trace_attention")  # new controls go last: the API's positional parameters keep their places


# Status of a Generate or Compare that Stop reached while it waited in the queue (the Stop button shows it too).
STOPPED_IN_QUEUE = "**Stopped by the user** before it started: nothing was run."


@dataclass(frozen=True)
class Settings:
    deadline_s: float = 120.0  # per request (generation or baseline)
    max_new_tokens: int = 512  # the playground's cap (the engine allows more)
    refresh_s: float = 0.15  # at most this often: token stream, inspector, stats
    plot_refresh_s: float = 1.0  # at most this often, and only at block ends: the plotly charts (each redraw remounts)
    frame_share: float = 0.1  # drawing a live run's frames takes at most about this share of its time (FrameThrottle)
    play_delay_s: float = 0.3  # replay animation, per frame
    export_max_age_s: float = 3600.0
    history_rows: int = 100  # per session: the latest runs it keeps (and sends back and exports at every run)
    # Server limits an operator sets (ui/serve.py reads them from the environment; docs/deploy.md, "Limits").
    trace_memory_mb: float = 1024.0  # the decoded traces of all sessions together (ui/trace_store.py)
    session_idle_s: float = 3600.0  # a session's trace unused this long is let go
    exports_mb: float = 1024.0  # the export folder's files, all sessions together (oldest removed first)
    waiting_generations: int = 8  # Generate / Compare requests waiting in the queue, all sessions together
    sweep_max_s: float = 300.0  # a sweep whose estimated time is longer is refused (ui/sweep_tab.py)

    def __post_init__(self):
        negative = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) < 0]
        if negative:
            raise ValueError(f"{negative[0]} must not be negative, got {getattr(self, negative[0])}")
        if not 0.0 < self.frame_share <= 1.0:
            raise ValueError(f"frame_share must be in (0, 1], got {self.frame_share}")
        if self.history_rows < 1:
            raise ValueError(f"history_rows must be at least 1, got {self.history_rows}")


def defaults(block_size: int = 16, dtype: str | None = None) -> dict[str, Any]:
    """Reset-to-defaults values: the Paper method (ui/modes.py) for a draft trained on blocks of `block_size`, in
    numerics `dtype` (None: the engine's own), greedy, with the first example as the prompt."""
    d = DEFAULTS
    return {"prompt": text.EXAMPLES[0][1], "preset": "default", **mode_values(PAPER, block_size, dtype),
            "confidence": d["confidence_threshold"], "temperature": d["temperature"], "top_p": d["top_p"],
            "max_new_tokens": 64, "seed": d["seed"], **CHECKBOXES}


def trace_from_state(state: dict | None) -> Trace | None:
    return state["replay"].trace if state else None


def view(events: RunState | list, show_rejected: bool = True, block: int | None = None,
         baseline: RunState | list | None = None, compare: dict | None = None, hw: str = "",
         charts: bool = True) -> dict[str, Any]:
    run = as_state(events)  # a list is folded once for all the panels
    out = {"legend": render.token_header_html(run, show_rejected), "tokens": render.token_stream_html(run, show_rejected),
           "inspector": inspector_html(run, block), "stats": stats_html(run, compare, hw)}
    if charts:
        figs = plots.all_figures(run, baseline)
        out.update(block_length=figs["block_length"], histogram=figs["histogram"], positions=figs["positions"],
                   throughput=figs["throughput"])
    return out


def live_frame(events: list, look: RunLook, charts: bool) -> dict[str, Any]:
    """One redraw of a streaming run. Step mode only records (the status line); the legend never changes."""
    if look.step_mode:
        return {"status": live_status(events, "Recording (step mode)")}
    out = {"status": live_status(events), **view(events, look.show_rejected, hw=look.hw, charts=charts)}
    del out["legend"]
    return out


class Playground:
    """Session-independent state: engines, the per-session Stop events, the export directory."""

    def __init__(self, engines: EngineProvider, settings: Settings | None = None, export_root: str | None = None):
        self.engines = engines
        self.settings = settings or Settings()
        self.runs = SessionRuns(self.settings.waiting_generations)
        self.traces = TraceStore(int(self.settings.trace_memory_mb * 2**20), self.settings.session_idle_s,
                                 dropped_message(self.settings))
        self._gpu_number = gpu.register(engines)  # before any GPU call, so that the ZeroGPU worker has it
        root = Path(export_root or Path(tempfile.gettempdir()) / "gradio") / "dflash-exports"
        root.mkdir(parents=True, exist_ok=True)
        self.export_root = root

    def trace_state(self, trace: Trace, **extra: Any) -> dict:
        """A session's trace for its gr.State: the decoded trace with its replay cursor (held under the server's
        memory budget), plus where it came from."""
        return {"replay": self.traces.hold(Replay(trace)), **extra}

    # -- stop --------------------------------------------------------------------------------------------------
    def stop(self, session: str) -> str:
        """Stop the session's run after its current step, and its requests waiting in the queue."""
        stopped = self.runs.stop(session)
        if stopped.running:
            return "Stopping after the current step…"
        return STOPPED_IN_QUEUE if stopped.queued else "Nothing is running."

    # -- requests ----------------------------------------------------------------------------------------------
    def make_request(self, values: dict[str, Any]) -> Request:
        """UI values → a validated Request (ValidationError names the parameter and its range), before any model is
        loaded for it; `EngineProvider.for_request` then fits it to the preset's engine."""
        given = {FIELDS[k]: whole(values.get(k)) if k in WHOLE else values.get(k) for k in FIELDS}
        cap, n = self.settings.max_new_tokens, given["max_new_tokens"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cap:
            raise ValidationError("max_new_tokens", f"must be an integer in [1, {cap}] in the playground, got {n!r}")
        if given["prompt"] is not None and not isinstance(given["prompt"], str):
            raise ValidationError("prompt", "must be text")
        return Request(**{**given, "prompt": given["prompt"] or ""}, deadline_s=self.settings.deadline_s,
                       trace_attention=records_attention(values.get("trace_attention")))

    def _start(self, engine: Engine, preset: str, request: Request, session: str, look: RunLook):
        """(event stream, its cancel flag) for this session; the flag is dropped again if the start fails."""
        cancel = self.runs.begin(session, GENERATION, look)
        try:
            return self._stream(engine, preset, request, cancel), cancel
        except BaseException:
            self.runs.end(session, cancel)
            raise

    def _stream(self, engine: Engine, preset: str, request: Request, cancel: threading.Event) -> Iterator:
        if zero_gpu():  # the whole run recorded in the GPU worker; Stop cannot reach it, the deadline holds
            return gpu.recorded_stream(engine, (self._gpu_number, preset), request)
        wait_until_free(engine, cancel, request.deadline_s)  # here: on the torch thread it would hold up the holder
        return torch_thread.Steps(engine.stream(request, cancel, blocking=False))  # steps on the torch thread

    # -- generate ----------------------------------------------------------------------------------------------
    def generate(self, values: dict[str, Any], history: list | None, session: str,
                 ticket: Any = None) -> Iterator[dict[str, Any]]:
        """A run of the controls' `values`, streamed; `ticket` names the queued request for Stop (ui/sessions.py)."""
        if not self.runs.take_admission(session, ticket):
            yield {"status": STOPPED_IN_QUEUE}
            return
        preset = values.get("preset")
        # Every value is checked before a model is loaded for it; the load follows the visitor rules (ui/engines.py).
        checked = self.make_request(values)
        show, step = shown_rejected(values.get("show_rejected")), in_step_mode(values.get("step_mode"))
        engine, request = self.engines.for_request(preset, checked, values.get("numerics"))
        look = RunLook(show, step, hardware(engine))
        stream, cancel = self._start(engine, preset, request, session, look)
        try:
            events = yield from self._live(stream, request, look)
        finally:
            stream.close()  # frees the engine at once if this generator is closed early
            self.runs.end(session, cancel)
        yield self._finished_run(events, request, preset, engine, look, history)

    def _live(self, stream: Iterator, request: Request, look: RunLook) -> Generator[dict[str, Any], None, list]:
        """Yield the views of a run as its events arrive (paced by a FrameThrottle); return all its events."""
        # Take the Started event before the first yield, so the engine's generator (and its lock) is live
        # before Gradio can cancel this handler.
        events: list = [next(stream)]
        yield {"status": live_status(events), **view(events, look.show_rejected, hw=look.hw), "replay_label": ""}
        throttle = FrameThrottle(self.settings.refresh_s, self.settings.plot_refresh_s,
                                 watch_steps=request.use_draft and request.diffusion_steps > 1,
                                 max_share=self.settings.frame_share)
        yield from throttle.frames(stream, events, lambda seen, charts: live_frame(seen, look, charts))
        return events

    def _finished_run(self, events: list, request: Request, preset: str, engine: Engine, look: RunLook,
                      history: list | None) -> dict[str, Any]:
        """A run's last update: its final views (step mode: its first frame), its trace, history row and exports."""
        run_id, model = next_run_id(history), engine.name
        meta = {"title": f"Run {run_id}: {request.prompt[:60]}", "model": model, "hardware": look.hw,
                "recorded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "source": "run"}
        trace = Trace(events, meta)
        # The history names the engine as the hardware line does: an operator's draft, not just "default"
        history = with_row(history, history_row(run_id, "run", model, events), self.settings.history_rows)
        n_frames = len(frames(events))
        frame = 0 if look.step_mode else n_frames - 1
        status = final_status(events)
        if look.step_mode:
            status += " · Step mode: press **Next ▶** (above the block inspector, or →) to walk through it."
        return {**view(events_at(events, frame), look.show_rejected, hw=look.hw), "status": status,
                "trace": self.trace_state(trace, source="run", preset=preset, run_id=run_id, hardware=look.hw,
                                     numerics=dtype_name(engine)),
                **_cursor(n_frames, frame, frame_label(events, frame), events), **_history_views(history),
                **self.exports(trace, history, run_id)}

    # -- compare -----------------------------------------------------------------------------------------------
    def compare(self, state: dict | None, history: list | None, show_rejected: bool, session: str,
                ticket: Any = None, numerics: str | None = None) -> Iterator[dict[str, Any]]:
        """Time the session's run again and then its request without the draft, back to back and drawn alike (status
        and throughput chart only): a live run's own rate also pays for drawing every frame of the page, which the
        lighter baseline would not, so the speedup is the ratio of these two. On ZeroGPU a run is recorded whole in
        the GPU worker, away from the page, so its own timing is fair and only the baseline runs (GPU quota).
        numerics: run both in this dtype (the exact re-run: "float32"); None: the run's own."""
        if not self.runs.take_admission(session, ticket):
            yield {"status": STOPPED_IN_QUEUE}
            return
        trace = _finished_session_run(state)
        preset = state.get("preset")
        engine, again = self.engines.for_request(preset, self._timed_request(trace), numerics or state.get("numerics"))
        todo = [] if zero_gpu() else [(again, "Timing the run again beside the baseline")]
        todo.append((dataclasses.replace(again, use_draft=False), "Running the autoregressive baseline"))
        cancel = self.runs.begin(session, GENERATION)  # one Stop flag for both runs
        timed: list[list] = []
        try:
            for request, what in todo:
                stream = self._stream(engine, preset, request, cancel)
                try:
                    timed.append((yield from self._live_timed(stream, timed, what)))
                finally:
                    stream.close()
                fin = render.finished(timed[-1])
                if fin is None or fin.reason in ("cancelled", "timeout", "error"):
                    who = "Baseline" if len(timed) == len(todo) else "Timed run"
                    words = render.FINISH_WORDS[fin.reason] if fin else "stopped"
                    detail = f" ({fin.message})" if fin is not None and fin.message and fin.reason != "cancelled" else ""
                    yield {"status": f"**{who} {words}{detail}:** nothing compared."}
                    return
        finally:
            self.runs.end(session, cancel)
        timed_run, base = timed if len(timed) == 2 else (None, timed[0])
        yield self._compared(state, trace, timed_run, base, history, engine, show_rejected)

    def _timed_request(self, trace: Trace) -> Request:
        """The run's request for just as many tokens as the run produced (a fair, shorter comparison), under this
        server's deadline."""
        req = dict(render.started(trace.events).request)
        req.update(max_new_tokens=max(1, len(render.finished(trace.events).output_ids)),
                   deadline_s=self.settings.deadline_s)
        return Request(**req)

    def _live_timed(self, stream: Iterator, done: list[list], what: str) -> Generator[dict[str, Any], None, list]:
        """Yield the throughput chart (the runs `done` and this one) as this one runs, at commits, at most every
        plot_refresh_s; return its events."""
        events: list = [next(stream)]  # start the engine's generator at once (see _live)
        throttle = FrameThrottle(self.settings.plot_refresh_s, self.settings.plot_refresh_s,
                                 max_share=self.settings.frame_share)
        yield from throttle.frames(stream, events, lambda seen, _: {
            "status": live_status(seen, what), "throughput": plots.throughput_figure(*done, seen)})
        return events

    def _compared(self, state: dict, trace: Trace, timed: list | None, base: list, history: list | None,
                  engine: Engine, show_rejected: bool) -> dict[str, Any]:
        """The comparison's update: every view, the trace with its baseline, the run's history row completed, and the
        exports. The timed run takes the shown run's place — a new trace, every view redrawn from it — so that the
        run has one tokens/s figure everywhere (the race, the statistics, the history), measured as the baseline's
        was; it is in the compared numerics (the exact re-run's float32). `timed` None (ZeroGPU): the run's own
        timing is compared."""
        shown_fin = render.finished(trace.events)
        repeated = timed is not None and render.finished(timed).output_ids == shown_fin.output_ids
        # A run the user stopped (or that timed out) stays the one shown: its repetition, asked for just its tokens,
        # ends by length, and would rewrite the history row's settings and finish reason.
        replace = timed is not None and shown_fin.reason not in ("cancelled", "timeout", "error")
        run = timed if replace else trace.events
        comp = comparison(run, base, dtype_name(engine), timed=None if replace else timed)
        trace, run_id = Trace(run, trace.meta, base), state.get("run_id", 0)
        history = with_comparison(history, run_id, comp, run if replace else None)
        kept = {k: v for k, v in state.items() if k not in ("replay", "compare")}
        if replace:
            kept.update(numerics=dtype_name(engine), hardware=hardware(engine))
        new = self.trace_state(trace, **kept, compare=comp)
        replay, hw = new["replay"], kept.get("hardware", "")
        with replay.lock:
            shown = view(replay.seek(replay.n_frames - 1), show_rejected, baseline=base, compare=comp, hw=hw)
            label = replay.label(replay.n_frames - 1)
        return {**shown, "throughput": plots.throughput_figure(timed or run, base), "trace": new,
                "status": compared_status(comp, timed is not None, timed is None or replace or repeated),
                **_cursor(replay.n_frames, replay.n_frames - 1, label, run), **_history_views(history),
                **self.exports(trace, history, run_id)}

    def race(self, state: dict | None) -> Iterator[dict[str, Any]]:
        """The race of the session's run against its baseline, played back at their measured timings (ui/race.py);
        nothing without a baseline."""
        trace = trace_from_state(state)
        if trace is None or not trace.baseline:
            return
        for html in playback(trace.events, trace.baseline, self.settings.refresh_s):
            yield {"race": html}

    # -- replay ------------------------------------------------------------------------------------------------
    def load_bundled(self, label: Any, show_rejected: bool) -> dict[str, Any]:
        traces = bundled_traces()
        if not isinstance(label, str) or label not in traces:  # only names from the list: a user value never becomes a path
            raise ValidationError("trace", f"choose one of the bundled traces: {', '.join(traces) or 'none installed'}")
        return self._loaded(load_trace_file(traces[label]), "bundled", show_rejected)

    def load_upload(self, path: str | None, show_rejected: bool) -> dict[str, Any]:
        if not path:
            raise ValidationError("trace", "upload a trace JSON file first")
        return self._loaded(load_trace_file(path), "upload", show_rejected)

    def _loaded(self, trace: Trace, source: str, show_rejected: bool) -> dict[str, Any]:
        hw = str(trace.meta.get("hardware", ""))
        comp = comparison(trace.events, trace.baseline, dtype_of(hw)) if trace.baseline else None
        title = render.md_text(str(trace.meta.get("title", "trace")))
        note = render.md_text(str(trace.meta.get("note", "")))
        state = self.trace_state(trace, source=source, compare=comp, hardware=hw)
        replay = state["replay"]
        last = replay.n_frames - 1
        with replay.lock:
            shown = view(replay.seek(last), show_rejected, baseline=replay.baseline_state(), compare=comp, hw=hw)
            label = replay.label(last)
        status = f"**Loaded {source} trace:** {title} ({speed_words(trace)})" + (f" — {note}" if note else "")
        return {**shown, "status": status,
                "trace": state, **_cursor(replay.n_frames, last, label, trace.events), **self.exports(trace, None, source)}

    def show_frame(self, state: dict | None, frame: Any, block: Any, show_rejected: bool, charts: bool = True) -> dict[str, Any]:
        if not state:
            return {"replay_label": "Nothing to replay yet: generate a run or load a trace."}
        replay: Replay = state["replay"]
        asked, frame = frame, _frame_index(frame, replay)
        b = whole(block)
        pick = min(max(b, 0), replay.n_blocks) if isinstance(b, int) and not isinstance(b, bool) else 0
        with replay.lock:
            shown = replay.seek(frame)
            done = shown.finished is not None
            out = view(shown, show_rejected, _block(pick), replay.baseline_state() if done else None,
                       state.get("compare") if done else None, state.get("hardware", ""), charts=charts)
            label = replay.label(frame)
        # A frame or block typed past the end (or below 0): its slider follows to what is shown.
        moved = ({} if whole(asked) == frame else {"replay": frame}) | ({} if b == pick else {"inspect_block": pick})
        return {**out, "replay_label": label, **moved}

    def step(self, state: dict | None, frame: Any, delta: int, block: Any, show_rejected: bool) -> dict[str, Any]:
        if not state:
            return {"replay_label": "Nothing to replay yet: generate a run or load a trace."}
        new = state["replay"].clamp(_frame_index(frame, state["replay"]) + delta)
        return {**self.show_frame(state, new, block, show_rejected), "replay": new}

    def play(self, state: dict | None, frame: Any, block: Any, show_rejected: bool, session: str) -> Iterator[dict[str, Any]]:
        if not state:
            yield {"replay_label": "Nothing to replay yet: generate a run or load a trace."}
            return
        replay: Replay = state["replay"]
        n = replay.n_frames
        start = _frame_index(frame, replay)
        start = 0 if start >= n - 1 else start
        self.runs.stop_replay(session)  # a replay already playing sends its last frame before this one's first
        cancel = self.runs.begin(session, REPLAY)  # BusyError while a generation of this session runs
        try:
            for f in range(start, n):
                charts = isinstance(replay.last_event(f), (ev.Commit, ev.Finished, ev.Started))
                out = {**self.show_frame(state, f, block, show_rejected, charts=charts), "replay": f}
                # Stopped while drawing: the frame is not sent (the control that stopped it draws its own), and
                # the wait between frames ends at once.
                if cancel.is_set():
                    break
                yield out
                if cancel.wait(self.settings.play_delay_s):
                    break
        finally:
            self.runs.end(session, cancel)

    # -- exports ----------------------------------------------------------------------------------------------
    def exports(self, trace: Trace, history: list | None, run_id: int | str) -> dict[str, Any]:
        return write_exports(self.export_root, trace, history, run_id, self.settings.export_max_age_s,
                             int(self.settings.exports_mb * 2**20))


def _n_blocks(events: list) -> int:
    return max((e.block for e in events if isinstance(e, ev.Commit)), default=0)


def _cursor(n_frames: int, frame: int, label: str, events: list) -> dict[str, Any]:
    """The replay slider at `frame` of `n_frames` with its label, and the block picker reset to the latest block."""
    return {"replay": gr.update(maximum=max(n_frames - 1, 1), value=frame), "replay_label": label,
            "inspect_block": gr.update(maximum=max(_n_blocks(events), 1), value=0)}


def _history_views(history: list) -> dict[str, Any]:
    return {"history": history, "history_table": history_table(history)}


def _finished_session_run(state: dict | None) -> Trace:
    """The finished run of this session that Compare measures against (ValidationError otherwise)."""
    trace = trace_from_state(state)
    if trace is None or state.get("source") != "run":
        raise ValidationError("compare", "needs a run from this session: press Generate first "
                                         "(a loaded trace has no live model)")
    if render.started(trace.events) is None or render.finished(trace.events) is None:
        raise ValidationError("compare", "the run has not finished yet")
    return trace


def _block(value: Any) -> int | None:
    v = whole(value)
    return v if isinstance(v, int) and v > 0 else None


def _frame_index(value: Any, replay: Replay) -> int:
    """The frame a slider value asks for: a fraction typed into its box rounds; no number at all means the last."""
    v = whole(value)
    if isinstance(v, float) and math.isfinite(v):
        v = round(v)
    return replay.clamp(v) if isinstance(v, int) and not isinstance(v, bool) else replay.n_frames - 1
