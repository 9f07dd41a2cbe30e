"""Limits that depend on the loaded models (`Engine.check`): the block sizes a drafted run uses and the context
budget. What a request alone shows (a block size outside the min and max it gives) is refused by `Request` itself;
nothing here lowers a value the request gives: a contradiction is a ValidationError naming it."""

from __future__ import annotations

from dflash.errors import ValidationError
from dflash.decode.request import DEFAULT_MIN_BLOCK, Request


def block_sizes(request: Request, trained: int) -> tuple[int, int, int]:
    """(block size, min, max) of a drafted run: the request's, with the draft's trained size for the block and the
    maximum it leaves out, and DEFAULT_MIN_BLOCK (or the block, when smaller) for the minimum it leaves out."""
    hi = request.max_block_size or trained
    size = request.block_size or min(trained, hi)
    lo = request.min_block_size if request.min_block_size is not None else min(DEFAULT_MIN_BLOCK, size)
    if request.block_size is not None and size > hi:  # above the trained size (the maximum when none is given)
        if request.max_block_size is None:  # the bound is the draft's, not one the caller set: say how to lift it
            raise ValidationError("block_size", f"must be at most the draft's trained block size, {hi}, unless "
                                                f"max_block_size allows more (its drafts past {hi} are untrained), got {size}")
        raise ValidationError("block_size", f"must be in [{lo}, {hi}] (min/max block size), got {size}")
    if lo > size:  # no block_size given: the block is the draft's trained size (or max_block_size when smaller)
        raise ValidationError("min_block_size", f"must be <= the block size, {size} (block_size not given: the draft's "
                                                f"trained size or max_block_size), got {lo}")
    return size, lo, hi


def check_context(request: Request, n_prompt: int, block: int, budget: int) -> None:
    """The prompt, the new tokens and one block of `block` positions must fit the target's `budget` positions. A
    prompt that leaves no room even for one new token is named as the problem, not max_new_tokens."""
    if n_prompt + 1 + block > budget:
        param = "prompt" if request.prompt_ids is None else "prompt_ids"
        raise ValidationError(param, f"is {n_prompt} tokens; with one new token and a block of {block} that exceeds "
                                     f"the context budget {budget} (at most {budget - 1 - block} prompt tokens)")
    total = n_prompt + request.max_new_tokens + block
    if total > budget:
        raise ValidationError("max_new_tokens", f"prompt ({n_prompt}) + max_new_tokens ({request.max_new_tokens}) + "
                                                f"block ({block}) = {total} exceeds the context budget {budget}")
