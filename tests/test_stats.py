"""Run statistics from events (τ, acceptance, timings, speedup): a hand-made event stream with known answers."""

from __future__ import annotations

import pytest

from dflash.decode import events as ev
from dflash.decode.stats import compute_stats, speedup


def verify(block: int, size: int, accepted: int, draft_ms: float, verify_ms: float, relaxed: int = 0) -> ev.Verify:
    n = size - 1
    return ev.Verify(block, 10 + block, size, [1] * n, ["a"] * n, [1] * size, ["a"] * size, [i < accepted for i in range(n)],
                     accepted, 1, draft_ms, verify_ms, [True] * relaxed + [False] * (accepted - relaxed))


def commit(block: int, n: int, n_out: int, t_ms: float) -> ev.Commit:
    return ev.Commit(block, [1] * n, [ev.DRAFT] * n, ["a"] * n, "a" * n, n_out, [-1.0] * n, [1] * n, t_ms)


def synthetic(lossy: bool = False) -> list:
    """Prefill at 50 ms, first token at 60 ms; blocks of size 4, 4, 2, 4 accepting 3, 1, 1, 0 drafts."""
    started = ev.Started({}, [1, 2], "", True, 255, 16, lossy)
    plan = [(4, 3, 5.0, 20.0, 0), (4, 1, 4.0, 21.0, 1 if lossy else 0), (2, 1, 2.0, 15.0, 0), (4, 0, 6.0, 22.0, 0)]
    events = [started, ev.Prefill(2, 50.0), commit(0, 1, 1, 60.0)]
    n_out, t = 1, 60.0
    for block, (size, acc, dms, vms, rel) in enumerate(plan, start=1):
        t += dms + vms
        n_out += acc + 1
        events += [ev.BlockSize(block, size, "test"), verify(block, size, acc, dms, vms, rel), commit(block, acc + 1, n_out, t)]
    return events


def test_compute_stats_on_a_synthetic_stream():
    s = compute_stats(synthetic())
    assert s["n_prompt_tokens"] == 2
    assert s["n_output_tokens"] == 1 + 4 + 2 + 2 + 1 == 10
    assert s["n_verify"] == 4
    assert s["acceptance_lengths"] == [4, 2, 2, 1]  # accepted + the target's own token
    assert s["tau"] == pytest.approx(9 / 4)
    assert s["acceptance_histogram"] == {"1": 1, "2": 2, "4": 1}
    assert list(s["acceptance_histogram"]) == ["1", "2", "4"]  # sorted by length
    # Position k: among blocks that drafted >= k tokens, the share that accepted >= k.
    assert s["per_position_acceptance"] == pytest.approx([3 / 4, 1 / 3, 1 / 3])
    assert s["block_sizes"] == [4, 4, 2, 4]
    assert s["prefill_ms"] == 50.0
    assert s["ttft_ms"] == 60.0
    total = 60.0 + 25 + 25 + 17 + 28
    assert s["total_ms"] == pytest.approx(total)
    assert s["decode_ms"] == pytest.approx(total - 60.0)
    assert s["tokens_per_s"] == pytest.approx(9 / ((total - 60.0) / 1000))
    assert s["draft_ms"] == pytest.approx(17.0) and s["verify_ms"] == pytest.approx(78.0)
    assert s["draft_share"] == pytest.approx(17 / 95)
    assert s["lossy"] is False and s["drift_tokens"] == 0


def test_lossy_flag_and_drift():
    s = compute_stats(synthetic(lossy=True))
    assert s["lossy"] is True and s["drift_tokens"] == 1


def test_drift_counts_only_emitted_tokens():
    """Relaxed drafts accepted after an EOS inside the block are cut from the output, so they are no drift."""
    events = synthetic(lossy=True)[:3]
    v = verify(1, 5, 4, 1.0, 2.0)
    v = ev.Verify(**{**v.__dict__, "relaxed": [False, True, True, True]})
    events += [ev.BlockSize(1, 5, "test"), v, commit(1, 3, 4, 70.0)]  # truncated after 3 of 5 tokens (EOS)
    s = compute_stats(events)
    assert s["drift_tokens"] == 2


def test_empty_and_prefill_only_streams():
    s = compute_stats([])
    assert s["tau"] == 0.0 and s["n_output_tokens"] == 0 and s["tokens_per_s"] == 0.0 and s["acceptance_histogram"] == {}
    s = compute_stats(synthetic()[:3])
    assert s["n_output_tokens"] == 1 and s["n_verify"] == 0 and s["tokens_per_s"] == 0.0 and s["draft_share"] == 0.0
    assert s["per_position_acceptance"] == []


def test_no_draft_stream():
    events = [ev.Started({}, [1], "", False, None, None, False), ev.Prefill(1, 5.0), commit(0, 1, 1, 10.0)]
    for b in range(1, 5):
        events += [ev.BlockSize(b, 1, "fixed"), verify(b, 1, 0, 0.0, 10.0), commit(b, 1, b + 1, 10.0 + 10 * b)]
    s = compute_stats(events)
    assert s["tau"] == 1.0 and s["per_position_acceptance"] == [] and s["acceptance_histogram"] == {"1": 4}
    assert s["tokens_per_s"] == pytest.approx(100.0)  # 4 tokens in 40 ms
    assert s["draft_share"] == 0.0


def test_speedup():
    r = speedup([100.0, 200.0, 300.0], [50.0, 100.0, 300.0])
    assert r["speedup"] == pytest.approx(600 / 450)
    assert r["min"] == 1.0 and r["max"] == 2.0 and r["median"] == 2.0
    assert speedup([], []) == {"speedup": 0.0, "min": 0.0, "median": 0.0, "max": 0.0}
    assert speedup([10.0], [0.0])["speedup"] == 0.0  # no division by zero


def test_first_difference_is_the_one_definition_of_identical():
    from dflash.decode.stats import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # shorter output: differs where it ends
    assert first_difference([1, 2], [1, 2, 3]) == 2  # longer output too
    assert first_difference([1, 2, 3], [1, 2], cut_short=True) is None  # stopped early: compared on what it made
    assert first_difference([1, 2], [1, 2, 3], cut_short=True) == 2  # cut short cannot excuse extra tokens


# -- why two greedy outputs differ: numerical tie or error ----------------------------------------------------------
@pytest.fixture
def bf16_bound(monkeypatch):
    """A bfloat16 tie bound of 0.25 (the shipped value is measured by `profile logit-drift`)."""
    from dflash.decode import stats

    monkeypatch.setitem(stats.TIE_BOUND, "bfloat16", 0.25)


def test_identical_outputs_have_no_diagnosis():
    from dflash.decode.stats import diagnose_difference

    assert diagnose_difference([1, 2, 3], [0.5, 0.1, 0.2], [1, 2, 3], [0.5, 0.1, 0.2], "bfloat16") is None
    assert diagnose_difference([1, 2, 3], None, [1, 2], None, "float32", cut_short=True) is None  # as first_difference


def test_a_difference_where_both_gaps_are_within_the_bound_is_a_tie(bf16_bound):
    from dflash.decode.stats import diagnose_difference

    d = diagnose_difference([1, 2, 3, 4], [2.0, 0.03, 1.0, 1.0], [1, 7, 8], [2.0, 0.05, 3.0], "bfloat16")
    assert d == {"position": 1, "ref_token": 2, "run_token": 7, "ref_gap": 0.03, "run_gap": 0.05, "bound": 0.25,
                 "verdict": "tie"}
    at_bound = diagnose_difference([1, 2], [2.0, 0.25], [1, 7], [2.0, 0.25], "bfloat16")
    assert at_bound["verdict"] == "tie"  # "at or below" the bound


@pytest.mark.parametrize("ref_gaps, run_gaps", [
    ([2.0, 0.3], [2.0, 0.05]),  # the reference's margin is above the bound
    ([2.0, 0.05], [2.0, 0.3]),  # the run's margin is above the bound
    (None, [2.0, 0.05]),  # a gap not recorded: nothing shows it is a tie
    ([2.0, 0.05], []),
])
def test_a_difference_with_a_gap_above_the_bound_or_unknown_is_an_error(bf16_bound, ref_gaps, run_gaps):
    from dflash.decode.stats import diagnose_difference

    d = diagnose_difference([1, 2], ref_gaps, [1, 7], run_gaps, "bfloat16")
    assert d["position"] == 1 and d["verdict"] == "error" and d["bound"] == 0.25


def test_float32_stays_strict_and_an_unknown_dtype_has_no_bound(bf16_bound):
    from dflash.decode.stats import TIE_BOUND, diagnose_difference

    assert TIE_BOUND["float32"] == 0.0
    exact_tie = diagnose_difference([1, 2], [2.0, 0.0], [1, 7], [2.0, 0.0], "float32")
    assert exact_tie["verdict"] == "error" and exact_tie["bound"] == 0.0  # float32 identity is strict
    other = diagnose_difference([1, 2], [2.0, 0.01], [1, 7], [2.0, 0.01], "int8")
    assert other["verdict"] == "error" and other["bound"] is None


def test_a_difference_in_length_only_is_an_error(bf16_bound):
    from dflash.decode.stats import diagnose_difference

    longer = diagnose_difference([1, 2], [0.01, 0.01], [1, 2, 3], [0.01, 0.01, 0.01], "bfloat16")
    assert longer == {"position": 2, "ref_token": None, "run_token": 3, "ref_gap": None, "run_gap": 0.01,
                      "bound": 0.25, "verdict": "error"}
    shorter = diagnose_difference([1, 2, 3], [0.01] * 3, [1, 2], [0.01] * 2, "bfloat16")
    assert shorter["position"] == 2 and shorter["run_token"] is None and shorter["verdict"] == "error"


def test_tie_bound_from_a_measured_drift_is_twice_it_rounded_up():
    from dflash.decode.stats import tie_bound_from

    assert tie_bound_from(0.0546875) == 0.11  # 0.109375 → two significant digits, up
    assert tie_bound_from(0.07) == 0.14 and tie_bound_from(0.125) == 0.25 and tie_bound_from(3.0) == 6.0
    assert tie_bound_from(3.4e-05) == 6.8e-05 and tie_bound_from(0.0) == 0.0


def test_output_gaps_come_from_the_commits():
    from dflash.decode.stats import output_gaps

    def gapped(block: int, n: int, gaps: list[float]) -> ev.Commit:
        return ev.Commit(block, [1] * n, [ev.DRAFT] * n, ["a"] * n, "a" * n, n, target_gaps=gaps)

    assert output_gaps([gapped(0, 1, [0.5]), gapped(1, 2, [0.1, 2.0]), gapped(2, 0, [])]) == [0.5, 0.1, 2.0]
    assert output_gaps([gapped(0, 1, [0.5]), gapped(1, 2, [])]) is None  # a sampled run, or an older trace
    assert output_gaps(synthetic()) is None
    assert output_gaps([]) == []


def test_the_bfloat16_tie_bound_is_the_committed_measurement():
    """The constant comes from results/numerics/logit-drift.json (`profile logit-drift`), not from a guess."""
    import json
    from pathlib import Path

    from dflash.decode import stats
    from dflash.decode.stats import tie_bound_from

    rows = json.loads((Path(__file__).parents[1] / "results" / "numerics" / "logit-drift.json").read_text())["result"]
    bf16 = next(r for r in rows if r["dtype"] == "bfloat16")
    assert stats.BFLOAT16_TIE_BOUND == bf16["suggested_bound"] == tie_bound_from(bf16["max_abs_diff"])
    f32 = next(r for r in rows if r["dtype"] == "float32")
    assert f32["n_argmax_differs"] == 0 and stats.TIE_BOUND["float32"] == 0.0  # float32 stays strict
    # int4's measured drift is within bfloat16's bound, which it takes for the hosts not measured
    int4 = json.loads((Path(__file__).parents[1] / "results" / "numerics" / "logit-drift-int4.json").read_text())
    (row,) = int4["result"]
    assert row["dtype"] == "int4" and row["suggested_bound"] <= stats.TIE_BOUND["int4"] == stats.BFLOAT16_TIE_BOUND
