"""The playground's two modes, one click each: "Paper method" (the draft alone, its trained block, fixed, one denoising
pass) and "Fastest here" (the library's own defaults, read from `dflash.decode.request.DEFAULTS`, so this follows whatever
the CLI and the API run). Both keep the host's default numerics. A control moved away from its mode's value makes
the mode "custom"; the note under the switch names what each mode sets and what was changed."""

from __future__ import annotations

from typing import Any

from dflash.decode.request import DEFAULT_MIN_BLOCK, DEFAULTS
from . import text

PAPER, FASTEST, CUSTOM = "Paper method", "Fastest here", "custom"
MODES = (PAPER, FASTEST)
# The controls a mode sets (ui/controls.FIELDS names, plus the numerics switch).
MODE_KEYS = ("block_size", "steps", "lookup", "adaptive", "min_block", "max_block", "acceptance", "numerics")


def mode_values(mode: str, block: int, dtype: str) -> dict[str, Any]:
    """The control values `mode` sets for a draft trained on blocks of `block`, in numerics `dtype`."""
    d = DEFAULTS
    lossless = {"acceptance": 1.0, "numerics": dtype}
    if mode == PAPER:
        return {"block_size": block, "steps": 1, "lookup": 0, "adaptive": "fixed",
                "min_block": min(DEFAULT_MIN_BLOCK, block), "max_block": block, **lossless}
    if mode == FASTEST:
        size = d["block_size"] or block
        return {"block_size": size, "steps": d["diffusion_steps"], "lookup": d["lookup_ngram"], "adaptive": d["adaptive"],
                "min_block": d["min_block_size"] or min(DEFAULT_MIN_BLOCK, size), "max_block": d["max_block_size"] or size,
                "acceptance": d["acceptance_threshold"], "numerics": dtype}
    raise ValueError(f"unknown mode {mode!r}")


def _same(a: Any, b: Any) -> bool:
    """A control's value against a mode's: sliders send floats (8.0 is 8)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def changed(values: dict[str, Any], mode: str, block: int, dtype: str) -> list[str]:
    """The mode-set controls whose `values` differ from `mode`'s."""
    want = mode_values(mode, block, dtype)
    return [k for k in MODE_KEYS if k in values and not _same(values[k], want[k])]


def mode_of(values: dict[str, Any], block: int, dtype: str) -> str:
    """The mode whose every setting `values` hold (Paper method first), else "custom"."""
    return next((m for m in MODES if not changed(values, m, block, dtype)), CUSTOM)


def _shown(key: str, value: Any) -> str:
    if key == "lookup" and not value:
        return "off"
    if key == "numerics":
        return text.NUMERICS.get(value, str(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def mode_note(values: dict[str, Any], block: int, dtype: str) -> str:
    """The line under the mode switch: what the current mode sets, or for "custom" what differs from the closer mode."""
    mode = mode_of(values, block, dtype)
    if mode != CUSTOM:
        sets = " · ".join(f"{text.LABELS[k]} {_shown(k, v)}" for k, v in mode_values(mode, block, dtype).items())
        return f"**{mode}** sets {sets}."
    base = min(MODES, key=lambda m: len(changed(values, m, block, dtype)))
    want = mode_values(base, block, dtype)
    diff = ", ".join(f"{text.LABELS[k]} {_shown(k, values[k])} (not {_shown(k, want[k])})"
                     for k in changed(values, base, block, dtype))
    return f"**custom**: {base} with {diff}."


def range_note(moved: str, asked: tuple, fitted: tuple) -> str:
    """A visible note for every block size the page changed on its own after the user moved `moved`: (block size,
    min, max) as `asked` and as `fitted` (ui/wiring.fit_block_range; a value that stays is not a number there)."""
    keys = ("block_size", "min_block", "max_block")
    final = {k: f if isinstance(f, (int, float)) else a for k, a, f in zip(keys, asked, fitted)}
    notes = []
    for key, a in zip(keys, asked):
        if not isinstance(a, (int, float)) or float(a) == float(final[key]):
            continue
        if key == moved:
            notes.append(f"{text.LABELS[key]} {a:g} is out of range: {final[key]:g} is used.")
        else:
            bound = "at most" if key == "min_block" else "at least"
            notes.append(f"{text.LABELS[key]} set to {final[key]:g}, {bound} {text.LABELS[moved]} ({final[moved]:g}).")
    return " ".join(notes)
