"""Which engine serves which preset: injected engines (tests, notebooks) or lazy loading from the registry.

The default preset uses the trained draft in assets/ when it exists and falls back to the target alone (the
autoregressive baseline) until then, with a notice the UI shows. Large presets are loaded on demand, only on
a CUDA machine, one at a time besides the default.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Mapping

from dflash.engine import Engine
from dflash.errors import ModelLoadError
from dflash.registry import PRESETS, draft_block_size, get_preset
from ui.text import NO_DRAFT_NOTICE, draft_notice

log = logging.getLogger("dflash.ui")

Loader = Callable[[str], tuple[Engine, str]]  # preset name → (engine, notice shown in the UI, "" for none)


def load_preset(name: str) -> tuple[Engine, str]:
    """The app's loader: registry presets only; the default falls back to no draft while none is trained."""
    import torch

    from dflash.load import default_draft_available, load_engine

    preset = get_preset(name)
    if preset.gpu_recommended and not torch.cuda.is_available():
        raise ModelLoadError(f"preset {name!r} needs a CUDA GPU and Hugging Face hub access; this server has no GPU")
    if name == "default" and not default_draft_available(preset.draft):
        engine, _ = load_engine(name, no_draft=True)
        return engine, NO_DRAFT_NOTICE
    engine, _ = load_engine(name)
    return engine, (draft_notice(Path(preset.draft) / "evaluation.json") if name == "default" else "")


class EngineProvider:
    """`get(preset)` → Engine. Built from a dict of ready engines, or a loader called on first use."""

    def __init__(self, engines: Mapping[str, Engine] | Loader | None = None, notices: Mapping[str, str] | None = None):
        self._engines: dict[str, Engine] = {}
        self._notices: dict[str, str] = dict(notices or {})
        self._loader: Loader | None = None
        if engines is None:
            self._loader = load_preset
        elif callable(engines) and not isinstance(engines, Mapping):
            self._loader = engines
        else:
            self._engines = dict(engines)
        self._lock = threading.Lock()

    @property
    def presets(self) -> list[str]:
        """Dropdown choices: the registry's presets (only those given, for injected engines)."""
        return list(PRESETS) if self._loader is not None else [p for p in PRESETS if p in self._engines] or list(self._engines)

    def loaded(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def notice(self, name: str) -> str:
        return self._notices.get(name, "")

    def block_size(self, name: str) -> int | None:
        """The preset's draft block size, for the sliders: the loaded engine's draft (None without one), else the
        registry's for a preset not loaded yet."""
        engine = self._engines.get(name)
        if engine is not None:
            return engine.trained_block_size
        return draft_block_size(PRESETS[name]) if name in PRESETS else None

    def get(self, name: str) -> Engine:
        if name not in self._engines and name not in PRESETS:
            get_preset(name)  # raises ValidationError naming the allowed presets
        with self._lock:
            if name in self._engines:
                return self._engines[name]
            if self._loader is None:
                raise ModelLoadError(f"preset {name!r} is not loaded on this server; choose one of {', '.join(self._engines)}")
            # Keep the default plus at most one large model in memory.
            for other in [k for k in self._engines if k not in ("default", name)]:
                del self._engines[other]
            log.info("loading preset %s", name)
            engine, notice = self._loader(name)
            self._engines[name] = engine
            self._notices[name] = notice
            return engine
