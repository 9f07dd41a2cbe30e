"""A shared trace file cannot script someone else's page: in Debian's Chromium (Playwright), upload a trace with
markup in every text field and one with markup where a number belongs, step and play through the first, and check
that no injected element exists and no script ran. Skipped cleanly when Chromium or Playwright is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser import test_playground_browser as harness
from tests.test_ui_replay import with_markup_in_every_string
from ui.replay import TRACES_DIR

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(harness.CHROMIUM).exists(), reason="Debian's chromium is not installed")]
browser = harness.browser  # the same fixture: one Chromium for this module
expect, open_page = harness.expect, harness.open_page

# Each payload, if it ever became an element or an attribute, would count itself in window.__pwned.
IMG = '<img src=x onerror="window.__pwned=(window.__pwned||0)+1">'
SVG = '<svg onload="window.__pwned=(window.__pwned||0)+1"></svg>'
# Gradio draws its own SVG icons (e.g. the error state's Clear button) in a component; an SVG inside our rendered
# token stream can only come from the trace.
INJECTED = ("document.querySelector('.gradio-container')"
            ".querySelectorAll('img[src=\"x\"], [onerror], [onload], [onmouseover], #token-stream .dfl-stream svg').length")


@pytest.fixture(scope="module")
def app():
    from tests.ui_support import served_tiny_app

    with served_tiny_app(play_delay_s=0.02) as url:
        yield url


def hostile_page(browser, url: str):
    """A fresh page on the Replay tab that records every dialog (alert, confirm …) a script might open."""
    page = open_page(browser, url)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.get_by_role("tab", name="Replay and step mode").click()
    return page, dialogs


def assert_clean(page, dialogs: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate(INJECTED) == 0
    assert dialogs == []


def upload(page, path: Path) -> None:
    page.locator("#trace-upload input[type=file]").set_input_files(str(path))


def test_markup_in_every_text_field_stays_text_through_load_step_and_play(app, browser, tmp_path):
    # The shortest bundled trace (every event type, a third of code.json's frames): Play goes through all its frames.
    doc = json.loads((TRACES_DIR / "maths.json").read_text(encoding="utf-8"))
    path = tmp_path / "hostile-strings.json"
    marked = with_markup_in_every_string(doc, IMG)
    for e in marked["events"]:  # a second payload in the reasons shown by the inspector and the charts
        if e["type"] == "BlockSize":
            e["reason"] = SVG
    path.write_text(json.dumps(marked), encoding="utf-8")
    page, dialogs = hostile_page(browser, app)
    upload(page, path)
    expect(page.locator("#status")).to_contain_text("Loaded upload trace")
    expect(page.locator("#status")).to_contain_text("<img src=x")  # shown as text
    expect(page.locator("#token-stream")).to_contain_text("<img src=x onerror=")
    expect(page.locator("#block-inspector")).to_contain_text("<svg onload=")
    assert_clean(page, dialogs)
    page.click("#step-prev")
    expect(page.locator("#replay-label")).not_to_contain_text("finished")
    page.click("#step-next")
    expect(page.locator("#replay-label")).to_contain_text("finished")
    page.click("#play")  # from the last frame Play starts again at the first
    expect(page.locator("#replay-label")).not_to_contain_text("finished")
    expect(page.locator("#replay-label")).to_contain_text("finished", timeout=120_000)
    for tok in page.locator("#token-stream .dfl-stream .tok").all()[:20]:
        tok.dispatch_event("click")  # the stream's click handler copies the token's title into the details line
    expect(page.locator("#token-stream .tok-details")).to_contain_text("onerror")  # the markup shown as text
    page.locator("#block-length-plot .js-plotly-plot").hover()
    assert_clean(page, dialogs)
    harness.ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(harness.ARTIFACTS / "playground-hostile-trace.png"), full_page=True)
    page.close()


def test_markup_where_a_number_belongs_is_a_named_error(app, browser, tmp_path):
    doc = json.loads((TRACES_DIR / "code.json").read_text(encoding="utf-8"))
    i = next(i for i, d in enumerate(doc["events"]) if d["type"] == "BlockSize")
    doc["events"][i]["size"] = IMG
    doc["events"][i + 1]["n_steps"] = SVG
    path = tmp_path / "hostile-numbers.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    page, dialogs = hostile_page(browser, app)
    upload(page, path)
    expect(page.get_by_text(f"trace: events[{i}] (BlockSize): 'size' must be an integer in [1, 64]").first).to_be_visible()
    expect(page.locator("#status")).not_to_contain_text("Loaded upload trace")
    assert_clean(page, dialogs)
    page.close()


def error_badges(page) -> list[str]:
    """The elem_ids of the components showing Gradio's "Error" badge."""
    return page.evaluate("""() => [...document.querySelectorAll('.error')]
        .filter(e => e.offsetParent !== null && /Error/.test(e.textContent)).map(e => e.closest('[id]')?.id)
        .filter(id => id)""")


def test_a_refused_upload_leaves_the_shown_trace_in_view(app, browser, tmp_path):
    """A file that is not a trace: its message as a toast and one badge on the replay label. Gradio badged every
    output of the failed event ("Error" over the four charts, the stream, the status and the sliders)."""
    page, dialogs = hostile_page(browser, app)
    page.click("#load-trace")
    expect(page.locator("#status")).to_contain_text("Loaded bundled trace")
    bad = tmp_path / "garbage.json"
    bad.write_text("not json at all", encoding="utf-8")
    upload(page, bad)
    expect(page.get_by_text("trace: line 1 is not valid JSON").first).to_be_visible()
    expect(page.locator("#replay-label .error")).to_be_visible()
    assert error_badges(page) == ["replay-label"]
    expect(page.locator("#status")).to_contain_text("Loaded bundled trace")  # the trace shown stays shown
    expect(page.locator("#block-length-plot .js-plotly-plot")).to_be_visible()
    assert_clean(page, dialogs)
    page.close()


def test_the_step_and_block_sliders_follow_the_keyboard(app, browser):
    """Arrow keys and a typed value move the replay (before, only a pointer release or leaving the box did)."""
    page, _ = hostile_page(browser, app)
    page.click("#load-trace")
    expect(page.locator("#replay-label")).to_contain_text("finished")
    page.locator("#replay-step input[type=range]").focus()
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#replay-label")).not_to_contain_text("finished")
    box = page.locator("#replay-step input[type=number]")
    box.fill("0")
    box.press("Enter")
    expect(page.locator("#replay-label")).to_contain_text("Frame 0/")
    page.locator("#replay-step input[type=range]").press("End")
    expect(page.locator("#replay-label")).to_contain_text("finished")
    page.locator("#inspect-block input[type=range]").press("ArrowRight")  # from 0 (the latest) to block 1
    expect(page.locator("#block-inspector")).to_contain_text("Block 1:")
    box = page.locator("#inspect-block input[type=number]")
    box.fill("2")
    box.press("Enter")
    expect(page.locator("#block-inspector")).to_contain_text("Block 2:")
    page.close()

