"""The step view in Debian's Chromium (Playwright): Prev / Play-Pause / Next beside the block inspector and their keys,
a loaded or uploaded trace stopping what plays and setting the controls it was recorded with, and chart notes that
fit on a desktop and on a phone. One page for the module; each test loads the trace it starts from (under
`--dist worksteal` a test can run on another worker than the one before it). Skipped cleanly when Chromium or Playwright
is missing."""

from __future__ import annotations

import html
import itertools
import re
import time
from pathlib import Path

import pytest

from tests.browser import test_playground_browser as harness
from ui.replay import TRACES_DIR, frames, load_trace_file
from ui.text import EXAMPLES

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(harness.CHROMIUM).exists(), reason="Debian's chromium is not installed")]
browser = harness.browser  # the same fixture: one Chromium for this module
expect = harness.expect
LABEL = "#replay-label"
CODE = "Code · SmolLM2 + trained draft, block 8, 2 denoising steps"


@pytest.fixture(scope="module")
def app():
    from tests.ui_support import served_tiny_app

    with served_tiny_app(play_delay_s=0.25) as url:
        yield url


@pytest.fixture(scope="module")
def page(app, browser):
    p = harness.open_page(browser, app)
    yield p
    p.close()


def last_frame_label(name: str) -> str:
    """The frame sentence's start at the last frame of the bundled trace `name`, as a loaded trace shows it."""
    n = len(frames(load_trace_file(TRACES_DIR / name).events)) - 1
    return f"Frame {n}/{n}: finished"


def load_bundled(page, title_start: str) -> None:
    page.get_by_role("tab", name="Replay and step mode").click()
    page.locator("#trace-select input").click()
    page.get_by_role("option", name=title_start).first.click()
    page.click("#load-trace")
    expect(page.locator("#status")).to_contain_text(f"Loaded bundled trace: {title_start}")


def shown(page, title_start: str) -> None:
    """The trace `title_start` loaded, unless the status says it is already (a second load of it would leave the
    status as it was, and the test could go on before the load's reply came)."""
    if title_start not in page.locator("#status").inner_text():
        load_bundled(page, title_start)


def settled(page) -> None:
    """Wait until the frame label shows no event in progress: a frame asked for while another is still being drawn
    could be overwritten by the older one's reply (they run outside the queue, side by side)."""
    expect(page.locator(LABEL)).to_have_text(re.compile(r"^\s*Frame \d+/\d+:"))


def press_on_page(page, key: str) -> None:
    """A key pressed with nothing focused (the page itself)."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.keyboard.press(key)


def in_accordion(page, selector: str, accordion: str):
    """`selector` inside a closed accordion (not in the page until it opens): the accordion opened."""
    if not page.locator(selector).count():
        page.locator(f"button:has-text('{accordion}')").first.click()
    return page.locator(selector)


def test_loading_a_bundled_trace_sets_the_prompt_and_its_controls(page):
    """The code trace was recorded with 2 denoising steps and a 0.5 confidence threshold: loading it sets those (before,
    Denoising steps stayed at 1 and the prompt box empty, so Generate ran something else)."""
    load_bundled(page, CODE)
    expect(page.locator("#prompt textarea")).to_have_value(dict(EXAMPLES)["Code"])
    expect(page.locator("#steps input[type=number]")).to_have_value("2")
    expect(page.locator("#confidence input[type=number]")).to_have_value("0.5")
    expect(in_accordion(page, "#max-new-tokens input[type=number]", "Sampling and length")).to_have_value("48")
    expect(page.locator(LABEL)).to_contain_text(last_frame_label("code.json"))
    # Two denoising steps are neither mode's: the switch and its note say "custom" (they kept "Paper method").
    expect(page.locator("#mode input[value=custom]")).to_be_checked()
    expect(page.locator("#mode-note")).to_contain_text("custom")


def test_the_step_buttons_sit_on_the_inspector_and_the_keys_move_it(page):
    """Prev / Play / Next directly above the block inspector (they were ~1,250 px below it); ← → step and space plays
    and pauses, except while typing; a key brings the inspector back into view."""
    shown(page, CODE)
    bar, insp = page.locator("#step-next").bounding_box(), page.locator("#block-inspector").bounding_box()
    assert 0 <= insp["y"] - (bar["y"] + bar["height"]) < 80
    done = last_frame_label("code.json")
    press_on_page(page, "ArrowLeft")
    expect(page.locator(LABEL)).not_to_contain_text("finished")
    expect(page.locator(LABEL)).to_contain_text("Frame ")
    before = page.locator(LABEL).inner_text()
    page.locator("#prompt textarea").press("ArrowLeft")  # typing: the text cursor moves, not the replay
    time.sleep(1.0)
    assert page.locator(LABEL).inner_text() == before
    press_on_page(page, "ArrowRight")
    expect(page.locator(LABEL)).to_contain_text(done)
    settled(page)
    page.set_viewport_size({"width": 1440, "height": 600})
    try:
        page.evaluate("window.scrollTo(0, 0)")
        if page.locator("#block-inspector").bounding_box()["y"] > 600:  # below the screen, as on a short laptop
            press_on_page(page, "ArrowLeft")
            expect(page.locator("#block-inspector")).to_be_in_viewport()
    finally:
        page.set_viewport_size({"width": 1440, "height": 1100})
    settled(page)
    box = page.locator("#replay-step input[type=number]")
    box.fill("0")  # from the first frame: a playback of ~20 s
    box.press("Enter")
    expect(page.locator(LABEL)).to_contain_text("Frame 0/")
    press_on_page(page, " ")  # Play: it becomes Pause and the frames move, block after block
    expect(page.locator("#pause")).to_be_visible()
    expect(page.locator("#play")).to_be_hidden()
    expect(page.locator(LABEL)).to_contain_text(re.compile(r"Frame ([2-9]|\d\d)/"))
    expect(page.locator("#block-inspector .insp-summary")).to_contain_text(re.compile(r"Block [1-9]"))
    press_on_page(page, " ")  # Pause: Play again, and the frame stays
    expect(page.locator("#play")).to_be_visible()
    expect(page.locator("#pause")).to_be_hidden()
    paused = page.locator(LABEL).inner_text()
    time.sleep(1.0)
    assert page.locator(LABEL).inner_text() == paused and "finished" not in paused
    page.click("#step-next")
    expect(page.locator(LABEL)).not_to_have_text(paused)


def test_uploading_while_play_runs_stops_it_and_shows_the_new_trace(page):
    """Before, the status said "Loaded upload trace" while the old trace went on playing over it; now the upload stops
    the playback, shows the new trace at its end, and sets the controls it was recorded with (slow-start, 1 step)."""
    shown(page, CODE)
    page.click("#play")
    expect(page.locator("#pause")).to_be_visible()
    expect(page.locator(LABEL)).not_to_contain_text("finished")
    page.locator("#trace-upload input[type=file]").set_input_files(str(TRACES_DIR / "maths.json"))
    expect(page.locator("#status")).to_contain_text("Loaded upload trace: Maths")
    done = last_frame_label("maths.json")
    expect(page.locator(LABEL)).to_contain_text(done)
    expect(page.locator("#play")).to_be_visible()
    time.sleep(1.5)  # ~6 frames of the old playback, had it gone on
    expect(page.locator(LABEL)).to_contain_text(done)
    expect(page.locator("#token-legend .dfl-prompt")).to_contain_text("17 multiplied by 24")
    expect(page.locator("#prompt textarea")).to_have_value(dict(EXAMPLES)["Maths"])
    expect(page.locator("#steps input[type=number]")).to_have_value("1")
    expect(in_accordion(page, "#adaptive input[value='slow-start']", "Adaptive block length")).to_be_checked()


CHARTS = ("#block-length-plot", "#acceptance-histogram", "#position-acceptance-plot", "#throughput-plot")
# A chart's texts (title, axis titles and ticks, legend, notes), each with its box relative to the chart's SVG; and the
# decisions the chart holds (its size lines' hover texts, on the block-length chart).
TEXTS_JS = """(chart) => {
  const plot = document.querySelector(chart + ' .js-plotly-plot');
  const svg = plot.querySelector('.main-svg').getBoundingClientRect();
  const texts = [...plot.querySelectorAll('.gtitle, .g-xtitle, .g-ytitle, .annotation, .legendtext, .xtick text, ' +
    '.ytick text')].map((a) => { const r = a.getBoundingClientRect();
    return {note: a.classList.contains('annotation'), w: svg.width, h: svg.height,
            text: [...a.querySelectorAll('tspan.line')].map((t) => t.textContent).join(' ') || a.textContent,
            x0: r.left - svg.left, x1: r.right - svg.left, y0: r.top - svg.top, y1: r.bottom - svg.top}; });
  return {texts, reasons: plot.data.filter((d) => d.hovertext).flatMap((d) => d.hovertext)}; }"""


def assert_chart_texts_fit(page, width: int) -> None:
    """At `width`, every chart's texts lie inside it, whole; the controller's decisions are written whole and over no
    other label."""
    page.set_viewport_size({"width": width, "height": 1100})
    time.sleep(1.0)  # plotly redraws on resize
    for chart in CHARTS:
        got = page.evaluate(TEXTS_JS, chart)
        for t in got["texts"]:
            assert "…" not in t["text"] and 0 <= t["x0"] and t["x1"] <= t["w"] + 0.5 and 0 <= t["y0"] \
                and t["y1"] <= t["h"] + 0.5, (width, chart, t)
    got = page.evaluate(TEXTS_JS, CHARTS[0])
    notes, reasons = [t for t in got["texts"] if t["note"]], {html.unescape(r) for r in got["reasons"]}
    decisions = [n for n in notes if not n["text"].startswith("max ")]
    assert decisions, (width, notes)
    for n in decisions:
        assert n["text"] in reasons or n["text"].removeprefix("copy: ") in reasons, (width, n["text"])
    for a, b in itertools.combinations(notes, 2):
        assert a["x1"] <= b["x0"] or b["x1"] <= a["x0"] or a["y1"] <= b["y0"] or b["y1"] <= a["y0"], (width, a, b)


def test_the_chart_texts_and_the_controllers_notes_fit_on_a_desktop_and_a_phone(page):
    """The block-length chart's decisions were cut to 28 characters ("probe the cost of size 2 (o…"): now each is
    written whole, and every chart text lies inside its chart, at 1440 px and at 390 px: for the slow-start trace
    loaded first, then for a run of the cost policy (whose reasons are the longest)."""
    shown(page, "Maths")
    try:
        for width in (1440, 390):
            assert_chart_texts_fit(page, width)
        page.set_viewport_size({"width": 1440, "height": 1100})
        in_accordion(page, "#adaptive", "Adaptive block length").locator("label:has-text('cost')").click()
        page.locator("#prompt textarea").fill("Once upon a time")
        page.click("#generate")
        expect(page.locator("#status")).to_contain_text("Finished", timeout=300_000)
        expect(page.locator("#block-length-plot .annotation").first).to_be_visible()
        for width in (1440, 390):
            assert_chart_texts_fit(page, width)
    finally:
        page.set_viewport_size({"width": 1440, "height": 1100})
