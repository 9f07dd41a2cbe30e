"""The events of the mode switch, the numerics' exact re-run, the race and the block-size notes (ui/modes.py,
ui/race.py), beside ui/wiring.py's: a mode sets its controls, a control moved by hand makes the mode "custom",
Compare ends with the race (and, after a numerical tie, offers to run both again in float32)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from .controls import shown_rejected
from .handlers import Playground
from .modes import MODE_KEYS, MODES, PAPER, mode_note, mode_of, mode_values, range_note
from .wiring import OUT_KEYS, _stream_errors, fit_block_range, offer_exact, pack

QUIET = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
BLOCK_KEYS = ("block_size", "min_block", "max_block")


def wire_modes(pg: Playground, ui: dict[str, Any]) -> None:
    provider, moded = pg.engines, [ui[k] for k in MODE_KEYS]

    def context(preset: Any) -> tuple[int, str | None]:
        """(the preset's trained block, 16 without a draft; its own numerics, None before it is loaded)."""
        ok = isinstance(preset, str) and preset in provider.presets
        return (provider.block_size(preset) or 16, provider.numerics(preset)[0] or None) if ok else (16, None)

    def on_mode(mode: Any, preset: Any) -> tuple:
        if mode not in MODES:  # "custom" is what the controls say, not something to set
            return (gr.skip(),) * (len(moded) + 1)
        block, dtype = context(preset)
        values = mode_values(mode, block, dtype)
        return (*(gr.skip() if values[k] is None else values[k] for k in MODE_KEYS), mode_note(values, block, dtype))

    def on_control(preset: Any, *values: Any) -> tuple:
        block, dtype = context(preset)
        shown = dict(zip(MODE_KEYS, values))
        return mode_of(shown, block, dtype), mode_note(shown, block, dtype)

    ui["mode"].input(on_mode, [ui["mode"], ui["preset"]], [*moded, ui["mode_note"]], **QUIET)
    # `change`: a hand's move, and a loaded trace's or another preset's values too (a mode sets its own consistently).
    for comp in (*moded, ui["preset"]):
        comp.change(on_control, [ui["preset"], *moded], [ui["mode"], ui["mode_note"]], preprocess=False, **QUIET)
    initial = {k: ui[k].value for k in MODE_KEYS}
    ui["reset"].click(lambda p: (PAPER, mode_note(initial, *context(p))), ui["preset"], [ui["mode"], ui["mode_note"]],
                      **QUIET)
    sizes = [ui[k] for k in BLOCK_KEYS]
    for key in BLOCK_KEYS:
        ui[key].input(lambda *v, key=key: range_note(key, v, fit_block_range(key, *v)), sizes, ui["range_note"],
                      preprocess=False, **QUIET)
    _wire_race(pg, ui)


def _wire_race(pg: Playground, ui: dict[str, Any]) -> None:
    """After Compare (or its exact re-run): the race, and the exact re-run's button where the outputs differ only
    by a numerical tie. A new run clears both."""
    def on_race(trace):
        for out in _stream_errors(pg.race(trace)):
            yield out["race"]

    def on_exact(trace, history, show_rejected, request: gr.Request):
        def runs():
            yield from pg.compare(trace, history, shown_rejected(show_rejected), request.session_hash,
                                  numerics="float32")
        for out in _stream_errors(runs(), status=True):
            yield (*pack(out), offer_exact(out))

    after = {"api_visibility": "private", "show_progress": "hidden"}
    clear = ("", gr.update(visible=False))  # a new run or comparison: no race, no offer, until it ends
    for event in (ui["compare_event"], ui["exact"].click(lambda: ("float32", *clear), None,
                                                         [ui["numerics"], ui["race"], ui["exact"]], **QUIET).then(
            on_exact, [ui["trace"], ui["history"], ui["show_rejected"]], [*(ui[k] for k in OUT_KEYS), ui["exact"]],
            api_name="compare_exactly", concurrency_id="engine", concurrency_limit=1, show_progress="full",
            show_progress_on=[ui["status"]])):
        event.success(on_race, ui["trace"], ui["race"], concurrency_limit=8, **after)
    for start in (ui["generate"].click, ui["prompt"].submit, ui["load_trace"].click):
        start(lambda: clear, None, [ui["race"], ui["exact"]], **QUIET)
    ui["compare"].click(lambda: "", None, ui["race"], **QUIET)  # the button: by Compare's own updates
