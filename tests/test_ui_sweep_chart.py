"""The Sweep tab's interactive chart (ui/sweep_chart.py) on real sweeps of the tiny models: what a hover shows, the
marks, and the same grid as the PNG's."""

from __future__ import annotations

from dflash.bench.sweep import sweep_result
from tests.test_sweep import LOSSY, MODELS, PROMPTS, engine, measure, measured, spec_of  # noqa: F401  (fixtures)
from ui.sweep_chart import sweep_chart


def test_nothing_measured_draws_nothing():
    assert sweep_chart(None) is None and sweep_chart({"cells": []}) is None


def test_one_axis_draws_lines_whose_hover_gives_the_numbers(engine):
    spec = spec_of(("block_size", (2, 4, 8)), max_new_tokens=4, repeats=2, prompts=PROMPTS[:1])
    cells, _ = measure(engine, spec)
    doc = sweep_result(spec, cells, host={}, models=MODELS)
    fig = sweep_chart(doc, "tau")
    (line,) = fig.data
    assert list(line.x) == ["2", "4", "8"] and list(line.y) == [c.tau[0] for c in cells]
    assert list(line.error_y.array) == [c.tau[2] - c.tau[0] for c in cells]
    for c, tip in zip(cells, line.hovertext, strict=True):
        assert f"τ (tokens per verify): {c.tau[0]:.2f}" in tip and "n = 2 (prompts × repeats)" in tip
    assert list(line.text) == [("★" if c.key == doc["best"] else "") + ("◇" if c.key == doc["default"] else "")
                               for c in cells]


def test_two_axes_draw_a_heatmap_with_every_cell_hoverable(measured):
    spec, cells, _ = measured
    doc = sweep_result(spec, cells[:3], host={}, models=MODELS)  # one cell not measured yet
    fig = sweep_chart(doc, "no such metric")  # falls back to the speedup
    (heat,) = fig.data
    assert list(heat.x) == ["2", "4"] and list(heat.y) == ["1.0", str(LOSSY)]
    tips = [t for row in heat.hovertext for t in row]
    assert tips[-1] == "not measured" and heat.z[1][1] is None
    for c, tip in zip(cells[:3], tips, strict=False):
        assert f"{c.speedup[0]:.2f}" in tip and "n = 4" in tip and ("drift tokens" in tip) == c.lossy
    assert sum(t.startswith("★") for row in heat.text for t in row) == 1
    assert "best lossless" in fig.layout.title.text


def test_three_axes_draw_one_heatmap_per_value_of_the_third(engine):
    spec = spec_of(("block_size", (2, 8)), ("acceptance_threshold", (1.0, LOSSY)), ("lookup_ngram", (0, 2)),
                   max_new_tokens=4, repeats=1, prompts=PROMPTS[:1])
    cells, _ = measure(engine, spec)
    fig = sweep_chart(sweep_result(spec, cells, host={}, models=MODELS))
    assert len(fig.data) == 2 and [a.text for a in fig.layout.annotations] == ["copy n-gram = 0 (off)",
                                                                               "copy n-gram = 2"]
    assert fig.data[0].zmin == fig.data[1].zmin and fig.data[0].zmax == fig.data[1].zmax  # one colour scale
