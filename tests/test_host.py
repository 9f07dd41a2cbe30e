"""dflash.loading.host: the CPU settings chosen by the probe on a real (tiny) model, their per-machine cache, and what the
caller fixes."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_target

from dflash.loading import host, probe
from dflash.errors import ValidationError
from dflash.models.packed import layout_of


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
    # Fewer threads are probed for the leading dtype only: the one chosen when the dtypes were compared (the best
    # score, or one within CLOSE of it with a faster step). Its row then takes the interleaved timing of its thread
    # counts, which can put the other dtype ahead (then the choice).
    leader = next(r for r in lead if "lead_score_ms" in r)
    other = next(r for r in lead if r is not leader)
    assert leader["lead_score_ms"] <= (1 + probe.CLOSE) * other["score_ms"]
    assert [(r["dtype"], r["threads"], r["layout"]) for r in s.candidates[2:]] == [
        (leader["dtype"], n, leader["layout"]) for n in sorted(host.thread_candidates(), reverse=True)[1:]]
    best = probe.choose(s.candidates, 4)
    assert best["score_ms"] <= (1 + probe.CLOSE) * min(r["score_ms"] for r in s.candidates)
    assert (s.dtype, s.threads, s.layout) == (best["dtype"], best["threads"], best["layout"])
    for i, r in enumerate(s.candidates):
        ms = {n: r[k] for n, k in ((1, "step_ms"), (2, "verify2_ms"), (4, "verify_ms")) if r[k] is not None}
        assert all(v > 0 for v in ms.values()) and 1 in ms
        # Missing sizes: a candidate dropped early says `partial` (its score a lower bound over every size). A row
        # timed again at fewer threads, or the leader's, leaves out a verify size whose first timing was far behind
        # (probe.deciding_sizes): it is scored on the sizes it timed again (the leader keeps its first verify).
        assert not r.get("partial") or len(ms) < 3
        scored = [[1, 2, 4]] if r.get("partial") else [[1, 2, 4], [1, 2], [1, 4]]
        assert any(set(sizes) <= set(ms) | ({2, 4} if r.get("partial") else set()) and
                   r["score_ms"] == pytest.approx(probe.lower_bound({n: ms[n] for n in sizes if n in ms}, sizes, 4),
                                                  abs=0.02) for sizes in scored), r
    assert not best.get("partial")
    assert torch.get_num_threads() == before  # the probe leaves the process as it found it …
    assert next(model.parameters()).dtype == torch.float32  # … and the model in float32 (bfloat16 ran on a copy)
    float32_layout = next(r["layout"] for r in s.candidates if r["dtype"] == "float32")
    assert layout_of(model.model.layers) == float32_layout
    assert s.exact == (s.dtype == "float32") and s.to_dict()["mode"] in ("exact", "fast")


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


@pytest.mark.parametrize("edit", [{"threads": "2"}, {"threads": 0}, {"dtype": "int8"}, {"layout": "diagonal"},
                                  {"float32_from_rows": 1.5}, {"candidates": "none"},
                                  {"threads": 2**80}, {"threads": host.usable_cores() + 1}])  # not for this machine
def test_a_cached_choice_with_a_wrong_value_means_a_new_probe(tmp_path, edit):
    """A cache entry is rebuilt from JSON a person may edit: threads "2" used to reach torch.set_num_threads."""
    model, path = tiny_target("llama", seed=0).model, tmp_path / "settings.json"
    host.choose(model, "tiny", 4, path, dtype="float32", threads=1)
    (key, entry), = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: {**entry, **edit}}))
    assert host.read_cached(path, key) is None
    assert host.choose(model, "tiny", 4, path, dtype="float32", threads=1).source == "probe"


def test_no_probe_when_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_PROBE", "0")
    s = host.choose(tiny_target("llama").model, "tiny", 4, tmp_path / "s.json")
    assert (s.source, s.dtype, s.layout, s.candidates) == ("default", "float32", "linear", [])
    assert s.numbers() == "settings: not probed (DFLASH_PROBE=0)"  # said "settings: default"
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


def test_more_threads_than_usable_cores_are_refused(monkeypatch):
    """999 threads on a 2-core machine were accepted and ran ~50x slower than 2."""
    cores = host.usable_cores()
    monkeypatch.setenv("DFLASH_THREADS", str(cores + 1))
    with pytest.raises(ValidationError, match=rf"DFLASH_THREADS: must be in \[1, {cores}\] \(this machine's usable cores\)"):
        host.env_threads()
    from dflash.loading.load import check_threads

    with pytest.raises(ValidationError, match=rf"threads: must be in \[1, {cores}\]"):
        check_threads(cores + 1)
    check_threads(cores)


def test_dflash_threads_fixes_the_thread_count(monkeypatch):
    monkeypatch.setenv("DFLASH_THREADS", str(host.usable_cores()))
    assert host.env_threads() == host.usable_cores()
    monkeypatch.delenv("DFLASH_THREADS")
    assert host.env_threads() is None


def test_the_summary_says_the_mode_and_the_probes_numbers():
    rows = [{"dtype": "bfloat16", "threads": 2, "layout": "linear", "step_ms": 39.4, "verify_ms": 48.2, "score_ms": 87.6}]
    fast = host.HostSettings("bfloat16", 2, "linear", "cache", block=8, probe_s=3.2, candidates=rows)
    assert "fast mode: identical except at numerical ties" in fast.summary() and not fast.exact
    assert fast.numbers() == "1-token step 39 ms, 8-token verify 48 ms (probe cached)"
    exact = host.HostSettings("float32", 1, "transposed", "probe", probe_s=2.5)
    assert exact.summary().startswith("float32 · 1 thread · transposed layout (exact; probed in 2.5 s)")
    # A fewer-threads row whose block was not timed (far behind its pair; the AVX2-only EPYC's bfloat16 at 1 thread)
    one = {"dtype": "bfloat16", "threads": 1, "layout": "linear", "step_ms": 83.8, "verify2_ms": 135.3, "verify_ms": None}
    chosen = host.HostSettings("bfloat16", 1, "linear", "probe", block=8, probe_s=4.6, candidates=[one])
    assert chosen.numbers() == "1-token step 84 ms, 2-token verify 135 ms (probed in 4.6 s)"
    user = host.HostSettings("float32", 2, "linear", "user")  # said "settings: user" in the playground's hardware line
    assert user.numbers() == "settings: set by the user" and user.summary().endswith("(exact; set by the user)")


def test_prefills_run_in_float32_matmuls_where_the_probe_measured_that_it_pays(tmp_path):
    assert probe.float32_rows({"rows": 64, "native": 8.2, "float32": 2.3}) == probe.FLOAT32_ROWS  # AVX2-only EPYC
    assert probe.float32_rows({"rows": 64, "native": 2.0, "float32": 1.9}) == 0  # not clearly faster: stay native
    assert probe.float32_rows({}) == 0  # float32 chosen: nothing measured
    model = tiny_target("llama", seed=0).model
    s = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="bfloat16")
    assert s.matmul_ms["rows"] == probe.MATMUL_ROWS and s.matmul_ms["native"] > 0 and s.matmul_ms["float32"] > 0
    assert s.float32_from_rows == probe.float32_rows(s.matmul_ms)
    assert ("prompts in float32 matmuls" in s.summary()) == bool(s.float32_from_rows)
    again = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="bfloat16")
    assert again.source == "cache" and (again.float32_from_rows, again.matmul_ms) == (s.float32_from_rows, s.matmul_ms)
    s32 = host.choose(model, "tiny", 4, tmp_path / "settings.json", dtype="float32")
    assert s32.matmul_ms == {} and s32.float32_from_rows == 0


def test_the_recording_script_names_a_bad_part_and_exits_2():
    script = Path(__file__).resolve().parent.parent / "scripts" / "host_settings.py"
    run = subprocess.run([sys.executable, str(script), "record", "--only", "probe,nope"], capture_output=True, text=True)
    assert run.returncode == 2 and "--only" in run.stderr and "'probe,nope'" in run.stderr and "Traceback" not in run.stderr


def test_the_tables_verdicts_give_each_ratio_with_its_interval_over_the_prompts(tmp_path, monkeypatch):
    """BENCHMARKS.md's verdicts come from the recorded `profile settings` runs: with the interval where the run
    recorded one, without where it did not (older runs)."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "host_settings.py"
    spec = importlib.util.spec_from_file_location("host_settings", script)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "OUT", tmp_path)
    host = {"dtype": "bfloat16", "threads": 2, "layout": "linear", "probe_s": 3.9, "mode": "fast"}
    result = {"host": host, "n_prompts": 10, "max_new_tokens": 64, "best_fixed": "bfloat16, 2 threads, linear",
              "default_vs_best_fixed": 0.94, "default_vs_hf_generate": 0.95,
              "intervals": {"default_vs_best_fixed": [0.88, 1.01], "default_vs_hf_generate": [0.9, 1.0]}}
    (tmp_path / "some-cpu-ar.json").write_text(json.dumps({"result": result}))
    (tmp_path / "older-cpu-ar.json").write_text(json.dumps({"result": {**result, "intervals": {}}}))
    new, old = sorted(script.ar_verdicts(), key=lambda line: "some-cpu" not in line)
    assert ("**0.94×** (95 % interval over the prompts 0.88–1.01) the fastest fixed setting" in new
            and "**0.95×** (95 % interval over the prompts 0.90–1.00) `hf-generate`" in new)
    assert "**0.94×** the fastest fixed setting" in old and "interval" not in old


@pytest.mark.parametrize("then,now,probed_again", [(2.0, 0.1, True), (2.0, 1.5, False), (0.3, 0.1, False),
                                                   (None, 0.1, False)])
def test_a_choice_cached_on_a_busy_machine_is_measured_again_once_it_is_quiet(tmp_path, monkeypatch, then, now,
                                                                             probed_again):
    """A probe taken while other work filled the cores (load `then` per core) is taken again at a start on a quiet
    machine (load `now`); one taken quiet, or whose load was not recorded (older caches), is kept."""
    model, path = tiny_target("llama", seed=0).model, tmp_path / "settings.json"
    first = host.choose(model, "tiny", 4, path, dtype="float32", threads=1)
    assert isinstance(first.load_per_core, float)  # recorded when probed
    (key, entry), = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: {**entry, "probe_s": -1.0, "load_per_core": then}}))
    monkeypatch.setattr(host.os, "getloadavg", lambda: (now * host.usable_cores(), 0.0, 0.0))
    again = host.choose(model, "tiny", 4, path, dtype="float32", threads=1)
    assert (again.source == "probe" and again.probe_s > 0) if probed_again else again.probe_s == -1.0
    if probed_again:
        assert json.loads(path.read_text())[key]["load_per_core"] == now  # the quiet measurement replaced it


def test_the_leaders_thread_counts_are_timed_against_each_other(monkeypatch):
    """Fewer threads are timed interleaved with the most, rep by rep, not after them: timed apart, a near tie went
    to whichever count met the quieter moment (on an AVX512_BF16 EPYC the probe chose 1 thread, 1.35x slower)."""
    model = tiny_target("llama", seed=0).model
    seen, real = [], probe.forward_ms
    monkeypatch.setattr(probe, "forward_ms", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    monkeypatch.setattr(probe, "SLOW", math.inf)  # no count dropped mid-timing: every rep times both
    before = torch.get_num_threads()
    lead = {"dtype": "float32", "threads": 2, "layout": "linear", "step_ms": 1e9, "verify2_ms": 1e9, "verify_ms": 1e9,
            "score_ms": 1e9, "other_layout_score_ms": 0.9}  # 1e9 ms: no timing of a tiny model comes close
    other = {**lead, "dtype": "bfloat16", "score_ms": 0.7}
    try:
        rows = probe._thread_rows([lead, other], lead, probe._prepared(model, ["float32"])["float32"], 4, [2, 1])
    finally:
        torch.set_num_threads(before)
    per_rep = [count for count, _ in itertools.groupby(seen[1:])]  # after the one warm-up forward
    assert per_rep == [2, 1] * probe.THREAD_REPS and len(seen) == 1 + 3 * 2 * probe.THREAD_REPS
    assert [(r["dtype"], r["threads"]) for r in rows] == [("float32", 2), ("bfloat16", 2), ("float32", 1)]
    assert rows[1] is other and rows[0]["other_layout_score_ms"] == 0.9 and "other_layout_score_ms" not in rows[2]
    assert rows[0]["lead_score_ms"] == 1e9 and "lead_score_ms" not in rows[2]
    assert all(r["score_ms"] < 1e9 and r["step_ms"] < 1e9 for r in (rows[0], rows[2]))  # the leader's row was re-timed


def test_the_cache_keeps_this_machines_newest_choices(tmp_path):
    """One entry per model directory ever probed used to stay for good (the test suite alone added dozens per run);
    entries of another machine key (older probe version or torch) can never be read again."""
    path = tmp_path / "settings.json"
    mine = host.HostSettings("float32", 1, "linear", "probe", machine=host.machine_key())
    stale = {**mine.to_dict(), "machine": {**host.machine_key(), "probe_version": 1}}
    path.write_text(json.dumps({"stale": stale}))
    for i in range(host.CACHE_ENTRIES + 5):
        host.write_cached(path, f"k{i}", mine)
    assert list(json.loads(path.read_text())) == [f"k{i}" for i in range(5, host.CACHE_ENTRIES + 5)]
    host.write_cached(path, "k7", mine)  # written again: now the newest
    table = json.loads(path.read_text())
    assert list(table)[-1] == "k7" and len(table) == host.CACHE_ENTRIES
    assert host.read_cached(path, "k7").source == "cache"
    path.write_text("[1, 2]")  # not a table: no crash at start, replaced on the next write
    assert host.read_cached(path, "k7") is None
    host.write_cached(path, "k", mine)
    assert list(json.loads(path.read_text())) == ["k"]


def test_a_probe_says_so_on_stderr_once_and_a_cached_start_says_nothing(tmp_path, caplog):
    """A first start measures the CPU before anything else shows: one line says so on stderr (Python prints a
    warning without any logging set up, as in the CLI: a fresh process); a start that reads the cached choice (here,
    in this process) logs nothing."""
    code = ("import sys; from pathlib import Path; from tests.conftest import tiny_target; from dflash.loading import host; "
            "host.choose(tiny_target('llama', seed=0).model, 'tiny', 4, Path(sys.argv[1]))")
    root = Path(__file__).resolve().parents[1]
    first = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.json")], cwd=root, capture_output=True,
                           text=True, timeout=300, check=True)
    said = [line for line in first.stderr.splitlines() if "measuring this CPU once" in line]
    assert len(said) == 1 and re.fullmatch(r"measuring this CPU once to choose its settings \(~\d+ s; kept for later "
                                           r"starts\)…", said[0])
    with caplog.at_level("DEBUG", logger=host.log.name):
        again = host.choose(tiny_target("llama", seed=0).model, "tiny", 4, tmp_path / "s.json")
    assert again.source == "cache" and not caplog.records
