"""dflash.host: the CPU settings probe on a real (tiny) model, its per-machine cache, and what the caller fixes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_target

from dflash import host
from dflash.errors import ValidationError
from dflash.packed import layout_of


def test_thread_candidates_are_one_half_and_all_cores():
    assert host.thread_candidates(1) == [1]
    assert host.thread_candidates(2) == [1, 2]
    assert host.thread_candidates(16) == [1, 8, 16]


def test_the_probe_times_every_candidate_and_keeps_the_fastest(tmp_path):
    model = tiny_target("llama", seed=0).model
    before = torch.get_num_threads()
    s = host.choose(model, "tiny", 4, tmp_path / "settings.json", threads=None)
    assert s.source == "probe" and s.block == 4 and 0 < s.probe_s < 60
    most, lead = max(host.thread_candidates()), s.candidates[:2]
    assert [(r["dtype"], r["threads"]) for r in lead] == [("float32", most), ("bfloat16", most)]
    leader = min(lead, key=lambda r: r["score_ms"])  # fewer threads are probed for the leading dtype only
    assert [(r["dtype"], r["threads"], r["layout"]) for r in s.candidates[2:]] == [
        (leader["dtype"], n, leader["layout"]) for n in sorted(host.thread_candidates(), reverse=True)[1:]]
    best = min(s.candidates, key=lambda r: r["score_ms"])
    assert (s.dtype, s.threads, s.layout) == (best["dtype"], best["threads"], best["layout"])
    for r in s.candidates:
        ms = {n: r[k] for n, k in ((1, "step_ms"), (2, "verify2_ms"), (4, "verify_ms")) if r[k] is not None}
        assert all(v > 0 for v in ms.values()) and r.get("partial", False) == (len(ms) < 3)
        assert r["score_ms"] == pytest.approx(host.lower_bound(ms, [1, 2, 4], 4), abs=0.02)
    assert not best.get("partial")
    assert torch.get_num_threads() == before  # the probe leaves the process as it found it …
    assert next(model.parameters()).dtype == torch.float32  # … and the model in float32 (bfloat16 ran on a copy)
    float32_layout = next(r["layout"] for r in s.candidates if r["dtype"] == "float32")
    assert layout_of(model.model.layers) == float32_layout
    assert s.exact == (s.dtype == "float32") and s.to_dict()["mode"] in ("exact", "fast")


def test_the_score_is_expected_ms_per_token_at_the_cheaper_of_a_pair_and_the_block():
    # Forward costs by token count measured on two hosts (AVX2-only AMD EPYC; Intel with AVX-512, no BF16).
    amd = {"float32": {1: 54, 2: 68, 8: 95}, "bfloat16": {1: 36, 2: 47, 8: 141}}
    intel = {"float32": {1: 73, 2: 79, 8: 92}, "bfloat16": {1: 58, 2: 86, 8: 156}}
    assert host.score_ms(amd["bfloat16"], 8) == pytest.approx(47 / 1.5)  # a pair commits 1 + 0.5 tokens
    assert host.score_ms(intel["float32"], 8) == pytest.approx(92 / (2 - 0.5 ** 7))  # a block of 8: 1 + … + 0.5^7
    assert host.score_ms(amd["float32"], 1) == 54  # no draft: the one-token step
    best = {name: min(costs, key=lambda d: host.score_ms(costs[d], 8)) for name, costs in (("amd", amd), ("intel", intel))}
    assert best == {"amd": "bfloat16", "intel": "float32"}  # what each host's DFlash runs were fastest in


def _variants(monkeypatch, scale: dict[str, float]):
    """Variants of one real tiny target whose forward times are scaled by `scale[name]` (what a bad layout or dtype
    costs on some CPUs), so that the schedule, not the machine, decides; and the (variant, tokens) timed, in order."""
    target = tiny_target("llama", seed=0)
    cache = target.new_cache()
    target.forward(torch.arange(host.CONTEXT)[None] % target.vocab_size, cache, last_only=True, capture=False)
    state, timed = {"variant": None}, []
    real = host.forward_ms

    def fake(target, cache, n, gen):
        timed.append((state["variant"], n))
        return real(target, cache, n, gen) * scale[state["variant"]]

    monkeypatch.setattr(host, "forward_ms", fake)

    def put(name):
        def go():
            state["variant"] = name
            return target, cache
        return go

    return {name: put(name) for name in scale}, timed


def test_a_candidate_that_cannot_win_is_dropped_at_its_first_timing(monkeypatch):
    variants, timed = _variants(monkeypatch, {"fast": 1.0, "slow": 50.0, "close": 1.1})
    out = host._measure(variants, 4)
    runs = {v: [n for name, n in timed if name == v] for v in variants}
    assert runs["fast"] == [1, 2, 4] * (1 + host.REPS)  # warm-up + every timed rep
    assert runs["close"] == [1, 2, 4] * host.REPS  # could win: timed in full, every rep
    assert runs["slow"] == [1]  # its one-token step alone already scores 50x: nothing more is timed
    assert out["slow"]["partial"] and out["slow"]["verify2_ms"] is None and out["slow"]["verify_ms"] is None
    assert out["slow"]["score_ms"] > host.SLOW * out["fast"]["score_ms"]  # a lower bound, still far behind
    assert "partial" not in out["fast"] and out["fast"]["verify2_ms"] > 0


def test_a_leader_timed_before_bounds_a_later_candidate(monkeypatch):
    variants, timed = _variants(monkeypatch, {"one thread": 50.0})
    out = host._measure(variants, 4, bound=1e-3)  # a leader scoring 1 µs: nothing real comes close
    assert [n for _, n in timed] == [1, 2, 4, 1] and out["one thread"]["partial"]  # warm-up, then one step
    variants, timed = _variants(monkeypatch, {"one thread": 1.0})
    assert "partial" not in host._measure(variants, 4, bound=1e9)["one thread"] and len(timed) == 3 * (1 + host.REPS)


def test_other_dtypes_time_on_a_context_cast_from_float32():
    model = tiny_target("llama", seed=0).model
    prepared = host._prepared(model, ["float32", "bfloat16"])
    (t32, c32), (t16, c16) = prepared["float32"], prepared["bfloat16"]
    assert t32.model is model and t16.model is not model and next(t16.model.parameters()).dtype == torch.bfloat16
    assert c32.get_seq_length() == c16.get_seq_length() == host.CONTEXT
    assert all(layer.keys.dtype == torch.bfloat16 for layer in c16.layers)
    torch.testing.assert_close(c16.layers[0].keys.float(), c32.layers[0].keys, rtol=1e-2, atol=1e-2)
    logits, _ = t16.forward(torch.tensor([[1, 2]]), c16, capture=False)  # the cast cache serves its target
    assert logits.shape[0] == 2 and c16.get_seq_length() == host.CONTEXT + 2


def test_a_second_start_reads_the_cached_choice(tmp_path):
    model = tiny_target("llama", seed=0).model
    path = tmp_path / "settings.json"
    first = host.choose(model, "tiny", 4, path)
    again = host.choose(model, "tiny", 4, path)
    assert again.source == "cache" and (again.dtype, again.threads, again.layout) == (first.dtype, first.threads, first.layout)
    assert again.candidates == first.candidates and again.machine == host.machine_key()
    other = host.choose(model, "tiny", 2, path)  # another block size is another measurement
    assert other.source == "probe" and len(json.loads(path.read_text())) == 2


def test_what_the_caller_fixes_is_not_probed_over(tmp_path):
    model = tiny_target("llama", seed=0).model
    s = host.choose(model, "tiny", 4, tmp_path / "s.json", dtype="float32", threads=1)
    assert (s.dtype, s.threads) == ("float32", 1) and [(r["dtype"], r["threads"]) for r in s.candidates] == [("float32", 1)]
    assert s.layout in ("linear", "transposed") and "other_layout_score_ms" in s.candidates[0]


def test_a_broken_cache_file_means_a_new_probe_not_a_failed_start(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    s = host.choose(tiny_target("llama").model, "tiny", 4, path, dtype="float32", threads=1)
    assert s.source == "probe" and json.loads(path.read_text())  # rewritten whole


def test_no_probe_when_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_PROBE", "0")
    s = host.choose(tiny_target("llama").model, "tiny", 4, tmp_path / "s.json")
    assert (s.source, s.dtype, s.layout, s.candidates) == ("default", "float32", "linear", [])
    assert not (tmp_path / "s.json").exists()


def test_refresh_probes_again_and_replaces_the_cached_choice(tmp_path, monkeypatch):
    model, path = tiny_target("llama", seed=0).model, tmp_path / "settings.json"
    host.choose(model, "tiny", 4, path, dtype="float32", threads=1)
    (key, entry), = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: {**entry, "probe_s": -1.0}}))  # marks the cached entry
    assert host.choose(model, "tiny", 4, path, dtype="float32", threads=1).probe_s == -1.0
    monkeypatch.setenv("DFLASH_PROBE", "refresh")
    fresh = host.choose(model, "tiny", 4, path, dtype="float32", threads=1)
    assert fresh.source == "probe" and fresh.probe_s > 0
    assert json.loads(path.read_text())[key]["probe_s"] == fresh.probe_s  # the new measurement is cached


@pytest.mark.parametrize("raw", ["yes", "2", "Refresh "])
def test_a_bad_dflash_probe_names_the_variable(tmp_path, monkeypatch, raw):
    monkeypatch.setenv("DFLASH_PROBE", raw)
    with pytest.raises(ValidationError, match="DFLASH_PROBE"):
        host.choose(tiny_target("llama").model, "tiny", 4, tmp_path / "s.json")


@pytest.mark.parametrize("raw", ["abc", "0", "-2", "1.5"])
def test_a_bad_dflash_threads_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("DFLASH_THREADS", raw)
    with pytest.raises(ValidationError, match="DFLASH_THREADS"):
        host.env_threads()


def test_dflash_threads_fixes_the_thread_count(monkeypatch):
    monkeypatch.setenv("DFLASH_THREADS", "3")
    assert host.env_threads() == 3
    monkeypatch.delenv("DFLASH_THREADS")
    assert host.env_threads() is None


def test_the_summary_says_the_mode_and_the_probes_numbers():
    rows = [{"dtype": "bfloat16", "threads": 2, "layout": "linear", "step_ms": 39.4, "verify_ms": 48.2, "score_ms": 87.6}]
    fast = host.HostSettings("bfloat16", 2, "linear", "cache", block=8, probe_s=3.2, candidates=rows)
    assert "fast mode: identical except at numerical ties" in fast.summary() and not fast.exact
    assert fast.numbers() == "1-token step 39 ms, 8-token verify 48 ms (probe cached)"
    exact = host.HostSettings("float32", 1, "transposed", "probe", probe_s=2.5)
    assert exact.summary().startswith("float32 · 1 thread · transposed layout (exact; probed in 2.5 s)")


def test_prefills_run_in_float32_matmuls_where_the_probe_measured_that_it_pays(tmp_path):
    assert host.float32_rows({"rows": 64, "native": 8.2, "float32": 2.3}) == host.FLOAT32_ROWS  # AVX2-only EPYC
    assert host.float32_rows({"rows": 64, "native": 2.0, "float32": 1.9}) == 0  # not clearly faster: stay native
    assert host.float32_rows({}) == 0  # float32 chosen: nothing measured
    model = tiny_target("llama", seed=0).model
    s = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="bfloat16")
    assert s.matmul_ms["rows"] == host.MATMUL_ROWS and s.matmul_ms["native"] > 0 and s.matmul_ms["float32"] > 0
    assert s.float32_from_rows == host.float32_rows(s.matmul_ms)
    assert ("prompts in float32 matmuls" in s.summary()) == bool(s.float32_from_rows)
    again = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="bfloat16")
    assert again.source == "cache" and (again.float32_from_rows, again.matmul_ms) == (s.float32_from_rows, s.matmul_ms)
    s32 = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="float32")
    assert s32.matmul_ms == {} and s32.float32_from_rows == 0


def test_a_dtypes_row_takes_the_layout_timed_in_full_over_one_dropped_early():
    full = {"step_ms": 60.0, "verify2_ms": 90.0, "verify_ms": 150.0, "score_ms": 75.4}
    dropped = {"step_ms": 150.0, "verify2_ms": None, "verify_ms": None, "score_ms": 75.2, "partial": True}  # ≥ 75.2
    rows = host._rows({("float32", "linear"): full, ("float32", "transposed"): dropped}, ["float32"], 2)
    assert rows == [{"dtype": "float32", "threads": 2, "layout": "linear", **full, "other_layout_score_ms": 75.2}]
