"""DFlash: block-diffusion speculative decoding (arXiv 2602.06036) — engine, training and playground.

Heavy modules (torch, transformers) load lazily, so `import dflash.verification.verify` or the CLI's --help stay light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "DFlashConfig": "dflash.api",
    "DFlashModel": "dflash.api",
    "Engine": "dflash.decode.engine",
    "Request": "dflash.decode.request",
    "ValidationError": "dflash.errors",
    "load_engine": "dflash.loading.load",
    "compute_stats": "dflash.decode.stats",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dflash' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy exports too (PEP 562): dir() and completion list them before their first use."""
    return sorted(set(globals()) | set(_EXPORTS))
