"""Take the README screenshots: the playground on the default models, mid-generation, in Debian's Chromium, on a
desktop (1440 px) and on a phone (390 px, where Generate brings the run into view).

    .venv/bin/python scripts/screenshot.py [--out docs/screenshot.png] [--phone-out docs/screenshot-phone.png]
                                           [--tokens 64]

Uses the app's own loader (the trained draft when assets/draft-smollm2-135m/ exists, else the target alone).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


# (viewport width, height, device scale) of each screenshot
DESKTOP, PHONE = (1440, 1500, 1), (390, 844, 2)


def shoot(browser, url: str, out: str, screen: tuple[int, int, int], tokens: int, after: int) -> None:
    """Generate the code example's answer and photograph the screen once `after` tokens are shown."""
    from ui.text import EXAMPLES

    width, height, scale = screen
    page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
    page.set_default_timeout(120_000)
    page.goto(url)
    page.wait_for_selector("#token-legend .dfl-legend")
    page.locator("#prompt textarea").fill(dict(EXAMPLES)["Code"])
    box = page.locator("#max-new-tokens input[type=number]")
    page.locator("button:has-text('Sampling and length')").first.click()
    box.wait_for(state="visible")
    time.sleep(0.5)
    box.fill(str(tokens))
    box.press("Tab")
    if width > 600:
        page.evaluate("window.scrollTo(0, 0)")
    page.click("#generate")  # on a phone the page scrolls to the run's status line
    page.wait_for_function(
        f"document.querySelectorAll('#token-stream .dfl-stream .tok:not(.tok-rejected)').length >= {after}",
        timeout=600_000)
    page.wait_for_selector("#block-length-plot .js-plotly-plot")
    if width > 600:
        page.evaluate("window.scrollTo(0, 0)")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=out, timeout=180_000, animations="disabled")
    page.locator("#stop").dispatch_event("click")
    page.locator("#status").filter(has_text="Finished").wait_for(timeout=300_000)  # the engine is free for the next
    page.close()
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"), help="the desktop screenshot")
    p.add_argument("--phone-out", default=str(ROOT / "docs" / "screenshot-phone.png"), help="the phone screenshot")
    p.add_argument("--tokens", type=int, default=64, help="max new tokens of the run being photographed")
    p.add_argument("--after", type=int, default=16, help="take the picture once this many tokens are shown")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from ui import build_demo, launch_kwargs
    from ui.engines import load_preset

    engine, notice = load_preset("default")
    demo = build_demo({"default": engine}, notice=notice)
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS, headless=True)
            for out, screen in ((args.out, DESKTOP), (args.phone_out, PHONE)):
                shoot(browser, url, out, screen, args.tokens, args.after)
            browser.close()
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
