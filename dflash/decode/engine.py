"""THE generation loop. `Engine.stream(request)` yields typed events; everything else drains it.

One step (`dflash.decode.step.run_block`): propose a block [last committed, proposals] → verify it with one target forward (KV
cache, hooks capture the draft's feature layers) → accept the longest allowed prefix + the target's own token →
crop the target cache to the committed length → let the controller pick the next block size. Without a draft the
same loop verifies blocks of size 1: the autoregressive baseline. Per-request state lives in `dflash.decode.step.Run`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from dflash.decode import events as ev
from dflash.decode.adaptive import make_controller, resolve
from dflash.decode.attention import TOP_K
from dflash.decode.drafter import DraftContext, Drafter
from dflash.decode.limits import block_sizes, check_context
from dflash.decode.lookup import CopyProposer
from dflash.decode.proposer import Proposer
from dflash.decode.request import MAX_PROMPT_TOKENS, Request
from dflash.decode.stats import compute_stats
from dflash.decode.step import Recorder, Run, TextStream, run_block, verify_rule
from dflash.errors import BusyError, ValidationError
from dflash.models.draft import DFlashDraftModel
from dflash.models.target import Target, chat_prompt_ids

log = logging.getLogger("dflash")

# The prompt goes through the target in chunks of this many tokens, with Stop and the deadline checked before each
# chunk: an 8,192-token prompt is seconds of work on a CPU. Chunking leaves the result the same (KV cache).
PREFILL_CHUNK = 512
# A request waiting for the engine (another one runs) re-checks its Stop and deadline this often.
WAIT_POLL_S = 0.05

T = TypeVar("T")
Finish = tuple[str, str]  # (finish reason, message)
Stopped = Callable[[], "Finish | None"]  # Engine._stop_reason bound to one request


@dataclass
class Result:
    output_ids: list[int]
    text: str
    finish_reason: str
    stats: dict
    events: list
    message: str = ""


def _recorded(events: list[ev.Event], gen: Generator[ev.Event, None, T],
              resumed: Callable[[], None]) -> Generator[ev.Event, None, T]:
    """Yield `gen`'s events, appending each to `events` (the stats are computed from them); return its value.
    `resumed` is called each time the consumer asks for the next event."""
    while True:
        resumed()
        try:
            event = next(gen)
        except StopIteration as done:
            return done.value
        events.append(event)
        yield event


class Engine:
    """Runs requests on a target, with a draft model's block proposals, or one token per step for requests with
    use_draft=False (the autoregressive baseline). Without a draft model only those run: a request with use_draft
    True, the default, is refused with a ValidationError naming use_draft.

    `drafter`: the `Proposer` of drafted blocks in place of the `Drafter` built from `draft` (see `use_drafter`);
    the draft's config still says which target layers are captured and the trained block size, so it needs `draft`.
    A request's chain (`chain`) may put other proposers before it.
    """

    def __init__(self, target: Target, draft: DFlashDraftModel | None = None, draft_vocab: torch.Tensor | None = None,
                 name: str = "", drafter: Proposer | None = None):
        self.target = target
        self.name = name
        if draft is not None:
            draft.config.check_fits(target.hidden_size, target.num_layers, target.vocab_size, draft_vocab)
        self.draft = draft.to(device=target.device, dtype=target.dtype).eval() if draft is not None else None
        self._draft_vocab = draft_vocab
        self.drafter: Proposer | None = None  # read by the UI: None means no draft to run
        if self.draft is not None:
            target.set_capture(self.draft.config.target_layer_ids)
            self.use_drafter(drafter)
        elif drafter is not None:
            raise ValueError("drafter: needs the draft model it drafts for (draft=...)")
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread that last advanced the running stream (None: no stream runs)
        self.clock = time.monotonic  # injectable for deadline tests
        self.prefill_chunk = PREFILL_CHUNK  # injectable: tests use small chunks on tiny models
        self._texts: dict[int, str] = {}
        self.host = None  # dflash.loading.host.HostSettings: the CPU settings load_engine chose (None: not chosen there)
        self.draft_source: str | None = None  # where the draft was loaded from, when its loader says (DFlashModel)
        # What a block's events need from the engine: token texts, and the clock for commit times (injectable).
        self._recorder = Recorder(self.token_texts, lambda: self.clock())

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """The target token ids the draft head scores (None: the whole vocabulary)."""
        return self._draft_vocab

    def use_drafter(self, drafter: Proposer | None = None) -> None:
        """Draft the blocks of the next requests with `drafter`; None: with a `Drafter` over the draft model. It
        reads the target layers the draft's config names, or none."""
        if self.draft is None:
            raise ValueError("drafter: this engine has no draft model, so it runs without a drafter")
        if drafter is not None and tuple(drafter.layers) not in ((), tuple(self.draft.config.target_layer_ids)):
            raise ValueError(f"drafter: reads target layers {list(drafter.layers)}; this engine captures "
                             f"{list(self.draft.config.target_layer_ids)}")
        if drafter is None:
            tg = self.target
            drafter = Drafter(self.draft, tg.embed, tg.lm_head_weight, self._draft_vocab, tg.vocab_size, head=tg.head)
        self.drafter = drafter

    # -- helpers ----------------------------------------------------------------------------------------
    @property
    def trained_block_size(self) -> int | None:
        return self.draft.config.block_size if self.draft is not None else None

    def token_text(self, tid: int) -> str:
        if tid not in self._texts:
            tok = self.target.tokenizer
            self._texts[tid] = tok.decode([tid]) if tok is not None else f"<{tid}>"
        return self._texts[tid]

    def token_texts(self, ids: list[int]) -> list[str]:
        return [self.token_text(t) for t in ids]

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
            ids = chat_prompt_ids(tok, request.prompt)
        else:
            ids = list(tok(request.prompt)["input_ids"])
        if not ids:  # a tokenizer without a vocabulary: the prefill would have nothing to run
            raise ValidationError("prompt", "this target's tokenizer turns it into no tokens; pass prompt_ids instead")
        return ids

    def check(self, request: Request, prompt_ids: list[int]) -> tuple[int, int, int]:
        """Model-dependent validation. Returns (block size, min block size, max block size)."""
        use_draft = request.use_draft and self.draft is not None
        if request.use_draft and self.draft is None:
            raise ValidationError("use_draft", "this engine has no draft model; pass use_draft=False (the no-draft baseline)")
        if any(i >= self.target.vocab_size for i in prompt_ids):
            raise ValidationError("prompt_ids", f"token ids must be < vocab size {self.target.vocab_size}")
        if request.top_k > self.target.vocab_size:
            raise ValidationError("top_k", f"must be in [0, {self.target.vocab_size}]")
        size, lo, hi = block_sizes(request, self.trained_block_size) if use_draft else (1, 1, 1)
        check_context(request, len(prompt_ids), hi, self.target.max_positions)
        return size, lo, hi

    # -- the loop ---------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A request is running (`stream(blocking=False)` would raise BusyError)."""
        return self._lock.locked()

    def stream(self, request: Request, cancel: threading.Event | None = None, blocking: bool = True) -> Iterator[ev.Event]:
        """Validate now (raises ValidationError), then return the event iterator. One request at a time."""
        prompt_ids, sizes = self.validate(request)
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise ValidationError("cancel", f"must be a threading.Event (set it to stop), got {cancel!r}")
        if not blocking and self.busy:
            raise BusyError("the engine is busy with another request")
        # "auto" becomes the policy it stands for on this device, so the Started event (the trace, the history)
        # records the one that ran.
        request = dataclasses.replace(request, adaptive=resolve(request.adaptive, self.target.device.type))
        return self._run(request, prompt_ids, sizes, cancel or threading.Event(), blocking, self.clock())

    def validate(self, request: Request) -> tuple[list[int], tuple[int, int, int]]:
        """Everything `stream` checks before it runs (ValidationError naming the parameter): the prompt's token ids
        and the block sizes. Callers that run the request elsewhere (a GPU worker) call it first."""
        if not isinstance(request, Request):
            raise ValidationError("request", f"must be a dflash.Request, got {type(request).__name__}")
        prompt_ids = self.prompt_ids(request)
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise ValidationError("prompt", f"is {len(prompt_ids)} tokens; the limit is {MAX_PROMPT_TOKENS}")
        return prompt_ids, self.check(request, prompt_ids)

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Result:
        events = list(self.stream(request, cancel))
        fin = events[-1]
        return Result(fin.output_ids, fin.text, fin.reason, fin.stats, events, fin.message)

    def _run(self, req: Request, prompt_ids: list[int], sizes: tuple[int, int, int], cancel: threading.Event,
             blocking: bool, called: float) -> Iterator[ev.Event]:
        # The deadline counts from the stream() call (`called`): time waiting for the engine is part of it.
        deadline = called + req.deadline_s if req.deadline_s else None
        stopped = functools.partial(self._stop_reason, req, cancel, deadline)
        # The lock is taken on the first next(), not in stream(): a stream that is never iterated holds nothing.
        why = self._acquire(blocking, stopped)
        if why:  # stopped while waiting: nothing ran, as for a run stopped during its prefill (Started, Finished)
            started = self._started(req, prompt_ids)
            yield started
            yield ev.Finished(reason=why[0], output_ids=[], text="", stats=compute_stats([started]), message=why[1])
            return
        events: list[ev.Event] = []
        out: list[int] = []
        t_start = self.clock()
        try:
            started = self._started(req, prompt_ids)
            events.append(started)
            yield started
            run = self._new_run(req, prompt_ids, out, t_start)
            reason, message = yield from _recorded(events, self._loop(run, prompt_ids, sizes, stopped), self._hold)
        except (torch.OutOfMemoryError, MemoryError):
            reason, message = "error", "out of memory: try a shorter prompt, fewer new tokens or a smaller block"
        except Exception as exc:  # noqa: BLE001 — a failed request must leave the engine serving
            log.exception("generation failed")
            reason, message = "error", f"generation failed ({type(exc).__name__})"
        finally:
            self._holder = None
            self._lock.release()
        yield ev.Finished(reason=reason, output_ids=list(out), text=self.decode(out), stats=compute_stats(events),
                          message=message)

    def _started(self, req: Request, prompt_ids: list[int]) -> ev.Started:
        return ev.Started(request=req.to_dict(), prompt_ids=prompt_ids, prompt_text=self.decode(prompt_ids),
                          has_draft=self.drafter is not None and req.use_draft,
                          mask_token_id=self.draft.config.mask_token_id if self.draft is not None else None,
                          trained_block_size=self.trained_block_size, lossy=req.lossy, model=self.name)

    def _acquire(self, blocking: bool, stopped: Stopped) -> Finish | None:
        """Take the one-request lock: None once taken. The wait polls, so that the waiting request's Stop and deadline
        end it: then (finish reason, message), without the lock. A stream left suspended in this very thread (a loop
        broken out of, or left by an exception, still referenced) holds it: waiting would never end, a BusyError."""
        if blocking and self._holder == threading.get_ident():
            raise BusyError("a stream of this engine is still open in this thread (a loop left early?): close() it "
                            "or read it to the end first")
        if not self._lock.acquire(blocking=False):
            if not blocking:
                raise BusyError("the engine is busy with another request")
            while not self._lock.acquire(timeout=WAIT_POLL_S):
                if why := stopped():
                    return why[0], f"{why[1]} while waiting for the engine (another request was running)"
        self._hold()
        return None

    def _hold(self) -> None:
        self._holder = threading.get_ident()  # a stream may be advanced by another thread than the one that started it

    def chain(self, req: Request) -> list[Proposer]:
        """The request's proposers, in the order they are asked for each block: copying from the context first when
        it asks (lookup_ngram > 0), then the draft. Empty for use_draft=False: blocks of one token."""
        if not req.use_draft or self.drafter is None:
            return []
        tg = self.target
        return ([CopyProposer(req.lookup_ngram, tg.vocab_size, tg.device)] if req.lookup_ngram else []) + [self.drafter]

    def _new_run(self, req: Request, prompt_ids: list[int], out: list[int], t_start: float) -> Run:
        """A request's state before its prefill: empty caches and proposer states, the verification rule chosen once
        for the request."""
        tg, chain = self.target, self.chain(req)
        eos = tg.stop_ids()
        states = [p.new_state() for p in chain]
        for state in states:
            if isinstance(state, DraftContext) and req.trace_attention:
                state.attention_k = TOP_K
        return Run(req=req, rule=verify_rule(req, tg.device), chain=chain, states=states,
                   cache=tg.new_cache(), text=TextStream(self.decode), t_start=t_start, out=out, seq=list(prompt_ids),
                   eos=eos, stops=set(req.stop_ids) | eos)

    def _stop_reason(self, req: Request, cancel: threading.Event, deadline: float | None) -> Finish | None:
        """(finish reason, message) once Stop was pressed or the deadline passed, else None."""
        if cancel.is_set():
            return "cancelled", "stopped by the user"
        if deadline is not None and self.clock() > deadline:
            return "timeout", f"deadline of {req.deadline_s:g} s reached"
        return None

    def _loop(self, run: Run, prompt_ids: list[int], sizes: tuple[int, int, int],
              stopped: Stopped) -> Generator[ev.Event, None, Finish]:
        """The prefill, then one `run_block` per block until the output ends or `stopped()` says why to stop.
        Yields the events; returns (finish reason, message).

        Each proposer of the chain has its own block-size controller: their acceptance differs too much (a copy is
        often right for many tokens, or wrong at once) for one estimate to serve both. A proposer whose smallest
        block exceeds the request's block size leaves the chain. Without proposers, blocks of one."""
        keep = [i for i, p in enumerate(run.chain) if p.min_block <= sizes[0]]
        run.chain, run.states = [run.chain[i] for i in keep], [run.states[i] for i in keep]
        controllers = {p.name: make_controller(run.req.adaptive, *(max(s, p.min_block) for s in sizes[:2]), sizes[2])
                       for p in run.chain} or {ev.DRAFT: make_controller(run.req.adaptive, *sizes)}
        finish = yield from self._start(run, prompt_ids, stopped)
        if finish:
            return finish
        chosen = {name: c.first() for name, c in controllers.items()}  # proposer → (size, reason)
        block = 0
        while True:
            finish = stopped()
            if finish:
                return finish
            block += 1
            step = yield from run_block(self.target, run, block, chosen, self._recorder)
            if step.finish:
                return step.finish, ""
            c = controllers.get(step.source)
            if c is not None and step.outcome.block_size >= c.min_size:  # not a block its whole chain declined
                chosen[step.source] = c.update(step.outcome)

    def _start(self, run: Run, prompt_ids: list[int], stopped: Stopped) -> Generator[ev.Event, None, Finish | None]:
        """Prefill the prompt and commit the target's first token. Yields Prefill and Commit; returns (finish
        reason, message) when stopped during the prefill or when the output already ended, else None."""
        t0 = time.perf_counter()
        logits, feats, why = self._prefill(prompt_ids, run.cache, run.captures, stopped)
        if why:
            return why
        first = run.rule.pick(logits[-1:], [len(prompt_ids)])[0]
        yield ev.Prefill(n_prompt_tokens=len(prompt_ids), ms=(time.perf_counter() - t0) * 1000)
        commit, why = self._recorder.commit(run, 0, [first], [ev.BONUS], [-1.0], [first], logits[-1:], len(prompt_ids))
        yield commit
        run.feed(feats, 0)  # the prompt's features become the proposers' first context
        return (why, "") if why else None

    def _prefill(self, prompt_ids: list[int], cache, capture: bool, stopped: Stopped):
        """The prompt through the target in chunks of `prefill_chunk` tokens, `stopped()` checked before each chunk.

        Returns (logits of the last position [1, V], features [1, T, k*H] or None, None), or (None, None, the
        stop's (reason, message)) when stopped before the last chunk; the request's caches are then dropped.
        """
        logits, feats = None, []
        for i in range(0, len(prompt_ids), self.prefill_chunk):
            why = stopped()  # before the first chunk too: a cancel already set, or a deadline passed, runs nothing
            if why:  # says how far the prompt got: a long one on a slow CPU can spend the whole deadline here
                where = f"while reading the prompt ({i:,} of {len(prompt_ids):,} tokens)" if i else "before reading the prompt"
                return None, None, (why[0], f"{why[1]} {where}")
            ids = torch.tensor([prompt_ids[i : i + self.prefill_chunk]], device=self.target.device)
            logits, f = self.target.forward(ids, cache, last_only=True, capture=capture)
            if f is not None:
                feats.append(f)
        return logits, (torch.cat(feats, 1) if feats else None), None
