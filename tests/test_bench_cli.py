"""`python -m dflash bench`: options are checked before any model loads, every prompt before the first is measured,
a resumed file keeps one set of conditions, and the result records what each method ran with. A run and Ctrl-C go
through a subprocess, as a user runs them, and so do the checks made before torch is imported; the rest through
`main(argv)` in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_draft, tiny_target
from dflash.models.draft import save_draft
from tests.cli_support import interruptible, run_main

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
PROMPTS = [[5, 17, 33, 4, 90, 61], [7, 8, 9, 10, 11, 12, 7, 8, 9, 10]]
CONTEXT = 512  # the tiny target's max_position_embeddings


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama target (vocabulary 256, context 512; no tokenizer: prompt_ids rows only), a draft for it and a
    2-prompt JSONL set."""
    d = tmp_path_factory.mktemp("bench-cli")
    target = tiny_target("llama")
    target.model.save_pretrained(d / "target")
    save_draft(tiny_draft(target, block_size=6), d / "draft")
    write_jsonl(d / "prompts.jsonl", PROMPTS)
    return d


def write_jsonl(path: Path, prompts: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    return path


def bench_argv(d: Path, out: Path, *extra: str) -> list[str]:
    """`bench` on the tiny models: 4 new tokens, no warm-up, one thread (given options win)."""
    return ["bench", "--target", str(d / "target"), "--draft", str(d / "draft"), "--prompts", str(d / "prompts.jsonl"),
            "--max-new-tokens", "4", "--no-warmup", "--no-progress", "--threads", "1", "--output", str(out), *extra]


def bench_process(d: Path, out: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m dflash bench …` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "dflash", *bench_argv(d, out, *extra)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def bench(capsys):
    """`bench(d, out, *extra)`: the same command through `main(argv)` in this process (no fresh interpreter)."""
    from dflash.cli import main

    return lambda d, out, *extra: run_main(main, bench_argv(d, out, *extra), capsys)


def assert_option_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """Exit status 2 and one `error:` line, the last one, naming the option words[0] as the user typed it and holding
    every other word; no traceback. Returns the line."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]  # besides transformers' load progress
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert errors[0].startswith(f"error: {words[0]}: "), errors[0]
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


# -- dflash-lookup's n-gram ------------------------------------------------------------------------------------------
def test_the_result_records_the_ngram_dflash_lookup_ran_with(models, tmp_path):  # a subprocess: the entry point
    """Without --lookup-ngram, dflash-lookup copies with 2-grams: the result says 2 (it used to say 0, "off"), and
    the request, which every method shares, holds no n-gram (ar and dflash never copy)."""
    out = tmp_path / "r.json"
    proc = bench_process(models, out, "--methods", "ar,dflash-lookup", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(out.read_text())["config"]
    assert cfg["lookup_ngram"] == 2 and "lookup_ngram" not in cfg["request"]


def test_lookup_ngram_without_dflash_lookup_is_refused(models, tmp_path, bench):
    """dflash never copies, so `--lookup-ngram 3 --methods ar,dflash` would measure nothing it says: refused before
    any model loads; so is 0 (dflash-lookup always copies: 0 used to mean 2 here)."""
    out = tmp_path / "r.json"
    assert_option_error(bench(models, out, "--methods", "ar,dflash", "--lookup-ngram", "3"), "--lookup-ngram",
                        "dflash-lookup")
    assert_option_error(bench(models, out, "--methods", "ar,dflash-lookup", "--lookup-ngram", "0"), "--lookup-ngram",
                        "[1, 8]")
    assert not out.exists()


def test_bench_help_says_what_lookup_ngram_means_here():
    proc = subprocess.run([sys.executable, "-m", "dflash", "bench", "--help"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps the help text
    help_text = text[text.index("--lookup-ngram N "):]
    assert help_text.startswith("--lookup-ngram N dflash-lookup's n-gram length") and "0 = off" not in text
    assert "[--resume | --overwrite]" in text


# -- --resume ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(models, tmp_path_factory):
    """A complete 2-prompt ar result to cut back into an interrupted one (measured in this process)."""
    from dflash.cli import main

    out = tmp_path_factory.mktemp("measured") / "r.json"
    assert main(bench_argv(models, out, "--methods", "ar")) == 0  # (--threads 1: the session's own count, conftest)
    return json.loads(out.read_text())


def interrupted(measured: dict, path: Path, edit=None) -> dict:
    """`measured` as a run stopped after its first prompt, edited by `edit(doc)`, written to `path`."""
    doc = json.loads(json.dumps(measured))
    doc.update(prompts=doc["prompts"][:1], complete=False, finished_at=None)
    if edit:
        edit(doc)
    path.write_text(json.dumps(doc))
    return doc


@pytest.mark.parametrize("edit, extra, named", [
    (lambda doc: doc["machine"].update(cpu_model="Another CPU", torch="1.0.0"), [], ["machine.cpu_model", "machine.torch"]),
    (lambda doc: doc["models"]["host"].update(layout="other"), [], ["models.host.layout"]),
    (lambda doc: doc["models"].update(quantize="8bit"), [], ["models.quantize"]),
    pytest.param(None, ["--threads", "2"], ["machine.torch_threads"],  # the same file continued with other threads
                 marks=pytest.mark.skipif(__import__("os").cpu_count() < 2, reason="needs 2 cores")),
])
def test_resume_refuses_other_conditions_naming_them(models, measured, tmp_path, bench, edit, extra, named):
    out = tmp_path / "r.json"
    before = interrupted(measured, out, edit)
    line = assert_option_error(bench(models, out, "--methods", "ar", "--resume", *extra), "--resume", *named)
    assert "--overwrite" in line and json.loads(out.read_text()) == before  # the file left alone


def test_resume_keeps_the_original_machine_and_command(models, measured, tmp_path, bench):
    """The resumed file describes the run that made it (its machine: load average, memory at the start …, its
    command) and records the resume's command line apart. The interrupted file is in the format written before
    `config.lookup_ngram` existed (`request.lookup_ngram`), which still resumes."""
    def older(doc):
        doc["machine"].update(load_average=[9.5, 9.5, 9.5], memory_gb=1.5)
        doc["command"] = "python -m dflash bench --original"
        doc["config"]["request"]["lookup_ngram"] = 0
        doc["config"].pop("lookup_ngram", None)

    out = tmp_path / "r.json"
    old = interrupted(measured, out, older)
    proc = bench(models, out, "--methods", "ar", "--resume")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["complete"] and len(r["prompts"]) == 2 and r["prompts"][0] == old["prompts"][0]
    assert r["machine"] == old["machine"] and r["command"] == old["command"]
    assert "--resume" in r["resumed_command"] and "--resume" not in r["command"]


def test_resuming_a_complete_result_measures_nothing_and_leaves_it(models, measured, tmp_path, bench):
    """It loaded the models, measured nothing and rewrote the file's finish time, load average and models."""
    out = tmp_path / "r.json"
    out.write_text(json.dumps(measured))
    before = out.read_bytes()
    proc = bench(models, out, "--methods", "ar", "--resume")
    assert proc.returncode == 0 and f"nothing to resume: {out} is complete" in proc.stderr, proc.stderr
    assert out.read_bytes() == before
    # Another configuration (one prompt more, say) would not extend it: refused, as for an incomplete file.
    line = assert_option_error(bench(models, out, "--methods", "ar", "--max-new-tokens", "5", "--resume"), "--resume",
                               "is complete and was made under other conditions", "max_new_tokens (was 4, now 5)")
    assert "--overwrite" in line and out.read_bytes() == before
    for bad in ("[1, 2]", "not json"):  # not a result: named, not a traceback after the model load
        out.write_text(bad)
        assert_option_error(bench(models, out, "--methods", "ar", "--resume"), "--resume", "not")


def test_an_interrupted_run_says_what_it_saved_and_how_to_continue(models, tmp_path):
    """Ctrl-C printed only "interrupted"."""
    import signal
    import time

    prompts = write_jsonl(tmp_path / "many.jsonl", PROMPTS * 30)
    out = tmp_path / "r.json"
    args = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--prompts", str(prompts),
            "--methods", "ar,dflash", "--max-new-tokens", "200", "--no-warmup", "--no-progress", "--threads", "1",
            "--output", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "dflash", "bench", *args], cwd=ROOT, env=ENV,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    saved = len(json.loads(out.read_text())["prompts"])
    assert 1 <= saved < 60 and f"{saved} of 60 prompts saved in {out}; the same command with --resume continues it" in err


def test_resume_and_overwrite_together_are_refused(models, measured, tmp_path, bench):
    out = tmp_path / "r.json"
    before = interrupted(measured, out)
    proc = bench(models, out, "--methods", "ar", "--resume", "--overwrite")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(out.read_text()) == before


# -- output paths ---------------------------------------------------------------------------------------------------
def test_a_markdown_path_in_a_missing_folder_is_refused_before_anything_runs(models, tmp_path, bench):
    """It used to fail with a traceback after the first prompt, leaving a partial JSON that blocked the corrected
    command."""
    out = tmp_path / "r.json"
    assert_option_error(bench(models, out, "--methods", "ar", "--markdown", str(tmp_path / "missing" / "x.md")),
                        "--markdown", "does not exist")
    assert_option_error(bench(models, out, "--methods", "ar", "--markdown", str(out)), "--markdown", "--output")
    assert not out.exists()
    table = tmp_path / "table.md"
    table.write_text("kept")  # an existing table is replaced only when asked, as the JSON is
    assert_option_error(bench(models, out, "--methods", "ar", "--markdown", str(table)), "--markdown", "--overwrite")
    assert table.read_text() == "kept" and not out.exists()


def bench_without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """bench with a `torch` that cannot be imported and a target that does not exist: an answer with its one line
    came before any model loads (and before torch is imported)."""
    (tmp_path / "no-torch" / "torch").mkdir(parents=True, exist_ok=True)
    (tmp_path / "no-torch" / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    argv = ["--target", str(tmp_path / "no-such-target"), "--methods", "ar", "--no-progress", *args]
    return subprocess.run([sys.executable, "-m", "dflash", "bench", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**ENV, "PYTHONPATH": str(tmp_path / "no-torch")}, timeout=60)


def test_the_default_markdown_path_is_checked_as_a_given_one(tmp_path):
    """The table's default path (--output with .md) was not checked: an existing table was silently replaced, and a
    directory there crashed the run after the first prompt (IsADirectoryError, a .md.tmp left behind)."""
    out, table = tmp_path / "new.json", tmp_path / "new.md"
    table.write_text("kept")
    line = assert_option_error(bench_without_torch(tmp_path, "--output", str(out)), "--markdown", str(table), "--overwrite")
    assert "default" in line and table.read_text() == "kept"
    table.unlink()
    table.mkdir()
    assert_option_error(bench_without_torch(tmp_path, "--output", str(out), "--overwrite"), "--markdown", str(table),
                        "is a directory; give a file path")
    assert not out.exists() and not (tmp_path / "new.md.tmp").exists()


def test_an_output_path_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / "r.json").mkdir()
    assert_option_error(bench_without_torch(tmp_path, "--output", str(tmp_path / "r.json"), "--overwrite"), "--output",
                        "is a directory; give a file path")


# -- prompts are checked up front ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad_row, words", [
    ('{"prompt_ids": [1, 2, 256]}', ["line 3", "vocab size 256"]),
    (json.dumps({"prompt_ids": [1] * (CONTEXT - 8)}), ["line 3", "context budget"]),
    ('{"prompt_ids": [1, 2', ["line 3", "not JSON"]),  # a truncated line (a line that is no object: test_datasets)
])
def test_every_prompt_is_checked_before_the_first_is_measured(models, tmp_path, bench, bad_row, words):
    """A bad second prompt (on line 3: a blank line before it) is named by its line, and nothing is measured or
    written: before, prompt 0 was measured first and the error named no line (or was a JSONDecodeError traceback)."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "r.json"
    prompts.write_text(json.dumps({"prompt_ids": PROMPTS[0]}) + "\n\n" + bad_row + "\n")
    assert_option_error(bench(models, out, "--prompts", str(prompts), "--methods", "ar,dflash"), "--prompts", *words)
    assert not out.exists()


@pytest.mark.parametrize("spec, words", [
    ("mtbench", ["mt-bench", "'mtbench'"]),  # a typo of a set's name: refused before the model loads (took ~7 s)
    ("missing.jsonl", ["an existing .jsonl file"]),
])
def test_an_unknown_prompt_set_is_refused_before_any_model_loads(tmp_path, spec, words):
    assert_option_error(bench_without_torch(tmp_path, "--output", str(tmp_path / "r.json"), "--prompts", spec),
                        "--prompts", *words)


@pytest.mark.parametrize("rows, words", [
    ([{"prompt": "a"}, {"promt": "b"}], ["line 2", "no prompt text", "promt"]),  # was dropped without a word
    ([{"prompt": "a"}, {"prompt": ""}], ["line 2", '"prompt" is empty']),
    ([{"prompt": "a"}, {"prompt": 5}], ["line 2", '"prompt" must be a non-empty string']),
    ([{"prompt": "a"}, {"prompt_ids": [1, 2]}], ["line 2", "all text or all token ids", "line 1"]),  # blamed line 1
    ([{"prompt_ids": [1, 2]}, {"prompt": "b"}], ["line 2", "all text or all token ids", "line 1"]),
    ([{"prompt_ids": [1, 2]}, {"prompt_ids": []}], ["line 2", "non-empty list of token ids"]),
    ([], ["gave no prompts"]),
])
def test_prompt_rows_are_checked_before_any_model_loads(tmp_path, rows, words):
    """Every row of a JSONL file is checked against the format (docs/bench.md) up front, and an error names its
    line: rows without prompt text were silently dropped, so the run measured fewer prompts than the file held."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = bench_without_torch(tmp_path, "--output", str(tmp_path / "r.json"), "--prompts", str(prompts))
    assert_option_error(proc, "--prompts", *words)


# -- --random-draft -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", ["0", "9"])
def test_random_draft_out_of_range_is_refused_before_any_model_loads(models, tmp_path, bench, layers):
    """A target that does not exist: the refusal comes before the load. 0 used to be ignored (the trained draft ran
    while the command said --random-draft 0); -1 and 9 were refused only after the target had loaded."""
    proc = bench(models, tmp_path / "r.json", "--target", str(tmp_path / "no-such-target"), "--random-draft", layers)
    assert_option_error(proc, "--random-draft", "[1, 8]")


def test_random_draft_replaces_the_draft(models, tmp_path, bench, capsys):
    """--random-draft runs in place of the draft; with --draft or --no-draft too, one of them would be ignored, so the
    pair is refused before any model loads."""
    out = tmp_path / "r.json"
    assert_option_error(bench(models, out, "--random-draft", "1"), "--random-draft", "--draft")
    assert_option_error(bench(models, out, "--random-draft", "1", "--no-draft"), "--random-draft", "--no-draft")
    from dflash.cli import main

    args = ["bench", "--target", str(models / "target"), "--prompts", str(models / "prompts.jsonl"), "--max-new-tokens",
            "4", "--no-warmup", "--no-progress", "--threads", "1", "--output", str(out), "--methods", "ar,dflash",
            "--random-draft", "1", "--limit", "1"]
    proc = run_main(main, args, capsys)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["models"]["draft"].startswith("RANDOM (1 layers")
