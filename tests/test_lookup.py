"""dflash.decode.lookup: the n-gram index against a brute-force search, the copied span, and the copy proposal's law."""

from __future__ import annotations

import random

import pytest
import torch

from dflash.decode.lookup import NgramIndex, copied_span, copy_proposal, find
from dflash.decode.request import MAX_NGRAM


def brute_force(tokens: list[int], n: int) -> int | None:
    """The largest j < len - 1 with tokens[j-n+1 .. j] == tokens[-n:] (j >= n - 1), by scanning everything."""
    if len(tokens) <= n:
        return None
    last = tokens[-n:]
    hits = [j for j in range(n - 1, len(tokens) - 1) if tokens[j - n + 1 : j + 1] == last]
    return max(hits) if hits else None


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_index_finds_what_a_full_scan_finds_as_the_sequence_grows(n):
    rng = random.Random(n)
    for trial in range(20):
        vocab = rng.choice([2, 3, 5, 50])
        seq = [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        index = NgramIndex(n)
        for _ in range(60):
            seq += [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]  # a commit adds one or more tokens
            assert index.find(seq) == brute_force(seq, n) == find(seq, n), (trial, seq)


def test_a_match_is_the_most_recent_and_never_the_ngram_itself():
    assert find([1, 2, 9, 1, 2, 7, 1, 2], 2) == 4  # the later of the two earlier (1, 2)
    assert find([1, 2], 2) is None and find([1, 2], 1) is None and find([2, 2], 1) == 0
    assert find([5], 1) is None and find([], 2) is None


def test_the_copied_span_follows_the_match_and_repeats_a_pattern_that_reaches_the_end():
    seq = [7, 1, 2, 3, 4, 1, 2]
    j = find(seq, 2)
    assert j == 2 and copied_span(seq, j, 3) == [3, 4, 1]
    periodic = [5, 6, 5, 6]  # (5, 6) last seen ending at 1: what follows is 5, 6 … and it goes on repeating
    assert copied_span(periodic, find(periodic, 2), 5) == [5, 6, 5, 6, 5]


def test_ngram_length_is_checked():
    for bad in (0, MAX_NGRAM + 1):
        with pytest.raises(ValueError, match="n-gram length"):
            NgramIndex(bad)


def test_a_copy_proposal_is_one_committed_step_and_a_point_mass_for_the_rejection_rule():
    p = copy_proposal(anchor=9, start=40, span=[3, 1, 4], vocab_size=6, sampling=None, device=torch.device("cpu"))
    assert p.tokens == [3, 1, 4] and p.confidences == [1.0] * 3 and p.q is None
    (step,) = p.steps
    assert step["tokens"] == [9, 3, 1, 4] and step["start"] == 40 and step["committed"] == [False, True, True, True]
    assert not any(step["masked"])
    q = copy_proposal(9, 40, [3, 1, 4], 6, {"temperature": 1.0}, torch.device("cpu")).q
    assert q.shape == (3, 6) and torch.equal(q.argmax(-1), torch.tensor([3, 1, 4])) and torch.equal(q.sum(-1), torch.ones(3))
