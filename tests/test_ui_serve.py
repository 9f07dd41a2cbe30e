"""`python app.py` (ui/serve.py) as an operator starts it: `--draft DIR` serves the default target with a draft the
operator trained, and every wrong --draft is one line naming it, exit status 2, before anything is served. Starts
that load a model and stop run `main(argv)` in this process (`here`); the rest start app.py itself."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash.loading.registry import DEFAULT_DRAFT_DIR

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "DFLASH_AUTO_INSTALL": "0"}
ENV.pop("SPACE_ID", None)
ENV.pop("DFLASH_DRAFT", None)


def serve(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "app.py", *argv], cwd=ROOT, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout, check=False)


def assert_draft_error(proc: subprocess.CompletedProcess, says: str) -> None:
    """Exit status 2, no traceback, the last line `dflash-playground: error: --draft: …` containing `says` (refused
    before anything loads: the only line)."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("dflash-playground: error: --draft: ") and says in lines[-1], proc.stderr
    assert len(lines) == 1 or "loading preset" in proc.stderr, proc.stderr


def copy_of_the_shipped_draft(path: Path, dflash: dict | None = None, **config) -> Path:
    """The shipped draft's files in `path`, its config.json changed by `config` (and its `dflash_config` by
    `dflash`)."""
    shutil.copytree(DEFAULT_DRAFT_DIR, path)
    doc = json.loads((path / "config.json").read_text())
    doc["dflash_config"].update(dflash or {})
    (path / "config.json").write_text(json.dumps({**doc, **config}))
    return path


def folder(path: Path, *files: str) -> Path:
    path.mkdir()
    for name in files:
        (path / name).write_text("{}")
    return path


@pytest.mark.parametrize("make,says", [
    (lambda tmp: tmp / "no such dir", "is not a directory"),
    (lambda tmp: folder(tmp / "empty"), "has no config.json or model.safetensors"),
    (lambda tmp: folder(tmp / "config only", "config.json"), "has no model.safetensors"),
])
def test_a_wrong_draft_directory_is_named_at_once(tmp_path, make, says):
    """Checked before torch or Gradio is imported: with a `torch` that cannot be imported, the answer is the same."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    path = make(tmp_path)
    assert_draft_error(serve("--draft", str(path), env={**ENV, "PYTHONPATH": str(tmp_path)}), says)
    # DFLASH_DRAFT is the same setting, for hosts where the operator sets variables rather than arguments.
    env = {**ENV, "PYTHONPATH": str(tmp_path), "DFLASH_DRAFT": str(path)}
    assert_draft_error(serve(env=env), says)


@pytest.mark.parametrize("argv,says", [
    (["--listen", "8000"], "unrecognized arguments: --listen 8000"),
    (["--draft"], "--draft: expected one argument"),
    (["--port", "http"], "--port: must be a port number in [1, 65535], got 'http'"),
    (["--port", "70000"], "--port: must be a port number in [1, 65535], got '70000'"),
    ([], "GRADIO_SERVER_PORT: must be a port number in [1, 65535], got 'seventy'"),
])
def test_a_command_line_error_is_one_line(argv, says):
    proc = serve(*argv, env={**ENV, "GRADIO_SERVER_PORT": "seventy"} if not argv else None)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dflash-playground: error: {says} (usage: python app.py --help)"], proc.stderr


def test_help_lists_the_option_and_the_environment():
    proc = serve("--help")
    assert proc.returncode == 0 and "--draft DIR" in proc.stdout and "--port PORT" in proc.stdout
    names = ("DFLASH_THREADS", "DFLASH_PRESETS", "DFLASH_DTYPE", "DFLASH_PROBE", "DFLASH_DRAFT")
    assert all(name in proc.stdout for name in names)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_is_named_before_anything_loads(host):
    """Before, the model loaded (~10 s), then Gradio's traceback suggested `launch(server_port=…)`."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = serve(env={**ENV, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": host})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dflash-playground: error: --port: port {port} is already in use on {host} (choose another with --port N or "
        "GRADIO_SERVER_PORT) (usage: python app.py --help)"], proc.stderr
    assert time.monotonic() - started < 60  # nothing was loaded (a load alone takes ~10 s, more on a busy host)


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # not an address; an address of no machine here
def test_a_server_name_that_is_not_this_machine_is_named(host):
    proc = serve("--port", str(free_port()), env={**ENV, "GRADIO_SERVER_NAME": host})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"dflash-playground: error: GRADIO_SERVER_NAME: '{host}' is not ") and "address" in lines[0]


@pytest.mark.parametrize("name,value,says", [
    ("DFLASH_WAITING", "20", "DFLASH_WAITING: must be a whole number in [1, 8], got '20'"),
    ("DFLASH_TRACE_MEMORY_MB", "lots", "DFLASH_TRACE_MEMORY_MB: must be a whole number in [256, 1000000], got 'lots'"),
])
def test_a_limit_out_of_its_range_is_one_line(name, value, says):
    proc = serve("--port", str(free_port()), env={**ENV, name: value})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dflash-playground: error: {says} (usage: python app.py --help)"], proc.stderr


@pytest.fixture
def here(capsys, monkeypatch):
    """`python app.py ARGV` as `ui.serve.main(argv)` in this process (no fresh interpreter's imports), in this
    module's environment; what `serve()` returns."""
    from tests.cli_support import run_main
    from ui.serve import main

    for name in ("SPACE_ID", "DFLASH_DRAFT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DFLASH_AUTO_INSTALL", "0")
    return lambda *argv: run_main(main, list(argv), capsys)


@pytest.mark.slow
def test_a_draft_made_for_another_target_is_refused_before_serving(tmp_path, here):
    """A draft for a deeper target (it reads layer 35 of 40), and one whose config.json is not a draft's."""
    draft = copy_of_the_shipped_draft(tmp_path / "deeper", {"target_layer_ids": [1, 15, 35]}, num_target_layers=40)
    port = ("--port", str(free_port()))  # not 7860, where a playground may be serving already
    assert_draft_error(here("--draft", str(draft), *port), "target_layer_ids [35] do not exist in the target (30 layers)")
    (draft / "config.json").write_text("{}")
    assert_draft_error(here("--draft", str(draft), *port),
                       "config.json is not a valid DFlash draft config: no 'hidden_size' entry")


def test_a_draft_with_absurd_sizes_is_refused_before_anything_loads(tmp_path):
    """hidden_size 16384 and intermediate_size 131072 in the shipped draft's config.json: the target loaded, then
    25 GB were allocated for the draft. Now one line, before the target loads, with the address space capped."""
    from tests.cli_support import capped_memory

    draft = copy_of_the_shipped_draft(tmp_path / "huge", hidden_size=16384, intermediate_size=131072)
    proc = subprocess.run([sys.executable, "app.py", "--draft", str(draft), "--port", str(free_port())], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120, preexec_fn=capped_memory(12))
    assert_draft_error(proc, "config.json has hidden_size 16384, but model.safetensors holds a draft with hidden_size 576")
    assert "target_load" not in proc.stderr and "Loading weights" not in proc.stderr


def test_a_bad_dflash_kernels_stops_the_start_in_one_line(here, monkeypatch):
    """Was accepted: the playground served, and every Generate ended in "generation failed (ValueError)"."""
    monkeypatch.setenv("DFLASH_KERNELS", "cuda")
    proc = here("--port", str(free_port()))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "dflash-playground: DFLASH_KERNELS: must be one of auto, triton, reference, got 'cuda'"), proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_playground_serves_the_operators_draft(tmp_path):
    """A copy of the shipped draft told it was trained on blocks of 4 (a folder name with a space and markup): the
    page says which draft it serves (the folder's name only, as text), the block-size slider starts at 4, and a
    Generate over HTTP runs that draft."""
    from gradio_client import Client

    from tests.test_app_api import args, named
    from ui.replay import parse_trace

    draft = copy_of_the_shipped_draft(tmp_path / "my <i>draft", block_size=4)
    port = free_port()
    env = {**ENV, "GRADIO_SERVER_PORT": "1", "DFLASH_PROBE": "0"}  # --port wins over the variable
    proc = subprocess.Popen([sys.executable, "app.py", "--draft", str(draft), "--port", str(port)], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        lines = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            lines.append(proc.stdout.readline())
            if "Running on local URL" in lines[-1]:
                break
        assert "Running on local URL" in lines[-1], "".join(lines)
        client = Client(f"http://127.0.0.1:{port}", verbose=False, download_files=str(tmp_path / "downloads"))
        props = {c["props"].get("elem_id"): c["props"] for c in client.config["components"] if "props" in c}
        notice = props["notice"]["value"]  # a badge that opens onto the details; the name only as code (text)
        assert notice.startswith('<details class="dfl-badge">') and "<i>" not in notice.split("\n")[0]
        assert "**Draft: `my <i>draft`**, chosen by this server's operator" in notice
        assert str(tmp_path) not in props["notice"]["value"]  # the server's own path stays private
        assert props["block-size"]["value"] == 4
        final = named(client.predict(*args(max_new_tokens=24, block_size=4), api_name="/generate"))
        trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
        started = trace.events[0]
        assert started.has_draft and started.trained_block_size == 4 and started.request["use_draft"]
        assert "Finished (length)" in final["status"] and "τ" in final["status"]
        # The run's hardware line and its trace name the operator's draft (they said "default", read as the shipped one)
        assert trace.meta["model"] == "default with draft my <i>draft" and str(tmp_path) not in trace.meta["hardware"]
        assert trace.meta["hardware"].startswith("default with draft my <i>draft · CPU")
        assert '<p class="hw">default with draft my &lt;i&gt;draft · CPU' in final["stats"]
        [row] = list(csv.DictReader(Path(final["export_history"]).open(encoding="utf-8")))  # and so does the history
        assert row["preset"] == "default with draft my <i>draft" and row["draft"] == "yes"
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
