"""The event contract (frozen dataclasses of plain types carrying everything the UI draws): grammar,
consistency and JSON round trip of the events of real runs."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from conftest import tiny_draft, tiny_target
from dflash.decode import events as ev
from dflash.decode.engine import Engine
from dflash.decode.request import Request
from dflash.decode.stats import compute_stats
from engine_helpers import FailingTarget, reference_greedy

PROMPT = (2, 7, 1, 8, 2, 8)


@pytest.fixture(scope="module")
def runs():
    """Events of a few real runs: draft with S = 1 and S = 3, sampling, no draft, EOS, cancel."""
    target = tiny_target("llama", seed=8)
    engine = Engine(target, tiny_draft(target, block_size=8))
    free = reference_greedy(target, list(PROMPT), 20)
    eos = next(t for i, t in enumerate(free) if i >= 6 and t not in free[:i])
    eos_target = tiny_target("llama", seed=8, eos=eos)
    eos_engine = Engine(eos_target, tiny_draft(eos_target, block_size=8))
    out = {
        "draft": engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=20, block_size=5)),
        "denoise": engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=20, diffusion_steps=3, confidence_threshold=0.2)),
        "sampled": engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=15, temperature=0.9, seed=5, verify="rejection")),
        "adaptive": engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=20, adaptive="cost", min_block_size=1)),
        "no-draft": engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=10, use_draft=False)),
        "eos": eos_engine.generate(Request(prompt_ids=PROMPT, max_new_tokens=20, block_size=8)),
    }
    cancel = threading.Event()
    events = []
    for e in engine.stream(Request(prompt_ids=PROMPT, max_new_tokens=20, block_size=4), cancel):
        events.append(e)
        if isinstance(e, ev.Commit) and e.block == 1:
            cancel.set()
    out["cancelled"] = events
    failing = FailingTarget(target.model, RuntimeError("boom"), 3)
    out["error"] = Engine(failing, tiny_draft(failing, block_size=8)).generate(Request(prompt_ids=PROMPT, max_new_tokens=20))
    return {k: (v if isinstance(v, list) else v.events) for k, v in out.items()}


def check_grammar(events: list, reason: str) -> None:
    """Started, Prefill, Commit(block 0), then per block BlockSize, DraftStep*, Verify, Commit; one Finished last."""
    assert isinstance(events[0], ev.Started)
    assert isinstance(events[1], ev.Prefill)
    assert isinstance(events[2], ev.Commit) and events[2].block == 0
    assert isinstance(events[-1], ev.Finished) and events[-1].reason == reason
    assert sum(isinstance(e, ev.Finished) for e in events) == 1
    assert sum(isinstance(e, (ev.Started, ev.Prefill)) for e in events) == 2
    body = events[3:-1]
    block, i = 0, 0
    while i < len(body):
        block += 1
        assert isinstance(body[i], ev.BlockSize) and body[i].block == block, (i, body[i])
        size = body[i].size
        i += 1
        steps = 0
        while i < len(body) and isinstance(body[i], ev.DraftStep):
            assert body[i].block == block and body[i].step == steps
            steps += 1
            i += 1
        if i == len(body):  # only an error may cut a block short
            assert reason == "error"
            break
        assert isinstance(body[i], ev.Verify) and body[i].block == block and body[i].block_size == size
        assert steps <= max(1, body[i - 1].n_steps if steps else 1)
        if size > 1 and events[0].has_draft:
            assert steps >= 1
        else:
            assert steps == 0
        assert isinstance(body[i + 1], ev.Commit) and body[i + 1].block == block
        i += 2


@pytest.mark.parametrize("name,reason", [("draft", "length"), ("denoise", "length"), ("sampled", "length"),
                                         ("adaptive", "length"), ("no-draft", "length"), ("eos", "eos"),
                                         ("cancelled", "cancelled"), ("error", "error")])
def test_grammar(runs, name, reason):
    check_grammar(runs[name], reason)


@pytest.mark.parametrize("name", ["draft", "denoise", "sampled", "adaptive", "no-draft", "eos", "cancelled", "error"])
def test_consistency(runs, name):
    events = runs[name]
    fin = events[-1]
    commits = [e for e in events if isinstance(e, ev.Commit)]
    assert [t for c in commits for t in c.token_ids] == fin.output_ids
    assert [c.n_out for c in commits] == [sum(len(x.token_ids) for x in commits[: k + 1]) for k in range(len(commits))]
    assert fin.stats == compute_stats(events[:-1])
    assert fin.stats["n_output_tokens"] == len(fin.output_ids)
    started = events[0]
    assert started.prompt_ids == list(PROMPT) and started.request["prompt_ids"] == list(PROMPT)
    greedy = started.request["temperature"] == 0
    for c in commits:
        assert len(c.token_ids) == len(c.kinds) == len(c.texts) == len(c.confidences) == len(c.target_tokens)
        assert len(c.target_gaps) == (len(c.token_ids) if greedy else 0)  # the target's margins: greedy runs only
        assert all(k in ev.TOKEN_KINDS for k in c.kinds)
    for v in (e for e in events if isinstance(e, ev.Verify)):
        n = v.block_size - 1
        assert len(v.draft_tokens) == len(v.draft_texts) == len(v.accepted) == n
        assert len(v.target_tokens) == len(v.target_texts) == n + 1
        assert v.accepted == [i < v.accepted_len for i in range(n)]
        assert v.next_token == v.target_tokens[v.accepted_len]
        if greedy:
            assert v.draft_tokens[: v.accepted_len] == v.target_tokens[: v.accepted_len]
        c = next(x for x in commits if x.block == v.block)
        full = v.draft_tokens[: v.accepted_len] + [v.next_token]
        assert c.token_ids == full[: len(c.token_ids)], "a commit is the accepted prefix + the target's token"
        if len(c.token_ids) < len(full):  # truncated: only by a stop token or the length limit
            assert fin.reason in ("eos", "stop", "length") and c is commits[-1]
        assert v.draft_ms >= 0 and v.verify_ms > 0
    ts = [c.t_ms for c in commits]
    assert ts == sorted(ts)
    if fin.reason == "eos":
        assert fin.output_ids[-1] not in fin.output_ids[:-1]


def test_draft_steps_describe_the_block(runs):
    for name in ("draft", "denoise", "sampled"):
        events = runs[name]
        for v in (e for e in events if isinstance(e, ev.Verify)):
            steps = [s for s in events if isinstance(s, ev.DraftStep) and s.block == v.block]
            for s in steps:
                assert s.start == v.start
                lengths = {len(s.tokens), len(s.token_texts), len(s.confidences), len(s.masked), len(s.committed)}
                assert lengths == {v.block_size}
            if steps:
                assert steps[-1].tokens[1:] == v.draft_tokens and not any(steps[-1].masked)


@pytest.mark.parametrize("name", ["draft", "denoise", "sampled", "adaptive", "no-draft", "eos", "cancelled", "error"])
def test_json_round_trip(runs, name):
    for event in runs[name]:
        d = ev.event_to_dict(event)
        text = json.dumps(d, allow_nan=False)
        back = ev.event_from_dict(json.loads(text))
        assert back == event
        assert type(back) is type(event) and d["type"] == type(event).__name__


def test_event_types_are_frozen():
    p = ev.Prefill(3, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ms = 2.0  # type: ignore[misc]
    assert set(ev.EVENT_TYPES) == {"Started", "Prefill", "BlockSize", "DraftStep", "Verify", "Commit", "Finished"}
    assert set(ev.FINISH_REASONS) == {"eos", "length", "stop", "cancelled", "timeout", "error"}
