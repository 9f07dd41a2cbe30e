"""The playground in a real browser: Debian's Chromium driven by Playwright (never a downloaded browser).

Load the page, type a prompt, Generate, see tokens stream and the inspector and charts appear, Stop, replay a
bundled trace. Screenshots go to artifacts/ (CI keeps them). Skipped cleanly when Chromium or Playwright is
missing.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")]
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=60_000)  # a loaded 2-core CI machine renders slowly


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


def launch(engine):
    from ui import build_demo, launch_kwargs

    demo = build_demo({"default": engine})
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    return SimpleNamespace(demo=demo, url=url, engine=engine)


@pytest.fixture(scope="module")
def app():
    from tests.ui_support import paced_text_engine

    torch.set_num_threads(1)
    a = launch(paced_text_engine(block_size=8, delay_s=0.0))  # paced only where a test must press Stop (`paced`)
    yield a
    a.demo.close()


@pytest.fixture
def pace(app):
    """The app's target waits 0.05 s per forward pass during the test (≥ 20 s for 400 tokens: time to press Stop)."""
    from tests.ui_support import paced

    with paced(app.engine, 0.05):
        yield


ACCORDION = {"max-new-tokens": "Sampling and length", "acceptance": "Draft and verification",
             "block-size": "Draft and verification", "lookup": "Draft and verification",
             "min-block": "Adaptive block length", "max-block": "Adaptive block length"}


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1440, "height": 1100})
    page.set_default_timeout(60_000)
    page.goto(url)
    page.wait_for_selector("#token-legend .dfl-legend", timeout=120_000)
    return page


def token_count(page) -> int:
    return page.locator("#token-stream .dfl-stream .tok").count()


def set_slider(page, elem_id: str, value: float) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    if not box.is_visible():  # inside a closed accordion: open it and let it render
        page.locator(f"button:has-text('{ACCORDION[elem_id]}')").first.click()
        box.wait_for(state="visible")
        time.sleep(0.5)
    box.fill(str(value))
    box.press("Tab")
    expect(box).to_have_value(str(value))


def test_a_visitor_waiting_in_the_queue_sees_their_place(app, browser, pace):
    """One generation runs at a time: a second visitor's Generate waits, and their status line shows the queue
    position and wait (before, the progress was hidden and nothing on their page changed until their turn)."""
    first, second = open_page(browser, app.url), open_page(browser, app.url)
    try:
        for page in (first, second):
            page.locator("#prompt textarea").fill("Once upon a time")
        set_slider(first, "max-new-tokens", 400)
        first.click("#generate")
        first.wait_for_function("document.querySelectorAll('#token-stream .dfl-stream .tok').length > 2", timeout=120_000)
        second.click("#generate")
        place = second.locator("#status .progress-text")
        expect(place).to_contain_text(re.compile(r"queue: \d+/\d+"))
        # Shown, not clipped by the one-line status: the text is what the browser hits at its own centre.
        assert place.evaluate("e => { const r = e.getBoundingClientRect();"
                              " return e.contains(document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2)); }")
        app.engine.target.delay_s = 0.0  # the second run unpaced (`pace` puts the delay back after the test)
        first.locator("#stop").dispatch_event("click")
        expect(second.locator("#status")).to_contain_text("Finished", timeout=120_000)  # then it runs
    finally:
        first.close()
        second.close()


def test_generate_stream_inspect_stop_and_replay(app, browser, pace):
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_page(browser, app.url)
    expect(page.locator("#token-stream")).to_contain_text("Press Generate")
    expect(page.locator("#token-legend .dfl-legend")).to_contain_text("accepted draft token")
    page.locator("#prompt textarea").fill("Once upon a time")
    set_slider(page, "max-new-tokens", 400)  # long enough to press Stop in the middle
    page.click("#generate")
    # Tokens stream in: the count grows while the run goes on.
    page.wait_for_function("document.querySelectorAll('#token-stream .dfl-stream .tok').length > 2", timeout=120_000)
    first = token_count(page)
    page.wait_for_function(f"document.querySelectorAll('#token-stream .dfl-stream .tok').length > {first}", timeout=120_000)
    page.locator("#stop").dispatch_event("click")  # no actionability wait: the page is busy streaming
    expect(page.locator("#status")).to_contain_text("stopped by the user", timeout=120_000)
    stopped = token_count(page)
    time.sleep(1.0)
    assert token_count(page) == stopped  # nothing streams after Stop
    assert not app.engine._lock.locked()
    expect(page.locator("#status")).to_contain_text("Finished (cancelled)")
    # The inspector and the charts are there.
    expect(page.locator("#block-inspector table.insp")).to_be_visible()
    expect(page.locator("#block-inspector .row-verify")).to_have_count(1)
    for plot in ("block-length-plot", "acceptance-histogram", "position-acceptance-plot", "throughput-plot"):
        expect(page.locator(f"#{plot} .js-plotly-plot")).to_be_visible()
    expect(page.locator("#stats")).to_contain_text("τ")
    # Hover text and click details on a token.
    tok = page.locator("#token-stream .dfl-stream .tok").nth(1)
    title = tok.get_attribute("title")
    assert re.match(r"block \d+ · ", title)
    tok.click()
    expect(page.locator("#token-stream .tok-details")).to_have_text(title)
    page.screenshot(path=str(ARTIFACTS / "playground-stopped.png"), full_page=True)
    # Replay a bundled trace, one step back and forth.
    page.get_by_role("tab", name="Replay and step mode").click()
    page.click("#load-trace")
    expect(page.locator("#status")).to_contain_text("Loaded bundled trace")
    expect(page.locator("#replay-label")).to_contain_text("finished")
    page.click("#step-prev")
    expect(page.locator("#replay-label")).not_to_contain_text("finished")
    page.click("#step-next")
    expect(page.locator("#replay-label")).to_contain_text("finished")
    expect(page.locator("#token-legend .dfl-prompt")).to_contain_text("Prompt:")
    page.screenshot(path=str(ARTIFACTS / "playground-replay.png"), full_page=True)
    page.close()


def test_controls_explain_themselves_and_reset(app, browser):
    page = open_page(browser, app.url)
    expect(page.locator("#acceptance")).to_contain_text("1.0 = exact (lossless)")
    page.locator("#prompt textarea").fill("Keep me")
    set_slider(page, "acceptance", 0.5)
    expect(page.locator("#acceptance")).to_contain_text("LOSSY below 1.0", timeout=30_000)
    page.click("#reset")
    expect(page.locator("#acceptance")).to_contain_text("1.0 = exact (lossless)", timeout=30_000)
    expect(page.locator("#prompt textarea")).to_have_value("Keep me")  # the user's text is not a setting
    expect(page.locator("#block-size")).to_contain_text("its default is the draft's trained size")
    page.close()


def test_the_block_size_and_its_range_move_together(app, browser):
    """The defaults tie the max block size to the draft's (8): a block size typed past it takes the max along (a
    request outside [min, max] is refused), and a max typed below the block size takes the block size down."""
    page = open_page(browser, app.url)
    page.locator("#prompt textarea").fill("Once upon a time")
    set_slider(page, "max-new-tokens", 24)
    set_slider(page, "block-size", 16)
    set_slider(page, "min-block", 2)  # opens the accordion
    expect(page.locator("#max-block input[type=number]")).to_have_value("16", timeout=30_000)
    page.click("#generate")
    expect(page.locator("#status")).to_contain_text("Finished (length)", timeout=300_000)
    set_slider(page, "max-block", 4)
    expect(page.locator("#block-size input[type=number]")).to_have_value("4", timeout=30_000)
    page.close()


def test_copy_from_context_shows_the_copied_tokens_and_resets_to_off(app, browser):
    page = open_page(browser, app.url)
    page.locator("#prompt textarea").fill("Once upon a time")
    set_slider(page, "lookup", 1)
    set_slider(page, "max-new-tokens", 40)
    page.click("#generate")
    expect(page.locator("#status")).to_contain_text("Finished", timeout=300_000)
    expect(page.locator("#token-legend")).to_contain_text("accepted token copied from the context")
    assert page.locator("#token-stream .dfl-stream .tok-copy").count() > 0
    expect(page.locator("#stats")).to_contain_text("blocks copied from the context")
    page.screenshot(path=str(ARTIFACTS / "playground-copy.png"), full_page=True)
    page.click("#reset")
    expect(page.locator("#lookup input[type=number]")).to_have_value("0", timeout=30_000)
    page.close()


def test_on_a_phone_the_charts_and_statistics_take_the_whole_width(app, browser):
    """Two charts side by side on a desktop; one under the other on a 400 px phone, where side by side each would be
    ~160 px wide (titles and legends cut) and the statistics beside the Compare button ~120 px (a word a line)."""
    charts = ["#block-length-plot", "#acceptance-histogram", "#position-acceptance-plot", "#throughput-plot"]
    for width, side_by_side in ((1440, True), (400, False)):
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(app.url)
        page.wait_for_selector("#token-legend .dfl-legend", timeout=120_000)
        boxes = [page.locator(c).bounding_box() for c in charts + ["#stats", "#compare"]]
        (bl, hist, pos, thr), (stats, compare) = boxes[:4], boxes[4:]
        assert (hist["y"] == bl["y"] and hist["x"] > bl["x"] + bl["width"] - 1) == side_by_side
        assert (compare["y"] == stats["y"]) == side_by_side  # the button beside the statistics, or under them
        for chart in charts:  # the toolbar (always shown on a touch screen) covered the end of every title on a phone
            bar, title = page.locator(f"{chart} .modebar").bounding_box(), page.locator(f"{chart} .gtitle").bounding_box()
            assert bar["x"] >= title["x"] + title["width"] or bar["y"] >= title["y"] + title["height"], (width, chart)
        if not side_by_side:
            assert len({round(b["x"]) for b in (bl, hist, pos, thr)}) == 1 and bl["y"] < hist["y"] < pos["y"] < thr["y"]
            assert all(b["width"] >= 0.8 * 400 for b in (bl, hist, pos, thr, stats))
        page.close()


def test_on_a_phone_generate_brings_the_run_into_view(app, browser):
    """At 390 px the status line sits ~2,000 px below Generate: pressing Generate scrolls it into view (and on a
    desktop, where it is already in view, nothing scrolls)."""
    for width, height in ((390, 844), (1440, 1100)):
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(app.url)
        page.wait_for_selector("#token-legend .dfl-legend", timeout=120_000)
        below = page.locator("#status").bounding_box()["y"] > height
        assert below == (width == 390)
        page.locator("#prompt textarea").fill("Once upon a time")
        set_slider(page, "max-new-tokens", 8)
        page.evaluate("window.scrollTo(0, 0)")
        page.click("#generate")
        expect(page.locator("#status")).to_be_in_viewport(timeout=30_000)
        expect(page.locator("#status")).to_contain_text("Finished", timeout=300_000)
        assert (page.evaluate("window.scrollY") > 0) == below
        page.close()


@pytest.mark.slow
def test_short_generation_with_the_default_models(browser):
    from dflash.loading.registry import get_preset
    from ui.engines import load_preset

    torch.set_num_threads(2)
    engine, notice = load_preset("default")
    from ui import build_demo, launch_kwargs

    demo = build_demo({"default": engine}, notice=notice)
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    try:
        page = open_page(browser, url)
        if engine.drafter is None:
            expect(page.locator("#notice")).to_contain_text("No trained draft is installed yet")
        else:
            # The notice states the draft's measured τ and speed, from the committed evaluation file.
            doc = json.loads((Path(get_preset("default").draft) / "evaluation.json").read_text())
            mt = doc["evaluations"]["mtbench"]
            expect(page.locator("#notice")).to_contain_text(f"τ = {mt['tau']:.2f}")
            expect(page.locator("#notice")).to_contain_text(f"{mt['speedup']:.2f}× the speed of plain decoding")
            # … and with the default block policy, from the headline benchmark
            speed = doc["default_policy"]["speedup"]
            expect(page.locator("#notice")).to_contain_text(f"it ran {speed:.2f}× the speed of plain decoding")
        page.locator("#prompt textarea").fill("What is 2 + 2?")
        set_slider(page, "max-new-tokens", 6)
        page.click("#generate")
        expect(page.locator("#status")).to_contain_text("Finished", timeout=300_000)
        assert token_count(page) >= 2
        expect(page.locator("#block-inspector .row-verify")).to_have_count(1)
        expect(page.locator("#block-length-plot .js-plotly-plot")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "playground-default-models.png"), full_page=True)
        page.close()
    finally:
        demo.close()


# WCAG contrast of every element's own text in `roots` against what is painted behind it (translucent backgrounds
# and opacities composed, as the browser draws them): [{text, ratio, need}] with need 4.5, or 3 for large text.
CONTRAST_JS = """(roots) => {
  const rgba = s => { const p = s.match(/[\\d.]+/g).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (t, b) => [0, 1, 2].map(i => t[i] * t[3] + b[i] * (1 - t[3])).concat([1]);
  const lum = c => c.slice(0, 3).map(v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
    .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  const out = [];
  for (const el of document.querySelectorAll(roots)) {
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()) || !el.getClientRects().length) continue;
    const layers = []; let alpha = 1;
    for (let e = el; e; e = e.parentElement) {
      const s = getComputedStyle(e), c = rgba(s.backgroundColor); alpha *= parseFloat(s.opacity);
      if (c[3] > 0 && layers.every(l => l[3] < 1)) layers.push(c);
    }
    let bg = layers.length && layers[layers.length - 1][3] === 1 ? layers.pop() : [255, 255, 255, 1];
    for (const l of layers.reverse()) bg = over(l, bg);
    const s = getComputedStyle(el), c = rgba(s.color), fg = over([c[0], c[1], c[2], c[3] * alpha], bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a), size = parseFloat(s.fontSize);
    const large = size >= 24 || (parseInt(s.fontWeight) >= 700 && size >= 18.66);
    out.push({text: el.textContent.trim().slice(0, 30), ratio: (hi + 0.05) / (lo + 0.05), need: large ? 3 : 4.5});
  }
  return out; }"""
CUSTOM_HTML = "#token-legend *, #token-stream *, #block-inspector *, #stats *"


def low_contrast(page) -> list[dict]:
    return [r for r in page.evaluate(CONTRAST_JS, CUSTOM_HTML) if r["ratio"] < r["need"]]


def test_keyboard_reaches_every_token_with_a_visible_focus_and_the_text_is_legible(app, browser):
    """Keyboard only: the token stream is one Tab stop and ← → / Home / End walk its tokens, each showing its details
    (before, only a mouse could: the tokens could not take focus); Gradio's sliders and the prompt show a focus ring
    (before, none: no pixel changed). The custom HTML's text reaches 4.5:1 on its background (before: the
    placeholders 4.0, the inspector's confidences 4.2, the comparison's verdict 3.4 on white)."""
    page = open_page(browser, app.url)
    try:
        assert low_contrast(page) == []  # the placeholders
        page.locator("#prompt textarea").fill("Once upon a time")
        set_slider(page, "max-new-tokens", 24)
        for sel in ("#prompt textarea", "#max-new-tokens input[type=range]"):  # reached by Tab: :focus-visible
            page.locator(sel).focus()
            page.keyboard.press("Shift+Tab")
            page.keyboard.press("Tab")
            assert page.evaluate("() => document.activeElement.matches(':focus-visible') && "
                                 "getComputedStyle(document.activeElement).outlineStyle") == "solid", sel
        page.locator("#generate").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("Finished", timeout=120_000)
        page.locator("#compare").focus()
        page.keyboard.press("Shift+Tab")  # back to the stream, the Tab stop before Compare
        assert page.evaluate("document.activeElement.classList.contains('dfl-stream-scroll')")
        toks, details = page.locator("#token-stream .dfl-stream .tok"), page.locator("#token-stream .tok-details")
        for key, index in (("ArrowRight", 0), ("ArrowRight", 1), ("End", toks.count() - 1), ("ArrowLeft", toks.count() - 2)):
            page.keyboard.press(key)
            expect(toks.nth(index)).to_be_focused()
            expect(details).to_have_text(toks.nth(index).get_attribute("title"))
        assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
        page.keyboard.press("Escape")
        assert page.evaluate("document.activeElement.classList.contains('dfl-stream-scroll')")
        page.click("#compare")
        expect(page.locator("#compare-result")).to_contain_text("identical", timeout=120_000)
        assert low_contrast(page) == []  # legend, tokens, inspector cells, statistics and the verdict
        # Each chart's toolbar: download, zoom, pan, reset and Plotly's logo — 9 Tab stops per chart before (selections,
        # stepwise zoom).
        for chart in ("#block-length-plot", "#acceptance-histogram", "#position-acceptance-plot", "#throughput-plot"):
            assert page.locator(f"{chart} .modebar-btn").count() <= 5, chart
    finally:
        page.close()


def test_a_screen_reader_hears_how_a_run_ends_not_its_progress(app, browser, pace):
    """The status line changes many times a second during a run, so it is not a live region; a hidden one (role
    status) announces what it ends on — the finished run, a loaded trace — and none of the progress lines."""
    page = open_page(browser, app.url)
    try:
        heard = page.locator("#announce[role=status][aria-live=polite]")
        expect(heard).to_have_count(1)
        page.evaluate("""() => { window.heard = []; new MutationObserver(() => window.heard.push(
            document.querySelector('#announce').textContent)).observe(document.querySelector('#announce'),
            {childList: true, characterData: true, subtree: true}); }""")
        page.locator("#prompt textarea").fill("Once upon a time")
        set_slider(page, "max-new-tokens", 24)
        page.click("#generate")
        expect(heard).to_contain_text("Finished")
        said = page.evaluate("window.heard")
        assert said and not any(s.endswith("…") or "verify steps" in s for s in said), said
        assert heard.bounding_box()["width"] <= 1  # heard, not seen
        page.get_by_role("tab", name="Replay and step mode").click()
        page.click("#load-trace")
        expect(heard).to_contain_text("Loaded bundled trace")
    finally:
        page.close()
