"""The page's events: which ui/handlers.py method each control runs, with which inputs and outputs, under the
serving rules (Generate and Compare share one "engine" slot, Stop runs outside the queue), and how handler
errors reach users (their own messages as they are, anything else as a generic `gr.Error` without internals).

`ui` is the dict of components that the panels of ui/layout.py return, keyed by the names handlers use: the
view and output names of `OUT_KEYS`, the control names of `CONTROL_KEYS`, and the buttons.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from dflash.errors import BusyError
from dflash.decode.request import MAX_BLOCK_SIZE
from . import text
from .engines import EngineProvider
from .controls import FIELDS, shown_rejected, user_message
from .handlers import CONTROL_KEYS, STOPPED_IN_QUEUE, USER_ERRORS, VIEW_KEYS, Playground, trace_from_state
from .live import dtype_of
from .render_stats import tie_only
from .replay import recorded_controls
from .step_view import NO_CHANGE, PAUSED, PLAYING
from .text import REPLAY_WAITS

log = logging.getLogger("dflash.ui")

RECORDED = tuple(FIELDS)  # the controls a loaded trace sets: those of its request, the prompt first

GENERIC_ERROR = "Something went wrong on the server (the details were logged). Please try again."

# The outputs of every handler that redraws the page, in the order the API returns them.
OUT_KEYS = VIEW_KEYS + ("trace", "history", "history_table", "replay", "replay_label", "inspect_block",
                        "export_trace", "export_metrics", "export_history")


def _errors(fn: Callable[..., Any]) -> Any:
    """Run a handler; messages written for users go out as they are, anything else as a generic gr.Error."""
    try:
        return fn()
    except (gr.Error, StopIteration):
        raise
    except USER_ERRORS as exc:
        raise gr.Error(user_message(exc), print_exception=False) from None
    except Exception:  # never show internals
        log.exception("playground handler failed")
        raise gr.Error(GENERIC_ERROR, print_exception=False) from None


# The status line of a request refused before it ran (the toast says why): it showed the previous run's status under
# an "Error" badge, as if that run had failed.
NOT_STARTED = "**Not started:** the request was refused (see the message)."


def _stream_errors(gen: Iterator[Any], status: bool = False) -> Iterator[Any]:
    """`gen`'s items, its errors as `_errors` raises them; with `status`, one refused before its first item first
    replaces the status line (NOT_STARTED)."""
    it, started = iter(gen), False
    while True:
        try:
            item = _errors(lambda: next(it))
        except StopIteration:
            return
        except gr.Error:
            if status and not started:
                yield {"status": NOT_STARTED}
            raise
        started = True
        yield item


def offer_exact(out: dict[str, Any]) -> Any:
    """The exact (float32) re-run's button: shown once a comparison ends in a numerical tie only, hidden while it
    runs and after any other ending. Sent with the comparison's own updates: a separate event that hid it at the
    click raced them in the browser, and the button stayed hidden."""
    trace = out.get("trace")
    comp = trace.get("compare") if isinstance(trace, dict) else None
    return gr.update(visible=comp is not None and tie_only(comp))


def pack(out: dict[str, Any]) -> tuple:
    """A handler's dict of views → the tuple of `OUT_KEYS` outputs, `gr.skip()` for the keys it leaves out."""
    return tuple(out[k] if k in out else gr.skip() for k in OUT_KEYS)


def acceptance_label(value: Any) -> str:
    try:
        lossy = float(value) < 1.0
    except (TypeError, ValueError):
        lossy = False
    return f"{text.LABELS['acceptance']} — {'LOSSY below 1.0' if lossy else '1.0 = exact (lossless)'}"


def block_updates(size: int | None) -> tuple:
    """(block size, max block size) for a newly chosen preset: its draft's block size, as the defaults set both;
    left as they are when the preset's block size is unknown."""
    return (gr.update(value=size), gr.update(value=size)) if size else (gr.skip(), gr.skip())


def fit_block_range(moved: str, size: Any, lo: Any, hi: Any) -> tuple:
    """(block size, min, max block size) after the user moved `moved` ("block_size", "min_block" or "max_block"):
    the other two follow so that min <= block size <= max still holds, where a request outside it is refused (the
    defaults tie the max to the draft's block size, so moving the block size past it would be an error otherwise).
    A value typed past the sliders' ends is taken as the end it passed, as Gradio's box shows it after it loses focus
    (and sends it at Generate). gr.skip() for a value that stays; all three when one is not a number (an empty box:
    the request then names it)."""
    try:
        raw = tuple(float(v) for v in (size, lo, hi))
    except (TypeError, ValueError, OverflowError):
        return (gr.skip(),) * 3
    if not all(math.isfinite(v) for v in raw):
        return (gr.skip(),) * 3
    size, lo, hi = (min(max(round(v), 1), MAX_BLOCK_SIZE) for v in raw)
    new = {"block_size": (size, min(lo, size), max(hi, size)), "min_block": (max(size, lo), lo, max(hi, lo)),
           "max_block": (min(size, hi), min(lo, hi), hi)}[moved]
    return tuple(gr.skip() if n == o else n for n, o in zip(new, raw))


def wire(demo: gr.Blocks, pg: Playground, ui: dict[str, Any], initial: dict[str, Any]) -> Any:
    """Connect every event of the page; `initial` holds the controls' starting values (Reset restores them).
    Returns Generate's click event."""
    outputs = [ui[k] for k in OUT_KEYS]
    gen_event = _wire_generation(pg, ui, outputs)
    _wire_settings(pg.engines, ui, initial)
    _wire_replay(pg, ui, outputs)

    def on_unload(request: gr.Request):  # closing the tab stops its run
        pg.runs.forget(request.session_hash)

    demo.unload(on_unload)
    return gen_event


def _wire_generation(pg: Playground, ui: dict[str, Any], outputs: list) -> Any:
    """Generate (button and Enter), Compare and Stop."""
    # `inputs`: the controls' values by their CONTROL_KEYS name, and the run history. (No docstring: Gradio would
    # show it on the API page.)
    def on_generate(request: gr.Request, **inputs: Any):
        history = inputs.pop("history")
        for out in _stream_errors(pg.generate(inputs, history, request.session_hash, request.request), status=True):
            yield pack(out)

    def on_compare(trace, history, show_rejected, request: gr.Request):
        def runs():  # the checkbox checked inside the stream, whose errors replace the status line
            yield from pg.compare(trace, history, shown_rejected(show_rejected), request.session_hash, request.request)
        for out in _stream_errors(runs(), status=True):
            yield (*pack(out), offer_exact(out))

    def admit(request: gr.Request, *values: Any, **named: Any) -> list:
        """The validator of Generate and Compare, which Gradio runs as a request enters the queue: it tells
        Stop that the session has a request waiting, known by its HTTP request (ui/sessions.py). Validation itself
        stays in the handler (it names the parameter, and a raw payload may hold anything). A session with a
        request waiting already, or a full share of the queue, is refused here: the request takes no place in it."""
        n = len(values) + len(named)
        try:
            pg.runs.admit(request.session_hash, request.request)
        except BusyError as exc:  # shown on the first input (the prompt)
            return [gr.validate(False, str(exc))] + [gr.validate(True, "")] * (n - 1)
        return [gr.validate(True, "")] * n

    def on_stop(request: gr.Request) -> Any:
        said = pg.stop(request.session_hash)
        # A started run reports "stopped by the user" in its own last update, which a reply from here could
        # overwrite (it may arrive later); a request stopped in the queue says so only when its turn comes.
        return said if said == STOPPED_IN_QUEUE else gr.skip()

    # Values by name (inputs_kwargs), in the API's parameter order: the controls, then the history State, which
    # clients do not send. Not a set of inputs: Gradio orders those by creation, which would reorder the API.
    gen_inputs = {**{k: ui[k] for k in CONTROL_KEYS}, "history": ui["history"]}
    # One generation at a time on this server; raw payloads (preprocess=False) so that our own validation names
    # the parameter, NaN included. Progress on the status line only: a visitor waiting behind another's run sees
    # the queue position and wait there (the streamed views draw the run itself).
    run = {"outputs": outputs, "show_progress": "full", "show_progress_on": [ui["status"]], "validator": admit,
           "concurrency_id": "engine", "concurrency_limit": 1}
    gen_event = ui["generate"].click(on_generate, inputs_kwargs=gen_inputs, api_name="generate", preprocess=False, **run)
    ui["prompt"].submit(on_generate, inputs_kwargs=gen_inputs, api_visibility="private", preprocess=False, **run)
    # Compare's last update also offers the exact re-run (ui/wiring_modes.py), in the same reply: a follow-up event
    # could read the session's trace before the comparison was stored in it.
    ui["compare_event"] = ui["compare"].click(on_compare, [ui["trace"], ui["history"], ui["show_rejected"]],
                                              api_name="compare", **{**run, "outputs": [*outputs, ui["exact"]]})
    # Outside the queue, so that it reaches a run at once; it stops the session's queued requests too.
    ui["stop"].click(on_stop, None, ui["status"], api_name="stop", queue=False, show_progress="hidden")
    return gen_event


def _wire_settings(provider: EngineProvider, ui: dict[str, Any], initial: dict[str, Any]) -> None:
    """Reset, the acceptance label that warns about lossy settings, and what a preset change updates."""
    settings = [k for k in CONTROL_KEYS if k != "prompt"]  # the prompt is the user's text, not a setting: it stays
    ui["reset"].click(lambda: tuple(initial[k] for k in settings), None, [ui[k] for k in settings],
                      api_name="reset", queue=False)
    acceptance, preset = ui["acceptance"], ui["preset"]
    # Raw values: a threshold typed below the slider's range (0, -0.5) failed Gradio's range check before the label
    # changed, leaving "exact (lossless)" beside a value whose run is lossy.
    acceptance.change(lambda v: gr.update(label=acceptance_label(v)), acceptance, acceptance, queue=False,
                      api_visibility="private", show_progress="hidden", preprocess=False)
    preset.change(lambda p: provider.notice(p) if provider.loaded(p) is not None else
                  f"Preset **{p}** loads on the first Generate (it needs a GPU and hub access).",
                  preset, ui["notice"], queue=False, api_visibility="private")
    preset.change(lambda p: block_updates(provider.block_size(p)), preset, [ui["block_size"], ui["max_block"]],
                  queue=False, api_visibility="private", show_progress="hidden")
    # `input`: the user's own moves only (a preset change or Reset sets all three consistently).
    sizes = [ui["block_size"], ui["min_block"], ui["max_block"]]
    for key in ("block_size", "min_block", "max_block"):
        ui[key].input(lambda *v, key=key: fit_block_range(key, *v), sizes, sizes, queue=False, api_visibility="private",
                      show_progress="hidden", preprocess=False)


def _wire_replay(pg: Playground, ui: dict[str, Any], outputs: list) -> None:
    """Bundled and uploaded traces, the step slider and buttons, Play / Pause, the block picker and the rejected
    switch. Every control but Play stops a playing replay on the server and waits for its loop to end, then shows
    Play again; a loaded trace also sets the controls it was recorded with. Not Gradio's `cancels`: a cancelled
    stream's closing message raced the page's own cancel, and the replay label showed "Error" about one time in
    four on a busy machine."""
    show = ui["show_rejected"]
    replay_inputs = [ui["trace"], ui["replay"], ui["inspect_block"], show]
    buttons = [ui["play"], ui["pause"]]
    # A refused file or frame shows its message as a toast and one "Error" badge on the replay label: Gradio badges
    # every output of a failed event otherwise, covering the charts and the stream that are still valid.
    # Raw slider values (preprocess=False) for every event that reads them: the handlers clamp a frame or block typed
    # past the end (`_frame_index`, `_block`), where Gradio's own check refused it with "Value 500 is greater than
    # maximum value 120" naming no control.
    quiet = {"show_progress": "hidden", "show_progress_on": [ui["replay_label"]], "preprocess": False}
    loud = {"show_progress_on": [ui["replay_label"]]}

    def on_play(trace, frame, block, show_rejected, request: gr.Request):
        def frames():
            yield from pg.play(trace, frame, block, shown_rejected(show_rejected), request.session_hash)
        # The last frame shows Play again with it (an API client's result is that frame); a replay stopped before
        # it ends with the buttons alone.
        last, started, ended = trace["replay"].n_frames - 1 if trace else None, False, False
        try:
            for out in _stream_errors(frames()):
                ended = out.get("replay") == last
                yield pack(out) + (PAUSED if ended else NO_CHANGE if started else PLAYING)
                started = True
        except gr.Error:
            if started:
                yield pack({}) + PAUSED
            raise
        if started and not ended:
            yield pack({}) + PAUSED

    # "multiple": Play pressed again just after Pause starts at once (the stopped stream's last message may not
    # have reached the page yet, and the default "once" would drop the click).
    ui["play"].click(on_play, replay_inputs, outputs + buttons, api_name="play", concurrency_limit=8,
                     trigger_mode="multiple", **quiet)

    def on_pause(request: gr.Request):
        pg.runs.stop_replay(request.session_hash)
        return PAUSED

    ui["pause"].click(on_pause, None, buttons, api_visibility="private", queue=False, show_progress="hidden")
    _wire_loading(pg, ui, outputs, buttons, loud)

    def frame_handler(draw: Callable[..., dict[str, Any]]) -> Callable[..., tuple]:
        """A replay control's handler: pauses a playing replay and draws `draw(trace, frame, block, show_rejected)`,
        except while this session's generation streams (its live view must not be painted over with the previous
        run's frame)."""
        def handler(trace, frame, block, show_rejected, request: gr.Request):
            if pg.runs.look(request.session_hash) is not None:
                return pack({"replay_label": REPLAY_WAITS}) + PAUSED
            pg.runs.stop_replay(request.session_hash)
            return pack(_errors(lambda: draw(trace, frame, block, shown_rejected(show_rejected)))) + PAUSED
        return handler

    def on_show_rejected(trace, frame, block, show_rejected, request: gr.Request):
        shown = _errors(lambda: shown_rejected(show_rejected))
        look = pg.runs.look(request.session_hash)
        if look is not None:  # the running generation's next frames and its final view follow the switch
            look.show_rejected = shown
            return pack({})
        return pack(_errors(lambda: pg.show_frame(trace, frame, block, shown, charts=False)) if trace else {})

    # `input`, not `release`: arrow keys and a value typed into the slider's box fire input only (release waits for the
    # box to lose focus); while a pointer drags, the last value wins.
    scrub = {"trigger_mode": "always_last", **quiet}
    steps = outputs + buttons
    ui["replay"].input(frame_handler(pg.show_frame), replay_inputs, steps, api_name="show_frame", **scrub)
    ui["prev"].click(frame_handler(lambda t, f, b, s: pg.step(t, f, -1, b, s)), replay_inputs, steps,
                     api_name="step_prev", **quiet)
    ui["next"].click(frame_handler(lambda t, f, b, s: pg.step(t, f, 1, b, s)), replay_inputs, steps,
                     api_name="step_next", **quiet)
    ui["inspect_block"].input(frame_handler(lambda t, f, b, s: pg.show_frame(t, f, b, s, charts=False)),
                              replay_inputs, steps, api_visibility="private", **scrub)
    ui["show_rejected"].change(on_show_rejected, replay_inputs, outputs, api_visibility="private", **quiet)


def _wire_loading(pg: Playground, ui: dict[str, Any], outputs: list, buttons: list, run: dict[str, Any]) -> None:
    """Load a bundled trace or upload one (`run`: their event settings): what played stops, and a
    trace that loaded sets the prompt and the controls it was recorded with (a refused one leaves them)."""
    show, controls = ui["show_rejected"], [ui[k] for k in RECORDED]
    numerics = ui.get("numerics")  # the trace's dtype (its hardware line's last word) where this host offers it
    offered = {v for _, v in numerics.choices} if numerics is not None else set()

    def on_load_trace(label, show_rejected, request: gr.Request):
        pg.runs.stop_replay(request.session_hash)
        return pack(_errors(lambda: pg.load_bundled(label, shown_rejected(show_rejected))))

    def on_upload_trace(path, show_rejected, request: gr.Request):
        pg.runs.stop_replay(request.session_hash)
        return pack(_errors(lambda: pg.load_upload(path, shown_rejected(show_rejected))))

    def on_loaded(state):
        trace = trace_from_state(state)
        values = recorded_controls(trace, pg.settings.max_new_tokens) if trace is not None else {}
        dtype = dtype_of(str(trace.meta.get("hardware", ""))) if trace is not None else ""
        shown = tuple(values.get(k, gr.skip()) for k in RECORDED) + PAUSED
        return shown + ((dtype if dtype in offered else gr.skip(),) if numerics is not None else ())

    # Raw (preprocess=False): Gradio's own check of a label not in the list named no control and logged a traceback.
    loads = (ui["load_trace"].click(on_load_trace, [ui["trace_select"], show], outputs, api_name="load_trace", **run,
                                    preprocess=False),
             ui["upload"].upload(on_upload_trace, [ui["upload"], show], outputs, api_name="upload_trace", **run))
    for load in loads:
        load.success(on_loaded, ui["trace"], controls + buttons + ([numerics] if numerics is not None else []),
                     api_visibility="private", queue=False,
                     show_progress="hidden")
        load.failure(lambda: PAUSED, None, buttons, api_visibility="private", queue=False, show_progress="hidden")
