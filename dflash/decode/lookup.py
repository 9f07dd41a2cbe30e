"""Copying from the context (prompt lookup): where the last n committed tokens occurred earlier, in the prompt or the
output, the tokens that followed them there are a proposal for the next ones.

`CopyProposer` is the first proposer of a request's chain when it asks (`Request.lookup_ngram` = n > 0): a block
whose anchor ends an n-gram seen before proposes the copied span and the draft model is not run; it hands the other
blocks to the draft. The target verifies both alike, so the output stays the target's own.

Why a DFlash draft gains from it: the target repeats itself (names, code, lists, its own phrases), and a one-layer
DFlash draft cannot copy — a masked block position's attention query comes from the MASK embedding and its position
only, so where it looks in the context cannot depend on the anchor. TRAINING.md ("Where the first proposal fails")
measures how often copying is right where the draft is not.
"""

from __future__ import annotations

import torch

from dflash.decode.events import COPY
from dflash.decode.proposer import Proposal
from dflash.decode.request import MAX_NGRAM


class NgramIndex:
    """The most recent earlier occurrence of a sequence's last n tokens, kept up to date as the sequence grows, so a
    lookup costs O(tokens added since the last one), not O(context). The sequence may only grow."""

    def __init__(self, n: int):
        if not 1 <= n <= MAX_NGRAM:
            raise ValueError(f"n-gram length must be in [1, {MAX_NGRAM}], got {n}")
        self.n = n
        self.last: dict[tuple[int, ...], int] = {}  # n-gram → the position of its last token, most recent
        self.indexed = 0  # n-grams ending before this position are in `last`

    def find(self, tokens: list[int]) -> int | None:
        """The end j < len(tokens) - 1 of the most recent earlier occurrence of tokens[-n:]; None without one.
        The copy proposes tokens[j + 1], tokens[j + 2], …"""
        n, end = self.n, len(tokens) - 1  # the n-gram to look up ends at `end`; earlier ones are indexed first
        for j in range(max(self.indexed, n - 1), end):
            self.last[tuple(tokens[j - n + 1 : j + 1])] = j
        self.indexed = max(self.indexed, end)
        return self.last.get(tuple(tokens[-n:])) if len(tokens) > n else None


def find(tokens: list[int], n: int) -> int | None:
    """`NgramIndex.find` for one sequence (no state kept between calls)."""
    return NgramIndex(n).find(tokens)


def copied_span(tokens: list[int], j: int, length: int) -> list[int]:
    """The `length` tokens after position j. A span that runs into the end of `tokens` starts over from j + 1: the
    match then lies inside a repeating pattern, and repeating it is the copy's best guess (j < len(tokens) - 1)."""
    period = tokens[j + 1 :]
    return (period * (length // len(period) + 1))[:length]


def copy_proposal(anchor: int, start: int, span: list[int], vocab_size: int, sampling: dict | None,
                  device: torch.device) -> Proposal:
    """A block proposal of copied tokens (positions 1 .. len(span) after `anchor` at absolute position `start`), as
    one fully committed step for the block inspector. Under the rejection rule (`sampling` given) the proposal law
    q is a point mass on each copied token: min(1, p/q) accepts a token with probability p(x), and the residual
    max(0, p - q) is p without x — still lossless."""
    size = len(span) + 1
    step = {"step": 0, "n_steps": 1, "start": start, "tokens": [anchor] + span, "confidences": [1.0] * size,
            "masked": [False] * size, "committed": [False] + [True] * len(span), "ms": 0.0}
    q = None
    if sampling is not None:
        q = torch.zeros(len(span), vocab_size, device=device)  # [n, V]
        q[torch.arange(len(span), device=device), torch.tensor(span, device=device)] = 1.0
    return Proposal(list(span), [1.0] * len(span), q, [step], 0.0)


class CopyProposer:
    """Copying from the context as a `dflash.decode.proposer.Proposer`: its per-request state is an `NgramIndex`; it reads
    no target features. `vocab_size` and `device` shape the point-mass law of the rejection rule."""

    name = COPY
    layers: tuple[int, ...] = ()
    min_block = 2  # a block of one copies nothing, and the copy's controller would never learn again

    def __init__(self, n: int, vocab_size: int, device: torch.device):
        self.n, self.vocab_size, self.device = n, vocab_size, device

    def new_state(self) -> NgramIndex:
        return NgramIndex(self.n)

    def extend_context(self, state: NgramIndex, features: torch.Tensor, start_pos: int) -> None:
        pass  # copying reads only the committed ids

    def propose(self, state: NgramIndex, seq: list[int], size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal | None:
        """The size-1 tokens that followed the last earlier occurrence of seq's last n tokens; None without one."""
        j = state.find(seq)
        if j is None:
            return None
        proposal = copy_proposal(seq[-1], len(seq) - 1, copied_span(seq, j, size - 1), self.vocab_size, sample, self.device)
        proposal.note = f"copy from the context ({self.n}-gram seen before)"
        return proposal


class HintIndex:
    """The copy hints of a hinted draft (`DraftConfig.hint_ngram` = n_max > 0): the longest n ≤ n_max whose last n
    committed tokens occurred earlier, and where (the most recent occurrence). One `NgramIndex` per n, kept up to date
    as the request's sequence grows."""

    def __init__(self, n_max: int):
        self.indexes = [NgramIndex(n) for n in range(n_max, 0, -1)]

    def find(self, tokens: list[int]) -> tuple[int, int]:
        """(n, j): the longest matching n and the end j of its most recent earlier occurrence; (0, -1) without one."""
        for index in self.indexes:
            j = index.find(tokens)
            if j is not None:
                return index.n, j
        return 0, -1


def match_table(ids: list[int], n_max: int) -> list[tuple[int, int]]:
    """`HintIndex(n_max).find(ids[: a + 1])` for every position a of a whole sequence in one pass (training reads
    every anchor of a stored sequence; the engine's incremental index and this table must agree: tested)."""
    last: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
    out = []
    for a in range(len(ids)):
        found = (0, -1)
        for n in range(min(n_max, a), 0, -1):  # NgramIndex needs len(tokens) > n: an n-gram with a token before it
            j = last[n].get(tuple(ids[a - n + 1 : a + 1]))
            if j is not None:
                found = (n, j)
                break
        out.append(found)
        for n in range(1, n_max + 1):
            if a >= n - 1:
                last[n][tuple(ids[a - n + 1 : a + 1])] = a
    return out


def block_hints(tokens: list[int], match: tuple[int, int], size: int) -> tuple[list[int], list[int]]:
    """The hints of a block of `size` anchored at tokens[-1]: per slot the copied token and the match length n that
    proposed it ([size] each; slot 0, the anchor, and a block without a match get token 0 with n = 0)."""
    n, j = match
    if n == 0:
        return [0] * size, [0] * size
    return [0] + copied_span(tokens, j, size - 1), [0] + [n] * (size - 1)
