"""dflash/decode/limits.py: the block sizes a drafted run uses and the context budget (pure functions of the request)."""

import pytest

from dflash.errors import ValidationError
from dflash.decode.limits import block_sizes, check_context
from dflash.decode.request import Request


@pytest.mark.parametrize("fields, want", [
    ({}, (8, 2, 8)),  # the draft's trained size, DEFAULT_MIN_BLOCK, the trained size as the maximum
    ({"block_size": 1}, (1, 1, 8)),  # a block below the default minimum lowers the minimum
    ({"block_size": 4, "max_block_size": 16}, (4, 2, 16)),
    ({"max_block_size": 4}, (4, 2, 4)),  # no block given: the trained size, capped by the maximum
    ({"block_size": 12, "max_block_size": 16}, (12, 2, 16)),  # past the trained size only when the maximum allows it
    ({"min_block_size": 3}, (8, 3, 8)),
])
def test_block_sizes_fill_in_what_the_request_leaves_out(fields, want):
    assert block_sizes(Request(prompt="x", **fields), trained=8) == want


@pytest.mark.parametrize("fields, param, words", [
    ({"block_size": 12}, "block_size", "at most the draft's trained block size, 8, unless max_block_size allows more"),
    ({"min_block_size": 10, "max_block_size": 12}, "min_block_size", "must be <= the block size, 8"),
])
def test_a_contradiction_with_the_draft_is_named(fields, param, words):
    with pytest.raises(ValidationError) as err:
        block_sizes(Request(prompt="x", **fields), trained=8)
    assert err.value.param == param and words in str(err.value)


def test_the_context_budget_names_the_prompt_or_the_new_tokens():
    check_context(Request(prompt="x", max_new_tokens=10), n_prompt=20, block=8, budget=38)  # exactly full
    with pytest.raises(ValidationError) as err:
        check_context(Request(prompt="x", max_new_tokens=11), n_prompt=20, block=8, budget=38)
    assert err.value.param == "max_new_tokens" and "= 39 exceeds the context budget 38" in str(err.value)
    with pytest.raises(ValidationError) as err:
        check_context(Request(prompt_ids=(1, 2)), n_prompt=30, block=8, budget=38)
    assert err.value.param == "prompt_ids" and "at most 29 prompt tokens" in str(err.value)
