"""Prompt sets from files (dflash.datasets): the limit, and JSONL lines that are not JSON objects."""

from __future__ import annotations

import json

import pytest

from dflash.datasets import jsonl_prompts, load_prompts
from dflash.errors import ValidationError


@pytest.fixture
def three(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ({"prompt": "a"}, {"turns": ["b", "x"]}, {"text": "c"})))
    return str(path)


def test_limit_takes_the_first_prompts_and_none_takes_all(three):
    assert load_prompts(three) == ["a", "b", "c"]
    assert load_prompts(three, 2) == ["a", "b"] and load_prompts(three, 9) == ["a", "b", "c"]


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_is_refused(three, limit):
    """0 used to mean "all" and -1 silently dropped the last prompt."""
    with pytest.raises(ValidationError) as e:
        load_prompts(three, limit)
    assert e.value.param == "limit" and f"got {limit}" in str(e.value)


@pytest.mark.parametrize("line, message", [('{"prompt": "b"', "line 3: not JSON"), ('"b"', "line 3: not a JSON object")])
def test_a_line_that_is_not_a_json_object_is_named(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n' + line + "\n")
    with pytest.raises(ValidationError) as e:
        jsonl_prompts(str(path))
    assert e.value.param == "prompts" and message in str(e.value)
