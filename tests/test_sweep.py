"""dflash.bench.sweep: the grid and its checks, the measurement on tiny random models (lossless cells identical to
their interleaved no-draft runs, a lossy cell's drift), read-back and stop, the document, its CSV and its chart."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_draft, tiny_target
from dflash.bench.sweep import (SCHEMA, CellResult, SweepSpec, best_cell, cell_key, estimate_seconds, load_sweep,
                                parse_set, run_sweep, sweep_result, to_csv)
from dflash.decode.engine import Engine
from dflash.errors import ValidationError

PROMPTS = ((5, 17, 33, 4, 90, 61), (7, 8, 9, 10, 11, 12, 7, 8, 9))
MODELS = {"target": "tiny-llama", "draft": "tiny", "dtype": "float32", "device": "cpu", "trained_block_size": 8}
LOSSY = 1e-9  # accepts almost any drafted token: a random draft's output then leaves the target's


@pytest.fixture(scope="module")
def engine() -> Engine:
    target = tiny_target("llama")
    return Engine(target, tiny_draft(target, block_size=8))


def spec_of(*axes, **kw) -> SweepSpec:
    return SweepSpec(tuple(axes), kw.pop("prompts", PROMPTS), **{"repeats": 2, "max_new_tokens": 20, **kw})


def measure(engine, spec, **kw) -> tuple[list[CellResult], list]:
    """Run a sweep to its end: (the finished cells, every progress report)."""
    reports = list(run_sweep(lambda dtype: engine, spec, **kw))
    return [p.cell for p in reports if p.cell is not None], reports


@pytest.fixture(scope="module")
def measured(engine):
    """block_size 2, 4 × acceptance threshold exact or LOSSY: 2 prompts × 2 repeats per cell."""
    spec = spec_of(("block_size", (2, 4)), ("acceptance_threshold", (1.0, LOSSY)))
    cells, reports = measure(engine, spec)
    return spec, cells, reports


# -- parse_set and the spec -------------------------------------------------------------------------------------------
def test_parse_set_converts_to_each_parameter_type():
    assert parse_set("block_size=2,4, 8") == ("block_size", (2, 4, 8))
    assert parse_set("acceptance_threshold=1,0.5") == ("acceptance_threshold", (1.0, 0.5))
    assert parse_set("adaptive=fixed,cost") == ("adaptive", ("fixed", "cost"))
    assert parse_set("dtype=float32,bfloat16") == ("dtype", ("float32", "bfloat16"))


@pytest.mark.parametrize("text, param, words", [
    ("blocksize=2,4", "set", ["'blocksize'", "block_size"]),
    ("block_size", "set", ["NAME=V1,V2"]),
    ("block_size=", "block_size", ["none empty"]),
    ("block_size=2,,4", "block_size", ["none empty"]),
    ("block_size=2,x", "block_size", ["integer", "'x'"]),
    ("block_size=2.5", "block_size", ["integer"]),
    ("block_size=100", "block_size", ["[1, 64]", "100"]),
    ("diffusion_steps=0", "diffusion_steps", ["[1, 16]"]),
    ("confidence_threshold=nan", "confidence_threshold", ["finite"]),
    ("adaptive=fast", "adaptive", ["fixed", "'fast'"]),
    ("lookup_ngram=9", "lookup_ngram", ["[0, 8]"]),
    ("dtype=float16", "dtype", ["float32", "bfloat16"]),
    ("temperature=3", "temperature", ["[0.0, 2.0]"]),
])
def test_parse_set_errors_name_the_parameter(text, param, words):
    with pytest.raises(ValidationError) as err:
        parse_set(text)
    assert err.value.param == param and all(w in err.value.message for w in words), err.value


@pytest.mark.parametrize("kw, param", [
    (dict(axes=()), "axes"),
    (dict(axes=(("block_size", (2,)),) * 2), "axes"),
    (dict(axes=(("block_size", (2,)), ("adaptive", ("fixed",)), ("dtype", ("float32",)), ("temperature", (0.0,)))),
     "axes"),
    (dict(axes=(("top_p", (0.5,)),)), "axes"),
    (dict(axes=(("block_size", (2, 2)),)), "block_size"),
    (dict(base={"block_size": 4}), "base"),
    (dict(base={"prompt": "x"}), "base"),
    (dict(repeats=0), "repeats"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(prompts=()), "prompts"),
    (dict(prompts=("  ",)), "prompts"),
    (dict(axes=(("acceptance_threshold", (1.0, 0.5)),), base={"verify": "rejection"}), "acceptance_threshold"),
    (dict(axes=(("block_size", tuple(range(1, 17))), ("lookup_ngram", tuple(range(0, 9))),
                ("diffusion_steps", (1, 2)))), "axes"),  # 288 cells
])
def test_the_spec_refuses_a_bad_grid_naming_the_parameter(kw, param):
    args = {"axes": (("block_size", (2, 4)),), "prompts": PROMPTS, **kw}
    with pytest.raises(ValidationError) as err:
        SweepSpec(**args)
    assert err.value.param == param, err.value


def test_cells_run_x_fastest_then_y_then_the_facet():
    spec = spec_of(("block_size", (2, 4)), ("lookup_ngram", (0, 2)), ("adaptive", ("fixed", "cost")))
    keys = [cell_key(s) for s in spec.cells()]
    assert keys[:3] == ["block_size=2|lookup_ngram=0|adaptive=fixed", "block_size=4|lookup_ngram=0|adaptive=fixed",
                        "block_size=2|lookup_ngram=2|adaptive=fixed"]
    assert len(keys) == len(set(keys)) == 8 and keys[-1] == "block_size=4|lookup_ngram=2|adaptive=cost"


def test_the_key_changes_with_what_the_measurements_depend_on():
    spec = spec_of(("block_size", (2, 4)))
    assert spec.key() == spec_of(("block_size", (2, 4))).key()
    assert spec.key() == SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).key()
    others = [spec_of(("block_size", (2, 8))), spec_of(("block_size", (2, 4)), repeats=3),
              spec_of(("block_size", (2, 4)), max_new_tokens=8), spec_of(("block_size", (2, 4)), prompts=PROMPTS[:1]),
              spec_of(("block_size", (2, 4)), base={"adaptive": "fixed"}),
              spec_of(("block_size", (2, 4)), conditions={"cpu_model": "other"})]
    assert len({spec.key(), *(o.key() for o in others)}) == 1 + len(others)


def test_the_estimate_grows_with_the_grid_and_leaves_out_read_back_cells():
    one = spec_of(("block_size", (2,)))
    two = spec_of(("block_size", (2, 4)))
    four = spec_of(("block_size", (2, 4)), ("diffusion_steps", (1, 2)))
    est = [estimate_seconds(s, 0.01, 0.02) for s in (one, two, four)]
    assert 0 < est[0] < est[1] < est[2]
    assert estimate_seconds(spec_of(("block_size", (2,)), repeats=4), 0.01, 0.02) == 2 * est[0]
    assert estimate_seconds(two, 0.01, 0.02, skip={"block_size=4"}) == est[0]


# -- measuring --------------------------------------------------------------------------------------------------------
def test_lossless_cells_are_identical_and_a_lossy_cell_reports_drift(measured):
    spec, cells, reports = measured
    assert [c.key for c in cells] == [cell_key(s) for s in spec.cells()]
    for c in cells:
        assert c.n == 4 and len(c.samples) == 4
        assert c.tau[1] <= c.tau[0] <= c.tau[2] and c.speedup[1] <= c.speedup[0] <= c.speedup[2]
        assert c.tok_s[0] > 0 and c.speedup[0] > 0
        exact = c.setting["acceptance_threshold"] == 1.0
        assert c.lossy is not exact
        if exact:
            assert c.identical and c.differs == c.ties == c.drift_tokens == 0
        else:
            assert not c.identical and c.differs > 0 and c.drift_tokens > 0 and c.ties == 0
    done = [p.done for p in reports]
    assert done == sorted(done) and done[-1] == reports[-1].total == 4 * 2 * 2 * 2


def test_the_result_document_marks_the_best_lossless_cell(measured):
    spec, cells, _ = measured
    doc = sweep_result(spec, cells[::-1], host={"cpu_model": "x"}, models=MODELS)
    assert doc["schema"] == SCHEMA and doc["complete"] and doc["spec_key"] == spec.key()
    assert [c["key"] for c in doc["cells"]] == [cell_key(s) for s in spec.cells()]  # grid order
    lossless = [c for c in cells if not c.lossy]
    assert doc["best"] == best_cell(doc) == max(lossless, key=lambda c: c.speedup[0]).key
    assert doc["default"] is None  # the default block (8) is not in the grid
    again = load_sweep(json.dumps(doc))
    assert [CellResult.from_dict(c) for c in again["cells"]] == sorted(cells, key=lambda c: doc["cells"].index(c.to_dict()))
    rows = to_csv(doc).splitlines()
    assert rows[0].startswith("block_size,acceptance_threshold,key,n,tau,tau_q25,tau_q75,") and len(rows) == 5
    assert rows[1].startswith(f"2,1.0,block_size=2|acceptance_threshold=1.0,4,{cells[0].tau[0]},")
    assert sum(r.endswith("True,False") for r in rows[1:]) == 1  # the best, not the default


def test_the_default_cell_is_the_one_holding_every_default(engine):
    spec = spec_of(("block_size", (4, 8)), ("lookup_ngram", (0, 2)), max_new_tokens=4, repeats=1, prompts=PROMPTS[:1])
    cells, _ = measure(engine, spec)
    assert sweep_result(spec, cells, host={}, models=MODELS)["default"] == "block_size=8|lookup_ngram=2"


def test_done_cells_are_read_back_not_run_again(engine, measured, monkeypatch):
    spec, cells, _ = measured
    calls = []
    original = engine.generate
    monkeypatch.setattr(engine, "generate", lambda req, *a: calls.append(req) or original(req, *a))
    done = {c.key: c for c in cells[:3]}
    again, reports = measure(engine, spec, done=done)
    assert again[:3] == cells[:3] and all(a is b for a, b in zip(again[:3], cells[:3], strict=True))
    assert [r.message for r in reports[:3]] == [f"cell {i}/4 read back ({c.key})" for i, c in enumerate(cells[:3], 1)]
    timed = [r for r in calls if r.max_new_tokens == 20]  # the warm-up runs 16
    assert len(timed) == 2 * 2 * 2 and {r.acceptance_threshold for r in timed} == {LOSSY}
    assert again[3].key == cells[3].key and again[3] is not cells[3]


def test_a_stop_keeps_the_finished_cells_and_drops_the_partial_one(engine):
    spec = spec_of(("block_size", (2, 4, 6)), max_new_tokens=6)
    finished: list[CellResult] = []
    runs = 0

    def stop() -> bool:  # stop two runs into the second cell
        return bool(finished) and runs >= 2 * 2 * 2 + 2

    for p in run_sweep(lambda dtype: engine, spec, should_stop=stop):
        if p.cell is not None:
            finished.append(p.cell)
        elif "prompt" in p.message:
            runs += 1
    assert [c.key for c in finished] == ["block_size=2"] and runs == 10
    rest, _ = measure(engine, spec, done={c.key: c for c in finished})
    assert [c.key for c in rest] == ["block_size=2", "block_size=4", "block_size=6"] and rest[0] is finished[0]


def test_a_cell_the_models_cannot_run_is_refused_before_any_run(engine):
    spec = spec_of(("block_size", (4, 16)))  # the draft was trained on blocks of 8
    reports = run_sweep(lambda dtype: engine, spec)
    with pytest.raises(ValidationError) as err:
        next(reports)
    assert err.value.param == "block_size" and "cell block_size=16, prompt 0" in err.value.message, err.value


def test_each_cell_runs_on_the_engine_of_its_dtype(engine):
    import copy

    import torch

    from dflash.models.target import Target

    half = Engine(Target(copy.deepcopy(engine.target.model), None, dtype=torch.bfloat16), copy.deepcopy(engine.draft))
    asked = []

    def engine_for(dtype):
        asked.append(dtype)
        return half if dtype == "bfloat16" else engine

    spec = spec_of(("dtype", ("float32", "bfloat16")), max_new_tokens=4, repeats=1, prompts=PROMPTS[:1])
    cells = [p.cell for p in run_sweep(engine_for, spec) if p.cell]
    assert asked == ["float32", "bfloat16"] and len(cells) == 2
    assert {s["n_tokens"] for c in cells for s in c.samples} == {4}


# -- the document -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, words", [
    (lambda d: "not json", "not JSON"),
    (lambda d: {**d, "schema": "dflash-bench/1"}, "schema"),
    (lambda d: {**d, "spec": {**d["spec"], "axes": [["nope", [1]]]}}, "spec: axes"),
    (lambda d: {**d, "spec": {**d["spec"], "repeats": 0}}, "spec: repeats"),
    (lambda d: {**d, "cells": {}}, "cells: must be a list"),
    (lambda d: {**d, "cells": [{**d["cells"][0], "tau": [1.0]}]}, "cells[0]: tau"),
    (lambda d: {**d, "cells": [{k: v for k, v in d["cells"][0].items() if k != "n"}]}, "cells[0]: n is missing"),
    (lambda d: {**d, "cells": [{**d["cells"][0], "identical": "yes"}]}, "cells[0]: identical"),
    (lambda d: {**d, "cells": [{**d["cells"][0], "key": "block_size=3"}]}, "cells[0]: key"),
    (lambda d: {**d, "best": "block_size=3|acceptance_threshold=1.0"}, "best"),
    (lambda d: {**d, "host": None}, "host"),
])
def test_load_sweep_names_what_is_wrong(measured, edit, words):
    spec, cells, _ = measured
    doc = edit(sweep_result(spec, cells, host={}, models=MODELS))
    with pytest.raises(ValueError) as err:
        load_sweep(doc if isinstance(doc, str) else json.dumps(doc))
    assert str(err.value).startswith(words), err.value


def test_host_costs_time_the_engine_when_no_probe_did(engine):
    from dflash.bench.sweep import host_costs

    assert engine.host is None  # built here, not by load_engine: nothing probed
    step, verify = host_costs(engine)
    assert 0 < step < 10 and 0 < verify < 10
    assert estimate_seconds(spec_of(("block_size", (2,))), step, verify) > 0


# -- the chart --------------------------------------------------------------------------------------------------------
def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_one_axis_draws_lines_with_quartile_error_bars(engine, tmp_path):
    from dflash.bench.sweep_plot import sweep_figure

    spec = spec_of(("block_size", (2, 4, 8)), max_new_tokens=4, repeats=2, prompts=PROMPTS[:1])
    cells, _ = measure(engine, spec)
    doc = sweep_result(spec, cells, host={}, models=MODELS)
    fig = sweep_figure(doc)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8"] and ax.get_xlabel() == "block size"
    line = ax.lines[0]
    assert list(line.get_ydata()) == [c.speedup[0] for c in cells]
    bars = ax.collections[0].get_segments()  # the error bars: q25 to q75
    ends = [y for s in bars for y in (s[0][1], s[1][1])]
    assert ends == pytest.approx([q for c in cells for q in (c.speedup[1], c.speedup[2])])
    assert sum("n=2" in t for t in _texts(fig)) == 3
    labels = ax.get_legend_handles_labels()[1]
    assert "best lossless" in labels and "default" in labels  # block 8 is the trained size: the default
    assert f"★ best lossless: {doc['best']}" in fig._supxlabel.get_text()
    fig.savefig(tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"


def test_two_axes_draw_a_heatmap_with_value_and_n_per_cell(measured, tmp_path):
    from dflash.bench.sweep_plot import sweep_figure

    spec, cells, _ = measured
    doc = sweep_result(spec, cells[:3], host={}, models=MODELS)  # one cell not measured yet
    fig = sweep_figure(doc, "tau")
    heat, bar = fig.axes
    assert heat.get_xlabel() == "block size" and heat.get_ylabel() == "acceptance threshold"
    texts = _texts(fig)
    assert len(texts) == 4 and texts[-1] == "not\nmeasured"
    for c, text in zip(cells[:3], texts, strict=False):
        assert f"{c.tau[0]:.2f}" in text and "n=4" in text and ("lossy" in text) == c.lossy
    assert sum(t.startswith("★") for t in texts) == 1
    assert bar.get_ylabel().startswith("τ")
    fig.savefig(tmp_path / "two.svg")
    with pytest.raises(ValueError, match="metric"):
        sweep_figure(doc, "ttft")


def test_three_axes_draw_one_heatmap_per_value_of_the_third(engine):
    from dflash.bench.sweep_plot import sweep_figure

    spec = spec_of(("block_size", (2, 8)), ("acceptance_threshold", (1.0, LOSSY)), ("lookup_ngram", (0, 2, 3)),
                   max_new_tokens=4, repeats=1, prompts=PROMPTS[:1])
    cells, _ = measure(engine, spec)
    doc = sweep_result(spec, cells, host={}, models=MODELS)
    fig = sweep_figure(doc)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["copy n-gram = 0 (off)", "copy n-gram = 2", "copy n-gram = 3"]
    assert len(fig.axes) == 4 and len(_texts(fig)) == 12  # three heatmaps of 2 × 2 and the shared colour bar
    outlined = [p for ax in fig.axes for p in ax.patches]
    assert len(outlined) == 2  # the best lossless cell and the default (block 8, exact, n-gram 2)
    assert doc["default"] == "block_size=8|acceptance_threshold=1.0|lookup_ngram=2"
