"""Prompt sets from files (dflash.loading.datasets): the limit, JSONL lines that are not JSON objects, rows without prompts."""

from __future__ import annotations

import json

import pytest

from dflash.loading.datasets import jsonl_prompts, load_prompts
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


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "a"}, {"promt": "b"}], "line 2: no prompt text"),
    ([{"prompt": "a"}, {"prompt": " "}], 'line 2: "prompt" is empty'),
    ([{"prompt": "a"}, {"turns": []}], 'line 2: "turns" must be a non-empty list'),
    ([{"prompt": "a"}, {"prompt_ids": [1]}], "line 2: prompt_ids, but line 1 gives prompt text"),
    ([{"prompt_ids": [1]}, {"text": "b"}], "line 2: no prompt_ids, but line 1 gives prompt_ids"),
    ([], "gave no prompts"),
])
def test_a_row_without_prompt_text_is_named_not_dropped(tmp_path, rows, message):
    """Such rows were dropped without a word; rows of both kinds blamed a valid text row."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValidationError) as e:
        load_prompts(str(path))
    assert e.value.param == "prompts" and message in str(e.value)


def test_text_prompts_from_a_file_of_token_ids_are_refused_naming_it(tmp_path):
    """A caller that needs text (the scripts) is told the file holds token ids, not handed an empty list."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_ids": [1, 2]}\n')
    with pytest.raises(ValidationError) as e:
        load_prompts(str(path))
    assert "line 1" in str(e.value) and "prompt text" in str(e.value)
