"""Typed events emitted by `Engine.stream` — the one contract between the engine, UI, CLI, benchmark and tests.

Every event is a frozen dataclass of plain types (ints, floats, strings, lists of those), so a run can be
saved as JSON and replayed without a model. `event_to_dict` / `event_from_dict` round-trip exactly.

Grammar of one run:
    Started, Prefill, Commit(first token), then per block:
        BlockSize, DraftStep × (1 to S) (none without a draft or for a block of one), Verify, Commit
    and exactly one Finished at the end. Denoising stops early once every position is committed, so with
    diffusion_steps S > 1 a block may have fewer than S DraftSteps (a block copied from the context has one).
    A run stopped (cancel or deadline) before its first token — already when it starts, during a long prompt's
    chunked prefill, or while waiting for the engine — is just Started, Finished.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

# Kinds of committed tokens (how the UI colours them).
DRAFT = "draft"  # a draft token the target accepted
COPY = "copy"  # a token copied from the context (Request.lookup_ngram) that the target accepted
CORRECTION = "correction"  # the target's own token at the first rejected position
BONUS = "bonus"  # the target's extra token after a fully accepted block (or the prefill's first token)
TOKEN_KINDS = (DRAFT, COPY, CORRECTION, BONUS)
# Who proposed a block: the `name` of its proposer (dflash.decode.proposer). The shipped ones: DRAFT (the draft model, also a
# block of one that proposed nothing) and COPY (copying from the context).
BLOCK_SOURCES = (DRAFT, COPY)

FINISH_REASONS = ("eos", "length", "stop", "cancelled", "timeout", "error")


@dataclass(frozen=True)
class Started:
    """The request as the engine understood it (after validation)."""

    request: dict[str, Any]
    prompt_ids: list[int]
    prompt_text: str
    has_draft: bool
    mask_token_id: int | None
    trained_block_size: int | None
    lossy: bool
    model: str = ""


@dataclass(frozen=True)
class Prefill:
    n_prompt_tokens: int
    ms: float


@dataclass(frozen=True)
class BlockSize:
    """The controller's choice for the next block: `size` = tokens verified (anchor + size-1 drafted)."""

    block: int
    size: int
    reason: str
    source: str = DRAFT  # one of BLOCK_SOURCES


@dataclass(frozen=True)
class DraftStep:
    """One denoising pass over the block (S = 1: the single pass of the paper).

    Lists have one entry per block position; position 0 is the anchor (the last committed token, confidence 1).
    `masked`: still masked *after* this step; `committed`: positions fixed at this step.
    """

    block: int
    step: int
    n_steps: int
    start: int  # absolute position of block position 0
    tokens: list[int]
    token_texts: list[str]
    confidences: list[float]
    masked: list[bool]
    committed: list[bool]
    ms: float
    # What the draft attended to at this step (Request.trace_attention; dflash.decode.attention.summarize), or None.
    attention: dict[str, Any] | None = None
    # A hinted draft's copy hints (DraftConfig.hint_ngram), one per block position: the token a copy from the context
    # offered the slot, its text, and the length of the n-gram that matched (0: none); None for z-lab's draft.
    hints: list[int] | None = None
    hint_texts: list[str] | None = None
    hint_n: list[int] | None = None


@dataclass(frozen=True)
class Verify:
    """The target's verdict on one block.

    `draft_tokens[i]` is the proposal for absolute position start+1+i, `target_tokens[i]` the target's own
    choice there (argmax, or its seeded sample). `accepted[i]` per drafted position; `accepted_len` = length of
    the accepted prefix; `next_token` = the target's token appended (correction or bonus).
    """

    block: int
    start: int
    block_size: int
    draft_tokens: list[int]
    draft_texts: list[str]
    target_tokens: list[int]
    target_texts: list[str]
    accepted: list[bool]
    accepted_len: int
    next_token: int
    draft_ms: float
    verify_ms: float
    relaxed: list[bool] = field(default_factory=list)  # accepted only thanks to acceptance_threshold < 1
    source: str = DRAFT  # who proposed draft_tokens: one of BLOCK_SOURCES


@dataclass(frozen=True)
class Commit:
    """Tokens appended to the output (after stop/length truncation)."""

    block: int
    token_ids: list[int]
    kinds: list[str]
    texts: list[str]
    text_delta: str
    n_out: int
    # Per token: the draft's confidence (None-free: -1.0 for target tokens) and the target's choice.
    confidences: list[float] = field(default_factory=list)
    target_tokens: list[int] = field(default_factory=list)
    t_ms: float = 0.0  # time since the request started
    # Per token: the margin of the target's choice at its position, in logits (float32) — top-1 minus top-2 of
    # the logits (greedy), or of logits + T·noise (Gumbel-max sampling without top-k / top-p); see
    # `dflash.decode.step.MatchRule.margins`. `dflash.decode.stats.diagnose_difference` reads it. Empty where the choice is not
    # such an argmax (top-k / top-p, the rejection rule). `dflash.verification.verify.NO_GAP` where there is no runner-up.
    target_gaps: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    reason: str
    output_ids: list[int]
    text: str
    stats: dict[str, Any]
    message: str = ""


Event = Union[Started, Prefill, BlockSize, DraftStep, Verify, Commit, Finished]
EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (Started, Prefill, BlockSize, DraftStep, Verify, Commit, Finished)}


def event_to_dict(event: Event) -> dict[str, Any]:
    """Plain dict with a "type" key; JSON-serialisable. Its values are the event's own lists and dicts, not copies
    (`dataclasses.asdict` deep-copied them: a 17 MB trace's upload took 3.8 s, now 2.1 s): serialise it, never change it."""
    return {"type": type(event).__name__, **{f.name: getattr(event, f.name) for f in dataclasses.fields(event)}}


def event_from_dict(data: dict[str, Any]) -> Event:
    data = dict(data)
    cls = EVENT_TYPES[data.pop("type")]
    return cls(**data)
