"""`dflash-playground` (and `python app.py`): serve the playground on http://127.0.0.1:7860.

GRADIO_SERVER_PORT changes the port; Hugging Face Spaces sets GRADIO_SERVER_NAME=0.0.0.0. Loads the default
preset (SmolLM2-135M-Instruct + our DFlash draft) before serving, so the first visitor does not wait.
DFLASH_THREADS sets torch's CPU threads.
"""

from __future__ import annotations

import logging
import os


def main() -> None:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (offline machines, privacy)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("DFLASH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["DFLASH_THREADS"]))
    from ui import build_demo, launch_kwargs
    from ui.engines import EngineProvider

    provider = EngineProvider()  # registry presets only
    provider.get("default")
    build_demo(provider).launch(**launch_kwargs())
