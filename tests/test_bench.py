"""The benchmark harness end to end on tiny random models (all four methods, a 2-prompt JSONL set), its
summaries on synthetic records, the statistics it relies on (synthetic event streams), and the transformers
baselines."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.decode import events as ev
from dflash.bench import report
from dflash.bench.baselines import hf_generate
from dflash.bench.runner import BenchConfig, compare
from dflash.cli import main
from dflash.models.draft import save_draft
from dflash.decode.engine import Engine
from dflash.errors import ValidationError
from dflash.decode.request import Request
from dflash.decode.stats import compute_stats, output_gaps, speedup

torch.set_num_threads(1)  # shared 2-core machine: OpenMP spin-waiting makes 2 threads far slower for tiny models

PROMPTS = [[5, 17, 33, 4, 90, 61], [7, 8, 9, 10, 11, 12, 7, 8, 9, 10]]
N_NEW = 16


def _eos_for(target, prompt: list[int]) -> int:
    """A token the greedy continuation of `prompt` emits for the first time at output position >= 4, so that
    prompt 0 ends on EOS (prompt 1 may or may not) and EOS handling is exercised."""
    out = Engine(target).generate(Request(prompt_ids=tuple(prompt), max_new_tokens=12, use_draft=False)).output_ids
    return next(t for i, t in enumerate(out) if i >= 4 and t not in out[:i])


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """The bench collects garbage before every run it measures (`bench.machine.trim_memory`): in a test process, a pass
    over all that earlier tests left alive, 0.14 s alone and more in a long pytest-xdist worker, 20 times for the
    end-to-end bench. Frozen, those objects are skipped, while the runs' own garbage is still collected, as in the
    CLI's own process."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    target = tiny_target("llama")
    eos = _eos_for(target, PROMPTS[0])
    target.model.config.eos_token_id = eos
    target.model.generation_config.eos_token_id = eos
    target.model.save_pretrained(d / "target")
    save_draft(tiny_draft(target, block_size=6), d / "draft")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in PROMPTS))
    return d, eos


def _args(d, out, *extra):
    return ["bench", "--target", str(d / "target"), "--draft", str(d / "draft"), "--prompts", str(d / "prompts.jsonl"),
            "--max-new-tokens", str(N_NEW), "--output", str(out), "--no-progress", "--threads", "1", *extra]


@pytest.fixture(scope="module")
def bench_result(bench_dir):
    d, eos = bench_dir
    out = d / "result.json"
    assert main(_args(d, out, "--repeats", "2", "--prompt-lookup-num-tokens", "4")) == 0
    return json.loads(out.read_text()), out, eos


RUN_KEYS = {"repeat": int, "finish_reason": str, "message": str, "n_output_tokens": int, "ttft_ms": float,
            "decode_ms": float, "total_ms": float, "decode_tokens": int, "ms_per_token": float, "tokens_per_s": float,
            "rss_before_mb": float, "rss_peak_mb": float, "stats": dict}


def check_schema(r: dict) -> None:
    """The schema documented in docs/bench.md."""
    assert r["schema"] == "dflash-bench/1"
    for key in ("command", "started_at", "finished_at", "complete", "machine", "models", "config", "prompts",
                "summary", "differences"):
        assert key in r, key
    for key in ("cpu_model", "logical_cores", "torch", "transformers", "torch_threads", "load_average", "device"):
        assert key in r["machine"], key
    for key in ("target", "device", "dtype", "trained_block_size"):
        assert key in r["models"], key
    cfg = r["config"]
    for key in ("prompts", "n_prompts", "methods", "baseline", "greedy", "repeats", "request", "prompt_lookup_num_tokens"):
        assert key in cfg, key
    assert len(r["prompts"]) == cfg["n_prompts"]
    for p in r["prompts"]:
        assert set(p) >= {"index", "text", "n_prompt_tokens", "prompt_ids", "methods"}
        assert list(p["methods"]) == cfg["methods"]
        for m, rec in p["methods"].items():
            assert set(rec) >= {"output_ids", "text", "finish_reason", "repeats_agree", "identical", "first_diff",
                                "same_length", "diagnosis", "runs"}
            assert len(rec["runs"]) == cfg["repeats"]
            for run in rec["runs"]:
                for key, typ in RUN_KEYS.items():
                    assert isinstance(run[key], typ), (m, key, run[key])
                assert run["ttft_ms"] <= run["total_ms"] and run["decode_ms"] >= 0
                assert run["rss_peak_mb"] >= run["rss_before_mb"] > 0
    for m in cfg["methods"]:
        s = r["summary"][m]
        for key in ("n_prompts", "decode_tokens", "decode_s", "tokens_per_s", "ttft_ms_median", "tau", "rss_peak_mb",
                    "rss_increase_mb", "identical", "speedup"):
            assert key in s, (m, key)
        if m != cfg["baseline"]:
            assert set(s["speedup"]) >= {"decode", "by_repeat", "repeat_min", "repeat_max", "per_token", "end_to_end"}
            assert len(s["speedup"]["by_repeat"]) == cfg["repeats"]


def test_dflash_lookup_copies_where_the_context_repeats_and_dflash_never_does(bench_dir, tmp_path):
    """A prompt holding every token id: with --lookup-ngram 1 every anchor occurred before, so dflash-lookup copies
    its blocks (and stays identical to ar); dflash, in the same run, drafts every block."""
    d, _ = bench_dir
    prompts, out = tmp_path / "every-token.jsonl", tmp_path / "r.json"
    prompts.write_text(json.dumps({"prompt_ids": list(range(256))}) + "\n")
    assert main(_args(d, out, "--prompts", str(prompts), "--methods", "ar,dflash,dflash-lookup", "--lookup-ngram", "1",
                      "--no-warmup")) == 0
    r = json.loads(out.read_text())
    runs = {m: r["prompts"][0]["methods"][m] for m in ("dflash", "dflash-lookup")}
    assert runs["dflash-lookup"]["runs"][0]["stats"]["copy_blocks"] > 0 == runs["dflash"]["runs"][0]["stats"]["copy_blocks"]
    assert r["summary"]["dflash-lookup"]["copy_share"] == 1.0 and r["summary"]["dflash"]["copy_share"] == 0.0
    assert runs["dflash-lookup"]["identical"] and runs["dflash"]["identical"] and r["differences"] == []
    assert r["config"]["lookup_ngram"] == 1 and "lookup_ngram" not in r["config"]["request"]  # ar and dflash never copy
    assert "--lookup-ngram 1" in r["command"]


def test_end_to_end_schema_identity_and_speedup(bench_result):
    r, out, eos = bench_result
    check_schema(r)
    assert r["complete"] and r["config"]["methods"] == ["ar", "dflash", "dflash-lookup", "hf-generate", "hf-prompt-lookup"]
    assert r["config"]["greedy"] and r["models"]["trained_block_size"] == 6
    # Greedy: every method's output equals ar's, on every prompt and repeat; prompt 0 stops on EOS everywhere.
    assert r["differences"] == []
    for p in r["prompts"]:
        ar = p["methods"]["ar"]["output_ids"]
        for m, rec in p["methods"].items():
            assert rec["output_ids"] == ar and rec["repeats_agree"], m
            assert rec["identical"] is (None if m == "ar" else True) and rec["diagnosis"] is None
    first = r["prompts"][0]["methods"]
    for m, rec in first.items():
        assert rec["finish_reason"] == "eos" and rec["output_ids"][-1] == eos, m
    assert all(s["identical"] is None or s["identical"]["n_identical"] == 2 for s in r["summary"].values())
    assert r["summary"]["dflash"]["identical"]["n_ties"] == r["summary"]["dflash"]["identical"]["n_errors"] == 0
    # Speedup is computed from the recorded times: sum of per-prompt medians over repeats, baseline / method.
    for m in ("dflash", "hf-generate", "hf-prompt-lookup"):
        med = {k: [sorted(run["decode_ms"] for run in p["methods"][k]["runs"]) for p in r["prompts"]] for k in ("ar", m)}
        base = sum((v[0] + v[1]) / 2 for v in med["ar"])
        mine = sum((v[0] + v[1]) / 2 for v in med[m])
        assert r["summary"][m]["speedup"]["decode"]["speedup"] == pytest.approx(base / mine)
        rep0 = sum(p["methods"]["ar"]["runs"][0]["decode_ms"] for p in r["prompts"]) / \
            sum(p["methods"][m]["runs"][0]["decode_ms"] for p in r["prompts"])
        assert r["summary"][m]["speedup"]["by_repeat"][0] == pytest.approx(rep0)
    # Engine statistics ride along; tau of ar is exactly 1.
    assert r["summary"]["ar"]["tau"] == 1.0 and r["summary"]["dflash"]["tau"] >= 1.0
    assert r["summary"]["hf-generate"]["tau"] is None
    assert r["summary"]["dflash"]["copy_share"] == 0.0  # only dflash-lookup copies (test_dflash_lookup_copies…)
    md = out.with_suffix(".md").read_text()
    for m in r["config"]["methods"]:
        assert f"| {m} |" in md
    assert "Every greedy output equals the `ar` output." in md and r["command"] in md


def test_resume_runs_only_missing_prompts(bench_dir, bench_result):
    d, _ = bench_dir
    r, out, _ = bench_result
    part = d / "partial.json"
    args = _args(d, part, "--methods", "ar,hf-generate", "--no-warmup")
    assert main(args) == 0
    full = json.loads(part.read_text())
    interrupted = dict(full, prompts=full["prompts"][:1], complete=False)
    part.write_text(json.dumps(interrupted))
    assert main(args + ["--resume"]) == 0
    resumed = json.loads(part.read_text())
    assert resumed["complete"] and len(resumed["prompts"]) == 2 and "resumed_at" in resumed
    assert resumed["prompts"][0] == full["prompts"][0]  # kept as recorded, not rerun
    assert resumed["prompts"][1]["methods"]["ar"]["output_ids"] == full["prompts"][1]["methods"]["ar"]["output_ids"]
    # Other settings: refused, the file left alone.
    assert main(_args(d, part, "--methods", "ar", "--no-warmup", "--resume")) == 2
    assert json.loads(part.read_text()) == resumed


@pytest.mark.parametrize("extra, param", [
    (["--methods", "ar,turbo"], "methods"),
    (["--methods", "ar,ar"], "methods"),
    (["--repeats", "0"], "repeats"),
    (["--temperature", "3"], "temperature"),
    (["--no-draft", "--methods", "ar,dflash"], "methods"),
    (["--limit", "0"], "limit"),
])
def test_bad_options_name_the_parameter(bench_dir, tmp_path, capsys, extra, param):
    d, _ = bench_dir
    assert main(_args(d, tmp_path / "x.json", *extra)) == 2
    assert param in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_existing_output_needs_resume_or_overwrite(bench_dir, tmp_path, capsys):
    d, _ = bench_dir
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(_args(d, out)) == 2
    assert "--resume" in capsys.readouterr().err and out.read_text() == "{}"


def test_config_validation():
    with pytest.raises(ValidationError) as e:
        BenchConfig(methods=("ar",), request={"use_draft": True})
    assert e.value.param == "request"
    with pytest.raises(ValidationError) as e:
        BenchConfig(methods=("ar",), request={"max_new_tokens": 0})
    assert e.value.param == "max_new_tokens"
    cfg = BenchConfig(methods=("hf-generate", "dflash"), request={"temperature": 0.7})
    assert cfg.baseline == "hf-generate" and not cfg.greedy


def test_compare_common_length():
    same = {"identical": True, "first_diff": None, "diagnosis": None}
    assert compare([1, 2, 3], [1, 2, 3]) == {**same, "same_length": True}
    shorter = compare([1, 2, 3], [1, 2])
    assert shorter["first_diff"] == 2 and not shorter["identical"] and not shorter["same_length"]
    assert shorter["diagnosis"]["verdict"] == "error" and shorter["diagnosis"]["run_token"] is None
    assert compare([1, 2, 3], [1, 2], "timeout") == {**same, "same_length": False}
    other = compare([1, 2, 3], [1, 5, 3])
    assert (other["identical"], other["first_diff"], other["same_length"]) == (False, 1, True)


def test_compare_diagnoses_a_difference_from_both_runs_gaps(monkeypatch):
    from dflash.decode import stats

    monkeypatch.setitem(stats.TIE_BOUND, "bfloat16", 0.25)
    tie = compare([1, 2, 3], [1, 5, 6], "length", [1.0, 0.03, 2.0], [1.0, 0.05, 0.5], "bfloat16")
    assert tie["diagnosis"] == {"position": 1, "ref_token": 2, "run_token": 5, "ref_gap": 0.03, "run_gap": 0.05,
                                "bound": 0.25, "verdict": "tie"}
    assert compare([1, 2, 3], [1, 5, 6], "length", [1.0, 0.03, 2.0], [1.0, 0.05, 0.5])["diagnosis"]["verdict"] == "error"
    assert compare([1, 2, 3], [1, 5, 6], "length", [1.0, 0.03, 2.0], None, "bfloat16")["diagnosis"]["verdict"] == "error"


def test_sampled_runs_of_the_engines_methods_are_compared_with_ar(bench_dir, tmp_path):
    """Sampling with per-position noise: ar, dflash and dflash-lookup draw the same tokens for the same seed, so the
    bench checks it (float32: identical); transformers' sampling has its own random stream and stays uncompared."""
    d, _ = bench_dir
    out = tmp_path / "sampled.json"
    assert main(_args(d, out, "--methods", "ar,dflash,dflash-lookup,hf-generate", "--no-warmup", "--temperature", "0.9",
                      "--seed", "4", "--dtype", "float32")) == 0
    r = json.loads(out.read_text())
    assert not r["config"]["greedy"]
    for p in r["prompts"]:
        assert p["methods"]["dflash"]["identical"] and p["methods"]["dflash-lookup"]["identical"]
        assert p["methods"]["hf-generate"]["identical"] is None and p["methods"]["ar"]["identical"] is None
    assert r["summary"]["dflash"]["identical"]["n_identical"] == len(PROMPTS) and r["differences"] == []
    assert r["summary"]["hf-generate"]["identical"] is None
    assert "Every compared output (the engine's methods, same seed" in out.with_suffix(".md").read_text()


def test_a_lossy_dflash_run_is_diagnosed_against_ar(bench_dir, tmp_path):
    """Relaxed acceptance makes dflash differ from ar for real: each differing record carries the numerical diagnosis
    from both runs' recorded gaps (float32: never a tie), and the summary, the differences and the Markdown call the
    difference what it is, the opt-in loss of a lossy run, not an error."""
    d, _ = bench_dir
    out = tmp_path / "lossy.json"
    assert main(_args(d, out, "--methods", "ar,dflash", "--no-warmup", "--acceptance-threshold", "1e-9", "--dtype",
                      "float32")) == 0  # the probe may choose bfloat16 for a tiny model: this case is float32
    r = json.loads(out.read_text())
    differing = [p for p in r["prompts"] if p["methods"]["dflash"]["identical"] is False]
    assert differing, "the case needs a lossy difference"
    for p in differing:
        rec = p["methods"]["dflash"]
        diag, k = rec["diagnosis"], rec["first_diff"]
        assert diag["position"] == k and diag["bound"] == 0.0 and diag["verdict"] == "error"
        assert diag["ref_token"] == p["methods"]["ar"]["output_ids"][k] and diag["run_token"] == rec["output_ids"][k]
        assert diag["ref_gap"] >= 0 and diag["run_gap"] >= 0
        assert rec["runs"][0]["stats"]["lossy"] and rec["runs"][0]["stats"]["drift_tokens"] > 0
    ident = r["summary"]["dflash"]["identical"]
    assert (ident["n_lossy"], ident["n_errors"], ident["n_ties"]) == (len(differing), 0, 0)
    assert [x["verdict"] for x in r["differences"]] == ["lossy"] * len(differing)
    md = out.with_suffix(".md").read_text()
    assert "expected, the run is lossy (" in md and "NOT a tie" not in md and f"{len(differing)} lossy)" in md


def test_profile_tool_measures_the_tiny_target(bench_dir, capsys):
    from dflash.bench.profile import main as profile_main

    d, _ = bench_dir
    assert profile_main(["forward", "--target", str(d / "target"), "--dtypes", "float32", "--tokens", "1,4", "--reps", "1",
                         "--threads", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["machine"]["cpu_model"] and "torch" in doc["machine"] and "cpu_flags" in doc["machine"]  # the host
    rows = doc["result"]
    assert {(r["layout"], r["tokens"], r["head"]) for r in rows} == {
        (lay, t, h) for lay in ("linear", "transposed") for t, h in ((1, "mkl"), (4, "onednn-packed"), (4, "mkl"))}
    assert all(r["median_ms"] > 0 for r in rows)
    assert profile_main(["gemm", "--target", str(d / "target"), "--rows", "1,2", "--reps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["result"]
    assert {(r["rows"], r["kernel"]) for r in rows} == {(1, "mkl"), (1, "onednn-packed"), (2, "mkl"), (2, "onednn-packed"),
                                                        (2, "per-row")}
    assert all(r["n_matrices"] == 4 * 7 for r in rows)  # 4 layers × (q, k, v, o, gate, up, down)
    assert profile_main(["prefill", "--target", str(d / "target"), "--tokens", "8,20", "--reps", "1", "--threads", "1",
                         "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["result"]
    assert {(r["dtype"], r["float32_matmuls"], r["tokens"]) for r in rows} == {
        (dt, f32, n) for dt, f32 in (("float32", False), ("bfloat16", False), ("bfloat16", True)) for n in (8, 20)}
    assert all(0 < r["min_ms"] <= r["median_ms"] for r in rows)


def test_host_work_profile_counts_per_block_traffic_by_vocabulary(capsys):
    """`profile host-work` as a user runs it (a subprocess), on the CPU: a row per vocabulary, the blocks of a sampled
    run, no host<->device copies (there is no device), both noise timings; a bad option is one line, exit 2 (through
    `main(argv)` in this process)."""
    import subprocess
    import sys

    from dflash.bench.profile import main as profile_main
    from tests.cli_support import run_main

    argv = [sys.executable, "-m", "dflash.bench.profile", "host-work", "--device", "cpu", "--vocabs", "64,512",
            "--layers", "1", "--block", "4", "--max-new-tokens", "6", "--reps", "2"]
    # One thread: the counts do not depend on it, and two threads on cores another job (or xdist worker) is using
    # took twice as long (9.7 s against 4.5 s).
    run = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    rows = doc["result"]["rows"]
    assert [r["vocab"] for r in rows] == [64, 512] and doc["machine"]["cpu_flags"] is not None
    for r in rows:
        assert r["tokens"] == 6 and 1 <= r["blocks"] <= 6 and r["ms_per_block"] > 0
        assert r["htod_copies"] == r["dtoh_copies"] == r["sync_calls"] == 0
        assert r["noise_on_device_ms"] > 0 and r["noise_cpu_copied_ms"] > 0
    assert doc["result"]["table"].count("\n") == 3  # header, rule, two rows
    bad = run_main(profile_main, [*argv[3:6], "--vocabs", "64,x"], capsys)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == "error: --vocabs: whole numbers separated by commas, got '64,x'"


def test_settings_profile_runs_every_fixed_setting_against_the_default(bench_dir, capsys):
    """`profile settings`: ar in the default settings (with the draft loaded, and as an engine without it gets them),
    hf-generate in the same, and ar in every dtype × threads × layout, interleaved; float32 in either layout and at
    any thread count gives the default's (float32) tokens."""
    from dflash.bench.profile import main as profile_main
    from dflash.loading.host import thread_candidates

    d, _ = bench_dir
    assert profile_main(["settings", "--target", str(d / "target"), "--draft", str(d / "draft"), "--prompts",
                         str(d / "prompts.jsonl"), "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32",
                         "--threads", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["result"]
    rows = {r["setting"]: r for r in res["rows"]}
    fixed = [f"{dt}, {n} thread{'s' * (n != 1)}, {lay}" for dt in ("float32", "bfloat16")
             for lay in ("linear", "transposed") for n in thread_candidates()]
    assert list(rows) == ["default", "default, no draft", "hf-generate", *fixed] and res["n_prompts"] == 2
    assert all(r["decode_tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    assert all(rows[n]["same_output_as_default"] == 2 for n in ["default, no draft", "hf-generate", *fixed]
               if not n.startswith("bfloat16"))
    assert res["host_no_draft"]["block"] == 1 and res["host"]["block"] == 6  # probed for the step alone / the block
    best = max(fixed, key=lambda n: rows[n]["tokens_per_s"])
    assert res["best_fixed"] == best
    assert res["default_vs_best_fixed"] == pytest.approx(rows["default"]["tokens_per_s"] / rows[best]["tokens_per_s"],
                                                         abs=2e-3)
    assert res["default_vs_hf_generate"] == pytest.approx(1 / rows["hf-generate"]["vs_default"], abs=5e-3)
    plain = rows["default, no draft"]["tokens_per_s"] / rows[best]["tokens_per_s"]
    assert res["no_draft_default_vs_best_fixed"] == pytest.approx(plain, abs=2e-3)
    # Two prompts: the interval's ends are the two prompts' own ratios, and the pooled ratio lies between them.
    assert set(res["intervals"]) == {"default_vs_best_fixed", "default_vs_hf_generate", "no_draft_default_vs_best_fixed"}
    for key, (lo, hi) in res["intervals"].items():
        assert lo - 2e-3 <= res[key] <= hi + 2e-3, key
    assert profile_main(["settings", "--target", str(d / "target"), "--limit", "0"]) == 2
    assert "limit: must be in [1, 1000]" in capsys.readouterr().err


def test_a_rate_ratio_interval_comes_from_resampling_the_prompts():
    from dflash.bench.settings import rate_ratio_interval

    a = [(60, 3000.0), (64, 2900.0), (50, 2600.0), (64, 3300.0), (40, 2000.0)]
    assert rate_ratio_interval(a, a) == pytest.approx((1.0, 1.0))
    half = [(t, 2 * ms) for t, ms in a]  # half the rate on every prompt
    assert rate_ratio_interval(half, a) == pytest.approx((0.5, 0.5))
    noisy = [(t, ms * f) for (t, ms), f in zip(a, (0.9, 1.1, 1.0, 0.95, 1.2))]
    lo, hi = rate_ratio_interval(a, noisy)
    pooled = (sum(t for t, _ in a) / sum(m for _, m in a)) / (sum(t for t, _ in noisy) / sum(m for _, m in noisy))
    assert lo < pooled < hi and 0.85 < lo and hi < 1.15
    assert rate_ratio_interval(a, noisy) == (lo, hi)  # seeded: the same interval every time
    assert rate_ratio_interval(a, noisy, level=0.5)[1] - rate_ratio_interval(a, noisy, level=0.5)[0] < hi - lo


def test_settings_profile_runs_dflash_in_every_fixed_setting(bench_dir, capsys):
    """`profile settings --method dflash`: DFlash in the default settings and in every dtype × threads × layout (each
    with its own copy of the draft), and ar in the default settings; float32 DFlash gives ar's tokens (lossless)."""
    from dflash.bench.profile import main as profile_main
    from dflash.loading.host import thread_candidates

    d, _ = bench_dir
    base = ["settings", "--target", str(d / "target"), "--prompts", str(d / "prompts.jsonl"), "--limit", "2",
            "--max-new-tokens", "8", "--dtype", "float32", "--threads", "1", "--json"]
    assert profile_main([*base, "--draft", str(d / "draft"), "--method", "dflash"]) == 0
    res = json.loads(capsys.readouterr().out)["result"]
    rows = {r["setting"]: r for r in res["rows"]}
    fixed = [f"{dt}, {n} thread{'s' * (n != 1)}, {lay}" for dt in ("float32", "bfloat16")
             for lay in ("linear", "transposed") for n in thread_candidates()]
    assert list(rows) == ["default", "default, ar", *fixed] and res["method"] == "dflash"
    assert all(r["ttft_ms_median"] > 0 for r in rows.values())
    assert [rows[n]["method"] for n in rows] == ["dflash", "ar"] + ["dflash"] * len(fixed)
    assert all(rows[n]["same_output_as_default"] == 2 for n in rows if not n.startswith("bfloat16"))
    assert res["default_vs_ar"] == pytest.approx(1 / rows["default, ar"]["vs_default"], abs=5e-3)
    assert res["default_vs_hf_generate"] is None and res["host_no_draft"] is None
    assert profile_main([*base, "--method", "dflash"]) == 2  # no draft
    assert "method: dflash needs a draft model" in capsys.readouterr().err
    assert profile_main([*base, "--method", "sampling"]) == 2
    assert "method: must be one of ar, dflash" in capsys.readouterr().err


# -- logit drift: a block verify against the one-token step ------------------------------------------------------------
def test_teacher_forcing_gives_the_no_draft_runs_logits_both_ways():
    """One token per forward reproduces the no-draft engine's greedy tokens; both ways give the logits of a plain
    no-cache forward over the whole sequence (float32), row for row."""
    from dflash.bench.drift import teacher_forced

    target = tiny_target("llama", seed=4)
    prompt = [9, 8, 7, 6, 5]
    out = Engine(target).generate(Request(prompt_ids=tuple(prompt), max_new_tokens=11, use_draft=False)).output_ids
    one, blk = teacher_forced(target, prompt, out, 4)
    assert one.shape == blk.shape == (len(out) - 1, target.vocab_size)
    assert one.argmax(-1).tolist() == out[1:]
    with torch.inference_mode():
        full = target.model(input_ids=torch.tensor([prompt + out])).logits[0, len(prompt) : -1].float()
    assert torch.allclose(one, full, atol=1e-4) and torch.allclose(blk, full, atol=1e-4)


def test_drift_percentile_is_the_nearest_rank_over_everything_added():
    import numpy as np

    from dflash.bench.drift import Drift
    from dflash.verification.verify import top2_gap

    gen = torch.Generator().manual_seed(5)
    pairs = [(torch.randn(n, 500, generator=gen), None) for n in (3, 7, 1)]
    pairs = [(a, a + torch.randn(a.shape, generator=gen) * 0.01) for a, _ in pairs]
    drift = Drift(sum(a.numel() for a, _ in pairs) + 1234)  # an upper bound, as the command gives
    for a, b in pairs:
        drift.add(a, b)
    res = drift.result()
    diffs = torch.cat([(a - b).abs().flatten() for a, b in pairs]).numpy()
    assert res["n_logits"] == diffs.size == 5500 and res["n_positions"] == 11
    assert res["max_abs_diff"] == pytest.approx(float(diffs.max()), abs=0)
    assert res["p999_abs_diff"] == pytest.approx(float(np.percentile(diffs, 99.9, method="inverted_cdf")), abs=0)
    gap_diffs = [abs(x - y) for a, b in pairs for x, y in zip(top2_gap(a), top2_gap(b))]
    assert res["max_gap_diff"] == max(gap_diffs)
    assert res["n_argmax_differs"] == sum(int((a.argmax(-1) != b.argmax(-1)).sum()) for a, b in pairs)


def test_logit_drift_command_on_the_tiny_target(bench_dir, capsys):
    from dflash.bench.profile import main as profile_main
    from dflash.decode.stats import tie_bound_from

    d, _ = bench_dir
    argv = ["logit-drift", "--target", str(d / "target"), "--prompts", str(d / "prompts.jsonl"), "--limit", "2",
            "--max-new-tokens", "12", "--block", "4", "--threads", "1", "--json"]
    assert profile_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "logit-drift"
    rows = {r["dtype"]: r for r in out["result"]}
    assert list(rows) == ["float32", "bfloat16"]
    for r in rows.values():
        assert set(r) == {"dtype", "n_prompts", "block", "n_positions", "n_logits", "max_abs_diff", "p999_abs_diff",
                          "max_gap_diff", "n_argmax_differs", "suggested_bound"}
        assert r["n_prompts"] == 2 and r["n_positions"] > 0 and r["n_logits"] == r["n_positions"] * 256
        assert 0 <= r["p999_abs_diff"] <= r["max_abs_diff"] and r["suggested_bound"] == tie_bound_from(r["max_abs_diff"])
    assert rows["float32"]["max_abs_diff"] < 1e-3 and rows["float32"]["n_argmax_differs"] == 0


@pytest.mark.parametrize("extra, message", [(["--block", "1"], "block: must be in [2, 64]"),
                                            (["--dtypes", "float32,int8"], "dtypes: choose from"),
                                            (["--max-new-tokens", "1"], "max_new_tokens: must be in [2, 4096]")])
def test_logit_drift_bad_options_name_the_parameter(bench_dir, capsys, extra, message):
    from dflash.bench.profile import main as profile_main

    d, _ = bench_dir
    assert profile_main(["logit-drift", "--target", str(d / "target"), "--prompts", str(d / "prompts.jsonl"),
                         *extra]) == 2
    assert message in capsys.readouterr().err


# -- transformers baselines ---------------------------------------------------------------------------------
def test_hf_generate_matches_engine_and_times_are_consistent():
    target = tiny_target("llama", seed=3)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    eos = _eos_for(target, prompt)
    target.model.config.eos_token_id = eos
    target.model.generation_config.eos_token_id = eos
    ref = Engine(target).generate(Request(prompt_ids=tuple(prompt), max_new_tokens=N_NEW, use_draft=False))
    assert ref.finish_reason == "eos" and ref.output_ids[-1] == eos
    ref_gaps = output_gaps(ref.events)
    for lookup in (None, 3):
        out = hf_generate(target, prompt, N_NEW, target.stop_ids(), prompt_lookup_num_tokens=lookup)
        assert out.output_ids == ref.output_ids and out.finish_reason == "eos"
        assert len(out.target_gaps) == len(ref_gaps)  # one gap per output token, as the engine records them
        assert out.target_gaps == pytest.approx(ref_gaps, abs=1e-4)  # so a difference can be diagnosed as a tie
        assert 0 < out.ttft_ms <= out.total_ms and out.decode_ms == pytest.approx(out.total_ms - out.ttft_ms)
        assert 0 <= out.decode_tokens < len(out.output_ids)
    long = hf_generate(target, prompt, 4, set())  # no stop ids: runs to the length limit
    assert long.finish_reason == "length" and len(long.output_ids) == 4 and long.decode_tokens == 3


def test_hf_generate_sampling_is_seeded():
    target = tiny_target("qwen3", seed=2)
    a = hf_generate(target, [1, 2, 3], 8, set(), temperature=1.0, top_k=20, top_p=0.9, seed=7)
    b = hf_generate(target, [1, 2, 3], 8, set(), temperature=1.0, top_k=20, top_p=0.9, seed=7)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 8
    assert a.target_gaps is None  # a sampled token has no tie to diagnose


# -- summaries on synthetic records ---------------------------------------------------------------------------
def _run(decode, total=None, tokens=9, peak=110.0, stats=None):
    return {"repeat": 0, "finish_reason": "length", "message": "", "n_output_tokens": tokens + 1, "ttft_ms": 5.0,
            "decode_ms": decode, "total_ms": total or decode + 5.0, "decode_tokens": tokens,
            "ms_per_token": decode / tokens, "tokens_per_s": tokens / decode * 1000, "rss_before_mb": 100.0,
            "rss_peak_mb": peak, "load1": 1.0, "stats": stats or {}}


def _synthetic_result():
    def rec(runs, ident=None):
        return {"output_ids": [1, 2, 3], "text": "", "finish_reason": "length", "repeats_agree": True, "identical": ident,
                "first_diff": None if ident is not False else 2, "same_length": True, "runs": runs}

    s = {"acceptance_lengths": [3, 1, 4], "acceptance_histogram": {"1": 1, "3": 1, "4": 1}, "draft_ms": 10.0, "verify_ms": 30.0}
    prompts = [
        {"index": 0, "text": "a", "n_prompt_tokens": 3, "prompt_ids": [1, 2, 3], "methods": {
            "ar": rec([_run(100.0), _run(120.0)]),
            "dflash": rec([_run(50.0, stats=s), _run(40.0, stats=s)], True)}},
        {"index": 1, "text": "b", "n_prompt_tokens": 3, "prompt_ids": [1, 2, 3], "methods": {
            "ar": rec([_run(200.0), _run(200.0)]),
            "dflash": rec([_run(100.0, peak=150.0, stats=s), _run(80.0, stats=s)], False)}},
    ]
    cfg = {"methods": ["ar", "dflash"], "baseline": "ar", "greedy": True, "repeats": 2, "prompts": "x.jsonl",
           "warmup": True, "request": {"max_new_tokens": 10, "temperature": 0.0, "seed": 0}}
    machine = {"cpu_model": "cpu", "logical_cores": 2, "torch_threads": 1, "torch": "t", "transformers": "tf",
               "load_average": [1.0, 1.0, 1.0]}
    return {"command": "python -m dflash bench", "complete": True, "config": cfg, "machine": machine,
            "models": {"name": "m", "device": "cpu", "dtype": "float32"}, "prompts": prompts}


def test_summary_speedup_spread_identity_memory():
    r = _synthetic_result()
    summ = report.summarize(r)
    sp = summ["dflash"]["speedup"]
    # Per-prompt medians: ar 110, 200; dflash 45, 90 → 310 / 135.
    assert sp["decode"]["speedup"] == pytest.approx(310 / 135)
    assert sp["decode"]["min"] == pytest.approx(200 / 90) and sp["decode"]["max"] == pytest.approx(110 / 45)
    assert sp["by_repeat"] == pytest.approx([300 / 150, 320 / 120])
    assert (sp["repeat_min"], sp["repeat_max"]) == pytest.approx((2.0, 320 / 120))
    assert sp["end_to_end"]["speedup"] == pytest.approx(320 / 145)
    assert summ["ar"]["speedup"] is None and summ["ar"]["identical"] is None
    assert summ["dflash"]["tau"] == pytest.approx(8 / 3)  # pooled over 4 runs of [3, 1, 4]
    assert summ["dflash"]["acceptance_histogram"] == {"1": 4, "3": 4, "4": 4}
    assert summ["dflash"]["draft_share"] == pytest.approx(0.25)
    assert summ["dflash"]["identical"] == {"n_identical": 1, "n_compared": 2, "differing_prompts": [1], "n_ties": 0,
                                           "n_lossy": 0, "n_errors": 1}  # a record without a diagnosis shows no tie
    assert summ["dflash"]["rss_increase_mb"] == 50.0 and summ["dflash"]["rss_peak_mb"] == 150.0
    assert summ["ar"]["tokens_per_s"] == pytest.approx(18 / 0.31)
    diffs = report.differences(r["prompts"])
    assert diffs == [{"prompt": 1, "method": "dflash", "first_diff": 2, "ar_token": 3, "method_token": 3,
                      "same_length": True, "verdict": "error", "ar_gap": None, "method_gap": None, "bound": None,
                      "drift_tokens": 0}]
    r["summary"], r["differences"] = summ, diffs
    md = report.markdown(r)
    assert "| dflash | 2.30× | 2.22 / 2.33 / 2.44 | 2.00–2.67 |" in md
    assert "prompt 1, dflash: first difference at output token 2" in md and "| 1/2 (0 ties, 1 error) |" in md
    assert "(ar 3, dflash 3): not shown to be a tie (no top-2 gaps recorded" in md  # the playground's words
    tie = {"position": 2, "ref_token": 3, "run_token": 3, "ref_gap": 0.03, "run_gap": 0.05, "bound": 0.25,
           "verdict": "tie"}
    r["prompts"][1]["methods"]["dflash"]["diagnosis"] = tie
    summ = report.summarize(r)
    assert (summ["dflash"]["identical"]["n_ties"], summ["dflash"]["identical"]["n_errors"]) == (1, 0)
    r["summary"], r["differences"] = summ, report.differences(r["prompts"])
    r["models"]["dtype"] = "bfloat16"
    assert "(ar 3, dflash 3): numerical tie (top-2 gaps 0.03 / 0.05 ≤ 0.25, bfloat16)" in report.markdown(r)
    for run in r["prompts"][1]["methods"]["dflash"]["runs"]:  # the same difference from a lossy run: expected
        run["stats"] = {"lossy": True, "drift_tokens": 2}
    summ = report.summarize(r)
    assert [summ["dflash"]["identical"][k] for k in ("n_ties", "n_lossy", "n_errors")] == [0, 1, 0]
    r["summary"], r["differences"] = summ, report.differences(r["prompts"])
    md = report.markdown(r)
    assert "| 1/2 (0 ties, 0 errors, 1 lossy) |" in md
    assert "(ar 3, dflash 3): expected, the run is lossy (2 tokens accepted by the relaxed rule; top-2 gaps" in md


# -- statistics on synthetic event streams (dflash.decode.stats, what the summaries are built from) ----------------------
def _events(blocks: list[tuple[int, int]], t_step: float = 10.0) -> list:
    """Events of a run whose blocks have (block_size, accepted_len); the first token at t = 100 ms."""
    out = [ev.Started({}, [1, 2], "", True, 0, 8, False), ev.Prefill(2, 80.0),
           ev.Commit(0, [5], [ev.BONUS], ["x"], "x", 1, [-1.0], [5], 100.0)]
    n, t = 1, 100.0
    for i, (b, a) in enumerate(blocks, start=1):
        drafted = [7] * (b - 1)
        out.append(ev.BlockSize(i, b, "fixed"))
        out.append(ev.Verify(i, n + 1, b, drafted, ["y"] * (b - 1), drafted[:a] + [9] * (b - a), ["y"] * b,
                             [k < a for k in range(b - 1)], a, 9, 2.0, 6.0))
        n, t = n + a + 1, t + t_step
        out.append(ev.Commit(i, [7] * a + [9], [ev.DRAFT] * a + [ev.CORRECTION], ["y"] * (a + 1), "", n,
                             [0.5] * a + [-1.0], [7] * a + [9], t))
    out.append(ev.Finished("length", [], "", {}))
    return out


def test_stats_on_synthetic_events():
    s = compute_stats(_events([(4, 3), (4, 0), (4, 1), (2, 1)]))
    assert s["acceptance_lengths"] == [4, 1, 2, 2] and s["tau"] == pytest.approx(2.25)
    assert s["acceptance_histogram"] == {"1": 1, "2": 2, "4": 1}
    # Position k reached by blocks drafting >= k tokens; accepted when accepted_len >= k.
    assert s["per_position_acceptance"] == pytest.approx([3 / 4, 1 / 3, 1 / 3])
    assert s["n_output_tokens"] == 10 and s["ttft_ms"] == 100.0 and s["decode_ms"] == pytest.approx(40.0)
    assert s["tokens_per_s"] == pytest.approx(9 / 0.040)
    assert s["draft_ms"] == 8.0 and s["verify_ms"] == 24.0 and s["draft_share"] == pytest.approx(0.25)
    ar = compute_stats(_events([(1, 0)] * 9))
    assert ar["tau"] == 1.0 and ar["per_position_acceptance"] == [] and ar["n_output_tokens"] == 10


def test_speedup_and_spread():
    s = speedup([100.0, 300.0], [50.0, 100.0])
    assert s == pytest.approx({"speedup": 400 / 150, "min": 2.0, "median": 2.5, "max": 3.0})
    assert speedup([100.0], [0.0])["speedup"] == 0.0  # a zero-time method gives no ratio, never a division error
