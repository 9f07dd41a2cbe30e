"""The page: components, their stable elem_ids, and the wiring of events to ui/handlers.py.

Serving hygiene lives here: one generation at a time (Generate and Compare share the "engine" concurrency
slot), a bounded queue, Stop outside the queue, errors as `gr.Error` without internals, and launch settings
(127.0.0.1 unless the host says otherwise, no share link, no extra allowed paths).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterator, Mapping

import gradio as gr

from dflash.engine import Engine
from dflash.registry import ASSETS
from dflash.request import MAX_PROMPT_CHARS
from ui import text
from ui.engines import EngineProvider, Loader
from ui.exports import HISTORY_COLUMNS, history_table
from ui.handlers import CONTROL_KEYS, STOPPED_IN_QUEUE, USER_ERRORS, VIEW_KEYS, Playground, Settings, defaults, view
from ui.render import TOKEN_TEMPLATE
from ui.replay import bundled_traces

log = logging.getLogger("dflash.ui")

CSS_PATH = ASSETS / "playground.css"
QUEUE_SIZE = 16
GENERIC_ERROR = "Something went wrong on the server (the details were logged). Please try again."
# Show a clicked token's details under the stream (hover shows the same text as a tooltip).
TOKEN_JS = """element.addEventListener('click', (e) => {
  const t = e.target.closest('.tok'); const d = element.querySelector('.tok-details');
  if (t && d && t.title) { d.textContent = t.title; }
});"""

OUT_KEYS = VIEW_KEYS + ("trace", "history", "history_table", "replay", "replay_label", "inspect_block",
                        "export_trace", "export_metrics", "export_history")


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a handler; messages written for users go out as they are, anything else as a generic gr.Error."""
    try:
        return fn()
    except (gr.Error, StopIteration):
        raise
    except USER_ERRORS as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except Exception:  # noqa: BLE001 — never show internals
        log.exception("playground handler failed")
        raise gr.Error(GENERIC_ERROR, print_exception=False) from None


def _stream_errors(gen: Iterator[Any]) -> Iterator[Any]:
    it = iter(gen)
    while True:
        try:
            item = _errors(lambda: next(it))
        except StopIteration:
            return
        yield item


def build_demo(engines: EngineProvider | Mapping[str, Engine] | Loader | None = None, *, notice: str | None = None,
               settings: Settings | None = None) -> gr.Blocks:
    """The playground. `engines`: a provider, a dict preset → Engine (tests, notebooks), a loader callable, or
    None for the registry loader. `notice` overrides the default preset's notice (e.g. "no draft yet")."""
    provider = engines if isinstance(engines, EngineProvider) else EngineProvider(engines)
    settings = settings or Settings()
    from gradio.utils import get_upload_folder

    pg = Playground(provider, settings, export_root=get_upload_folder())
    presets = provider.presets
    first = "default" if "default" in presets else presets[0]
    trained = provider.block_size(first) or 16  # the first preset's draft block size (16 when it has none)
    d = defaults(trained)
    d["preset"] = first
    first_notice = notice if notice is not None else provider.notice(d["preset"])
    traces = list(bundled_traces())

    with gr.Blocks(title="DFlash playground", fill_width=True, delete_cache=(1800, 3600)) as demo:
        gr.Markdown(text.INTRO, elem_id="intro")
        notice_md = gr.Markdown(first_notice, elem_id="notice")
        trace_state = gr.State(None)
        history_state = gr.State([])
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=320):
                preset = gr.Dropdown(presets, value=d["preset"], label="Model preset", info=text.INFO["preset"],
                                     allow_custom_value=False, elem_id="preset")
                prompt = gr.Textbox(label="Prompt", lines=4, max_length=MAX_PROMPT_CHARS, info=text.INFO["prompt"],
                                    placeholder="Ask something, or pick an example below", elem_id="prompt")
                gr.Examples([[p] for _, p in text.EXAMPLES], inputs=[prompt], example_labels=[n for n, _ in text.EXAMPLES],
                            label="Examples (prose · code · maths)", cache_examples=False, elem_id="examples")
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
                    reset = gr.Button("Reset to defaults", elem_id="reset")
                with gr.Row():
                    show_rejected = gr.Checkbox(value=d["show_rejected"], label="Show rejected draft tokens",
                                                info=text.INFO["show_rejected"], elem_id="show-rejected")
                    step_mode = gr.Checkbox(value=d["step_mode"], label="Step mode", info=text.INFO["step_mode"],
                                            elem_id="step-mode")
                with gr.Accordion("Draft and verification", open=True):
                    block_size = gr.Slider(1, 64, value=d["block_size"], step=1, label="Block size", info=text.INFO["block_size"],
                                           buttons=["reset"], elem_id="block-size")
                    steps = gr.Slider(1, 8, value=d["steps"], step=1, label="Denoising steps (extension)",
                                      info=text.INFO["steps"], buttons=["reset"], elem_id="steps")
                    confidence = gr.Slider(0.05, 1.0, value=d["confidence"], step=0.05, label="Confidence threshold (steps > 1)",
                                           info=text.INFO["confidence"], buttons=["reset"], elem_id="confidence")
                    acceptance = gr.Slider(0.05, 1.0, value=d["acceptance"], step=0.05, label=_acceptance_label(d["acceptance"]),
                                           info=text.INFO["acceptance"], buttons=["reset"], elem_id="acceptance")
                with gr.Accordion("Adaptive block length (extension)", open=False):
                    adaptive = gr.Radio(["fixed", "slow-start", "cost"], value=d["adaptive"], label="Policy",
                                        info=text.INFO["adaptive"], elem_id="adaptive")
                    min_block = gr.Slider(1, 64, value=d["min_block"], step=1, label="Min block size",
                                          info=text.INFO["min_block"],
                                          buttons=["reset"], elem_id="min-block")
                    max_block = gr.Slider(1, 64, value=d["max_block"], step=1, label="Max block size",
                                          info=text.INFO["max_block"],
                                          buttons=["reset"], elem_id="max-block")
                with gr.Accordion("Sampling and length", open=False):
                    temperature = gr.Slider(0.0, 2.0, value=d["temperature"], step=0.05, label="Temperature",
                                            info=text.INFO["temperature"], buttons=["reset"], elem_id="temperature")
                    top_p = gr.Slider(0.05, 1.0, value=d["top_p"], step=0.05, label="Top-p", info=text.INFO["top_p"],
                                      buttons=["reset"], elem_id="top-p")
                    max_new = gr.Slider(1, settings.max_new_tokens, value=d["max_new_tokens"], step=1, label="Max new tokens",
                                        info=text.INFO["max_new_tokens"], buttons=["reset"], elem_id="max-new-tokens")
                    seed = gr.Number(d["seed"], precision=0, minimum=0, label="Seed", info=text.INFO["seed"], elem_id="seed")
            with gr.Column(scale=8, min_width=480):
                status = gr.Markdown("Ready.", elem_id="status")
                legend = gr.HTML(view([])["legend"], elem_id="token-legend", padding=True)
                tokens = gr.HTML(view([])["tokens"], html_template=TOKEN_TEMPLATE, js_on_load=TOKEN_JS, elem_id="token-stream",
                                 padding=True)
                with gr.Row(equal_height=False):
                    stats = gr.HTML(view([])["stats"], elem_id="stats", padding=True)
                    compare = gr.Button("Compare with autoregressive", elem_id="compare", scale=0, min_width=200)
                inspector = gr.HTML(view([])["inspector"], elem_id="block-inspector", padding=True)
                inspect_block = gr.Slider(0, 1, value=0, step=1, label="Inspect block (0 = the latest)",
                                          info="Pick any block of the current run or trace.", elem_id="inspect-block")
                empty = view([])
                with gr.Row():
                    block_length = gr.Plot(empty["block_length"], show_label=False, elem_id="block-length-plot")
                    histogram = gr.Plot(empty["histogram"], show_label=False, elem_id="acceptance-histogram")
                with gr.Row():
                    positions = gr.Plot(empty["positions"], show_label=False, elem_id="position-acceptance-plot")
                    throughput = gr.Plot(empty["throughput"], show_label=False, elem_id="throughput-plot")
                with gr.Tabs():
                    with gr.Tab("Replay and step mode", elem_id="replay-tab"):
                        gr.Markdown(text.REPLAY_HELP)
                        with gr.Row():
                            trace_select = gr.Dropdown(traces, value=traces[0] if traces else None, label="Bundled traces",
                                                       allow_custom_value=False, elem_id="trace-select", scale=3)
                            load_trace = gr.Button("Load trace", elem_id="load-trace", scale=1)
                            upload = gr.File(label="…or upload a trace JSON", file_types=[".json", ".jsonl"],
                                             elem_id="trace-upload", scale=2)
                        replay = gr.Slider(0, 1, value=0, step=1, label="Step", elem_id="replay-step")
                        with gr.Row():
                            prev_btn = gr.Button("◀ Prev step", elem_id="step-prev")
                            next_btn = gr.Button("Next step ▶", elem_id="step-next")
                            play_btn = gr.Button("▶▶ Play", elem_id="play")
                        replay_label = gr.Markdown("", elem_id="replay-label")
                    with gr.Tab("Run history and export", elem_id="history-tab"):
                        history = gr.Dataframe(history_table([]), headers=HISTORY_COLUMNS, interactive=False, wrap=True,
                                               label="Runs in this session", elem_id="history")
                        with gr.Row():
                            export_trace = gr.DownloadButton("Export trace (JSON)", elem_id="export-trace")
                            export_metrics = gr.DownloadButton("Export metrics (CSV)", elem_id="export-metrics")
                            export_history = gr.DownloadButton("Export run history (CSV)", elem_id="export-history")
                    with gr.Tab("Workshop guide", elem_id="guide-tab"):
                        gr.Markdown(text.GUIDE, elem_id="guide")
                    with gr.Tab("What the numbers mean", elem_id="numbers-tab"):
                        gr.Markdown(text.NUMBERS, elem_id="numbers")

        controls = [prompt, preset, block_size, steps, confidence, acceptance, adaptive, min_block, max_block, temperature,
                    top_p, max_new, seed, show_rejected, step_mode]
        comp = {"legend": legend, "tokens": tokens, "inspector": inspector, "block_length": block_length, "histogram": histogram,
                "positions": positions, "throughput": throughput, "stats": stats, "status": status, "trace": trace_state,
                "history": history_state, "history_table": history, "replay": replay, "replay_label": replay_label,
                "inspect_block": inspect_block, "export_trace": export_trace, "export_metrics": export_metrics,
                "export_history": export_history}
        outputs = [comp[k] for k in OUT_KEYS]

        def pack(out: dict[str, Any]) -> tuple:
            return tuple(out[k] if k in out else gr.skip() for k in OUT_KEYS)

        def on_generate(prompt_v, preset_v, block_v, steps_v, conf_v, acc_v, adaptive_v, min_v, max_v, temp_v, top_p_v,
                        max_new_v, seed_v, show_v, step_v, history_v, request: gr.Request):
            values = dict(zip(CONTROL_KEYS, (prompt_v, preset_v, block_v, steps_v, conf_v, acc_v, adaptive_v, min_v, max_v,
                                             temp_v, top_p_v, max_new_v, seed_v, show_v, step_v)))
            for out in _stream_errors(pg.generate(values, history_v, request.session_hash)):
                yield pack(out)

        def on_compare(trace_v, history_v, show_v, request: gr.Request):
            for out in _stream_errors(pg.compare(trace_v, history_v, bool(show_v), request.session_hash)):
                yield pack(out)

        def on_stop(request: gr.Request) -> Any:
            said = pg.stop(request.session_hash)
            # A started run reports "stopped by the user" in its own last update, which a reply from here could
            # overwrite (it may arrive later); a request stopped in the queue says so only when its turn comes.
            return said if said == STOPPED_IN_QUEUE else gr.skip()

        def admitted(n_inputs: int) -> Callable[..., list]:
            """The validator of Generate and Compare, which Gradio runs as a request enters the queue: it tells
            Stop that the session has a request waiting. Validation itself stays in the handler (it names the
            parameter, and a raw payload may hold anything)."""

            def admit(request: gr.Request, *values: Any) -> list:
                pg.runs.admit(request.session_hash)
                return [gr.validate(True, "")] * n_inputs

            return admit

        def on_play(trace_v, frame_v, block_v, show_v, request: gr.Request):
            for out in _stream_errors(pg.play(trace_v, frame_v, block_v, bool(show_v), request.session_hash)):
                yield pack(out)

        # Generate and Compare share one slot: one generation at a time on this server. Raw payloads
        # (preprocess=False) so our own validation names the parameter, NaN included.
        engine_slot = {"concurrency_id": "engine", "concurrency_limit": 1}
        gen_inputs, compare_inputs = controls + [history_state], [trace_state, history_state, show_rejected]
        gen_event = generate.click(on_generate, gen_inputs, outputs, api_name="generate", preprocess=False,
                                   show_progress="hidden", validator=admitted(len(gen_inputs)), **engine_slot)
        prompt.submit(on_generate, gen_inputs, outputs, api_visibility="private", preprocess=False,
                      show_progress="hidden", validator=admitted(len(gen_inputs)), **engine_slot)
        compare.click(on_compare, compare_inputs, outputs, api_name="compare", show_progress="hidden",
                      validator=admitted(len(compare_inputs)), **engine_slot)
        # Outside the queue, so that it reaches a run at once; it stops the session's queued requests too.
        stop.click(on_stop, None, status, api_name="stop", queue=False, show_progress="hidden")
        reset.click(lambda: tuple(defaults(trained)[k] if k != "preset" else d["preset"] for k in CONTROL_KEYS), None, controls,
                    api_name="reset", queue=False)
        acceptance.change(lambda v: gr.update(label=_acceptance_label(v)), acceptance, acceptance, queue=False,
                          api_visibility="private", show_progress="hidden")
        preset.change(lambda p: provider.notice(p) if provider.loaded(p) is not None else
                      f"Preset **{p}** loads on the first Generate (it needs a GPU and hub access).",
                      preset, notice_md, queue=False, api_visibility="private")
        preset.change(lambda p: block_updates(provider.block_size(p)), preset, [block_size, max_block], queue=False,
                      api_visibility="private", show_progress="hidden")

        replay_inputs = [trace_state, replay, inspect_block, show_rejected]
        load_trace.click(lambda label, show_v: pack(_errors(lambda: pg.load_bundled(label, bool(show_v)))),
                         [trace_select, show_rejected], outputs, api_name="load_trace")
        upload.upload(lambda path, show_v: pack(_errors(lambda: pg.load_upload(path, bool(show_v)))),
                      [upload, show_rejected], outputs, api_name="upload_trace")
        replay.release(lambda t, f, b, s: pack(_errors(lambda: pg.show_frame(t, f, b, bool(s)))), replay_inputs, outputs,
                       api_name="show_frame", show_progress="hidden")
        prev_btn.click(lambda t, f, b, s: pack(_errors(lambda: pg.step(t, f, -1, b, bool(s)))), replay_inputs, outputs,
                       api_name="step_prev", show_progress="hidden")
        next_btn.click(lambda t, f, b, s: pack(_errors(lambda: pg.step(t, f, 1, b, bool(s)))), replay_inputs, outputs,
                       api_name="step_next", show_progress="hidden")
        play_btn.click(on_play, replay_inputs, outputs, api_name="play", show_progress="hidden", concurrency_limit=8)
        inspect_block.release(lambda t, f, b, s: pack(_errors(lambda: pg.show_frame(t, f, b, bool(s), charts=False))),
                              replay_inputs, outputs, api_visibility="private", show_progress="hidden")
        show_rejected.change(lambda t, f, b, s: pack(_errors(lambda: pg.show_frame(t, f, b, bool(s), charts=False)) if t else {}),
                             replay_inputs, outputs, api_visibility="private", show_progress="hidden")
        def on_unload(request: gr.Request):  # closing the tab stops its run
            pg.runs.forget(request.session_hash)

        demo.unload(on_unload)
        demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=4)
        demo.playground = pg  # for tests and notebooks
        demo.gen_event = gen_event
    return demo


def block_updates(size: int | None) -> tuple:
    """(block size, max block size) for a newly chosen preset: its draft's block size, as the defaults set both;
    left as they are when the preset's block size is unknown."""
    return (gr.update(value=size), gr.update(value=size)) if size else (gr.skip(), gr.skip())


def _acceptance_label(value: Any) -> str:
    try:
        lossy = float(value) < 1.0
    except (TypeError, ValueError):
        lossy = False
    return "Acceptance threshold — LOSSY below 1.0" if lossy else "Acceptance threshold — 1.0 = exact (lossless)"


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
    }
    kw.update(overrides)
    return kw
