"""Errors the engine raises on purpose. Messages are safe to show to a user (no paths, no tracebacks)."""

from __future__ import annotations


class DFlashError(Exception):
    """Base class for every error the engine raises deliberately."""


class ValidationError(DFlashError, ValueError):
    """A request or config value is out of range. `param` names the field, the message states the bound."""

    def __init__(self, param: str, message: str):
        self.param, self.message = param, message
        super().__init__(f"{param}: {message}")


class BusyError(DFlashError):
    """The engine is serving another request and the caller asked not to wait."""


class ModelLoadError(DFlashError):
    """A model could not be found or loaded (offline hub, missing file, unsafe format)."""


def first_line(exc: BaseException) -> str:
    """An exception's message for a one-line error: its first line (safetensors' run on), or its class name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
