"""What the draft attends to, in Debian's Chromium (Playwright) on the tiny served playground: a step-mode run with
"Record what the draft attends to" ticked shows the view for the drafted block under the inspector, and an uploaded
trace that recorded it shows it again in replay. Skipped cleanly when Chromium or Playwright is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash.decode.request import Request
from tests.browser import test_playground_browser as harness
from tests.browser import test_step_view_browser as step_view
from ui.replay import Trace, dumps_trace

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(harness.CHROMIUM).exists(), reason="Debian's chromium is not installed")]
# The same fixtures: one Chromium and one page on the tiny served playground for this module.
browser, app, page = harness.browser, step_view.app, step_view.page
expect = harness.expect
VIEW = "#block-inspector .dfl-attn"


def test_step_mode_shows_what_the_draft_attends_to(page):
    page.locator("#trace-attention input").check()
    page.locator("#step-mode input").check()
    page.click("#generate")
    expect(page.locator("#status")).to_contain_text("Step mode")
    expect(page.locator(VIEW)).to_have_count(0)  # frame 0: nothing drafted yet
    for frame in (1, 2):  # the prefill's first token; block 1's denoising step: drafted, not yet verified
        page.click("#step-next")  # (one at a time: a click while the last one is drawn would be dropped)
        expect(page.locator(step_view.LABEL)).to_contain_text(f"Frame {frame}/")
    expect(page.locator("#block-inspector .insp-summary")).to_contain_text("Block 1")
    view = page.locator(VIEW)
    expect(view).to_contain_text("What the draft attends to")
    expect(view).to_contain_text("KV injection")
    expect(view.locator("details[open] .attn-tok").first).to_be_visible()  # layer 0 open: its context tokens
    assert "weight" in view.locator(".attn-tok").first.get_attribute("title")
    expect(view.locator("th.attn-anchor").first).to_contain_text("anchor")


def test_a_replayed_trace_shows_it_for_the_inspected_block(page, tmp_path):
    from tests.ui_support import PROMPT, tiny_text_engine

    run = tiny_text_engine(block_size=8).generate(Request(prompt=PROMPT, max_new_tokens=16, lookup_ngram=0,
                                                          adaptive="fixed", trace_attention=True))
    path = tmp_path / "attention.json"
    path.write_text(dumps_trace(Trace(run.events, {"title": "Attention"})), encoding="utf-8")
    page.locator("#trace-attention input").uncheck()  # the trace recorded it: the box is for new runs
    page.get_by_role("tab", name="Replay and step mode").click()
    page.locator("#trace-upload input[type=file]").set_input_files(str(path))
    expect(page.locator("#status")).to_contain_text("Loaded upload trace: Attention")
    box = page.locator("#inspect-block input[type=number]")
    box.fill("1")
    box.press("Enter")
    expect(page.locator("#block-inspector .insp-summary")).to_contain_text("Block 1:")
    expect(page.locator(VIEW)).to_contain_text("Draft layer 0")
    expect(page.locator(f"{VIEW} .attn-tok").first).to_be_visible()
