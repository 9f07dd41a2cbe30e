"""The playground's Sweep tab (ui/sweep_tab.py, ui/sweep_run.py, ui/sweep_form.py) on the tiny real models: the
form's checks naming the control, the estimate and its refusal, a sweep over HTTP with its progress, table and
exports, the cells of the session read back, a cell applied to the controls, and a reloaded sweep."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from dflash.bench.sweep import SweepSpec, cell_key, load_sweep
from dflash.errors import ValidationError
from tests.ui_support import tiny_text_engine
from ui import build_demo, launch_kwargs
from ui.handlers import Settings, defaults
from ui.sweep_form import BASE_KEYS, FORM_KEYS, estimate_words, form_spec
from ui.sweep_run import TABLE_COLUMNS, SweepRunner, cell_controls, progress_html, read_sweep_file
from ui.sweep_tab import APPLY_KEYS, FIRST_FORM, SWEEP_OUT

# A 2 × 2 grid, short: one prompt, one repeat, 6 new tokens (8 runs on the tiny model, a second or two).
SMALL = {**FIRST_FORM, "n_prompts": 1, "repeats": 1, "sweep_max_new": 6}
PAGE = {**defaults(8), "preset": "default", "numerics": "float32"}
CLIENT_OUT = [k for k in SWEEP_OUT if k not in ("sweep_result", "sweep_done")]  # State is not sent to clients


def form(**over) -> dict:
    return {**SMALL, **over}


def sweep_args(**over) -> dict:
    return {**{k: form(**over)[k] for k in FORM_KEYS}, **{k: PAGE[k] for k in BASE_KEYS}, "sweep_metric": "speedup"}


# -- the form --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, control", [
    ({"values_1": "2,x"}, "Values 1: block_size: must be an integer"),
    ({"values_1": ""}, "Values 1: give the values of block_size"),
    ({"param_2": "(none)"}, "Parameter 2: choose the parameter that takes the values '0,2'"),
    ({"param_2": "block_size"}, "Parameter 2: block_size is varied twice"),
    ({"param_1": "top_k"}, "Parameter 1: must be one of block_size"),
    ({"param_1": "(none)", "values_1": "", "param_2": "(none)", "values_2": ""}, "Parameter 1: choose at least one"),
    ({"values_1": "4,99999"}, "Values 1: block_size: must be in [1, 64]"),
    ({"n_prompts": 4}, "Prompts: the set has 3 prompt(s), asked for 4"),
    ({"n_prompts": 1.5}, "Prompts: must be a whole number"),
    ({"repeats": 0}, "Repeats: must be a whole number in [1, 10]"),
    ({"sweep_max_new": 513}, "New tokens per run: must be a whole number in [1, 512]"),
    ({"prompt_set": "mine", "my_prompts": " \n "}, "Your prompts: write at least one prompt"),
    ({"prompt_set": "../etc/passwd"}, "Prompt set: choose one of examples"),
])
def test_a_bad_form_value_is_one_message_naming_its_control(over, control):
    with pytest.raises(ValidationError) as info:
        form_spec(form(**over), {}, 512)
    assert str(info.value).startswith(control), str(info.value)


def test_the_form_gives_the_grid_prompts_and_base():
    spec = form_spec(form(prompt_set="mine", my_prompts="one\n\ntwo\nthree", n_prompts=2), {"adaptive": "fixed",
                                                                                             "block_size": 8}, 512)
    assert spec.axes == (("block_size", (4, 8)), ("lookup_ngram", (0, 2)))
    assert spec.prompts == ("one", "two") and spec.repeats == 1 and spec.max_new_tokens == 6
    assert spec.base == {"adaptive": "fixed"}  # the varied block size is the grid's, not the page's


def test_the_estimate_refuses_a_grid_past_the_limit():
    spec = SweepSpec((("block_size", (4, 8)),), ("a", "b"), repeats=2, max_new_tokens=10)
    words, ok = estimate_words(spec, (0.01, 0.02), limit_s=60)
    assert ok and words.startswith("**Estimated time:**") and "2 cells to measure × 2 prompts × 2 repeats" in words
    words, ok = estimate_words(spec, (1.0, 2.0), limit_s=60)
    assert not ok and words.startswith("**Too long:**") and "limit of 1 min 0 s" in words
    # Cells read back cost nothing: only the rest is estimated.
    words, ok = estimate_words(spec, (1.0, 2.0), limit_s=60, skip={cell_key({"block_size": 4}): None})
    assert "1 cell to measure (1 read back)" in words


def test_the_progress_line_is_escaped():
    assert "<b>" not in progress_html(1, 2, "<b>cell</b>") and "&lt;b&gt;" in progress_html(1, 2, "<b>cell</b>")


# -- in process ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local():
    torch.set_num_threads(1)
    demo = build_demo({"default": tiny_text_engine(block_size=8)}, settings=Settings(sweep_max_s=600))
    runner = SweepRunner(demo.playground)
    outs = list(runner.run(form(), PAGE, {}, "speedup", "local"))
    yield SimpleNamespace(demo=demo, runner=runner, outs=outs, result=outs[-1]["sweep_result"],
                          store=outs[-2]["sweep_done"])
    demo.close()


def test_a_sweep_streams_its_progress_and_a_chart_per_cell(local):
    cells = [o for o in local.outs[:-1] if "sweep_result" in o]  # the last update repeats the whole result
    assert len(cells) == 4 and [len(o["sweep_table"]) for o in cells] == [1, 2, 3, 4]
    assert local.outs[-1]["sweep_table"] == cells[-1]["sweep_table"]
    assert all(o["sweep_plot"] is not None for o in cells)
    assert "Finished: 4 cells" in local.outs[-1]["sweep_progress"]
    assert any("cell 3/4" in o.get("sweep_progress", "") for o in local.outs)
    assert all(len(row) == len(TABLE_COLUMNS) and row[7] == 1 for row in cells[-1]["sweep_table"])  # n = 1 sample


def test_cells_of_the_same_spec_are_read_back_not_run_again(local):
    again = list(local.runner.run(form(), PAGE, local.store, "speedup", "local"))
    assert "(4 read back from this session)" in again[-1]["sweep_progress"]
    assert "0 cells to measure (4 read back)" in next(o["sweep_estimate"] for o in again if "sweep_estimate" in o)
    assert again[-1]["sweep_result"]["cells"] == local.result["cells"]
    # Another spec (more tokens) is measured afresh.
    other = list(local.runner.run(form(sweep_max_new=7, values_1="8", values_2="0"), PAGE, local.store, "speedup",
                                  "local"))
    assert "read back" not in other[-1]["sweep_progress"]


def test_stop_ends_the_sweep_keeping_the_finished_cells(local):
    outs = []
    for out in local.runner.run(form(sweep_max_new=5), PAGE, {}, "speedup", "stopper"):
        outs.append(out)
        if "sweep_result" in out:  # the first cell is in: Stop, as the tab's button does
            local.demo.playground.stop("stopper")
    assert "Stopped: 1 of 4 cells measured, kept" in outs[-1]["sweep_progress"]
    assert len(outs[-1]["sweep_result"]["cells"]) == 1 and len(outs[-1]["sweep_table"]) == 1
    assert load_sweep(Path(outs[-1]["sweep_json"]).read_text(encoding="utf-8"))["complete"] is False


def test_a_sweep_past_the_servers_limit_is_refused_before_it_runs():
    demo = build_demo({"default": tiny_text_engine(block_size=8)}, settings=Settings(sweep_max_s=0))
    try:
        outs, runner = [], SweepRunner(demo.playground)
        with pytest.raises(ValidationError, match="Sweep: the estimated time is more than this server's limit"):
            outs.extend(runner.run(form(), PAGE, {}, "speedup", "s"))
        assert outs[-1]["sweep_estimate"].startswith("**Too long:**")
        assert not any("sweep_result" in o for o in outs)
    finally:
        demo.close()


def test_apply_a_cell_sets_the_controls(local):
    key = cell_key({"block_size": 4, "lookup_ngram": 2})
    values, note = cell_controls(local.result, key, ["float32"], 2, 16)
    assert values["block_size"] == 4 and values["lookup"] == 2 and values["steps"] == PAGE["steps"]
    assert values["adaptive"] == PAGE["adaptive"] and values["min_block"] == 2 and values["max_block"] == 16
    assert note.startswith("**Applied:** block\\_size=4")
    with pytest.raises(ValidationError, match="Cell: pick one"):
        cell_controls(local.result, "block_size=3", ["float32"], 2, 16)
    with pytest.raises(ValidationError, match="Cell: run or load a sweep first"):
        cell_controls(None, key, ["float32"], 2, 16)


def test_export_and_reload_round_trip(local, tmp_path):
    files = local.runner.exports(local.result)
    text = Path(files["sweep_json"]).read_text(encoding="utf-8")
    assert load_sweep(text) == local.result == read_sweep_file(files["sweep_json"])
    assert len(Path(files["sweep_csv"]).read_text().splitlines()) == 5
    bad = tmp_path / "bad.json"
    for content, words in (('{"schema": "x"}', "Sweep file: schema"), ("not json", "Sweep file: not JSON"),
                           (json.dumps({**local.result, "cells": [{"key": 1}]}), "Sweep file: cells[0]")):
        bad.write_text(content)
        with pytest.raises(ValidationError, match=words.replace("[", r"\[")):
            read_sweep_file(str(bad))


# -- over HTTP -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory):
    torch.set_num_threads(1)
    demo = build_demo({"default": tiny_text_engine(block_size=8)})
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))
    yield SimpleNamespace(demo=demo, client=client)
    client.close()
    demo.close()


def named(result) -> dict:
    return dict(zip(CLIENT_OUT, result))


def test_a_sweep_shares_the_engine_slot_with_generate(app):
    fns = {fn.api_name: fn for fn in app.demo.fns.values() if fn.api_name}
    assert fns["sweep"].concurrency_id == fns["generate"].concurrency_id == "engine"
    assert fns["sweep"].concurrency_limit == 1 and fns["sweep_apply"].queue is False


def test_over_http_a_bad_value_names_its_control(app):
    with pytest.raises(AppError, match="Values 2: lookup_ngram: must be an integer"):
        app.client.predict(**sweep_args(values_2="0,two"), api_name="/sweep")
    with pytest.raises(AppError, match="Block size: must be"):  # the page's own control, as the page names it
        app.client.predict(**{**sweep_args(), "block_size": 0}, api_name="/sweep")
    with pytest.raises(AppError, match="Sweep: the estimated time is more than this server's limit of 5 min"):
        app.client.predict(**sweep_args(values_1="2,3,4,5,6,7,8", n_prompts=3, repeats=10, sweep_max_new=512),
                           api_name="/sweep")


def test_over_http_sweep_apply_export_and_reload(app):
    final = named(app.client.predict(**sweep_args(), api_name="/sweep"))
    assert "Finished: 4 cells" in final["sweep_progress"]
    rows = final["sweep_table"]["data"]
    assert len(rows) == 4 and final["sweep_table"]["headers"] == TABLE_COLUMNS
    doc = load_sweep(Path(final["sweep_json"]).read_text(encoding="utf-8"))
    assert [c["key"] for c in doc["cells"]] == [cell_key(s) for s in SweepSpec.from_dict(doc["spec"]).cells()]
    assert doc["models"]["target"] == "tiny" and doc["host"]["torch"] == torch.__version__
    # The session's result is what Apply reads: the cell's settings reach the controls.
    key = cell_key({"block_size": 8, "lookup_ngram": 2})
    applied = dict(zip([*APPLY_KEYS, "note"], app.client.predict(key, 2, 8, api_name="/sweep_apply")))
    assert applied["block_size"] == 8 and applied["lookup"] == 2 and applied["max_block"] == 8
    # Again: every cell read back from the session.
    again = named(app.client.predict(**sweep_args(), api_name="/sweep"))
    assert "(4 read back from this session)" in again["sweep_progress"]
    loaded = named(app.client.predict(handle_file(final["sweep_json"]), "tau", api_name="/sweep_reload"))
    assert "Loaded a sweep of 4 cells" in loaded["sweep_progress"]
    assert loaded["sweep_table"]["data"] == rows


def test_over_http_a_bad_sweep_file_is_one_message(app, tmp_path):
    bad = tmp_path / "sweep.json"
    bad.write_text(json.dumps({"schema": "dflash-sweep/1", "spec": {"axes": "no"}}))
    with pytest.raises(AppError, match="Sweep file: spec"):
        app.client.predict(handle_file(str(bad)), "speedup", api_name="/sweep_reload")


# -- the operator's limit --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, env, says", [
    (["--sweep-max-seconds", "5"], {}, "--sweep-max-seconds: must be a whole number of seconds in [10, 604800], got '5'"),
    ([], {"DFLASH_SWEEP_MAX_SECONDS": "ten"}, "DFLASH_SWEEP_MAX_SECONDS: must be a whole number in [10, 604800], got 'ten'"),
])
def test_a_bad_sweep_limit_stops_the_start_in_one_line(argv, env, says):
    from tests.test_ui_serve import ENV, free_port, serve

    proc = serve(*argv, "--port", str(free_port()), env={**ENV, **env})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dflash-playground: error: {says} (usage: python app.py --help)"], proc.stderr


def test_the_sweep_limit_comes_from_the_flag_over_the_variable(monkeypatch):
    from tests.test_ui_serve import free_port
    from ui.serve import parse_args

    port = str(free_port())
    assert "sweep_max_s" not in parse_args(["--port", port]).limits  # Settings' default: 300 s
    monkeypatch.setenv("DFLASH_SWEEP_MAX_SECONDS", "42")
    assert parse_args(["--port", port]).limits["sweep_max_s"] == 42
    assert parse_args(["--port", port, "--sweep-max-seconds", "900"]).limits["sweep_max_s"] == 900
    assert Settings().sweep_max_s == 300
