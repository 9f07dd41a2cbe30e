"""The step view: Prev / Play-Pause / Next and the frame's sentence right above the block inspector, their keys, and
the Replay tab (bundled and uploaded traces, the frame slider).

Play and Pause are two buttons in one place, one shown at a time: Play's stream shows Pause when it starts and Play
again when it ends; every other replay control (and a loaded trace) stops the stream and shows Play itself.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from . import text

PLAY_LABEL, PAUSE_LABEL = "▶ Play", "❚❚ Pause"
KEYS_HINT = "Step through a run or a trace: ◀ ▶ or the ← → keys; space plays and pauses."

# (Play, Pause) visibility: while a replay plays, and otherwise.
PLAYING = (gr.update(visible=False), gr.update(visible=True))
PAUSED = (gr.update(visible=True), gr.update(visible=False))
NO_CHANGE = (gr.skip(), gr.skip())


def step_bar() -> dict[str, Any]:
    """The step buttons and the frame's sentence, built where the block inspector follows (ui/layout.py)."""
    with gr.Row(elem_id="step-bar", equal_height=True):
        s = {"prev": gr.Button("◀ Prev", elem_id="step-prev", scale=0, min_width=90, size="sm"),
             "play": gr.Button(PLAY_LABEL, elem_id="play", scale=0, min_width=90, size="sm"),
             "pause": gr.Button(PAUSE_LABEL, elem_id="pause", scale=0, min_width=90, size="sm", visible=False),
             "next": gr.Button("Next ▶", elem_id="step-next", scale=0, min_width=90, size="sm"),
             "replay_label": gr.Markdown(KEYS_HINT, elem_id="replay-label", label="Frame description",
                                         show_label=False)}
    return s


def replay_tab(choices: list[tuple[str, str]]) -> dict[str, Any]:
    """Bundled traces (each named with its measured speed, `choices`: (shown, label)), an upload and the frame
    slider."""
    with gr.Tab("Replay and step mode", elem_id="replay-tab"):
        gr.Markdown(text.REPLAY_HELP)
        with gr.Row():
            r = {"trace_select": gr.Dropdown(choices, value=choices[0][1] if choices else None, label="Bundled traces",
                                             allow_custom_value=False, elem_id="trace-select", scale=3,
                                             min_width=300),  # wraps the row on a phone rather than cut the name to a word
                 "load_trace": gr.Button("Load trace", elem_id="load-trace", scale=1),
                 "upload": gr.File(label="…or upload a trace JSON", file_types=[".json", ".jsonl"],
                                   elem_id="trace-upload", scale=2)}
        r["replay"] = gr.Slider(0, 1, value=0, step=1, label="Frame (0 = the request starts)", elem_id="replay-step")
    return r


# The step keys, page-wide: ← / → press Prev / Next and space Play or Pause, except where a key already means something
# (typing in a box, a slider, the token stream's own arrows, a focused button's space, a modifier held). The block
# inspector under the buttons is brought into view when a key steps while it is off the screen.
STEP_JS = """() => {
  const KEYS = {ArrowLeft: '#step-prev', ArrowRight: '#step-next', ' ': '#pause, #play'};
  const OWN = 'input, textarea, select, [contenteditable], [role=slider], [role=tab], [role=listbox], [role=option], ' +
              '[role=menu], [role=menuitem], .dfl-stream-scroll, .js-plotly-plot';
  const shown = (sel) => [...document.querySelectorAll(sel)].find((b) => b.offsetParent !== null && !b.disabled);
  const ours = (t) => t.closest && t.closest('#step-bar button');
  document.addEventListener('keydown', (e) => {
    const sel = KEYS[e.key], t = e.target;
    if (!sel || e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || (t.closest && t.closest(OWN))) { return; }
    if (e.key === ' ' && t.closest && t.closest('button, a, summary, [role=button]') && !ours(t)) { return; }
    const b = shown(sel);
    if (!b) { return; }
    e.preventDefault();
    if (!e.repeat || e.key !== ' ') { b.click(); }
    const insp = document.getElementById('block-inspector');
    const r = insp && insp.getBoundingClientRect();
    if (r && (r.top > window.innerHeight || r.bottom < 0)) { insp.scrollIntoView({block: 'nearest'}); }
  });
  // A focused step button's own space would press it again on release: the keydown above already acted.
  document.addEventListener('keyup', (e) => { if (e.key === ' ' && ours(e.target)) { e.preventDefault(); } });
}"""
