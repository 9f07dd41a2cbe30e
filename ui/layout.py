"""The page: its panels, their components with stable elem_ids, and the serving settings.

Each panel builder creates its components inside the current Gradio context and returns them in a dict, keyed by
the names ui/wiring.py and ui/handlers.py use; `build_demo` lays the panels out and has ui/wiring.py connect them.
Serving hygiene: one generation at a time (see ui/wiring.py), a bounded queue, and launch settings (127.0.0.1
unless the host says otherwise, no share link, no extra allowed paths).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import gradio as gr

from dflash.decode.adaptive import POLICIES
from dflash.decode.engine import Engine
from dflash.loading.registry import ASSETS
from dflash.decode.request import MAX_BLOCK_SIZE, MAX_NGRAM, MAX_PROMPT_CHARS, MAX_STEPS
from . import text
from .engines import EngineProvider, Loader
from .exports import HISTORY_COLUMNS, history_table
from .handlers import Playground, Settings, defaults, view
from .modes import CUSTOM, MODE_KEYS, MODES, PAPER, mode_note
from .render import TOKEN_TEMPLATE
from .replay import bundled_choices
from .step_view import STEP_JS, replay_tab, step_bar
from .sweep_tab import initial_estimate, sweep_tab, wire_sweep
from .wiring import OUT_KEYS, acceptance_label, wire
from .wiring_modes import wire_modes

__all__ = ["CSS_PATH", "OUT_KEYS", "QUEUE_SIZE", "build_demo", "launch_kwargs"]  # OUT_KEYS: defined in ui/wiring.py

CSS_PATH = ASSETS / "playground.css"
QUEUE_SIZE = 16
STATE_SESSIONS = 1000  # the oldest session's state is dropped beyond this (see launch_kwargs)
NARROWEST = 320  # px: a chart or the statistics narrower than this wraps onto its own line (titles, legends and
# the comparison's verdict stay readable on a phone)

# Show a clicked or focused token's details under the stream (hover shows the same text as a tooltip). Keyboard: the
# stream is one Tab stop; ← → move through its tokens (Home / End: the first / the last), Escape goes back to the stream.
TOKEN_JS = """const show = (t) => {
  const d = element.querySelector('.tok-details'); if (t && d && t.title) { d.textContent = t.title; }
};
element.addEventListener('click', (e) => show(e.target.closest('.tok')));
element.addEventListener('focusin', (e) => show(e.target.closest('.tok')));
element.addEventListener('keydown', (e) => {
  const toks = [...element.querySelectorAll('.dfl-stream .tok')]; const at = toks.indexOf(e.target);
  const moves = {ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: toks.length - 1};
  if (e.key === 'Escape' && at >= 0) { e.target.closest('.dfl-stream-scroll').focus(); return; }
  if (!(e.key in moves) || !toks.length || !e.target.closest('.dfl-stream-scroll')) { return; }
  const t = toks[Math.min(Math.max(at < 0 && e.key.startsWith('Arrow') ? 0 : moves[e.key], 0), toks.length - 1)];
  e.preventDefault(); t.tabIndex = -1; t.focus();
});"""


# The page's script. Screen readers: the status line changes many times a second while a run streams, so it is not a
# live region itself; a hidden one announces what it ends on (finished, stopped, compared, an error, a loaded trace),
# never the progress. Narrow pages: the output column sits under the controls, ~2,000 px below Generate, so a run
# started there (Generate, Compare, Shift+Enter) brings its status line into view — only when it is below the screen.
PAGE_JS = """() => {
  const follow = (e) => {
    const started = e.type === 'click' ? e.target.closest('#generate, #compare')
      : e.key === 'Enter' && e.shiftKey && e.target.closest('#prompt');
    const status = document.getElementById('status');
    if (!started || !status || status.getBoundingClientRect().top < window.innerHeight) { return; }
    const calm = window.matchMedia('(prefers-reduced-motion: reduce)').matches;
    status.scrollIntoView({behavior: calm ? 'auto' : 'smooth', block: 'start'});
  };
  document.addEventListener('click', follow, true);
  document.addEventListener('keydown', follow, true);
  const say = document.createElement('div');
  say.id = 'announce'; say.className = 'sr-only'; say.setAttribute('role', 'status'); say.setAttribute('aria-live', 'polite');
  document.body.appendChild(say);
  const watch = () => {
    const s = document.querySelector('#status [data-testid=markdown]');
    if (!s) { setTimeout(watch, 300); return; }
    new MutationObserver(() => {
      const text = s.innerText.trim();
      if (text && !text.endsWith('…') && text !== say.textContent) { say.textContent = text; }  // progress ends in …
    }).observe(s, {subtree: true, childList: true, characterData: true});
  };
  watch();
}"""


def build_demo(engines: EngineProvider | Mapping[str, Engine] | Loader | None = None, *, notice: str | None = None,
               settings: Settings | None = None) -> gr.Blocks:
    """The playground. `engines`: a provider, a dict preset → Engine (tests, notebooks), a loader callable, or
    None for the registry loader. `notice` overrides the default preset's notice (e.g. "no draft yet")."""
    provider = engines if isinstance(engines, EngineProvider) else EngineProvider(engines)
    settings = settings or Settings()
    from gradio.utils import get_upload_folder

    pg = Playground(provider, settings, export_root=get_upload_folder())
    initial = initial_values(provider)
    with gr.Blocks(title="DFlash playground", fill_width=True, delete_cache=(1800, 3600)) as demo:
        gr.Markdown(text.INTRO, elem_id="intro")
        ui: dict[str, Any] = {
            "notice": gr.Markdown(text.notice_badge(notice if notice is not None else provider.notice(initial["preset"])),
                                  elem_id="notice"),
            "trace": gr.State(None), "history": gr.State([])}
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=320):
                ui.update(mode_panel(initial, provider.numerics(initial["preset"])[1]))
                ui.update(controls_panel(provider.presets, initial, settings.max_new_tokens))
                for key in MODE_KEYS:  # the controls a mode sets carry a mark (assets/playground.css)
                    ui[key].elem_classes = [*(ui[key].elem_classes or []), "dfl-moded"]
            with gr.Column(scale=8, min_width=480):
                empty = view([])
                ui.update(output_panel(empty))
                ui.update(charts_panel(empty))
                with gr.Tabs():
                    ui.update(replay_tab(bundled_choices()))
                    ui.update(history_tab())
                    ui.update(sweep_tab(initial_estimate(pg, initial), settings.max_new_tokens))
                    guide_tabs()
        demo.gen_event = wire(demo, pg, ui, initial)
        wire_modes(pg, ui)
        wire_sweep(pg, ui)
        demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=4)
        demo.playground = pg  # for tests and notebooks
    return demo


def initial_values(provider: EngineProvider) -> dict[str, Any]:
    """The controls' starting (and Reset) values: the defaults (the Paper method) for the first preset's draft block
    size (16 when it has none) and numerics, with that preset selected."""
    presets = provider.presets
    first = "default" if "default" in presets else presets[0]
    return {**defaults(provider.block_size(first) or 16, provider.numerics(first)[0] or None), "preset": first}


def mode_panel(d: dict[str, Any], dtypes: list[str]) -> dict[str, Any]:
    """The mode switch, the line saying what it set, and the numerics switch (shown where there is a choice)."""
    return {"mode": gr.Radio([*MODES, CUSTOM], value=PAPER, label=text.LABELS["mode"], info=text.INFO["mode"],
                             elem_id="mode"),
            "mode_note": gr.Markdown(mode_note(d, d["block_size"], d["numerics"]), elem_id="mode-note"),
            "numerics": gr.Radio([(text.NUMERICS.get(t, t), t) for t in dtypes], value=d["numerics"],
                                 label=text.LABELS["numerics"], info=text.INFO["numerics"], visible=len(dtypes) > 1,
                                 elem_id="numerics")}


def controls_panel(presets: list[str], d: dict[str, Any], max_new_cap: int) -> dict[str, Any]:
    """The left column: preset, prompt and examples, the buttons, the view switches, then the settings."""
    c: dict[str, Any] = {
        "preset": gr.Dropdown(presets, value=d["preset"], label=text.LABELS["preset"], info=text.INFO["preset"],
                              allow_custom_value=False, elem_id="preset"),
        "prompt": gr.Textbox(d["prompt"], label=text.LABELS["prompt"], lines=4, max_length=MAX_PROMPT_CHARS,
                             info=text.INFO["prompt"],
                             placeholder="Ask something, or pick an example below", elem_id="prompt")}
    gr.Examples([[p] for _, p in text.EXAMPLES], inputs=[c["prompt"]], example_labels=[n for n, _ in text.EXAMPLES],
                label="Examples (prose · code · maths)", cache_examples=False, elem_id="examples")
    with gr.Row():
        c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
        c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop")
        c["reset"] = gr.Button("Reset to defaults", elem_id="reset")
    with gr.Row():
        c["show_rejected"] = gr.Checkbox(value=d["show_rejected"], label=text.LABELS["show_rejected"],
                                         info=text.INFO["show_rejected"], elem_id="show-rejected")
        c["step_mode"] = gr.Checkbox(value=d["step_mode"], label=text.LABELS["step_mode"], info=text.INFO["step_mode"],
                                     elem_id="step-mode")
        c["trace_attention"] = gr.Checkbox(value=d["trace_attention"], label=text.LABELS["trace_attention"],
                                           info=text.INFO["trace_attention"], elem_id="trace-attention")
    with gr.Accordion("Draft and verification", open=True):
        c.update(draft_settings(d))
    with gr.Accordion("Adaptive block length (extension)", open=False):
        c.update(adaptive_settings(d))
    c["range_note"] = gr.Markdown("", elem_id="range-note")  # a block size another one moved (ui/modes.range_note)
    with gr.Accordion("Sampling and length", open=False):
        c.update(sampling_settings(d, max_new_cap))
    return c


def _setting(key: str, lo: float, hi: float, step: float, d: dict[str, Any], elem_id: str, label: str = "") -> gr.Slider:
    """A slider for the control `key`: its starting value, its label (text.LABELS, unless given), its help text, a
    button back to the default."""
    return gr.Slider(lo, hi, value=d[key], step=step, label=label or text.LABELS[key], info=text.INFO[key],
                     buttons=["reset"], elem_id=elem_id)


def draft_settings(d: dict[str, Any]) -> dict[str, Any]:
    return {"block_size": _setting("block_size", 1, MAX_BLOCK_SIZE, 1, d, "block-size"),
            "steps": _setting("steps", 1, MAX_STEPS, 1, d, "steps", f"{text.LABELS['steps']} (extension)"),
            "confidence": _setting("confidence", 0.05, 1.0, 0.05, d, "confidence", f"{text.LABELS['confidence']} (steps > 1)"),
            "acceptance": _setting("acceptance", 0.05, 1.0, 0.05, d, "acceptance", acceptance_label(d["acceptance"])),
            "lookup": _setting("lookup", 0, MAX_NGRAM, 1, d, "lookup", f"{text.LABELS['lookup']}: n-gram (0 = off)")}


def adaptive_settings(d: dict[str, Any]) -> dict[str, Any]:
    return {"adaptive": gr.Radio(list(POLICIES), value=d["adaptive"], label=text.LABELS["adaptive"],
                                 info=text.INFO["adaptive"], elem_id="adaptive"),
            "min_block": _setting("min_block", 1, MAX_BLOCK_SIZE, 1, d, "min-block"),
            "max_block": _setting("max_block", 1, MAX_BLOCK_SIZE, 1, d, "max-block")}


def sampling_settings(d: dict[str, Any], max_new_cap: int) -> dict[str, Any]:
    return {"temperature": _setting("temperature", 0.0, 2.0, 0.05, d, "temperature"),
            "top_p": _setting("top_p", 0.05, 1.0, 0.05, d, "top-p"),
            "max_new_tokens": _setting("max_new_tokens", 1, max_new_cap, 1, d, "max-new-tokens"),
            "seed": gr.Number(d["seed"], precision=0, minimum=0, label=text.LABELS["seed"], info=text.INFO["seed"],
                              elem_id="seed")}


def _named(label: str) -> dict[str, Any]:
    """A label the page does not show (the view says what it is) but the API does: clients see `Status`, `Token
    stream`, … among /generate's return values instead of `value_38`, `value_39`, …"""
    return {"label": label, "show_label": False}


def output_panel(empty: dict[str, Any]) -> dict[str, Any]:
    """Status, the token stream with its legend, the statistics with Compare, and the block inspector; `empty`:
    the views of no run."""
    o: dict[str, Any] = {
        "status": gr.Markdown("Ready.", elem_id="status", **_named("Status")),
        "legend": gr.HTML(empty["legend"], elem_id="token-legend", padding=True, **_named("Legend and prompt")),
        "tokens": gr.HTML(empty["tokens"], html_template=TOKEN_TEMPLATE, js_on_load=TOKEN_JS, elem_id="token-stream",
                          padding=True, **_named("Token stream"))}
    with gr.Row(equal_height=False):  # side by side where both fit, the button below the statistics on a phone
        with gr.Column(min_width=NARROWEST):  # (gr.HTML does not apply its own min_width)
            o["stats"] = gr.HTML(empty["stats"], elem_id="stats", padding=True, **_named("Statistics"))
        with gr.Column(scale=0, min_width=200):
            o["compare"] = gr.Button("Compare with autoregressive", elem_id="compare")
            o["exact"] = gr.Button("Re-run both exactly (float32)", visible=False, elem_id="exact-rerun")
    o["race"] = gr.HTML("", elem_id="race", padding=True, **_named("Race"))
    o.update(step_bar())  # Prev / Play-Pause / Next right above the inspector they move
    o["inspector"] = gr.HTML(empty["inspector"], elem_id="block-inspector", padding=True, **_named("Block inspector"))
    o["inspect_block"] = gr.Slider(0, 1, value=0, step=1, label="Inspect block (0 = the latest)",
                                   info="Pick any block of the current run or trace.", elem_id="inspect-block")
    return o


def charts_panel(empty: dict[str, Any]) -> dict[str, Any]:
    """The four charts, two by two where two fit side by side, else one under the other (a phone)."""
    def plot(name: str, elem_id: str, label: str) -> gr.Plot:
        return gr.Plot(empty[name], elem_id=elem_id, min_width=NARROWEST, **_named(label))

    with gr.Row():
        p = {"block_length": plot("block_length", "block-length-plot", "Block length chart"),
             "histogram": plot("histogram", "acceptance-histogram", "Acceptance length histogram")}
    with gr.Row():
        p["positions"] = plot("positions", "position-acceptance-plot", "Acceptance by draft position chart")
        p["throughput"] = plot("throughput", "throughput-plot", "Throughput chart")
    return p


def history_tab() -> dict[str, Any]:
    """The session's runs and the three downloads."""
    with gr.Tab("Run history and export", elem_id="history-tab"):
        h = {"history_table": gr.Dataframe(history_table([]), headers=HISTORY_COLUMNS, interactive=False, wrap=True,
                                           label="Runs in this session", elem_id="history")}
        with gr.Row():
            h["export_trace"] = gr.DownloadButton("Export trace (JSON)", elem_id="export-trace")
            h["export_metrics"] = gr.DownloadButton("Export metrics (CSV)", elem_id="export-metrics")
            h["export_history"] = gr.DownloadButton("Export run history (CSV)", elem_id="export-history")
    return h


def guide_tabs() -> None:
    with gr.Tab("Workshop guide", elem_id="guide-tab"):
        gr.Markdown(text.GUIDE, elem_id="guide")
    with gr.Tab("What the numbers mean", elem_id="numbers-tab"):
        gr.Markdown(text.NUMBERS, elem_id="numbers")


def launch_kwargs(**overrides: Any) -> dict[str, Any]:
    """Launch settings: 127.0.0.1 and port 7860 unless GRADIO_SERVER_NAME / GRADIO_SERVER_PORT say otherwise (HF
    Spaces sets 0.0.0.0), never a share link, no extra allowed paths, uploads capped at the trace size limit."""
    kw: dict[str, Any] = {
        "server_name": os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        "server_port": int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        "share": False,
        "allowed_paths": [],
        "show_error": False,
        "max_file_size": "20mb",
        "css_paths": [CSS_PATH],
        "theme": gr.themes.Soft(),
        "footer_links": ["api", "gradio"],
        # Sessions whose state (a run's trace: ~1 MB per 500 tokens, more after Compare) stays in memory. API clients
        # never close their sessions, so only this bound frees them; Gradio's default, 10,000, could hold ~10 GB.
        "state_session_capacity": STATE_SESSIONS,
        "js": f"() => {{ ({PAGE_JS})(); ({STEP_JS})(); }}",
    }
    kw.update(overrides)
    return kw
