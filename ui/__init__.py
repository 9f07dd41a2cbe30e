"""The DFlash playground (Gradio): `build_demo(engines)` builds the page, `launch_kwargs()` the serving settings.

Everything drawn comes from the engine's events through the pure functions in ui/render.py and ui/plots.py.
The two names load Gradio and torch on first use (PEP 562), so `dflash-playground --help` or a wrong option
answers at once.
"""

from typing import Any

__all__ = ["build_demo", "launch_kwargs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import layout

        return getattr(layout, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
