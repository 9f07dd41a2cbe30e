"""Chunked prefill: the prompt goes through the target in chunks, with Stop and the deadline checked between them;
the output is the unchunked output, and a stopped prefill leaves the engine ready for the next request."""

from __future__ import annotations

import threading

import pytest
from conftest import tiny_draft, tiny_target
from engine_helpers import reference_greedy

from dflash.decode.engine import PREFILL_CHUNK, Engine
from dflash.decode.events import Commit, Finished, Prefill, Started, Verify
from dflash.decode.request import Request
from dflash.models.target import Target


class CountingTarget(Target):
    """A real target that counts its forward passes (and their lengths) and calls `on_forward(n)` before the n-th."""

    def __init__(self, model):
        super().__init__(model, None, name="counting")
        self.lengths: list[int] = []
        self.on_forward = lambda n: None

    def forward(self, ids, cache, last_only=False, capture=True):
        self.on_forward(len(self.lengths) + 1)
        self.lengths.append(ids.shape[1])
        return super().forward(ids, cache, last_only=last_only, capture=capture)


PROMPT = tuple((7 * i + 3) % 250 for i in range(40))  # 40 tokens: 5 chunks of 8


@pytest.fixture(scope="module")
def target():
    return CountingTarget(tiny_target("llama", seed=4).model)


@pytest.fixture(scope="module")
def expected(target):
    return reference_greedy(target, list(PROMPT), 12)  # transformers' own generate: one unchunked prefill


def run(engine: Engine, chunk: int, **kw) -> list:
    engine.prefill_chunk = chunk
    engine.target.lengths.clear()
    # fixed blocks: the cost policy (the CPU default) sizes blocks by measured time, so its verdicts could differ
    return list(engine.stream(Request(prompt_ids=PROMPT, max_new_tokens=12, adaptive="fixed", **kw)))


@pytest.mark.parametrize("use_draft", [False, True])
def test_chunked_prefill_gives_the_unchunked_output(target, expected, use_draft):
    engine = Engine(target, tiny_draft(target, block_size=4))
    whole = run(engine, 10_000, use_draft=use_draft)
    assert target.lengths[0] == 40
    chunked = run(engine, 8, use_draft=use_draft)
    assert target.lengths[:5] == [8] * 5  # the prompt in 5 forward passes, then the blocks
    for events in (whole, chunked):
        assert events[-1].reason == "length" and events[-1].output_ids == expected
        assert next(e for e in events if isinstance(e, Prefill)).n_prompt_tokens == 40
    # With a draft, the chunks' features are its context: the same proposals and verdicts as after one prefill.
    verdicts = [[(v.draft_tokens, v.accepted_len) for v in events if isinstance(v, Verify)] for events in (whole, chunked)]
    assert verdicts[0] == verdicts[1]


def test_prompts_longer_than_the_chunk_constant():
    model = tiny_target("llama", seed=4).model
    model.config.max_position_embeddings = 2 * PREFILL_CHUNK + 64  # room for a prompt of two and a bit chunks
    target = CountingTarget(model)
    prompt = [(5 * i + 1) % 250 for i in range(2 * PREFILL_CHUNK + 20)]
    fin = list(Engine(target).stream(Request(prompt_ids=tuple(prompt), max_new_tokens=4, use_draft=False)))[-1]
    assert target.lengths[:3] == [PREFILL_CHUNK, PREFILL_CHUNK, 20]
    assert fin.output_ids == reference_greedy(target, prompt, 4)


def during_second_chunk(engine: Engine, action, request: Request, cancel: threading.Event | None = None) -> list:
    """Run `request` with chunks of 8, calling `action()` as the target starts its second forward pass."""
    target = engine.target
    engine.prefill_chunk = 8
    target.lengths.clear()
    target.on_forward = lambda n: action() if n == 2 else None
    try:
        return list(engine.stream(request, cancel))
    finally:
        target.on_forward = lambda n: None


def test_cancel_during_prefill_stops_it_and_the_engine_serves_the_next_request(target, expected):
    engine = Engine(target, tiny_draft(target, block_size=4))
    cancel = threading.Event()
    events = during_second_chunk(engine, cancel.set, Request(prompt_ids=PROMPT, max_new_tokens=12), cancel)
    assert target.lengths == [8, 8], "the prefill must stop at the first chunk boundary after the cancel"
    assert [type(e) for e in events] == [Started, Finished]
    fin = events[-1]
    assert (fin.reason, fin.output_ids, fin.text) == ("cancelled", [], "")
    assert fin.message == f"stopped by the user while reading the prompt (16 of {len(PROMPT)} tokens)"
    assert not engine._lock.locked()
    again = run(engine, 8)
    assert again[-1].reason == "length" and again[-1].output_ids == expected
    assert sum(isinstance(e, Commit) for e in again) > 1


def test_deadline_during_prefill_gives_a_timeout(target, expected):
    engine = Engine(target, tiny_draft(target, block_size=4))
    now = [1000.0]
    engine.clock = lambda: now[0]

    def six_seconds_later():
        now[0] += 6.0

    events = during_second_chunk(engine, six_seconds_later, Request(prompt_ids=PROMPT, max_new_tokens=12, deadline_s=5.0))
    assert target.lengths == [8, 8]
    fin = events[-1]
    assert (fin.reason, fin.output_ids) == ("timeout", [])
    assert fin.message == f"deadline of 5 s reached while reading the prompt (16 of {len(PROMPT)} tokens)"
    events = during_second_chunk(engine, six_seconds_later, Request(prompt_ids=PROMPT, max_new_tokens=12, deadline_s=7.0))
    assert events[-1].reason == "length" and events[-1].output_ids == expected  # 6 s < 7 s: no timeout


def test_a_stop_set_before_the_run_starts_runs_nothing(target, expected):
    """Stop and the deadline are checked before the first chunk too: a cancel already set ran the whole first chunk
    (seconds of a long prompt on a CPU) and committed a token after it."""
    engine = Engine(target, tiny_draft(target, block_size=4))
    cancel = threading.Event()
    cancel.set()
    target.lengths.clear()
    events = list(engine.stream(Request(prompt_ids=PROMPT, max_new_tokens=12), cancel))
    assert [type(e) for e in events] == [Started, Finished] and target.lengths == []
    assert (events[-1].reason, events[-1].message) == ("cancelled", "stopped by the user before reading the prompt")
    assert run(engine, 8)[-1].output_ids == expected
