"""Serving hygiene of the playground: launch settings, what the server will and won't serve, where exports are
written, trace uploads, queue limits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from dflash.errors import ValidationError
from tests.ui_support import PROMPT, tiny_text_engine
from ui import build_demo, launch_kwargs
from ui.engines import EngineProvider
from ui.handlers import CONTROL_KEYS, Playground, defaults
from ui.layout import OUT_KEYS, QUEUE_SIZE
from ui.replay import MAX_TRACE_BYTES, TRACES_DIR, TraceError, load_trace_file

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def app():
    torch.set_num_threads(1)
    engine = tiny_text_engine(block_size=8)
    demo = build_demo({"default": engine})
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    yield SimpleNamespace(demo=demo, url=url, engine=engine)
    demo.close()


def test_launch_settings(monkeypatch):
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    kw = launch_kwargs()
    assert kw["server_name"] == "127.0.0.1" and kw["server_port"] == 7860
    assert kw["share"] is False and kw["allowed_paths"] == [] and kw["show_error"] is False
    assert kw["state_session_capacity"] == 1000  # bounds the memory kept for API sessions, which never close
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    assert launch_kwargs()["server_port"] == 7999
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")  # what HF Spaces sets
    assert launch_kwargs()["server_name"] == "0.0.0.0"


def test_app_py_never_shares():
    app, serve = (REPO / "app.py").read_text(), (REPO / "ui" / "serve.py").read_text()
    assert "share=True" not in app + serve and "from ui.serve import main" in app
    assert ".launch(**launch_kwargs(server_port=args.port))" in serve


@pytest.mark.parametrize("path", ["/etc/passwd", str(REPO / "app.py"), str(REPO / "assets" / "playground.css"),
                                  str(TRACES_DIR / "prose.json"), "../../../../etc/passwd"])
def test_server_does_not_serve_arbitrary_files(app, path):
    r = httpx.get(f"{app.url}gradio_api/file={path}", timeout=30)
    assert r.status_code in (403, 404), (path, r.status_code)
    assert "root:" not in r.text and "def main" not in r.text


def test_exports_are_written_to_gradio_temp_files_without_user_text(app):
    client = Client(app.url, verbose=False)
    try:
        d = defaults(8)
        d.update(prompt="../../etc/evil $(rm -rf /) <x>", max_new_tokens=6)
        out = dict(zip([k for k in OUT_KEYS if k not in ("trace", "history")],
                       client.predict(*[d[k] for k in CONTROL_KEYS], api_name="/generate")))
    finally:
        client.close()
    export_root = app.demo.playground.export_root
    from gradio.utils import get_upload_folder

    assert export_root.resolve().is_relative_to(Path(get_upload_folder()).resolve())
    written = sorted(p.name for p in export_root.glob("run-*/*"))
    # (a loaded trace's files are named by where it came from: bundled or upload; a sweep's are fixed names)
    assert written and all(re.fullmatch(r"dflash-((run\d+|bundled|upload)-(trace\.json|metrics\.csv)|history\.csv|"
                                        r"sweep\.(json|csv))", n)
                           for n in written)
    for key in ("export_trace", "export_metrics", "export_history"):
        name = Path(out[key]).name
        assert "evil" not in name and ".." not in name and "rm" not in name


def test_trace_uploads_are_bounded_and_checked(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.seek(MAX_TRACE_BYTES + 1)
        f.write(b"\0")
    with pytest.raises(TraceError, match="larger than 20 MB"):
        load_trace_file(big)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8|not valid JSON|not a DFlash"):
        load_trace_file(binary)


def test_a_hostile_trace_upload_is_a_named_error_without_markup(app, tmp_path):
    """Through the served API: the user gets the parser's message (event, field, bound), no traceback, no markup."""
    doc = json.loads((TRACES_DIR / "code.json").read_text(encoding="utf-8"))
    i = next(i for i, d in enumerate(doc["events"]) if d["type"] == "BlockSize")
    doc["events"][i]["size"] = '<img src=x onerror="alert(1)">'
    bad = tmp_path / "hostile.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    client = Client(app.url, verbose=False)
    try:
        with pytest.raises(AppError) as info:
            client.predict(handle_file(str(bad)), True, api_name="/upload_trace")
    finally:
        client.close()
    message = str(info.value)
    assert f"trace: events[{i}] (BlockSize): 'size' must be an integer in [1, 64]" in message
    assert "<" not in message and "Traceback" not in message


def test_an_upload_with_a_byte_order_mark_loads_and_a_bad_one_names_its_line(app, tmp_path):
    """Through the served API: a UTF-8 file with a BOM (refused before as "line 1 is not valid JSON"), and JSON lines
    after 200,000 blank lines whose fourth event nests 100,000 deep (reported before at "line 1")."""
    doc = json.loads((TRACES_DIR / "code.json").read_text(encoding="utf-8"))
    bom = tmp_path / "bom.json"
    bom.write_text(json.dumps(doc), encoding="utf-8-sig")
    deep = tmp_path / "deep.jsonl"
    lines = [json.dumps(d) for d in doc["events"]]
    lines[3] = "[" * 100_000 + "]" * 100_000
    deep.write_text("\n" * 200_000 + "\n".join(lines), encoding="utf-8")
    client = Client(app.url, verbose=False)
    try:
        out = dict(zip([k for k in OUT_KEYS if k not in ("trace", "history")],
                       client.predict(handle_file(str(bom)), True, api_name="/upload_trace")))
        assert out["status"].startswith("**Loaded upload trace:**")
        with pytest.raises(AppError) as info:
            client.predict(handle_file(str(deep)), True, api_name="/upload_trace")
    finally:
        client.close()
    assert str(info.value) == "trace: line 200004 is not valid JSON (nested more than 100 levels deep)"


def test_bundled_trace_names_never_become_paths(app):
    pg = Playground(EngineProvider({"default": app.engine}))
    for label in ("../../etc/passwd", str(TRACES_DIR / "prose.json"), "prose"):
        with pytest.raises(ValidationError, match="choose one of the bundled traces"):
            pg.load_bundled(label, True)


def test_queue_is_bounded_and_generation_is_serialised(app):
    assert app.demo._queue.max_size == QUEUE_SIZE
    fns = {fn.api_name: fn for fn in app.demo.fns.values() if fn.api_name}
    assert fns["generate"].concurrency_limit == 1 and fns["generate"].concurrency_id == fns["compare"].concurrency_id
    assert fns["stop"].queue is False  # Stop is never stuck behind the generation it stops


def test_preset_dropdown_allows_registry_values_only(app):
    from dflash.loading.registry import PRESETS

    dropdown = next(b for b in app.demo.blocks.values() if getattr(b, "elem_id", None) == "preset")
    assert dropdown.allow_custom_value is False
    assert {c[1] for c in dropdown.choices} <= set(PRESETS)
    assert set(EngineProvider().presets) <= set(PRESETS)  # the app's loader offers registry presets only (which
    # of them: the operator's DFLASH_PRESETS, tests/test_ui_engines.py)


def test_stable_elem_ids(app):
    ids = {getattr(b, "elem_id", None) for b in app.demo.blocks.values()}
    assert {"prompt", "generate", "stop", "token-stream", "block-inspector", "block-length-plot", "acceptance-histogram",
            "stats", "compare"} <= ids


def test_large_presets_refuse_to_load_without_a_gpu():
    from dflash.errors import ModelLoadError
    from ui.engines import load_preset

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelLoadError, match="needs a CUDA GPU"):
        load_preset("qwen3-8b")


def test_prompt_text_never_reaches_html_unescaped(app):
    pg = Playground(EngineProvider({"default": app.engine}))
    values = dict(zip(CONTROL_KEYS, [defaults(8)[k] for k in CONTROL_KEYS]))
    values.update(prompt='<img src=x onerror="alert(1)">' + PROMPT, max_new_tokens=3)
    final = list(pg.generate(values, [], "s"))[-1]
    assert "<img" not in final["legend"] and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in final["legend"]
