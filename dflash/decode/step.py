"""One block of a request, top to bottom (`run_block`), and the state it works on: the request's verification rule,
its caches, proposers and output (`Run`), and what a block reports back to the engine's loop (`StepResult`).

The rule is chosen once per request (`verify_rule`): the *match* rule (greedy, Gumbel-max sampling, or relaxed
with acceptance_threshold < 1) or, for sampled requests that ask for it, the lossless *rejection* rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import torch

from dflash.decode import events as ev
from dflash.decode.adaptive import BlockOutcome
from dflash.decode.attention import with_texts
from dflash.decode.proposer import Proposal, Proposer
from dflash.decode.request import Request
from dflash.verification.sampling import GUMBEL_TARGET, UNIFORM_ACCEPT, gumbel_noise, uniform_noise
from dflash.models.target import Target
from dflash.verification.verify import Outcome, top2_gap
# On CUDA the faster of Triton and dflash.verification.verify (measured per kind of call).
from dflash.verification.verify_dispatch import match_verify, speculative_verify


class MatchRule:
    """Accept draft tokens equal to the target's own choice at their position: the argmax, or (temperature > 0)
    the Gumbel-max sample with the noise of (seed, absolute position). acceptance_threshold < 1 relaxes it."""

    draft_sampling: dict | None = None  # `Proposer.propose(sample=...)`: None asks for argmax proposals

    def __init__(self, req: Request, device: torch.device):
        self.req, self.device = req, device
        self._noise: tuple[int, torch.Tensor] | None = None  # the last block's (first position, noise): margins reuse it

    def gumbel(self, positions: list[int], vocab: int) -> torch.Tensor | None:
        """[len(positions), V] target noise when sampling; None when greedy. `positions` are consecutive."""
        req = self.req
        if req.temperature == 0.0:
            return None
        if self._noise is not None and self._noise[0] == positions[0] and len(self._noise[1]) >= len(positions):
            return self._noise[1][: len(positions)]  # the committed rows of the block just verified
        noise = gumbel_noise(req.seed, positions, vocab, GUMBEL_TARGET, self.device)
        self._noise = (positions[0], noise)
        return noise

    def margins(self, logits: torch.Tensor, positions: list[int]) -> list[float]:
        """The target's decision margin per row of logits [len(positions), V], in logits (`Commit.target_gaps`): the
        top-2 gap of the logits (greedy) or of the noisy scores logits + T·g (Gumbel-max: the argmax of logits/T + g),
        so a rounding of every logit by less than half of it keeps the token. [] where the token is not such an
        argmax alone: top-k / top-p filtering, whose boundary can move with the rounding too."""
        req = self.req
        if req.temperature == 0.0:
            return top2_gap(logits)
        if req.top_k or req.top_p < 1.0:
            return []
        return top2_gap(logits.float() + req.temperature * self.gumbel(positions, logits.shape[-1]))

    def pick(self, logits: torch.Tensor, positions: list[int]) -> list[int]:
        """The target's own token at each absolute position (nothing drafted); logits [len(positions), V]."""
        req = self.req
        none = torch.empty(0, dtype=torch.long, device=logits.device)
        return match_verify(none, logits, req.temperature, req.top_k, req.top_p,
                            self.gumbel(positions, logits.shape[-1])).target_tokens

    def verify(self, drafted: list[int], proposal: Proposal | None, logits: torch.Tensor,
               positions: list[int]) -> Outcome:
        """The verdict on `drafted` (proposals for positions[:-1]) from the target's logits [len(positions), V]."""
        req = self.req
        d = torch.tensor(drafted, dtype=torch.long, device=logits.device)
        return match_verify(d, logits, req.temperature, req.top_k, req.top_p, self.gumbel(positions, logits.shape[-1]),
                            req.acceptance_threshold)


class RejectionRule(MatchRule):
    """Speculative sampling: drafts sampled from the draft's tempered law `proposal.q`, accepted with probability
    min(1, p/q), the residual drawn at the first rejection. Lossless for any draft."""

    def __init__(self, req: Request, device: torch.device):
        super().__init__(req, device)
        self.draft_sampling = {"temperature": req.temperature, "top_k": req.top_k, "top_p": req.top_p, "seed": req.seed}

    def margins(self, logits: torch.Tensor, positions: list[int]) -> list[float]:
        """[]: an accepted draft token is the draft's sample, not the target's argmax (only the law is the target's)."""
        return []

    def verify(self, drafted: list[int], proposal: Proposal | None, logits: torch.Tensor,
               positions: list[int]) -> Outcome:
        if proposal is None:  # a block of size 1 drafted nothing: the target's own sample, drawn as the match rule does
            return super().verify(drafted, proposal, logits, positions)
        req = self.req
        d = torch.tensor(drafted, dtype=torch.long, device=logits.device)
        return speculative_verify(d, proposal.q, logits, req.temperature, req.top_k, req.top_p,
                                  uniform_noise(req.seed, positions[:-1], UNIFORM_ACCEPT),
                                  self.gumbel(positions, logits.shape[-1]))


def verify_rule(req: Request, device: torch.device) -> MatchRule:
    """The request's rule: rejection for a sampled request with verify="rejection", match otherwise."""
    if req.temperature > 0.0 and req.verify == "rejection":
        return RejectionRule(req, device)
    return MatchRule(req, device)


class TextStream:
    """Incremental detokenization: each `push` decodes only a window of recent tokens and returns the text that
    is now stable, instead of re-decoding the whole output at every commit.

    The window starts one emitted chunk back, so a tokenizer that treats the first token of a decode specially
    (e.g. drops its leading space) does so in both decodes that are compared. Text ending in "\ufffd" (a UTF-8
    character split across tokens) is held back until it completes; `final=True` flushes whatever is held.
    """

    def __init__(self, decode):
        self.decode = decode  # list of ids -> text
        self.ids: list[int] = []
        self.start = 0  # the window's first token
        self.emitted = 0  # tokens whose text has been returned

    def push(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        before = self.decode(self.ids[self.start : self.emitted])
        after = self.decode(self.ids[self.start :])
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        self.start, self.emitted = self.emitted, len(self.ids)
        return after[len(before) :]


@dataclass
class Run:
    """One request between steps.

    The target cache holds every committed token but the newest (the next block's anchor). `chain` is the request's
    proposers in the order they are asked (empty: blocks of size 1, the autoregressive baseline), `states` their
    per-request states; those that read target features get each committed position's once (`feed`).
    """

    req: Request
    rule: MatchRule
    chain: list[Proposer]
    states: list[Any]
    cache: Any  # the target's KV cache
    text: TextStream
    t_start: float  # the engine clock when the request started
    out: list[int]  # the output so far
    seq: list[int]  # prompt + output
    eos: set[int]
    stops: set[int]  # eos + the request's stop ids

    @property
    def captures(self) -> bool:
        """Some proposer reads the target's features: the target forwards capture them."""
        return any(p.layers for p in self.chain)

    def feed(self, feats: torch.Tensor | None, start: int) -> None:
        """Hand the features [1, T, k*H] of positions start .. start+T-1 (all committed) to the proposers that read
        them."""
        if feats is None:
            return
        for p, state in zip(self.chain, self.states):
            if p.layers:
                p.extend_context(state, feats, start)

    def take(self, new: list[int]) -> tuple[list[int], str | None]:
        """Append `new` up to its first stop id or max_new_tokens. Returns (tokens kept, finish reason or None)."""
        keep, why = [], None
        for tid in new:
            keep.append(tid)
            if tid in self.stops:
                why = "eos" if tid in self.eos else "stop"
                break
            if len(self.out) + len(keep) >= self.req.max_new_tokens:
                why = "length"
                break
        self.out.extend(keep)
        self.seq.extend(keep)
        return keep, why


@dataclass(frozen=True)
class StepResult:
    """What one block did, for the loop: the tokens it committed, the controller's outcome, why the output ended."""

    committed: list[int]  # tokens appended to the output (after stop / length truncation)
    outcome: BlockOutcome  # block size, accepted drafts, draft and verify ms (the block-size controller's input)
    finish: str | None  # "eos", "stop" or "length" when the output ended with this block, else None
    source: str = ev.DRAFT  # the proposer whose block it was (its controller learns from the outcome)


@dataclass(frozen=True)
class Recorder:
    """What a block's events need from the engine: token texts and the clock of commit times."""

    texts: Callable[[list[int]], list[str]]
    clock: Callable[[], float]

    def commit(self, run: Run, block: int, new: list[int], kinds: list[str], confs: list[float], targets: list[int],
               logits: torch.Tensor, pos: int) -> tuple[ev.Commit, str | None]:
        """Append tokens, stopping at EOS/stop ids and max_new_tokens. Returns (Commit event, finish reason).
        `logits` [len(new), V]: the target's rows that chose `new`, at absolute positions pos, pos + 1, … (their
        decision margins: `MatchRule.margins`)."""
        keep, why = run.take(new)
        # The last commit flushes a held-back partial character, so the deltas add up to Finished.text (a run
        # stopped by cancel, deadline or error can end without its last incomplete character in the deltas).
        delta = run.text.push(keep, final=why is not None)
        n = len(keep)
        return ev.Commit(block=block, token_ids=keep, kinds=kinds[:n], texts=self.texts(keep), text_delta=delta,
                         n_out=len(run.out), confidences=confs[:n], target_tokens=targets[:n],
                         target_gaps=run.rule.margins(logits[:n], list(range(pos, pos + n))) if n else [],
                         t_ms=(self.clock() - run.t_start) * 1000), why


def run_block(target: Target, run: Run, block: int, chosen: dict[str, tuple[int, str]],
              rec: Recorder) -> Generator[ev.Event, None, StepResult]:
    """One block: propose (`propose`), verify with one target forward over [anchor, proposals], accept the longest
    allowed prefix and the target's own next token, crop the target cache. `chosen`: each proposer's (size, reason)
    from its controller. Yields BlockSize, DraftStep × (at most S), Verify, Commit; returns the StepResult."""
    start = len(run.seq) - 1  # absolute position of the anchor (last committed token, not yet in the cache)
    source, b, reason, proposal = propose(run, chosen)
    yield ev.BlockSize(block=block, size=b, reason=reason, source=source)
    for s in proposal.steps if proposal else []:
        if s.get("attention"):  # a traced request: the kept context positions' texts
            s = {**s, "attention": with_texts(s["attention"], run.seq, rec.texts)}
        if s.get("hints") is not None:
            s = {**s, "hint_texts": rec.texts(s["hints"])}
        yield ev.DraftStep(block=block, token_texts=rec.texts(s["tokens"]), **s)
    drafted = proposal.tokens if proposal else []
    t0 = time.perf_counter()
    block_ids = torch.tensor([[run.seq[-1]] + drafted], device=target.device)
    logits, feats = target.forward(block_ids, run.cache, capture=run.captures)  # [b, V], [1, b, k*H]
    res = run.rule.verify(drafted, proposal, logits, list(range(start + 1, start + b + 1)))
    verify_ms = (time.perf_counter() - t0) * 1000
    a = res.accepted_len
    # Keep the target cache and the proposers' features for the anchor + accepted drafts only.
    target.crop(run.cache, start + a + 1)
    run.feed(feats[:, : a + 1] if feats is not None else None, start)
    draft_ms = proposal.ms if proposal else 0.0
    yield ev.Verify(block=block, start=start, block_size=b, draft_tokens=drafted, draft_texts=rec.texts(drafted),
                    target_tokens=res.target_tokens, target_texts=rec.texts(res.target_tokens),
                    accepted=[i < a for i in range(len(drafted))], accepted_len=a, next_token=res.next_token,
                    draft_ms=draft_ms, verify_ms=verify_ms, relaxed=res.relaxed, source=source)
    kinds = [source] * a + [ev.CORRECTION if a < len(drafted) else ev.BONUS]
    confs = (proposal.confidences[:a] if proposal else []) + [-1.0]
    commit, why = rec.commit(run, block, drafted[:a] + [res.next_token], kinds, confs, res.target_tokens[: a + 1],
                             logits[: a + 1], start + 1)
    yield commit
    return StepResult(commit.token_ids, BlockOutcome(b, a, draft_ms, verify_ms), why, source)


def propose(run: Run, chosen: dict[str, tuple[int, str]]) -> tuple[str, int, str, Proposal | None]:
    """Ask the chain in order, each proposer at its controller's size clipped to the tokens left; the first proposal
    wins. Returns (its proposer's name, block size, the BlockSize reason, the proposal: None for a block of one).
    Without proposers, or when all decline, the block is one target step."""
    req = run.req
    left = req.max_new_tokens - len(run.out) + 1
    for p, state in zip(run.chain, run.states):
        size, reason = chosen[p.name]
        b = min(size, left)
        reason = reason if b == size else f"{reason}; clipped to {b} (tokens left)"
        if b < 2:
            return p.name, 1, reason, None
        proposal = p.propose(state, run.seq, b, req.diffusion_steps, req.confidence_threshold, run.rule.draft_sampling)
        if proposal is not None:
            return p.name, b, f"{proposal.note}; {reason}" if proposal.note else reason, proposal
    if not run.chain:
        return ev.DRAFT, 1, chosen[ev.DRAFT][1], None
    return run.chain[-1].name, 1, "no proposer proposed: one target step", None
