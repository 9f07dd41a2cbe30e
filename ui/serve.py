"""`dflash-playground` (and `python app.py`): serve the playground on http://127.0.0.1:7860.

GRADIO_SERVER_PORT changes the port; Hugging Face Spaces sets GRADIO_SERVER_NAME=0.0.0.0. Loads the default
preset (SmolLM2-135M-Instruct + our DFlash draft) before serving, so the first visitor does not wait; on a Space
(or with DFLASH_AUTO_INSTALL=1) it first installs the default target's GGUF package if missing (ui/space_setup.py).
DFLASH_THREADS sets torch's CPU threads. DFLASH_PRESETS lists the presets visitors may load besides the default
(comma-separated registry names, or "all" for every preset this host can run; unset: the default only), see
ui/engines.py for how their loads are bounded.
"""

from __future__ import annotations

import logging
import os


def main() -> None:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (offline machines, privacy)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dflash.errors import ValidationError
    from dflash.host import env_threads
    from ui import build_demo, launch_kwargs
    from ui.engines import EngineProvider
    from ui.space_setup import prepare_default_target

    try:
        threads = env_threads()
        provider = EngineProvider()  # registry presets only: the default and the operator's DFLASH_PRESETS
    except ValidationError as exc:  # a bad DFLASH_THREADS or DFLASH_PRESETS: one line naming it, no traceback
        raise SystemExit(f"dflash-playground: {exc}") from None
    if threads:
        import torch

        torch.set_num_threads(threads)

    prepare_default_target()  # before any load, and before ZeroGPU forks its worker (which inherits sys.path)
    provider.get("default")
    build_demo(provider).launch(**launch_kwargs())
