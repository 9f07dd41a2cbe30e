"""The copy-gap diagnostic: the copy candidate of a context, and per-verify rows read from the engine's events."""

import pytest

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.decode.events import Verify
from dflash.decode.request import Request
from dflash.training.copy_gap import block_rows, copy_candidate, copy_gap, copy_match, markdown_table, summarize
from engine_helpers import OracleDrafter, ScriptedDrafter, with_drafter


@pytest.mark.parametrize("tokens, expected", [
    ([1, 2, 3, 1, 2], ("bigram", 3)),
    ([1, 2, 3, 1, 2, 4, 1, 2], ("bigram", 4)),  # the most recent occurrence
    ([5, 2, 9, 2], ("unigram", 9)),  # (9, 2) never occurred before; 2 did, followed by 9
    ([7, 7], ("unigram", 7)),
    ([7, 7, 7], ("bigram", 7)),
    ([1, 2, 3], ("none", None)),
    ([7], ("none", None)),
])
def test_copy_candidate(tokens, expected):
    assert copy_candidate(tokens) == expected
    kind, j = copy_match(tokens)
    assert kind == expected[0] and (j is None) == (expected[1] is None)
    if j is not None:
        assert tokens[j + 1] == expected[1] and tokens[j] == tokens[-1] and j < len(tokens) - 1


class CopyDrafter(ScriptedDrafter):
    """Proposes at each position what copying gives from the known sequence before it (else token 0)."""

    def token_at(self, t: int) -> int:
        return copy_candidate(self.full[:t])[1] or 0


def _engine_and_sequence(prompt, n=40):
    target = tiny_target("llama", seed=5)
    engine = Engine(target, tiny_draft(target, block_size=4))
    out = engine.generate(Request(prompt_ids=prompt, max_new_tokens=n, use_draft=False)).output_ids
    return engine, list(prompt) + out


def test_rows_follow_the_engines_verifies_and_the_anchor():
    prompt = (3, 9, 3, 9, 4, 3, 9)
    engine, seq = _engine_and_sequence(prompt)
    # A drafter proposing the copy candidate of the context up to each anchor (from the script, by absolute
    # position): the rows' candidate must be that proposal, which fails if their context is shifted by one.
    with_drafter(engine, CopyDrafter, seq)
    events = list(engine.stream(Request(prompt_ids=prompt, max_new_tokens=40, adaptive="fixed")))
    rows = block_rows(events)
    verifies = [e for e in events if isinstance(e, Verify)]
    assert len(rows) == len(verifies) > 5
    for row, v in zip(rows, verifies):
        assert row["draft"] == (v.accepted_len >= 1)  # greedy: the first draft is accepted iff it is the target's
        if row["kind"] != "none":
            assert row["candidate"] == v.draft_tokens[0] and row["copy"] == row["draft"]
    assert {r["kind"] for r in rows} >= {"unigram", "none"}


def test_oracle_draft_hits_every_first_position():
    prompt = (11, 12, 13)
    engine, seq = _engine_and_sequence(prompt)
    with_drafter(engine, OracleDrafter, seq)
    res = copy_gap(engine, [prompt], max_new_tokens=40)
    assert res["all"]["draft"] == 1.0 and res["all"]["either"] == 1.0
    assert sum(res[k]["blocks"] for k in ("bigram", "unigram", "none")) == res["all"]["blocks"] > 0


def test_summarize_rates_per_kind():
    rows = [{"kind": "bigram", "draft": False, "copy": True, "accepted": 0},
            {"kind": "bigram", "draft": True, "copy": True, "accepted": 3},
            {"kind": "none", "draft": False, "copy": False, "accepted": 0},
            {"kind": "unigram", "draft": True, "copy": False, "accepted": 1}]
    s = summarize(rows)
    assert s["tau"] == 2.0
    assert s["bigram"] == {"blocks": 2, "share": 0.5, "draft": 0.5, "copy": 1.0, "either": 1.0}
    assert s["all"]["draft"] == 0.5 and s["all"]["either"] == 0.75 and s["none"]["copy"] == 0.0
    assert summarize([])["all"]["blocks"] == 0


def test_markdown_table_has_a_row_per_draft():
    rows = [{"kind": "bigram", "draft": False, "copy": True, "accepted": 0},
            {"kind": "none", "draft": True, "copy": False, "accepted": 2}]
    table = markdown_table([{"label": "a", **summarize(rows)}, {"label": "b", **summarize(rows[:1])}])
    assert len(table) == 4 and table[2].startswith("| a | 2.000 | 2 | (50%) **0.000** / 1.000 |")
    assert table[3].endswith("| **0.000** / 1.000 / 1.000 |")
