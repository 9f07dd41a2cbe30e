"""The playground's controls as the engine knows them: the Request field each control sets, which controls hold
whole numbers, and an error about a field in the words of the page (the control's label, ui/text.py)."""

from __future__ import annotations

import math
import re
from typing import Any

from dflash.errors import ValidationError
from dflash.decode.request import MAX_SEED
from . import text

# The Request field each control sets (make_request); the controls whose values are whole numbers.
FIELDS = {"prompt": "prompt", "block_size": "block_size", "steps": "diffusion_steps", "confidence": "confidence_threshold",
          "acceptance": "acceptance_threshold", "lookup": "lookup_ngram", "adaptive": "adaptive",
          "min_block": "min_block_size", "max_block": "max_block_size", "temperature": "temperature", "top_p": "top_p",
          "max_new_tokens": "max_new_tokens", "seed": "seed"}
WHOLE = frozenset({"block_size", "steps", "lookup", "min_block", "max_block", "max_new_tokens", "seed"})
# The checkboxes' values on a fresh page, and for a request that leaves one out (null).
CHECKBOXES = {"show_rejected": False, "step_mode": False, "trace_attention": False}
# Fields and other names an error may start with, as the page names them.
_LABEL_OF_FIELD = {field: text.LABELS[key] for key, field in FIELDS.items()} | {
    "preset": text.LABELS["preset"], "compare": "Compare with autoregressive",
    "show_rejected": text.LABELS["show_rejected"], "step_mode": text.LABELS["step_mode"],
    "trace_attention": text.LABELS["trace_attention"],
    "numerics": text.LABELS["numerics"]}
# Python's words in a message, and a bound too long to read, in the page's words.
_PLAIN = {"got None": "got an empty value", f"{MAX_SEED}]": "2^63 - 1]"}


def user_message(exc: Exception) -> str:
    """An error's message for the page: a request field is named as its control is labelled there ("Max block size:
    must be >= Min block size (4), got 2", not max_block_size / min_block_size), also inside the message."""
    if not isinstance(exc, ValidationError) or exc.param not in _LABEL_OF_FIELD:
        return str(exc)
    message = re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: _LABEL_OF_FIELD.get(m.group(), m.group()), exc.message)
    for python, plain in _PLAIN.items():
        message = message.replace(python, plain)
    return f"{_LABEL_OF_FIELD[exc.param]}: {message}"


def flag(value: Any, key: str, default: bool) -> bool:
    """A checkbox's raw value (an API caller may send anything): True or False, None for the default. A string is
    refused, since "false" would count as true."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError(key, f"must be true or false, got {value!r}")
    return value


def shown_rejected(value: Any) -> bool:
    """The "Show rejected draft tokens" checkbox as a request sent it (left out: as on a fresh page)."""
    return flag(value, "show_rejected", CHECKBOXES["show_rejected"])


def in_step_mode(value: Any) -> bool:
    """The "Step mode" checkbox as a request sent it (left out: as on a fresh page)."""
    return flag(value, "step_mode", CHECKBOXES["step_mode"])


def records_attention(value: Any) -> bool:
    """The "Record what the draft attends to" checkbox as a request sent it (left out: as on a fresh page)."""
    return flag(value, "trace_attention", CHECKBOXES["trace_attention"])


def whole(value: Any) -> Any:
    """Sliders send floats: 16.0 → 16. Anything else goes to Request unchanged, which names the parameter."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
