"""ui/controls.py: the controls' Request fields, and errors named as the page names its controls."""

from __future__ import annotations

import pytest

from dflash.errors import BusyError, ValidationError
from dflash.decode.request import Request
from ui import text
from ui.controls import FIELDS, WHOLE, user_message, whole
from ui.handlers import CONTROL_KEYS


def test_every_request_control_has_a_field_and_a_label():
    assert set(FIELDS) == set(CONTROL_KEYS) - {"preset", "show_rejected", "step_mode", "numerics", "trace_attention"} and WHOLE <= set(FIELDS)
    assert set(FIELDS.values()) <= set(Request.__dataclass_fields__) and set(FIELDS) | {"preset"} <= set(text.LABELS)


@pytest.mark.parametrize("param, message, shown", [
    ("max_block_size", "must be >= min_block_size (4), got 2", "Max block size: must be >= Min block size (4), got 2"),
    ("lookup_ngram", "must be in [0, 8], got 9", "Copy from context: must be in [0, 8], got 9"),
    ("diffusion_steps", "must be 1 with verify='rejection'", "Denoising steps: must be 1 with verify='rejection'"),
    ("preset", "unknown preset 'x'", "Model preset: unknown preset 'x'"),
    ("trace", "upload a trace first", "trace: upload a trace first"),  # as a refused file's TraceError says it
    ("compare", "needs a run from this session", "Compare with autoregressive: needs a run from this session"),
    ("seed", "must be an integer in [0, 9223372036854775807], got None",
     "Seed: must be an integer in [0, 2^63 - 1], got an empty value"),  # Python's words, a bound too long to read
    ("verify", "must be one of match, rejection", "verify: must be one of match, rejection"),  # not on the page: as it is
])
def test_an_error_names_the_control_as_the_page_labels_it(param, message, shown):
    assert user_message(ValidationError(param, message)) == shown


def test_other_errors_keep_their_message():
    assert user_message(BusyError("preset: another model is being loaded")) == "preset: another model is being loaded"


@pytest.mark.parametrize("value, expected", [(16.0, 16), (2.5, 2.5), (float("nan"), "nan"), (True, True), ("8", "8")])
def test_whole_turns_only_integral_floats_into_ints(value, expected):
    got = whole(value)
    assert (str(got) if expected == "nan" else got) == expected and type(got) is type(expected if expected != "nan" else 0.0)
