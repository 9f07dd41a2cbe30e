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
        assert r["step_ms"] > 0 and r["verify2_ms"] > 0 and r["verify_ms"] > 0
        assert r["score_ms"] == pytest.approx(host.score_ms({1: r["step_ms"], 2: r["verify2_ms"], 4: r["verify_ms"]}, 4),
                                              abs=0.02)
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


def test_a_candidate_twice_as_slow_as_the_leader_is_timed_once(monkeypatch):
    """Real forwards of a tiny target; the "slow" variant's times are scaled up 50× (what a bad layout costs on
    some CPUs) so that the schedule, not the machine, decides: after its first timed rep it is dropped."""
    target = tiny_target("llama", seed=0)
    cache = target.new_cache()
    target.forward(torch.arange(host.CONTEXT)[None] % target.vocab_size, cache, last_only=True, capture=False)
    state, puts = {"variant": None}, {"fast": 0, "slow": 0}
    real = host.forward_ms
    monkeypatch.setattr(host, "forward_ms", lambda *a: real(*a) * (50.0 if state["variant"] == "slow" else 1.0))

    def put(name):
        def go():
            puts[name] += 1
            state["variant"] = name
        return go

    out = host._measure(target, cache, 4, {"fast": put("fast"), "slow": put("slow")})
    assert puts == {"fast": 1 + host.REPS, "slow": 1}  # warm-up + every timed rep / its first timed rep only
    assert out["slow"]["score_ms"] > host.SLOW * out["fast"]["score_ms"] and out["fast"]["verify2_ms"] > 0


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
