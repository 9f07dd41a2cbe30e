"""The Sweep tab: measure τ, tokens/s and the speedup over a grid of up to three settings, each cell over a set of
prompts with repeats, the no-draft run interleaved as its baseline (dflash.bench.sweep). Its layout and events;
ui/sweep_run.py does the work.

A sweep runs in the "engine" slot that Generate and Compare share, so it waits behind their runs and they behind
it; Stop (the tab's or the page's) ends it after the current run and keeps the finished cells.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from dflash.bench.sweep import SWEEP_PARAMS
from dflash.errors import BusyError
from .handlers import STOPPED_IN_QUEUE, Playground
from .sweep_form import (AXES, BASE_KEYS, CONTROL_OF, FORM_KEYS, FORM_LABELS, MAX_PROMPTS, MAX_REPEATS, NONE,
                         engine_costs, offered_prompt_sets)
from .sweep_run import METRICS, TABLE_COLUMNS, SweepRunner, cell_controls, figure, progress_html
from .wiring import _errors, _stream_errors

# The grid a fresh tab offers: block size × copy n-gram, two prompts, two repeats (about a minute on a CPU).
FIRST_AXES = (("block_size", "4,8"), ("lookup_ngram", "0,2"), (NONE, ""))
FIRST_FORM = {**{f"param_{i}": a for i, (a, _) in enumerate(FIRST_AXES, 1)},
              **{f"values_{i}": v for i, (_, v) in enumerate(FIRST_AXES, 1)},
              "prompt_set": "examples", "my_prompts": "", "n_prompts": 2, "sweep_max_new": 32, "repeats": 2}
SWEEP_OUT = ("sweep_progress", "sweep_estimate", "sweep_plot", "sweep_table", "sweep_pick", "sweep_json", "sweep_csv",
             "sweep_result", "sweep_done")
APPLY_KEYS = tuple(dict.fromkeys([*CONTROL_OF.values(), "min_block", "max_block"]))  # the controls a cell sets
HELP = ("Vary up to three settings; every other setting is the playground's, as set on the left. Each cell runs every "
        "prompt **Repeats** times, each run beside a run without the draft (the speedup's baseline), and shows the "
        "median with its spread (q25–q75) over those samples. The time is estimated before it starts; a grid "
        "longer than this server allows is refused.")


def sweep_tab(estimate: str, max_new_cap: int) -> dict[str, Any]:
    """The tab's components; `estimate`: the first grid's estimate line; `max_new_cap`: the playground's cap."""
    with gr.Tab("Sweep", elem_id="sweep-tab"):
        gr.Markdown(HELP)
        s: dict[str, Any] = {}
        with gr.Row():
            for i in range(1, AXES + 1):
                with gr.Column(min_width=160):
                    s[f"param_{i}"] = gr.Dropdown([NONE, *SWEEP_PARAMS], value=FIRST_FORM[f"param_{i}"],
                                                  label=FORM_LABELS[f"param_{i}"], elem_id=f"sweep-param-{i}")
                    s[f"values_{i}"] = gr.Textbox(FIRST_FORM[f"values_{i}"], label=FORM_LABELS[f"values_{i}"],
                                                  placeholder="2,4,8", max_lines=1, elem_id=f"sweep-values-{i}")
        with gr.Row():
            s["prompt_set"] = gr.Dropdown(offered_prompt_sets(), value="examples", label=FORM_LABELS["prompt_set"],
                                          elem_id="sweep-prompt-set")
            s["n_prompts"] = _number("n_prompts", MAX_PROMPTS, "sweep-n-prompts")
            s["sweep_max_new"] = _number("sweep_max_new", max_new_cap, "sweep-max-new")
            s["repeats"] = _number("repeats", MAX_REPEATS, "sweep-repeats")
        s["my_prompts"] = gr.Textbox("", label=FORM_LABELS["my_prompts"], lines=3, placeholder="One prompt per line "
                                     "(with the prompt set “My prompts”)", elem_id="sweep-my-prompts")
        s["sweep_estimate"] = gr.Markdown(estimate, elem_id="sweep-estimate")
        with gr.Row():
            s["sweep_run"] = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
            s["sweep_stop"] = gr.Button("Stop sweep", variant="stop", elem_id="sweep-stop")
        s["sweep_progress"] = gr.HTML(progress_html(0, 1, "Not started."), elem_id="sweep-progress",
                                      label="Sweep progress", show_label=False)
        s.update(_results())
    return s


def _number(key: str, most: int, elem_id: str) -> gr.Number:
    return gr.Number(FIRST_FORM[key], precision=0, minimum=1, maximum=most, label=FORM_LABELS[key], elem_id=elem_id)


def _results() -> dict[str, Any]:
    r: dict[str, Any] = {
        "sweep_metric": gr.Radio([(v, k) for k, v in METRICS.items()], value="speedup", label="Chart",
                                 elem_id="sweep-metric"),
        "sweep_plot": gr.Plot(None, label="Sweep chart", show_label=False, elem_id="sweep-plot"),
        "sweep_table": gr.Dataframe([], headers=TABLE_COLUMNS, interactive=False, wrap=True,
                                    label="Cells (median, q25–q75 over n samples; click a row to pick it)",
                                    elem_id="sweep-table")}
    with gr.Row():
        r["sweep_pick"] = gr.Dropdown([], value=None, label="Cell", elem_id="sweep-pick", scale=3)
        r["sweep_apply"] = gr.Button("Apply this cell to the playground", elem_id="sweep-apply", scale=1)
    r["sweep_applied"] = gr.Markdown("", elem_id="sweep-applied")
    with gr.Row():
        r["sweep_json"] = gr.DownloadButton("Export sweep (JSON)", elem_id="sweep-export-json")
        r["sweep_csv"] = gr.DownloadButton("Export cells (CSV)", elem_id="sweep-export-csv")
        r["sweep_upload"] = gr.UploadButton("Reload a sweep (JSON)", file_types=[".json"], elem_id="sweep-upload")
    r["sweep_result"], r["sweep_done"] = gr.State(None), gr.State({})
    return r


def initial_estimate(pg: Playground, page: dict[str, Any]) -> str:
    """The first grid's estimate, from the costs of the preset loaded before the page is served (none runs yet)."""
    engine = pg.engines.loaded(page.get("preset"))
    if engine is not None:
        engine_costs(engine)
    return SweepRunner(pg).estimate(FIRST_FORM, page)


def wire_sweep(pg: Playground, ui: dict[str, Any]) -> None:
    """The tab's events. `ui` holds its components and the playground's controls (the sweep's base settings and the
    controls a cell sets)."""
    runner = SweepRunner(pg)
    outputs = [ui[k] for k in SWEEP_OUT]

    def pack(out: dict[str, Any]) -> tuple:
        return tuple(out[k] if k in out else gr.skip() for k in SWEEP_OUT)

    def split(named: dict[str, Any]) -> tuple[dict, dict]:
        return {k: named[k] for k in FORM_KEYS}, {k: named[k] for k in BASE_KEYS}

    def on_sweep(request: gr.Request, **named: Any):
        store, metric = named.pop("sweep_done"), named.pop("sweep_metric")
        form, page = split(named)

        def cells():
            yield from runner.run(form, page, store, metric, request.session_hash, request.request)
        for out in _stream_errors(cells()):
            yield pack(out)

    def admit(request: gr.Request, *values: Any, **named: Any) -> list:
        """As Generate's: Stop reaches a sweep waiting in the queue; one waiting request per session."""
        n = len(values) + len(named)
        try:
            pg.runs.admit(request.session_hash, request.request)
        except BusyError as exc:
            return [gr.validate(False, str(exc))] + [gr.validate(True, "")] * (n - 1)
        return [gr.validate(True, "")] * n

    form_inputs = {k: ui[k] for k in (*FORM_KEYS, *BASE_KEYS)}
    inputs = {**form_inputs, "sweep_metric": ui["sweep_metric"], "sweep_done": ui["sweep_done"]}
    ui["sweep_run"].click(on_sweep, inputs_kwargs=inputs, outputs=outputs, api_name="sweep", preprocess=False,
                          validator=admit, concurrency_id="engine", concurrency_limit=1, show_progress="minimal",
                          show_progress_on=[ui["sweep_progress"]])

    def on_stop(request: gr.Request) -> Any:
        said = pg.stop(request.session_hash)
        return progress_html(0, 1, said.replace("*", "")) if said == STOPPED_IN_QUEUE else gr.skip()

    ui["sweep_stop"].click(on_stop, None, ui["sweep_progress"], api_visibility="private", queue=False,
                           show_progress="hidden")
    _wire_views(pg, runner, ui, outputs, form_inputs, pack)


def _wire_views(pg: Playground, runner: SweepRunner, ui: dict[str, Any], outputs: list, form_inputs: dict,
                pack: Any) -> None:
    """The estimate as the form changes, the chart's metric, a row picked, Apply, reload."""
    quiet = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
    keys = list(form_inputs)

    def on_form(*values: Any) -> str:
        named = dict(zip(keys, values))
        return runner.estimate({k: named[k] for k in FORM_KEYS}, {k: named[k] for k in BASE_KEYS})

    for comp in dict.fromkeys(form_inputs[k] for k in (*FORM_KEYS, "preset")):
        comp.change(on_form, list(form_inputs.values()), ui["sweep_estimate"], preprocess=False, **quiet)
    ui["sweep_metric"].change(figure, [ui["sweep_result"], ui["sweep_metric"]], ui["sweep_plot"],
                              api_visibility="private", show_progress="hidden")

    def on_select(result: Any, evt: gr.SelectData) -> Any:
        cells = (result or {}).get("cells", [])
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return cells[row]["key"] if isinstance(row, int) and 0 <= row < len(cells) else gr.skip()

    ui["sweep_table"].select(on_select, ui["sweep_result"], ui["sweep_pick"], **quiet)
    numerics = ui["numerics"]
    offered = [v for _, v in numerics.choices]

    def on_apply(result: Any, key: Any, lo: Any, hi: Any) -> tuple:
        values, note = _errors(lambda: cell_controls(result, key, offered, lo, hi))
        return (*(values.get(k, gr.skip()) for k in APPLY_KEYS), note)

    ui["sweep_apply"].click(on_apply, [ui["sweep_result"], ui["sweep_pick"], ui["min_block"], ui["max_block"]],
                            [*(ui[k] for k in APPLY_KEYS), ui["sweep_applied"]], api_name="sweep_apply",
                            queue=False, preprocess=False)
    ui["sweep_upload"].upload(lambda path, metric: pack(_errors(lambda: runner.reload(path, metric))),
                              [ui["sweep_upload"], ui["sweep_metric"]], outputs, api_name="sweep_reload")
