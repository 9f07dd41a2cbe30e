"""The Sweep tab in Debian's Chromium (Playwright), end to end on the tiny model: a 2 × 2 sweep (block size × copy
n-gram) with its progress, the heatmap and the table, a picked cell applied to the playground's controls, the JSON
export downloaded and reloaded. Skipped cleanly when Chromium or Playwright is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.browser import test_playground_browser as harness

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(harness.CHROMIUM).exists(), reason="Debian's chromium is not installed")]
browser = harness.browser  # the same fixture: one Chromium for this module
expect, open_page = harness.expect, harness.open_page


@pytest.fixture(scope="module")
def app():
    from tests.ui_support import served_tiny_app

    with served_tiny_app(play_delay_s=0.02) as url:
        yield url


def fill_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input")
    box.fill(str(value))
    box.press("Tab")


def hover_text(page, target, fx: float, fy: float) -> str:
    """The plotly tooltip at a point of `target` (fractions of its box). The chart may still be redrawn by the
    sweep's last update, which drops a tooltip shown before it: hover again until one stays."""
    tip = page.locator("#sweep-plot .hovertext")
    for _ in range(20):
        target.scroll_into_view_if_needed()  # (plotly's drag layer above the cells takes the pointer: move the mouse)
        box = target.bounding_box()
        page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy, steps=4)
        page.wait_for_timeout(250)
        if tip.count():
            return tip.first.text_content()
        page.mouse.move(0, 0)
    raise AssertionError("no tooltip over the chart")


def test_a_two_by_two_sweep_end_to_end(app, browser, tmp_path):
    page = open_page(browser, app)
    try:
        page.get_by_role("tab", name="Sweep").click()
        # The first grid is block size 4,8 × copy n-gram 0,2; keep it short: one prompt, one repeat, 6 tokens.
        expect(page.locator("#sweep-values-1 input")).to_have_value("4,8")
        expect(page.locator("#sweep-values-2 input")).to_have_value("0,2")
        for elem_id, value in (("sweep-n-prompts", 1), ("sweep-repeats", 1), ("sweep-max-new", 6)):
            fill_number(page, elem_id, value)
        expect(page.locator("#sweep-estimate")).to_contain_text("4 cells to measure × 1 prompt × 1 repeat")
        page.click("#sweep-run")
        progress = page.locator("#sweep-progress")
        expect(progress).to_contain_text("Finished: 4 cells")
        bar = progress.locator("progress")
        expect(bar).to_have_attribute("max", "4")
        expect(bar).to_have_attribute("value", "4")
        heatmap = page.locator("#sweep-plot .js-plotly-plot .hm")  # the heatmap, drawn by plotly
        expect(heatmap).to_be_visible()
        expect(page.locator("#sweep-plot")).to_contain_text("best lossless")
        # Hover the first cell (block size 4, copy off): its numbers and sample count.
        assert re.search(r"block_size=4\|lookup_ngram=0.*n = 1", hover_text(page, heatmap, 0.25, 0.75), re.S)
        rows = page.locator("#sweep-table [role=row]")  # the header and a row per cell
        expect(rows).to_have_count(5)
        # Pick the cell block size 4, copy 2 by its row, apply it: the playground's controls take its settings.
        page.locator("#sweep-table [role=gridcell]", has_text="block_size=4 · lookup_ngram=2").click()
        expect(page.locator("#sweep-pick input")).to_have_value(re.compile(r"^block_size=4 · lookup_ngram=2 — "))
        page.click("#sweep-apply")
        expect(page.locator("#sweep-applied")).to_contain_text("Applied:")
        expect(page.locator("#block-size input[type=number]")).to_have_value("4")
        expect(page.locator("#lookup input[type=number]")).to_have_value("2")
        # Export the JSON and load it back.
        with page.expect_download() as download:
            page.click("#sweep-export-json")
        saved = tmp_path / "sweep.json"
        download.value.save_as(saved)
        doc = json.loads(saved.read_text(encoding="utf-8"))
        assert doc["schema"] == "dflash-sweep/1" and len(doc["cells"]) == 4
        page.locator("#sweep-upload").evaluate("e => e.scrollIntoView()")
        with page.expect_file_chooser() as chooser:
            page.click("#sweep-upload")
        chooser.value.set_files(str(saved))
        expect(progress).to_contain_text("Loaded a sweep of 4 cells")
        expect(rows).to_have_count(5)
    finally:
        page.close()
