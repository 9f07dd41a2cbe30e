"""dflash.loading.probe: how the host probe times candidates on a real (tiny) model, scores them and drops the ones that
cannot win; dflash.loading.host (tests/test_host.py) caches what it finds."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch
from conftest import tiny_target

from dflash.loading import probe


def test_the_score_is_expected_ms_per_token_at_the_cheaper_of_a_pair_and_the_block():
    # Forward costs by token count measured on two hosts (AVX2-only AMD EPYC; Intel with AVX-512, no BF16).
    amd = {"float32": {1: 54, 2: 68, 8: 95}, "bfloat16": {1: 36, 2: 47, 8: 141}}
    intel = {"float32": {1: 73, 2: 79, 8: 92}, "bfloat16": {1: 58, 2: 86, 8: 156}}
    assert probe.score_ms(amd["bfloat16"], 8) == pytest.approx(47 / 1.5)  # a pair commits 1 + 0.5 tokens
    assert probe.score_ms(intel["float32"], 8) == pytest.approx(92 / (2 - 0.5 ** 7))  # a block of 8: 1 + … + 0.5^7
    assert probe.score_ms(amd["float32"], 1) == 54  # no draft: the one-token step
    best = {name: min(costs, key=lambda d: probe.score_ms(costs[d], 8)) for name, costs in (("amd", amd), ("intel", intel))}
    assert best == {"amd": "bfloat16", "intel": "float32"}  # what each host's DFlash runs were fastest in


def _tiny_with_context():
    """A real tiny target and a cache of CONTEXT positions for it, as the probe times on."""
    target = tiny_target("llama", seed=0)
    return target, probe._context(target)


def _variants(monkeypatch, scale: dict[str, float], size_scale: dict[int, float] | None = None):
    """Variants of one real tiny target whose forward times are scaled by `scale[name]` (what a bad layout or dtype
    costs on some CPUs) and a forward of n tokens by `size_scale[n]` too, so that the schedule, not the machine,
    decides; and the (variant, tokens) timed, in order."""
    target, cache = _tiny_with_context()
    state, timed = {"variant": None}, []
    real = probe.forward_ms

    def fake(target, cache, n, gen):
        timed.append((state["variant"], n))
        return real(target, cache, n, gen) * scale[state["variant"]] * (size_scale or {}).get(n, 1.0)

    monkeypatch.setattr(probe, "forward_ms", fake)

    def put(name):
        def go():
            state["variant"] = name
            return target, cache
        return go

    return {name: put(name) for name in scale}, timed


def test_a_candidate_that_cannot_win_is_dropped_at_its_first_timing(monkeypatch):
    monkeypatch.setattr(probe, "SLOW_SIZE", math.inf)  # every size timed again, however the tiny forwards compare
    monkeypatch.setattr(probe, "SLOW", 1000.0)  # far beyond a loaded machine's hiccups on a ~1 ms forward
    variants, timed = _variants(monkeypatch, {"fast": 1.0, "slow": 1e6, "close": 1.1})
    out = probe._measure(variants, 4)
    runs = {v: [n for name, n in timed if name == v] for v in variants}
    assert runs["fast"] == [1] + [1, 2, 4] * probe.REPS  # a one-token warm-up, then every timed rep
    assert runs["close"] == [1, 2, 4] * probe.REPS  # could win: timed in full, every rep
    assert runs["slow"] == [1]  # its one-token step alone already scores 10^6x: nothing more is timed
    assert out["slow"]["partial"] and out["slow"]["verify2_ms"] is None and out["slow"]["verify_ms"] is None
    assert out["slow"]["score_ms"] > probe.SLOW * out["fast"]["score_ms"]  # a lower bound, still far behind
    assert "partial" not in out["fast"] and out["fast"]["verify2_ms"] > 0


def test_only_the_verify_that_can_decide_the_score_is_timed_again():
    # Forward ms by token count at 2 threads, one probe on an AVX2-only AMD EPYC: bfloat16's block of 8 costs 2.2x its
    # pair per expected token, float32's about the same as its pair; and a made-up host where the pair is the slow one.
    assert probe.deciding_sizes({1: 104, 2: 170, 8: 505}, 8) == [1, 2]
    assert probe.deciding_sizes({1: 106, 2: 158, 8: 236}, 8) == [1, 2, 8]
    assert probe.deciding_sizes({1: 50, 2: 200, 8: 100}, 8) == [1, 8]
    assert probe.deciding_sizes({1: 50, 2: 500}, 2) == [1, 2]  # a block of 2 is the pair: nothing to choose


def test_fewer_threads_are_not_timed_at_a_block_the_leader_timed_far_behind_its_pair(monkeypatch):
    target, cache = _tiny_with_context()
    sizes, real = [], probe.forward_ms
    monkeypatch.setattr(probe, "forward_ms", lambda t, c, n, g: (sizes.append(n), real(t, c, n, g))[1])
    monkeypatch.setattr(probe, "SLOW", math.inf)  # no thread count dropped mid-timing: every rep times both
    # The AVX2-only EPYC's bfloat16 leader (ms at 2 threads): its block of 8 costs 2.2x its pair per expected token.
    lead = {"dtype": "bfloat16", "threads": 2, "layout": "linear", "step_ms": 104.0, "verify2_ms": 170.0,
            "verify_ms": 505.0, "score_ms": 113.3, "other_layout_score_ms": 166.6}
    rows = probe._thread_rows([lead], lead, (target, cache), 8, [2, 1])
    assert set(sizes) == {1, 2} and len(sizes) == 1 + 2 * 2 * probe.THREAD_REPS  # a warm-up, then step and pair
    assert [r["threads"] for r in rows] == [2, 1] and "partial" not in rows[1]
    assert rows[0]["verify_ms"] == 505.0 and rows[1]["verify_ms"] is None  # the leader keeps its block's timing
    assert all(r["score_ms"] == pytest.approx(r["verify2_ms"] / 1.5, abs=0.01) for r in rows)  # the pair scores
    sizes.clear()  # float32 there: its block costs about its pair per token, so it is timed at every thread count
    probe._thread_rows([lead], {**lead, "verify2_ms": 158.0, "verify_ms": 236.0}, (target, cache), 8, [2, 1])
    assert 8 in sizes


def test_every_dtype_times_on_a_drawn_context_of_its_own_dtype_without_a_prefill(monkeypatch):
    model = tiny_target("llama", seed=0).model
    from dflash.models.target import Target

    forwards, real = [], Target.forward
    monkeypatch.setattr(Target, "forward", lambda self, ids, *a, **k: (forwards.append(ids.shape), real(self, ids, *a, **k))[1])
    prepared = probe._prepared(model, ["float32", "bfloat16"])
    assert forwards == []  # no prefill: a 64-token one cost 0.5-0.6 s of a probe on an AVX2-only CPU
    (t32, c32), (t16, c16) = prepared["float32"], prepared["bfloat16"]
    assert t32.model is model and t16.model is not model and next(t16.model.parameters()).dtype == torch.bfloat16
    assert c32.get_seq_length() == c16.get_seq_length() == probe.CONTEXT
    assert all(layer.keys.dtype == torch.bfloat16 for layer in c16.layers) and len(c16.layers) == t16.num_layers
    assert all(layer.keys.dtype == torch.float32 for layer in c32.layers)
    logits, _ = t16.forward(torch.tensor([[1, 2]]), c16, capture=False)  # the drawn cache serves its target
    assert logits.shape[0] == 2 and torch.isfinite(logits).all() and c16.get_seq_length() == probe.CONTEXT + 2


def test_the_low_precision_copy_is_cast_while_copying_and_keeps_tied_weights():
    model = tiny_target("llama", seed=0).model  # ties the LM head to the embeddings
    copied = probe._copy_in(model, torch.bfloat16)
    assert copied.lm_head.weight is copied.get_input_embeddings().weight  # tied as in the original
    for (name, p), q in zip(model.named_parameters(), copied.parameters(), strict=True):
        assert q.dtype == torch.bfloat16 and torch.equal(q, p.to(torch.bfloat16)), name
        assert q.data_ptr() != p.data_ptr()
    assert next(model.parameters()).dtype == torch.float32  # the original is untouched


def test_a_dtypes_row_takes_the_layout_timed_in_full_over_one_dropped_early():
    full = {"step_ms": 60.0, "verify2_ms": 90.0, "verify_ms": 150.0, "score_ms": 75.4}
    dropped = {"step_ms": 150.0, "verify2_ms": None, "verify_ms": None, "score_ms": 75.2, "partial": True}  # ≥ 75.2
    rows = probe._rows({("float32", "linear"): full, ("float32", "transposed"): dropped}, ["float32"], 2)
    assert rows == [{"dtype": "float32", "threads": 2, "layout": "linear", **full, "other_layout_score_ms": 75.2}]


def test_a_draft_engines_near_tie_goes_to_the_faster_one_token_step():
    # One probe of an AVX2-only EPYC (ms at 2 threads): float32 scored 8 % ahead on its pair, while bfloat16's step was
    # 1.2x faster, and generation there ran DFlash 1.16x and `ar` 1.3x faster in bfloat16.
    f32 = {"dtype": "float32", "threads": 2, "step_ms": 86.0, "verify2_ms": 110.5, "verify_ms": 163.0, "score_ms": 73.66}
    bf16 = {"dtype": "bfloat16", "threads": 2, "step_ms": 70.0, "verify2_ms": 119.4, "verify_ms": 284.0, "score_ms": 79.63}
    assert probe.choose([f32, bf16], 8) is bf16
    assert probe.choose([f32, {**bf16, "score_ms": 73.66 * (1 + probe.CLOSE) + 0.1}], 8) is f32  # beyond CLOSE: the score
    assert probe.choose([f32, {**bf16, "score_ms": 73.0}], 1) is not f32  # no draft: the score is the step itself
    dropped = {**bf16, "step_ms": 1.0, "score_ms": 74.0, "partial": True}  # a lower bound: never a tie's winner
    assert probe.choose([f32, dropped], 8) is f32


def test_a_lone_candidate_left_is_not_timed_again(monkeypatch):
    variants, timed = _variants(monkeypatch, {"fast": 1.0, "slow": 1e6})  # far behind whatever the machine's noise
    out = probe._measure(variants, 4)
    runs = {v: [n for name, n in timed if name == v] for v in variants}
    assert runs == {"fast": [1, 1, 2, 4], "slow": [1]}  # its warm-up and one rep: nothing is left to compare it with
    assert "partial" not in out["fast"] and out["slow"]["partial"]
    timed.clear()  # after the probe's own warm-up: no warm-up forward
    probe._measure(variants, 4, warm=False)
    assert [n for name, n in timed if name == "fast"] == [1, 2, 4]


def test_the_most_threads_row_keeps_its_fastest_timings_when_fewer_threads_fall_far_behind(monkeypatch):
    target, cache = _tiny_with_context()
    real, sizes = probe.forward_ms, []

    def slow_alone(t, c, n, g):  # one thread: 10^6x slower, far behind at its first timing whatever the noise
        sizes.append((torch.get_num_threads(), n))
        return real(t, c, n, g) * (1e6 if torch.get_num_threads() == 1 else 1.0)

    monkeypatch.setattr(probe, "forward_ms", slow_alone)
    lead = {"dtype": "float32", "threads": 2, "layout": "linear", "step_ms": 0.05, "verify2_ms": 0.06,
            "verify_ms": 0.07, "score_ms": 0.04, "other_layout_score_ms": 0.05}  # faster than any real forward
    rows = probe._thread_rows([lead], lead, (target, cache), 8, [2, 1])
    assert sizes == [(2, 1), (2, 1), (2, 2), (2, 8), (1, 1)]  # a warm-up, one rep at 2, one step at 1: decided
    assert {k: rows[0][k] for k in ("step_ms", "verify2_ms", "verify_ms")} == {"step_ms": 0.05, "verify2_ms": 0.06,
                                                                               "verify_ms": 0.07}
    assert rows[1]["threads"] == 1 and rows[1]["partial"] and probe.choose(rows, 8) is rows[0]


def test_an_untimed_block_is_bounded_by_the_largest_size_timed_below_it():
    # bfloat16 in the transposed layout on an AVX2-only EPYC (ms): once its pair is timed, the block's bound is the
    # pair's cost, which already puts it far behind a leader at ~65 ms per token, so its 1.5 s block is not timed.
    e8 = 2 - 0.5 ** 7  # tokens a block of 8 commits at the prior acceptance
    assert probe.lower_bound({1: 223.0}, [1, 2, 8], 8) == pytest.approx(223 / e8)
    assert probe.lower_bound({1: 223.0, 2: 418.0}, [1, 2, 8], 8) == pytest.approx(418 / e8)  # was 223 / e8
    assert probe.lower_bound({1: 223.0, 2: 418.0}, [1, 2, 8], 8) > probe.SLOW * 65
    assert probe.lower_bound({1: 50.0, 8: 90.0}, [1, 2, 8], 8) == pytest.approx(50 / 1.5)  # the pair: the step below it


def test_the_warm_up_runs_until_every_dtypes_steps_are_steady(monkeypatch):
    """Right after a load a step ran up to 2x slower than a second later (48 → 24 ms over 25 steps, bfloat16 on an
    AVX512_BF16 EPYC), so the first candidate timed looked slow; where the step is fast from the first forward (an
    AVX2-only EPYC: float32 75, 74, 76, 74 ms) a full second of warm-up was a fifth of the probe."""
    prepared = probe._prepared(tiny_target("llama", seed=0).model, ["float32", "bfloat16"])
    series = {torch.float32: iter([90.0, 75, 74, 76, 74] + [75.0] * 100),
              torch.bfloat16: iter([48.0 - i for i in range(25)] + [24.0] * 100)}  # still speeding up for 25 forwards
    monkeypatch.setattr(probe, "forward_ms", lambda target, cache, n, gen: next(series[target.dtype]))
    assert probe._warm_up(prepared, 60.0, 1000, least=0) == 2 * (25 + probe.STEADY)  # until bfloat16 has settled too
    series[torch.float32], series[torch.bfloat16] = iter([75.0] * 100), iter([50.0] * 100)
    assert probe._warm_up(prepared, 60.0, 1000, least=0) == 2 * (1 + probe.STEADY)  # steady from the first forward
    series[torch.float32], series[torch.bfloat16] = itertools.repeat(75.0), itertools.repeat(50.0)
    t0 = time.perf_counter()
    assert probe._warm_up(prepared, 60.0, 10**9, least=0.05) > 2 * (1 + probe.STEADY)  # but never under `least`
    assert time.perf_counter() - t0 >= 0.05


def test_steady_means_no_new_best_beyond_noise():
    assert not probe.steady([75.0, 74.0, 76.0])  # too few to tell
    assert probe.steady([75.0, 74.0, 76.0, 74.0])
    assert probe.steady([90.0, 75.0, 74.0, 76.0, 74.0])  # a slow first forward, then settled
    assert not probe.steady([48.0, 47.0, 46.0, 45.0, 44.0])  # each forward a new best
    assert not probe.steady([75.0, 74.0, 76.0, 70.0])  # a new best by more than STEADY_GAIN


def test_the_warm_up_also_ends_at_its_forwards_or_its_seconds(monkeypatch):
    prepared = probe._prepared(tiny_target("llama", seed=0).model, ["float32", "bfloat16"])
    faster = (1000.0 * 0.9 ** i for i in itertools.count())  # never settles: 10 % faster at every forward
    monkeypatch.setattr(probe, "forward_ms", lambda target, cache, n, gen: (time.sleep(0.001), next(faster))[1])
    assert probe._warm_up(prepared, 60.0, forwards=6) == 6  # the count ends it (checked after each pair)
    t0 = time.perf_counter()
    assert 0 < probe._warm_up(prepared, 0.5, forwards=10**9) and 0.5 <= time.perf_counter() - t0 < 30  # or the clock


def _scripted_layer_ms(monkeypatch, ratios: dict):
    """`probe._fastest_ms` run for real, but reporting 1 ms for the layer as it is and `ratios[(dtype, rows)]` ms
    for its other layout: which layout a CPU makes slow is what the gate decides on, not this machine's timings."""
    real = probe._fastest_ms

    def scripted(ways, inputs, reps):
        if set(ways) != set(probe.LAYOUTS):  # another product timed the same way (`matmul_ms`): as measured
            return real(ways, inputs, reps)
        real(ways, inputs, reps)
        dtype = next(next(iter(ways.values())).parameters()).dtype
        first = next(iter(ways))
        return {(way, n): 1.0 if way == first else ratios[(dtype, n)] for way in ways for n in inputs}

    monkeypatch.setattr(probe, "_fastest_ms", scripted)


def test_a_layout_far_behind_at_one_layers_products_is_neither_built_nor_timed(monkeypatch):
    # bfloat16's transposed products on an AVX2-only EPYC: 4.7x the linear one at one row, 8.5x at 8 rows
    _scripted_layer_ms(monkeypatch, {(torch.float32, 1): 1.1, (torch.float32, 4): 0.9,
                                     (torch.bfloat16, 1): 4.7, (torch.bfloat16, 4): 8.5})
    timed, real = [], probe.forward_ms
    monkeypatch.setattr(probe, "forward_ms", lambda t, c, n, g: (timed.append((t.dtype, t.layout)), real(t, c, n, g))[1])
    model = tiny_target("llama", seed=0).model
    out = probe.probe(model, 4, ["float32", "bfloat16"], [1])
    assert (torch.bfloat16, "transposed") not in timed and (torch.float32, "transposed") in timed
    rows = {r["dtype"]: r for r in out["candidates"]}
    assert rows["bfloat16"]["layout"] == "linear" and rows["bfloat16"]["other_layout_score_ms"] is None
    assert rows["float32"]["other_layout_score_ms"] is not None
    assert out["layout_ms"]["bfloat16"] == {"linear": {"1": 1.0, "4": 1.0}, "transposed": {"1": 4.7, "4": 8.5}}


def test_a_layout_behind_at_one_row_but_not_at_the_blocks_rows_is_timed_whole(monkeypatch):
    layers = tiny_target("llama", seed=0).model.model.layers
    _scripted_layer_ms(monkeypatch, {(torch.float32, 1): 3.0, (torch.float32, 8): 1.5})
    assert probe.layouts_worth_timing(layers, 8)[0] == ["linear", "transposed"]
    _scripted_layer_ms(monkeypatch, {(torch.float32, 1): 0.4, (torch.float32, 8): 0.3})  # the layer's own: behind
    assert probe.layouts_worth_timing(layers, 8)[0] == ["transposed"]


def test_the_layout_test_times_one_layer_in_both_layouts_and_leaves_the_model_as_it_was():
    layers = tiny_target("llama", seed=0).model.model.layers
    before = [m for m in layers.modules()]
    worth, ms = probe.layouts_worth_timing(layers, 8)
    assert set(worth) <= {"linear", "transposed"} and worth
    assert set(ms) == {"linear", "transposed"} and all(set(v) == {"1", "8"} and min(v.values()) > 0 for v in ms.values())
    assert [m for m in layers.modules()] == before
