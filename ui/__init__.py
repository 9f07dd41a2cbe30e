"""The DFlash playground (Gradio): `build_demo(engines)` builds the page, `launch_kwargs()` the serving settings.

Everything drawn comes from the engine's events through the pure functions in ui/render.py and ui/plots.py.
"""

from ui.layout import build_demo, launch_kwargs

__all__ = ["build_demo", "launch_kwargs"]
