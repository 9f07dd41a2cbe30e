"""What the engine asks of anything that proposes blocks: the `Proposer` protocol and its `Proposal`.

A request runs an ordered chain of proposers (`Engine.chain`: for instance copy-from-context, then the draft model).
For each block the engine asks them in order, each at the size its own block-size controller chose, and the first
that proposes something is verified; a proposer that returns None hands the block to the next one. The target
verifies every proposal alike, so whatever proposes, the output stays the target's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class Proposal:
    tokens: list[int]  # [b - 1] proposals for block positions 1 .. b-1
    confidences: list[float]  # the proposer's probability of each proposal when it was committed
    q: torch.Tensor | None  # [b - 1, V] the proposal law (rejection rule only)
    steps: list[dict]  # one dict per denoising step (fields of events.DraftStep)
    ms: float
    note: str = ""  # why this proposer proposed, for the block's BlockSize reason ("" for the draft model)


@runtime_checkable
class Proposer(Protocol):
    """Proposes blocks for the requests of one engine.

    `name` is the blocks' `source` in the events (its colour and statistics in the playground and the benchmark).
    `layers` are the target layers whose features it reads (empty: none). `min_block` is the smallest block it
    proposes for (a block of one proposes nothing, so a proposer that may decline needs at least 2).
    Per request, `new_state` makes its state; the engine hands it the target's features of committed positions
    (each position once, in order, only positions before the next block's anchor), then asks for proposals.
    """

    name: str
    layers: tuple[int, ...]
    min_block: int

    def new_state(self) -> Any:
        """An empty per-request state (for a draft model: its context cache)."""
        ...

    def extend_context(self, state: Any, features: torch.Tensor, start_pos: int) -> None:
        """Add target features [1, T, k*H] of absolute positions start_pos .. start_pos+T-1 to `state`."""
        ...

    def propose(self, state: Any, seq: list[int], size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal | None:
        """Proposals for block positions 1 .. size-1 after the anchor seq[-1] (absolute position len(seq) - 1), or
        None to hand the block to the next proposer. `seq` is the prompt and the committed output. n_steps and
        threshold: denoising steps and their confidence threshold. sample: None → argmax proposals; else
        {temperature, top_k, top_p, seed} → proposals drawn from the proposer's tempered law with its `q`."""
        ...
