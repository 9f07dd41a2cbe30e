"""Take the README screenshot: the playground on the default models, mid-generation, in Debian's Chromium.

    .venv/bin/python scripts/screenshot.py [--out docs/screenshot.png] [--tokens 64]

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    p.add_argument("--tokens", type=int, default=64, help="max new tokens of the run being photographed")
    p.add_argument("--after", type=int, default=16, help="take the picture once this many tokens are shown")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from ui import build_demo, launch_kwargs
    from ui.engines import load_preset
    from ui.text import EXAMPLES

    engine, notice = load_preset("default")
    demo = build_demo({"default": engine}, notice=notice)
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1440, "height": 1500}, device_scale_factor=1)
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_selector("#token-legend .dfl-legend")
            page.locator("#prompt textarea").fill(dict(EXAMPLES)["Code"])
            box = page.locator("#max-new-tokens input[type=number]")
            page.locator("button:has-text('Sampling and length')").first.click()
            box.wait_for(state="visible")
            time.sleep(0.5)
            box.fill(str(args.tokens))
            box.press("Tab")
            page.click("#generate")
            page.wait_for_function(
                f"document.querySelectorAll('#token-stream .dfl-stream .tok:not(.tok-rejected)').length >= {args.after}",
                timeout=600_000)
            page.wait_for_selector("#block-length-plot .js-plotly-plot")
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=args.out, timeout=180_000, animations="disabled")
            page.locator("#stop").dispatch_event("click")
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
