"""DFlash playground: `python app.py` serves it on http://127.0.0.1:7860 (`--port N` or GRADIO_SERVER_PORT to change
the port). The same file runs on Hugging Face Spaces (which sets GRADIO_SERVER_NAME=0.0.0.0); an installed package has the
same entry point as the `dflash-playground` command (ui/serve.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no calls home

from ui.serve import main  # noqa: E402

if __name__ == "__main__":
    main()
