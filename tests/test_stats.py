"""Run statistics from events (τ, acceptance, timings, speedup): a hand-made event stream with known answers."""

from __future__ import annotations

import pytest

from dflash import events as ev
from dflash.stats import compute_stats, speedup


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
    from dflash.stats import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # shorter output: differs where it ends
    assert first_difference([1, 2], [1, 2, 3]) == 2  # longer output too
    assert first_difference([1, 2, 3], [1, 2], cut_short=True) is None  # stopped early: compared on what it made
    assert first_difference([1, 2], [1, 2, 3], cut_short=True) == 2  # cut short cannot excuse extra tokens
