"""DFlash playground: `python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_PORT to change the port).
The same file runs on Hugging Face Spaces (which sets GRADIO_SERVER_NAME=0.0.0.0).

Loads the default preset (SmolLM2-135M-Instruct + our DFlash draft); until the trained draft is in
assets/draft-smollm2-135m/ it serves the target alone and says so on the page. DFLASH_THREADS sets torch's
CPU threads (on a small machine shared with other jobs, 1 is often much faster than 2).
"""

from __future__ import annotations

import logging
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (offline machines, privacy)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("DFLASH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["DFLASH_THREADS"]))
    from ui import build_demo, launch_kwargs
    from ui.engines import EngineProvider

    provider = EngineProvider()  # registry presets only
    provider.get("default")  # load before serving, so the first visitor doesn't wait
    demo = build_demo(provider)
    demo.launch(**launch_kwargs())


if __name__ == "__main__":
    main()
