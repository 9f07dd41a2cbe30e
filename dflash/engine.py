"""THE generation loop. `Engine.stream(request)` yields typed events; everything else drains it.

One step: draft a block [last committed, MASK × (b-1)] → verify it with one target forward (KV cache, hooks
capture the draft's feature layers) → accept the longest allowed prefix + the target's own token → crop both
caches to the committed length → let the controller pick the next block size. Without a draft the same loop
verifies blocks of size 1: the autoregressive baseline.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from dflash import events as ev
from dflash.adaptive import Outcome as StepOutcome, make_controller
from dflash.draft import DFlashDraftModel, DraftCache, DraftConfig
from dflash.drafter import Drafter
from dflash.errors import BusyError, ModelLoadError, ValidationError
from dflash.request import MAX_PROMPT_TOKENS, Request
from dflash.sampling import GUMBEL_TARGET, UNIFORM_ACCEPT, gumbel_noise, uniform_noise
from dflash.stats import compute_stats
from dflash.target import Target, chat_prompt_ids
from dflash.verify_dispatch import match_verify, speculative_verify  # Triton on CUDA, dflash.verify elsewhere

log = logging.getLogger("dflash")

# The prompt goes through the target in chunks of this many tokens, with Stop and the deadline checked between
# chunks: an 8,192-token prompt is seconds of work on a CPU. Chunking leaves the result the same (KV cache).
PREFILL_CHUNK = 512


@dataclass
class Result:
    output_ids: list[int]
    text: str
    finish_reason: str
    stats: dict
    events: list
    message: str = ""


def check_draft_fits(cfg: DraftConfig, target: Target, vocab: torch.Tensor | None) -> None:
    """A draft trained for another target fails here with a message, not later with an IndexError mid-run."""
    if cfg.hidden_size != target.hidden_size:
        raise ModelLoadError(f"draft: hidden size {cfg.hidden_size} does not match the target's {target.hidden_size}")
    bad = [j for j in cfg.target_layer_ids if not 0 <= j < target.num_layers]
    if bad:
        raise ModelLoadError(f"draft: target_layer_ids {bad} do not exist in the target ({target.num_layers} layers)")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise ModelLoadError(f"draft: mask_token_id {cfg.mask_token_id} is outside the target's vocabulary "
                             f"({target.vocab_size})")
    if vocab is not None and vocab.numel() and not (0 <= int(vocab.min()) and int(vocab.max()) < target.vocab_size):
        raise ModelLoadError(f"draft: its draft vocabulary has ids outside the target's vocabulary ({target.vocab_size})")


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


class Engine:
    def __init__(self, target: Target, draft: DFlashDraftModel | None = None, draft_vocab: torch.Tensor | None = None,
                 name: str = ""):
        self.target = target
        self.name = name
        if draft is not None:
            check_draft_fits(draft.config, target, draft_vocab)
        self.draft = draft.to(device=target.device, dtype=target.dtype).eval() if draft is not None else None
        self.drafter = None
        if self.draft is not None:
            target.set_capture(self.draft.config.target_layer_ids)
            self.drafter = Drafter(self.draft, target.embed, target.lm_head_weight, draft_vocab, target.vocab_size,
                                   head=target.head)
        self._lock = threading.Lock()
        self.clock = time.monotonic  # injectable for deadline tests
        self.prefill_chunk = PREFILL_CHUNK  # injectable: tests use small chunks on tiny models
        self._texts: dict[int, str] = {}

    # -- helpers ----------------------------------------------------------------------------------------
    @property
    def trained_block_size(self) -> int | None:
        return self.draft.config.block_size if self.draft is not None else None

    def token_text(self, tid: int) -> str:
        if tid not in self._texts:
            tok = self.target.tokenizer
            self._texts[tid] = tok.decode([tid]) if tok is not None else f"<{tid}>"
        return self._texts[tid]

    def decode(self, ids: list[int]) -> str:
        tok = self.target.tokenizer
        return tok.decode(ids, skip_special_tokens=True) if tok is not None else ""

    def prompt_ids(self, request: Request) -> list[int]:
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        tok = self.target.tokenizer
        if tok is None:
            raise ValidationError("prompt", "this target has no tokenizer; pass prompt_ids instead")
        if request.chat_template and getattr(tok, "chat_template", None):
            return chat_prompt_ids(tok, request.prompt)
        return list(tok(request.prompt)["input_ids"])

    def check(self, request: Request, prompt_ids: list[int]) -> tuple[int, int, int]:
        """Model-dependent validation. Returns (block size, min block size, max block size)."""
        use_draft = request.use_draft and self.draft is not None
        if request.use_draft and self.draft is None:
            raise ValidationError("use_draft", "this engine has no draft model; use the no-draft baseline")
        if any(i >= self.target.vocab_size for i in prompt_ids):
            raise ValidationError("prompt_ids", f"token ids must be < vocab size {self.target.vocab_size}")
        if request.top_k > self.target.vocab_size:
            raise ValidationError("top_k", f"must be in [0, {self.target.vocab_size}]")
        if not use_draft:
            size = lo = hi = 1
        else:
            trained = self.trained_block_size
            hi = request.max_block_size or trained
            size = request.block_size or min(trained, hi)
            lo = min(request.min_block_size, size)
            if not lo <= size <= hi:
                raise ValidationError("block_size", f"must be in [{lo}, {hi}] (min/max block size), got {size}")
        budget = self.target.max_positions
        total = len(prompt_ids) + request.max_new_tokens + hi
        if total > budget:
            raise ValidationError("max_new_tokens", f"prompt ({len(prompt_ids)}) + max_new_tokens ({request.max_new_tokens}) + block ({hi}) = {total} exceeds the context budget {budget}")
        return size, lo, hi

    # -- the loop ---------------------------------------------------------------------------------------
    def stream(self, request: Request, cancel: threading.Event | None = None, blocking: bool = True) -> Iterator[ev.Event]:
        """Validate now (raises ValidationError), then return the event iterator. One request at a time."""
        prompt_ids, sizes = self.validate(request)
        if not blocking and self._lock.locked():
            raise BusyError("the engine is busy with another request")
        return self._run(request, prompt_ids, sizes, cancel or threading.Event(), blocking)

    def validate(self, request: Request) -> tuple[list[int], tuple[int, int, int]]:
        """Everything `stream` checks before it runs (ValidationError naming the parameter): the prompt's token ids
        and the block sizes. Callers that run the request elsewhere (a GPU worker) call it first."""
        prompt_ids = self.prompt_ids(request)
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise ValidationError("prompt", f"is {len(prompt_ids)} tokens; the limit is {MAX_PROMPT_TOKENS}")
        return prompt_ids, self.check(request, prompt_ids)

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Result:
        events = list(self.stream(request, cancel))
        fin = events[-1]
        return Result(fin.output_ids, fin.text, fin.reason, fin.stats, events, fin.message)

    def _run(self, req: Request, prompt_ids: list[int], sizes: tuple[int, int, int], cancel: threading.Event,
             blocking: bool) -> Iterator[ev.Event]:
        # The lock is taken on the first next(), not in stream(): a stream that is never iterated holds nothing.
        if not self._lock.acquire(blocking=blocking):
            raise BusyError("the engine is busy with another request")
        events: list[ev.Event] = []
        out: list[int] = []
        reason, message = "length", ""
        t_start = self.clock()
        deadline = t_start + req.deadline_s if req.deadline_s else None

        def emit(event: ev.Event) -> ev.Event:
            events.append(event)
            return event

        try:
            yield emit(ev.Started(req.to_dict(), prompt_ids, self.decode(prompt_ids), self.drafter is not None and req.use_draft,
                                  self.draft.config.mask_token_id if self.draft is not None else None,
                                  self.trained_block_size, req.lossy, self.name))
            for event in self._loop(req, prompt_ids, sizes, out, cancel, deadline, t_start):
                if isinstance(event, tuple):  # (finish reason, message)
                    reason, message = event
                    break
                yield emit(event)
        except (torch.OutOfMemoryError, MemoryError):
            reason, message = "error", "out of memory: try a shorter prompt, fewer new tokens or a smaller block"
        except Exception as exc:  # noqa: BLE001 — a failed request must leave the engine serving
            log.exception("generation failed")
            reason, message = "error", f"generation failed ({type(exc).__name__})"
        finally:
            self._lock.release()
        yield emit(ev.Finished(reason, list(out), self.decode(out), compute_stats(events), message))

    def _stop_reason(self, req: Request, cancel: threading.Event, deadline: float | None) -> tuple[str, str] | None:
        """(finish reason, message) once Stop was pressed or the deadline passed, else None."""
        if cancel.is_set():
            return "cancelled", "stopped by the user"
        if deadline is not None and self.clock() > deadline:
            return "timeout", f"deadline of {req.deadline_s:g} s reached"
        return None

    def _prefill(self, prompt_ids: list[int], cache, capture: bool, stopped):
        """The prompt through the target in chunks of `prefill_chunk` tokens, `stopped()` checked between chunks.

        Returns (logits of the last position [1, V], features [1, T, k*H] or None, None), or (None, None, the
        stop's (reason, message)) when stopped before the last chunk; the request's caches are then dropped.
        """
        logits, feats = None, []
        for i in range(0, len(prompt_ids), self.prefill_chunk):
            why = stopped() if i else None
            if why:
                return None, None, why
            ids = torch.tensor([prompt_ids[i : i + self.prefill_chunk]], device=self.target.device)
            logits, f = self.target.forward(ids, cache, last_only=True, capture=capture)
            if f is not None:
                feats.append(f)
        return logits, (torch.cat(feats, 1) if feats else None), None

    def _loop(self, req: Request, prompt_ids: list[int], sizes: tuple[int, int, int], out: list[int],
              cancel: threading.Event, deadline: float | None, t_start: float):
        tg, drafter = self.target, (self.drafter if req.use_draft else None)
        dev = tg.device
        eos = tg.stop_ids()
        stops = set(req.stop_ids) | eos
        sampling = req.temperature > 0.0
        cache, dcache = tg.new_cache(), DraftCache()
        size, lo, hi = sizes
        controller = make_controller(req.adaptive, size, lo, hi)
        text = TextStream(self.decode)

        def pick(logits: torch.Tensor, positions: list[int]) -> list[int]:
            """The target's own token at each absolute position (argmax, or seeded Gumbel-max sample)."""
            g = gumbel_noise(req.seed, positions, logits.shape[-1], GUMBEL_TARGET, dev) if sampling else None
            none = torch.empty(0, dtype=torch.long, device=logits.device)  # nothing drafted: the target's own choices
            return match_verify(none, logits, req.temperature, req.top_k, req.top_p, g).target_tokens

        def commit(block: int, new: list[int], kinds: list[str], confs: list[float], targets: list[int]):
            """Append tokens, stopping at EOS/stop ids and max_new_tokens. Returns (Commit event, finish reason)."""
            keep, why = [], None
            for tid in new:
                keep.append(tid)
                if tid in stops:
                    why = "eos" if tid in eos else "stop"
                    break
                if len(out) + len(keep) >= req.max_new_tokens:
                    why = "length"
                    break
            out.extend(keep)
            # The last commit flushes a held-back partial character, so the deltas add up to Finished.text (a run
            # stopped by cancel, deadline or error can end without its last incomplete character in the deltas).
            delta = text.push(keep, final=why is not None)
            n = len(keep)
            return ev.Commit(block, keep, kinds[:n], [self.token_text(t) for t in keep], delta, len(out), confs[:n],
                             targets[:n], (self.clock() - t_start) * 1000), why

        stopped = functools.partial(self._stop_reason, req, cancel, deadline)
        # Prefill: the whole prompt, in chunks with Stop checked between them; its features become the draft's context.
        t0 = time.perf_counter()
        logits, feats, why = self._prefill(prompt_ids, cache, drafter is not None, stopped)
        if why:
            yield why
            return
        first = pick(logits[-1:], [len(prompt_ids)])[0]
        yield ev.Prefill(len(prompt_ids), (time.perf_counter() - t0) * 1000)
        event, why = commit(0, [first], [ev.BONUS], [-1.0], [first])
        yield event
        if why:
            yield (why, "")
            return
        pending, pending_pos = feats, 0  # target features not yet in the draft's context cache
        seq = prompt_ids + [first]
        block = 0
        size, reason = controller.first()
        while True:
            why = stopped()
            if why:
                yield why
                return
            block += 1
            start = len(seq) - 1  # absolute position of the anchor (last committed token, not yet in the cache)
            b = min(size, req.max_new_tokens - len(out) + 1) if drafter else 1
            yield ev.BlockSize(block, b, reason if b == size else f"{reason}; clipped to {b} (tokens left)")
            # Draft.
            proposal = None
            if drafter is not None and b > 1:
                if pending is not None:
                    drafter.extend_context(dcache, pending, pending_pos)
                    pending = None
                sample = ({"temperature": req.temperature, "top_k": req.top_k, "top_p": req.top_p, "seed": req.seed}
                          if sampling and req.verify == "rejection" else None)
                proposal = drafter.propose(dcache, seq[-1], start, b, req.diffusion_steps, req.confidence_threshold, sample)
                for s in proposal.steps:
                    yield ev.DraftStep(block=block, token_texts=[self.token_text(t) for t in s["tokens"]], **s)
            drafted = proposal.tokens if proposal else []
            # Verify: one target forward over [anchor, drafts].
            t0 = time.perf_counter()
            block_ids = torch.tensor([[seq[-1]] + drafted], device=dev)
            logits, feats = tg.forward(block_ids, cache, capture=drafter is not None)  # [b, V], [1, b, k*H]
            positions = list(range(start + 1, start + b + 1))
            d = torch.tensor(drafted, dtype=torch.long, device=logits.device)
            if sampling and req.verify == "rejection" and proposal is not None:
                res = speculative_verify(d, proposal.q, logits, req.temperature, req.top_k, req.top_p,
                                         uniform_noise(req.seed, positions[:-1], UNIFORM_ACCEPT),
                                         gumbel_noise(req.seed, positions, logits.shape[-1], GUMBEL_TARGET, dev))
            else:
                g = gumbel_noise(req.seed, positions, logits.shape[-1], GUMBEL_TARGET, dev) if sampling else None
                res = match_verify(d, logits, req.temperature, req.top_k, req.top_p, g, req.acceptance_threshold)
            verify_ms = (time.perf_counter() - t0) * 1000
            a = res.accepted_len
            # Keep the target cache and the pending features for the anchor + accepted drafts only.
            Target.crop(cache, start + a + 1)
            if feats is not None:
                if pending is None:
                    pending, pending_pos = feats[:, : a + 1], start
                else:  # a block of size 1 drafted nothing, so the earlier features are still pending: keep them
                    pending = torch.cat([pending, feats[:, : a + 1]], 1)
            draft_ms = proposal.ms if proposal else 0.0
            yield ev.Verify(block, start, b, drafted, [self.token_text(t) for t in drafted], res.target_tokens,
                            [self.token_text(t) for t in res.target_tokens], [i < a for i in range(len(drafted))], a,
                            res.next_token, draft_ms, verify_ms, res.relaxed)
            new = drafted[:a] + [res.next_token]
            kinds = [ev.DRAFT] * a + [ev.CORRECTION if a < len(drafted) else ev.BONUS]
            confs = (proposal.confidences[:a] if proposal else []) + [-1.0]
            event, why = commit(block, new, kinds, confs, res.target_tokens[: a + 1])
            seq.extend(event.token_ids)
            yield event
            if why:
                yield (why, "")
                return
            size, reason = controller.update(StepOutcome(b, a, draft_ms, verify_ms))
