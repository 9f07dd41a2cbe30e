"""What the draft attends to, in the launched playground (gradio_client, tiny engine): a run with the checkbox ticked
shows the view under the block inspector and exports it in its trace, a run without does not, a version-1 trace
replays without it, and a bad value is named as the checkbox is labelled. The view's HTML is escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from dflash.decode import events as ev
from tests import test_app_api
from tests.ui_support import tiny_text_engine
from ui.render_attention import attention_html
from ui.replay import TRACE_VERSION, parse_trace
from ui.run_state import RunState

OLD_TRACE = Path(__file__).parent / "data" / "trace_v1_tiny.json"
VIEW = 'class="dfl-attn"'


app, named = test_app_api.app, test_app_api.named  # its fixture: the tiny engine's playground and a client


def args(**over):
    return test_app_api.args(**{"max_new_tokens": 24, "lookup": 0, "adaptive": "fixed", **over})


def block_one(client) -> str:
    """The inspector for block 1 at the session's last frame."""
    return named(client.predict(10**6, 1, True, api_name="/show_frame"))["inspector"]


def test_a_run_with_the_checkbox_shows_the_view_and_one_without_does_not(app):
    final = named(app.client.predict(*args(trace_attention=True), api_name="/generate"))
    assert "Finished" in final["status"]
    shown = block_one(app.client)
    assert VIEW in shown and "What the draft attends to" in shown and "KV injection" in shown
    assert "Draft layer 0" in shown and 'class="attn-anchor"' in shown
    trace_text = Path(final["export_trace"]).read_text(encoding="utf-8")
    assert json.loads(trace_text)["version"] == TRACE_VERSION
    steps = [e for e in parse_trace(trace_text).events if isinstance(e, ev.DraftStep)]
    assert steps and all(s.attention is not None for s in steps)

    final = named(app.client.predict(*args(), api_name="/generate"))  # the checkbox as a fresh page has it: off
    assert "Finished" in final["status"] and "Block 1" in block_one(app.client)
    assert VIEW not in block_one(app.client)
    steps = [e for e in parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8")).events
             if isinstance(e, ev.DraftStep)]
    assert steps and all(s.attention is None for s in steps)


def test_a_version_1_trace_replays_without_the_view(app):
    loaded = named(app.client.predict(handle_file(str(OLD_TRACE)), True, api_name="/upload_trace"))
    assert "Loaded" in loaded["status"]
    assert "Block 1" in block_one(app.client) and VIEW not in block_one(app.client)


def test_a_bad_value_is_named_as_the_checkbox_is_labelled(app):
    with pytest.raises(AppError, match="Record what the draft attends to: must be true or false"):
        app.client.predict(*args(trace_attention="yes"), api_name="/generate")


def test_token_texts_are_escaped_in_the_view():
    engine = tiny_text_engine(block_size=4)
    from dflash.decode.request import Request

    run = engine.generate(Request(prompt="<b>&'\"x</b> <script>", max_new_tokens=8, block_size=4, lookup_ngram=0,
                                  adaptive="fixed", trace_attention=True))
    html = attention_html(RunState.of(run.events).blocks[1])
    assert "<script>" not in html and "<b>" not in html and "&lt;" in html
