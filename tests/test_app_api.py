"""The launched playground through its API (gradio_client), on a tiny real engine: streaming, final statistics,
clear errors for bad parameters, Stop, Compare, replay and uploads — plus the handlers' deadline and step mode,
and one short run on the real default target."""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

from dflash.decode.engine import PREFILL_CHUNK
from dflash.errors import BusyError
from dflash.decode.events import Commit
from dflash.decode.request import Request
from tests.ui_support import PROMPT, paced, paced_text_engine, tiny_text_engine
from ui import build_demo, launch_kwargs, torch_thread
from ui.engines import EngineProvider
from ui.controls import user_message
from ui.handlers import CONTROL_KEYS, STOPPED_IN_QUEUE, USER_ERRORS, Playground, Settings, defaults
from ui import render
from ui.exports import HISTORY_COLUMNS, history_table
from ui.layout import OUT_KEYS
from ui.replay import bundled_traces, frames, load_trace_file, parse_trace
from ui.text import REPLAY_WAITS

CLIENT_KEYS = [k for k in OUT_KEYS if k not in ("trace", "history")]  # State outputs are not sent to clients


def args(**over):
    d = defaults(8)
    d.update(prompt=PROMPT, max_new_tokens=32, show_rejected=False)
    d.update(over)
    return [d[k] for k in CONTROL_KEYS]


def named(result) -> dict:
    return dict(zip(CLIENT_KEYS, result))


def n_tokens(html: str) -> int:
    return len(re.findall(r'class="tok tok-(?!rejected)', html))


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    torch.set_num_threads(1)
    engine = tiny_text_engine(block_size=8)
    demo = build_demo({"default": engine})
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))
    yield SimpleNamespace(demo=demo, url=url, client=client, engine=engine)
    client.close()
    demo.close()


def test_generation_streams_updates_and_ends_with_the_engines_statistics(app):
    job = app.client.submit(*args(max_new_tokens=48), api_name="/generate")
    final = named(job.result(timeout=600))
    outs = [named(o) for o in job.outputs()]
    counts = [n_tokens(o["tokens"]) for o in outs if isinstance(o["tokens"], str)]
    assert len(outs) >= 3 and counts == sorted(counts) and counts[-1] == 48
    assert "Finished (length)" in final["status"] and "48 tokens" in final["status"]
    # The exported trace is the run; the same request on the engine gives the same tokens and statistics.
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    direct = app.engine.generate(Request(**trace.events[0].request))
    assert trace.events[-1].output_ids == direct.output_ids
    assert trace.events[-1].stats["acceptance_lengths"] == direct.stats["acceptance_lengths"]
    assert f'data-tau="{direct.stats["tau"]:.4f}"' in final["stats"] and 'data-n-out="48"' in final["stats"]
    assert "· float32 (exact)</p>" in final["stats"]  # the hardware line ends with the dtype and its mode
    assert trace.events[0].request["deadline_s"] == Settings().deadline_s  # per-request deadline applied
    # The page opens in the Paper method: the draft alone at its trained block, fixed (the last block may be clipped).
    request, sizes = trace.events[0].request, trace.events[-1].stats["block_sizes"]
    assert (request["adaptive"], request["lookup_ngram"], request["block_size"]) == ("fixed", 0, 8)
    lengths = trace.events[-1].stats["acceptance_lengths"]  # blocks of 8, clipped only to the tokens left at the end
    assert sizes == [min(8, 48 - (1 + sum(lengths[:i])) + 1) for i in range(len(sizes))] and sizes[0] == 8
    for key in ("block_length", "histogram", "positions", "throughput"):
        fig = json.loads(final[key]["plot"])
        assert fig["data"], key
    assert json.loads(final["block_length"]["plot"])["data"][0]["y"] == trace.events[-1].stats["block_sizes"]
    rows = Path(final["export_metrics"]).read_text().splitlines()
    assert rows[0].startswith("block,source,start,block_size") and len(rows) == 1 + sum(
        1 for e in trace.events if type(e).__name__ == "Commit")
    assert final["history_table"]["data"][-1][CLIENT_HISTORY_TOKENS] == 48


CLIENT_HISTORY_TOKENS = HISTORY_COLUMNS.index("tokens")


def test_copying_from_the_context_through_the_api_keeps_the_targets_tokens(app):
    """The "Copy from context" slider reaches the engine: copied blocks are shown as such, and the tokens are the
    no-draft run's."""
    final = named(app.client.predict(*args(max_new_tokens=40, lookup=1), api_name="/generate"))
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    request = trace.events[0].request
    assert request["lookup_ngram"] == 1 and trace.events[-1].stats["copy_blocks"] > 0
    assert 'class="tok tok-copy' in final["tokens"] and "blocks copied from the context" in final["stats"]
    base = app.engine.generate(Request(**{**request, "use_draft": False}))
    assert trace.events[-1].output_ids == base.output_ids
    assert final["history_table"]["data"][-1][HISTORY_COLUMNS.index("lookup")] == 1
    names = [d["name"] for d in json.loads(final["positions"]["plot"])["data"]]  # the charts split by source
    assert names[-1] == "P(accept | reached), copied" and "drafted" in names[0]


def raw_call(app, api_name: str, body: str) -> str:
    """Call an event over Gradio's HTTP queue with a hand-written JSON body (gradio_client refuses NaN and
    infinity, a browser or script need not). Returns the error message, or "" on success."""
    import httpx

    fn = next(fn for fn in app.demo.fns.values() if fn.api_name == api_name)
    session = f"raw{time.monotonic_ns()}"
    payload = f'{{"data": {body}, "fn_index": {fn._id}, "session_hash": "{session}", "event_data": null}}'
    with httpx.Client(base_url=app.url, timeout=120) as http:
        r = http.post("gradio_api/queue/join", content=payload, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    return "" if msg.get("success") else str((msg.get("output") or {}).get("error"))
    return "no completion message"


def test_the_server_refuses_bad_values_by_name(app):
    """Over HTTP: a bad value from a client library (an AppError without internals), and values a client library
    cannot send, in a hand-written payload (NaN; a lone surrogate in JSON). Every other refusal: the next test."""
    with pytest.raises(AppError) as info:
        app.client.predict(*args(block_size=999), api_name="/generate")
    text = str(info.value)
    assert "Block size: must be in [1, 64], got 999" in text
    assert "Traceback" not in text and "/work" not in text and ".py" not in text
    for name, value, message in [("temperature", "NaN", "Temperature: must be a finite number, got nan"),
                                 ("prompt", '"bad \\ud800 text"', "Prompt: contains text that is not valid Unicode")]:
        data = [json.dumps(v) for v in args()] + ["[]"]  # + the history State
        data[CONTROL_KEYS.index(name)] = value
        assert message in raw_call(app, "generate", "[" + ", ".join(data) + "]")


def refusal(pg: Playground, **over) -> str:
    """The message the page shows for a request with `over` (what the server sends as its gr.Error: the handler's
    error in the page's words), from Generate's handler run in this process: its first step refuses the request."""
    values = dict(zip(CONTROL_KEYS, args(**over)))
    with pytest.raises(USER_ERRORS) as info:
        next(pg.generate(values, [], "refused"))
    return user_message(info.value)


@pytest.mark.parametrize("over, message", [
    # Values a client library cannot send (NaN, infinity, a lone surrogate): a raw payload can (the test above).
    ({"temperature": float("nan")}, "Temperature: must be a finite number, got nan"),
    ({"top_p": float("inf")}, "Top-p: must be a finite number, got inf"),
    ({"block_size": float("nan")}, "Block size: must be an integer in [1, 64], got nan"),
    ({"confidence": float("-inf")}, "Confidence threshold: must be a finite number"),
    ({"prompt": "bad \ud800 text"}, "Prompt: contains text that is not valid Unicode"),
    ({"block_size": 999}, "Block size: must be in [1, 64], got 999"),
    ({"block_size": 12}, "Block size: must be in [2, 8]"),
    ({"prompt": "x" * 40_000}, "Prompt: is 40000 characters; the limit is 32000"),
    ({"prompt": "   "}, "Prompt: must be a non-empty string"),
    ({"max_new_tokens": 100_000}, "Max new tokens: must be an integer in [1, 512] in the playground"),
    ({"max_new_tokens": 2.5}, "Max new tokens: must be an integer in [1, 512] in the playground, got 2.5"),
    ({"max_new_tokens": "ten"}, "Max new tokens: must be an integer in [1, 512] in the playground, got 'ten'"),
    ({"seed": None}, "Seed: must be an integer in [0, 2^63 - 1], got an empty value"),
    ({"min_block": 6, "max_block": 4, "block_size": 5}, "Max block size: must be >= Min block size (6), got 4"),
    ({"acceptance": 0.0}, "Acceptance threshold: must be in (0.0, 1.0]"),
    ({"steps": 2.5}, "Denoising steps: must be an integer"),
    ({"seed": -1}, "Seed: must be in [0,"),
    ({"adaptive": "yolo"}, "Policy: must be one of auto, fixed, slow-start, cost"),
    ({"lookup": 9}, "Copy from context: must be in [0, 8], got 9"),
    ({"preset": "../../etc/passwd"}, "Model preset: unknown preset"),
    ({"temperature": 10**400}, "Temperature: must be in [0.0, 2.0], got a number too large to represent"),
    # An API caller's string was read by bool(): "false" switched the option on.
    ({"step_mode": "false"}, "Step mode: must be true or false, got 'false'"),
    ({"show_rejected": "no"}, "Show rejected draft tokens: must be true or false, got 'no'"),
])
def test_bad_parameters_come_back_as_clear_errors(app, over, message):
    text = refusal(app.demo.playground, **over)
    assert message in text
    assert "Traceback" not in text and "/work" not in text and ".py" not in text


def test_a_checkbox_left_out_is_as_on_a_fresh_page(app):
    """A request with `show_rejected` null showed rejected tokens while a fresh page's box is unticked."""
    shown = {v: named(app.client.predict(*args(max_new_tokens=16, show_rejected=v), api_name="/generate"))["tokens"]
             for v in (None, False, True)}
    assert defaults()["show_rejected"] is False
    assert shown[None] == shown[False] != shown[True]


def test_a_refused_request_says_so_on_the_status_line(app):
    """The status line kept the previous run's words under Gradio's "Error" badge, as if that run had failed."""
    app.client.predict(*args(max_new_tokens=4), api_name="/generate")
    job = app.client.submit(*args(block_size=999), api_name="/generate")
    with pytest.raises(AppError, match="Block size: must be in"):
        job.result(timeout=120)
    assert named(job.outputs()[-1])["status"].startswith("**Not started:**")


def test_stop_cancels_the_run_and_frees_the_engine(app):
    job = app.client.submit(*args(max_new_tokens=400), api_name="/generate")  # the tiny model has 512 positions
    deadline = time.monotonic() + 300
    while len(job.outputs()) < 3 and not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    app.client.predict(api_name="/stop")
    final = named(job.result(timeout=300))
    assert "Finished (cancelled): stopped by the user" in final["status"]
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    assert trace.events[-1].reason == "cancelled" and len(trace.events[-1].output_ids) < 400
    assert not app.engine._lock.locked()
    assert app.demo.playground.stop(app.client.session_hash) == "Nothing is running."
    again = named(app.client.predict(*args(max_new_tokens=4), api_name="/generate"))
    assert "Finished (length)" in again["status"]


@pytest.fixture(scope="module")
def paced_app():
    """A target slowed to 0.05 s per forward pass, so a run is still going when the next request arrives."""
    engine = paced_text_engine(block_size=8, delay_s=0.05)
    demo = build_demo({"default": engine}, settings=Settings(play_delay_s=0.0))
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False)
    yield SimpleNamespace(demo=demo, url=url, client=client, engine=engine)
    client.close()
    demo.close()


def unchanged(value) -> bool:
    """What a client receives for an output that an update leaves as it is (gr.skip())."""
    return isinstance(value, dict) and value.get("__type__") == "update" and "value" not in value


def wait_for(condition, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def queued_behind_a_run(paced_app):
    """A long run of the app's client, and a second session whose short Generate waits in the queue behind it:
    yields (the running job, the second client, its waiting job)."""
    running = paced_app.client.submit(*args(max_new_tokens=400), api_name="/generate")
    wait_for(lambda: len(running.outputs()) >= 2)
    other = Client(paced_app.url, verbose=False)
    try:
        waiting = other.submit(*args(max_new_tokens=8), api_name="/generate")
        wait_for(lambda: waiting.status().code == Status.IN_QUEUE)
        yield running, other, waiting
    finally:
        other.close()


def test_one_session_flooding_generate_leaves_the_server_to_others(paced_app):
    """Twenty Generate joins from one session (before: 16 accepted, the queue's size, and every other visitor then got
    "Queue is full" for every button): one runs, one waits, the rest are refused at once with a message and take no
    place in the queue. Meanwhile another visitor loads and steps through a trace at once, and its Generate runs."""
    import httpx

    fn = next(fn for fn in paced_app.demo.fns.values() if fn.api_name == "generate")
    data = [json.dumps(v) for v in args(max_new_tokens=400)] + ["[]"]  # + the history State
    flood = f"flood{time.monotonic_ns()}"
    body = f'{{"data": [{", ".join(data)}], "fn_index": {fn._id}, "session_hash": "{flood}", "event_data": null}}'
    with httpx.Client(base_url=paced_app.url, timeout=60) as http:
        answers = [http.post("gradio_api/queue/join", content=body, headers={"content-type": "application/json"})
                   for _ in range(20)]
        codes = [r.status_code for r in answers]
        assert codes.count(200) == 2 and codes.count(422) == 18, codes  # the second may come once the first runs
        assert codes[0] == 200
        refused = next(r for r in answers if r.status_code == 422)
        assert "this session already has a request waiting for its turn" in refused.text
        visitor = Client(paced_app.url, verbose=False)
        try:
            started = time.monotonic()
            loaded = named(visitor.predict(next(iter(bundled_traces())), True, api_name="/load_trace"))
            stepped = named(visitor.predict(1, 0, True, api_name="/step_prev"))
            assert loaded["status"].startswith("**Loaded bundled trace:**") and stepped["replay"] == 0
            assert time.monotonic() - started < 30  # not behind the flood's runs (each ~20 s or more here)
            job = visitor.submit(*args(max_new_tokens=4), api_name="/generate")  # waits behind the flood's two
            wait_for(lambda: job.status().code == Status.IN_QUEUE)
            paced_app.demo.playground.stop(flood)  # the flood's running and waiting requests end
            assert "Finished (length)" in named(job.result(timeout=300))["status"]
        finally:
            visitor.close()


def test_stop_reaches_a_request_waiting_in_the_queue(paced_app):
    with queued_behind_a_run(paced_app) as (running, other, waiting):
        assert not running.done()
        assert other.predict(api_name="/stop") == STOPPED_IN_QUEUE  # shown at once, not when its turn comes
        paced_app.client.predict(api_name="/stop")
        assert "stopped by the user" in named(running.result(timeout=300))["status"]
        final = named(waiting.result(timeout=300))
        assert final["status"] == STOPPED_IN_QUEUE  # and nothing else changes: it never ran
        assert all(unchanged(value) for key, value in final.items() if key != "status")
        assert [named(o)["status"] for o in waiting.outputs()] == [STOPPED_IN_QUEUE]
        # Nothing is left marked: the session's next request runs.
        assert unchanged(other.predict(api_name="/stop"))  # "Nothing is running." is not shown: it could hide a result
        again = named(other.predict(*args(max_new_tokens=4), api_name="/generate"))
        assert "Finished (length)" in again["status"]


def test_a_request_cancelled_in_the_queue_is_not_stopped_in_place_of_the_next(paced_app):
    """A client may cancel its request while it waits (gradio_client's Job.cancel): it never starts, so a later
    Stop must not count it as waiting (before, that Stop dropped the session's next Generate instead)."""
    with queued_behind_a_run(paced_app) as (running, other, waiting):
        assert waiting.cancel()
        paced_app.client.predict(api_name="/stop")
        assert "stopped by the user" in named(running.result(timeout=300))["status"]
        assert unchanged(other.predict(api_name="/stop"))  # nothing of this session waits or runs
        again = named(other.predict(*args(max_new_tokens=4), api_name="/generate"))
        assert "Finished (length)" in again["status"]


def test_a_refused_request_leaves_nothing_for_stop(app):
    """A request is counted for Stop when it enters the queue; one refused for a bad value is not left over."""
    with pytest.raises(AppError, match="Block size"):
        app.client.predict(*args(block_size=999), api_name="/generate")
    assert app.demo.playground.stop(app.client.session_hash) == "Nothing is running."
    assert "Finished (length)" in named(app.client.predict(*args(max_new_tokens=4), api_name="/generate"))["status"]


def test_play_is_refused_while_a_generation_of_the_session_runs(paced_app):
    client = Client(paced_app.url, verbose=False)
    try:
        client.predict(next(iter(bundled_traces())), True, api_name="/load_trace")  # something to replay
        job = client.submit(*args(max_new_tokens=50), api_name="/generate")
        wait_for(lambda: len(job.outputs()) >= 2)
        with pytest.raises(AppError, match="a generation is running in this session: Play replays once it has "
                                           "finished"):
            client.predict(0, 0, True, api_name="/play")
        with paced(paced_app.engine, 0.0):  # the rest of the run at full speed
            final = named(job.result(timeout=300))
        assert "Finished (length)" in final["status"] and "50 tokens" in final["status"]  # it was not stopped
        played = named(client.predict(0, 0, True, api_name="/play"))  # the run just generated, to its end
        assert played["replay"] == final["replay"]["value"] and "finished" in played["replay_label"]
    finally:
        client.close()


def test_replay_controls_leave_a_running_generation_alone(paced_app):
    """Prev / Next / the step slider during a generation of the session: they say so and draw nothing (before, they
    painted the previous run's frame over the live view); afterwards they replay the new run."""
    client = Client(paced_app.url, verbose=False)
    try:
        client.predict(next(iter(bundled_traces())), True, api_name="/load_trace")  # a previous trace in the session
        job = client.submit(*args(max_new_tokens=50), api_name="/generate")
        wait_for(lambda: len(job.outputs()) >= 2)
        for api in ("/step_next", "/step_prev", "/show_frame"):
            out = named(client.predict(0, 0, True, api_name=api))
            assert out["replay_label"] == REPLAY_WAITS, api
            assert all(unchanged(v) for k, v in out.items() if k != "replay_label"), api
        with paced(paced_app.engine, 0.0):  # the rest of the run at full speed
            final = named(job.result(timeout=300))
        assert "Finished (length)" in final["status"]
        stepped = named(client.predict(0, 0, True, api_name="/step_next"))
        assert stepped["replay_label"].startswith("Frame 1/")
    finally:
        client.close()


def test_the_rejected_switch_changed_during_a_run_holds_for_its_final_view():
    """The switch's handler changes the running generation's look (SessionRuns.look); the run's last update is
    drawn with it (before, with the value the run started with)."""
    pg = Playground(EngineProvider({"default": tiny_text_engine(block_size=8)}))
    values = {**defaults(8), "prompt": PROMPT, "max_new_tokens": 24, "show_rejected": False}
    run = pg.generate(values, [], "s1")
    next(run)
    look = pg.runs.look("s1")
    assert look is not None and look.show_rejected is False and pg.runs.look("other") is None
    look.show_rejected = True
    *_, final = run
    assert "tok-rejected" in final["tokens"] and pg.runs.look("s1") is None


def test_compare_with_autoregressive_shows_speedup_and_identical_output(app):
    app.client.predict(*args(max_new_tokens=24), api_name="/generate")
    final = named(app.client.predict(False, api_name="/compare"))
    assert "Compared with autoregressive" in final["status"] and "outputs ✓ identical" in final["status"]
    assert "✓ identical to the target&#x27;s own output" in final["stats"] and "speedup" in final["stats"]
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    assert trace.baseline is not None and trace.baseline[-1].output_ids == trace.events[-1].output_ids
    assert not trace.baseline[0].has_draft
    assert len(json.loads(final["throughput"]["plot"])["data"]) == 2
    row = final["history_table"]["data"][-1]
    assert row[-1] == "✓" and row[-2].endswith("×") and float(row[-2][:-1]) > 0  # "1.00×": a bare 1 read as a count


def test_compare_times_the_run_again_beside_the_baseline(app, monkeypatch):
    """A live run's own rate pays for drawing every frame of the page and the baseline's would not: Compare runs the
    request again and then without the draft, both drawn alike, and compares those two."""
    app.client.predict(*args(max_new_tokens=24), api_name="/generate")
    shown = parse_trace(Path(named(app.client.predict(False, api_name="/compare"))["export_trace"]).read_text(encoding="utf-8"))
    asked, real = [], app.engine.stream

    def recording(request, *rest, **kw):
        asked.append((request.use_draft, request.max_new_tokens))
        return real(request, *rest, **kw)

    monkeypatch.setattr(app.engine, "stream", recording)
    final = named(app.client.predict(False, api_name="/compare"))
    n = len(shown.events[-1].output_ids)
    assert asked == [(True, n), (False, n)]  # the run again, then the baseline, back to back
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    assert trace.events[-1].output_ids == shown.events[-1].output_ids  # the timed run repeats the shown one …
    assert trace.events[-1].stats != shown.events[-1].stats  # … as a run of its own, which the trace now keeps
    run_tps, base_tps = trace.events[-1].stats["tokens_per_s"], trace.baseline[-1].stats["tokens_per_s"]
    assert f"DFlash {run_tps:.1f} tok/s, baseline {base_tps:.1f} tok/s (timed back to back)" in final["status"]
    assert f"speedup {run_tps / base_tps:.2f}×" in final["status"]
    assert "timed again right before the baseline" not in final["stats"]  # one tok/s per run: the timed run is shown
    curves = json.loads(final["throughput"]["plot"])["data"]
    assert curves[0]["y"][-1] == n and curves[0]["x"][-1] == pytest.approx(trace.events[-2].t_ms / 1000, abs=1e-3)
    assert final["history_table"]["data"][-1][HISTORY_COLUMNS.index("tok/s")] == round(run_tps, 2)
    # Every view now shows the timed run (the cost policy's blocks follow timings, so they may differ from the shown
    # run's): charts, statistics, tokens, the replay and block pickers' ranges and the history row.
    stats = trace.events[-1].stats
    assert json.loads(final["block_length"]["plot"])["data"][0]["y"] == stats["block_sizes"]
    assert f'data-tau="{stats["tau"]:.4f}"' in final["stats"] and n_tokens(final["tokens"]) == n
    assert final["replay"]["maximum"] == len(frames(trace.events)) - 1
    assert final["inspect_block"]["maximum"] == max(e.block for e in trace.events if hasattr(e, "block"))
    assert final["history_table"]["data"][-1][HISTORY_COLUMNS.index("τ")] == round(stats["tau"], 2)


def test_compare_keeps_a_stopped_run_as_the_user_left_it():
    """Compare repeats a run for just the tokens it produced: for a run the user stopped that repetition ends by
    length, and it replaced the run in the views and the history (finish "length", max new = the tokens made)."""
    pg = Playground(EngineProvider({"default": paced_text_engine(block_size=8, delay_s=0.02)}))
    values = dict(zip(CONTROL_KEYS, args(max_new_tokens=300)))
    outs = []
    for out in pg.generate(values, [], "s"):
        outs.append(out)
        if len(outs) == 4:
            pg.stop("s")
    stopped = outs[-1]
    column = {k: HISTORY_COLUMNS.index(k) for k in ("finish", "max new", "identical")}
    row = history_table(stopped["history"])[-1]
    assert "stopped by the user" in stopped["status"] and row[column["finish"]] == "cancelled"
    *_, compared = pg.compare(stopped["trace"], stopped["history"], False, "s")
    assert "Compared with autoregressive" in compared["status"] and "outputs ✓ identical" in compared["status"]
    row = history_table(compared["history"])[-1]
    assert (row[column["finish"]], row[column["max new"]], row[column["identical"]]) == ("cancelled", 300, "✓")
    assert render.finished(compared["trace"]["replay"].trace.events).reason == "cancelled"
    # The statistics keep the stopped run's own (live) rate; the comparison beside them shows the timed run's, from
    # which the speedup is computed, so the three numbers shown together agree.
    comp = compared["trace"]["compare"]
    timed = f'<div class="k">run tokens / s (timed)</div><div class="v">{comp["run_tokens_per_s"]:.1f}</div>'
    assert timed in compared["stats"]
    assert comp["speedup"] == pytest.approx(comp["run_tokens_per_s"] / comp["baseline_tokens_per_s"])


def test_every_forward_of_a_request_runs_on_the_torch_thread(app):
    """All of the server's torch work on one thread (ui/torch_thread.py): OpenMP gives every thread that runs a
    parallel operator a team of its own, and more teams than cores make every operator slower."""
    names: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda *_: names.append(threading.current_thread().name))
             for m in (app.engine.target.model, app.engine.draft)]
    try:
        app.client.predict(*args(max_new_tokens=16), api_name="/generate")
        app.client.predict(False, api_name="/compare")
    finally:
        for h in hooks:
            h.remove()
    assert len(names) > 10 and all(n.startswith(torch_thread.NAME) for n in names), set(names)


def test_compare_needs_a_run_of_this_session(app):
    fresh = Client(app.url, verbose=False)
    try:
        with pytest.raises(AppError, match="Compare with autoregressive: needs a run from this session"):
            fresh.predict(False, api_name="/compare")
    finally:
        fresh.close()


def test_replay_bundled_and_uploaded_traces(app, tmp_path):
    label = next(iter(bundled_traces()))
    loaded = named(app.client.predict(label, True, api_name="/load_trace"))
    assert f"Loaded bundled trace:** {label}" in loaded["status"]
    last = loaded["replay"]["value"]  # a slider update: {"maximum": .., "value": ..}
    assert loaded["replay"]["maximum"] == last
    assert loaded["replay_label"].startswith(f"Frame {last}/{last}: finished")
    # The downloads follow the trace shown (they kept the session's last run's files); the history's stays the runs'.
    original = load_trace_file(bundled_traces()[label])
    exported = parse_trace(Path(loaded["export_trace"]).read_text(encoding="utf-8"))
    assert Path(loaded["export_trace"]).name == "dflash-bundled-trace.json"
    assert [e.output_ids for e in exported.events[-1:]] == [original.events[-1].output_ids]
    assert Path(loaded["export_metrics"]).read_text().count("\n") == 1 + sum(isinstance(e, Commit) for e in original.events)
    assert loaded["export_history"] == {"__type__": "update"}  # skipped: left as it was
    prev = named(app.client.predict(last, 0, True, api_name="/step_prev"))
    assert prev["replay"] == last - 1 and prev["replay_label"].startswith(f"Frame {last - 1}/{last}")
    first = named(app.client.predict(0, 0, True, api_name="/show_frame"))
    assert "the request starts" in first["replay_label"] and "No tokens yet at this point of the run" in first["tokens"]
    nxt = named(app.client.predict(0, 0, True, api_name="/step_next"))
    assert nxt["replay"] == 1
    # A frame or block typed past the end shows the last one and the slider follows (Gradio's own range check
    # refused it before: "Value 1000000 is greater than maximum value …", naming no control).
    far = named(app.client.predict(10**6, 10**6, True, api_name="/show_frame"))
    assert far["replay"] == last and far["replay_label"].startswith(f"Frame {last}/{last}: finished")
    n_blocks = max(e.block for e in original.events if isinstance(e, Commit))
    assert far["inspect_block"] == n_blocks and f"Block {n_blocks}" in far["inspector"]  # the block box follows too
    assert named(app.client.predict(last, -3, True, api_name="/show_frame"))["inspect_block"] == 0  # 0 = the latest
    assert named(app.client.predict(10**6, 0, True, api_name="/step_prev"))["replay"] == last - 1
    assert unchanged(named(app.client.predict(1, 0, True, api_name="/show_frame"))["replay"])  # in range: left alone
    assert named(app.client.predict(2.6, 0, True, api_name="/show_frame"))["replay"] == 3  # a fraction rounds (was: the end)
    up = named(app.client.predict(handle_file(str(bundled_traces()[label])), True, api_name="/upload_trace"))
    assert "Loaded upload trace" in up["status"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dflash-trace", "version": 1, "events": [{"type": "Evil"}]}')
    with pytest.raises(AppError, match="not a DFlash event"):
        app.client.predict(handle_file(str(bad)), True, api_name="/upload_trace")
    # Our own message (Gradio's "not in the list of choices" named no control and logged a traceback).
    with pytest.raises(AppError, match="trace: choose one of the bundled traces"):
        app.client.predict("../../../etc/passwd", True, api_name="/load_trace")
    with pytest.raises(AppError, match="Show rejected draft tokens: must be true or false, got 'false'"):
        app.client.predict(1, 0, "false", api_name="/show_frame")


def test_the_api_names_every_parameter_of_the_replay_and_compare_endpoints(app):
    """Gradio names an endpoint's parameters after its handler's: they were `show_v`, `f`, `b` and `s`."""
    endpoints = app.client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    names = {api: [p["parameter_name"] for p in endpoints[api]["parameters"]]
             for api in ("/compare", "/show_frame", "/step_next", "/play", "/load_trace", "/upload_trace")}
    assert names == {"/compare": ["show_rejected"], "/show_frame": ["frame", "block", "show_rejected"],
                     "/step_next": ["frame", "block", "show_rejected"], "/play": ["frame", "block", "show_rejected"],
                     "/load_trace": ["label", "show_rejected"], "/upload_trace": ["path", "show_rejected"]}


def test_one_generation_at_a_time(app):
    fns = {fn.api_name: fn for fn in app.demo.fns.values() if fn.api_name}
    for name in ("generate", "compare"):
        assert fns[name].concurrency_id == "engine" and fns[name].concurrency_limit == 1
    assert app.demo._queue.max_size == 16
    other = Client(app.url, verbose=False)
    try:
        jobs = [c.submit(*args(max_new_tokens=16), api_name="/generate") for c in (app.client, other)]
        for j in jobs:
            assert "Finished (length)" in named(j.result(timeout=600))["status"]
    finally:
        other.close()


def test_each_session_numbers_its_own_runs_and_keeps_a_bounded_history(app):
    """Two sessions at once: run numbers count the session's own runs (before, one counter for the server: a
    visitor's first run could be "Run 37"), and the history keeps the session's latest `history_rows` runs (it is
    sent back and written to a new history CSV at every run: unbounded, a scripted session grew both without end)."""
    demo = build_demo({"default": app.engine}, settings=Settings(history_rows=2))
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    try:
        first = named(a.predict(*args(max_new_tokens=2), api_name="/generate"))
        for _ in range(3):  # numbered 1, 2, 3 although session a ran first
            last = named(b.predict(*args(max_new_tokens=2), api_name="/generate"))
        runs = HISTORY_COLUMNS.index("run")
        assert [r[runs] for r in first["history_table"]["data"]] == [1]
        assert [r[runs] for r in last["history_table"]["data"]] == [2, 3]
        assert Path(last["export_trace"]).name == "dflash-run3-trace.json"
        rows = Path(last["export_history"]).read_text(encoding="utf-8").splitlines()
        assert len(rows) == 3 and [r.split(",")[runs] for r in rows[1:]] == ["2", "3"]
    finally:
        a.close()
        b.close()
        demo.close()


# -- handlers without HTTP -----------------------------------------------------------------------------------------
def test_deadline_ends_the_request(app):
    pg = Playground(EngineProvider({"default": app.engine}), Settings(deadline_s=0.001))
    values = dict(zip(CONTROL_KEYS, args(max_new_tokens=200)))
    final = list(pg.generate(values, [], "s"))[-1]
    assert "Finished (timeout)" in final["status"] and "deadline of 0.001 s reached" in final["status"]


def test_a_request_stopped_while_reading_its_prompt_says_how_far_it_got(app):
    """A prompt of the allowed length can spend the whole deadline in its prefill on a slow CPU: the status said
    "0 tokens in 0.0 s" after two minutes."""
    pg = Playground(EngineProvider({"default": app.engine}), Settings(deadline_s=0.001))
    values = dict(zip(CONTROL_KEYS, args(max_new_tokens=8)))
    app.engine.prefill_chunk = 2
    try:
        status = list(pg.generate(values, [], "s"))[-1]["status"]
    finally:
        app.engine.prefill_chunk = PREFILL_CHUNK
    assert re.search(r"deadline of 0\.001 s reached (while|before) reading the prompt", status)
    assert status.endswith(" 0 tokens") and " s · " not in status


def test_a_request_waits_for_an_engine_busy_outside_the_queue_within_its_deadline(app):
    """Something outside the queue (a notebook, a script) holds the engine: the request waits in its handler's
    thread, never on the torch thread, which the run it waits for needs; then it fails by name."""
    pg = Playground(EngineProvider({"default": app.engine}), Settings(deadline_s=0.3))
    holder = app.engine.stream(Request(prompt=PROMPT, max_new_tokens=4))
    next(holder)  # takes the engine's lock
    try:
        start = time.monotonic()
        with pytest.raises(BusyError, match="stayed busy with another request for the deadline of 0.3 s"):
            list(pg.generate(dict(zip(CONTROL_KEYS, args(max_new_tokens=4))), [], "s"))
        assert 0.3 <= time.monotonic() - start < 5
    finally:
        holder.close()
    assert not app.engine.busy
    # Served again (by a playground whose deadline a loaded machine's 4 tokens cannot outlast: 0.3 s could, and the
    # run then finished by its deadline instead of its length)
    again = Playground(EngineProvider({"default": app.engine}), Settings(deadline_s=60))
    final = list(again.generate(dict(zip(CONTROL_KEYS, args(max_new_tokens=4))), [], "s"))[-1]
    assert "Finished (length)" in final["status"]


def test_stop_reaches_a_request_waiting_for_a_busy_engine(app):
    pg = Playground(EngineProvider({"default": app.engine}), Settings(deadline_s=60))
    holder = app.engine.stream(Request(prompt=PROMPT, max_new_tokens=4))
    next(holder)
    raised: list = []

    def run():
        try:
            list(pg.generate(dict(zip(CONTROL_KEYS, args(max_new_tokens=4))), [], "s"))
        except BusyError as exc:
            raised.append(str(exc))

    waiting = threading.Thread(target=run)
    try:
        waiting.start()
        time.sleep(0.3)
        assert pg.stop("s") == "Stopping after the current step…"
        waiting.join(timeout=10)
        assert not waiting.is_alive() and raised == ["stopped while waiting for the engine, which another request was using"]
    finally:
        holder.close()


def test_stop_takes_effect_within_one_step(app):
    pg = Playground(EngineProvider({"default": app.engine}), Settings(refresh_s=0.0))
    gen = pg.generate(dict(zip(CONTROL_KEYS, args(max_new_tokens=300))), [], "s")
    for i, out in enumerate(gen):
        if i == 4:  # the generator (and the engine inside it) is paused right after a commit
            verified = int(re.search(r"(\d+) verify steps", out["status"]).group(1))
            assert pg.stop("s") == "Stopping after the current step…"
            break
    final = list(gen)[-1]
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    assert trace.events[-1].reason == "cancelled"
    assert sum(type(e).__name__ == "Verify" for e in trace.events) <= verified + 1
    assert not app.engine._lock.locked()


def test_step_mode_records_then_starts_at_the_first_step(app):
    pg = Playground(EngineProvider({"default": app.engine}))
    values = dict(zip(CONTROL_KEYS, args(max_new_tokens=8, step_mode=True)))
    outs = list(pg.generate(values, [], "s"))
    assert all(set(o) <= {"status", "legend", "tokens", "inspector", "stats", "block_length", "histogram", "positions",
                          "throughput", "replay_label"} for o in outs[:-1])
    assert all("tokens" not in o for o in outs[1:-1])  # no animation while recording
    final = outs[-1]
    assert final["replay"]["value"] == 0 and "Step mode" in final["status"]
    # Its first frame has no token yet: the stream says so (it said "Press Generate", which had just been pressed).
    assert "No tokens yet at this point of the run" in final["tokens"] and "Press Generate" not in final["tokens"]
    stepped = pg.step(final["trace"], 0, 1, 0, True)
    assert stepped["replay"] == 1 and "Frame 1/" in stepped["replay_label"]


def test_unexpected_errors_are_shown_without_internals():
    def broken_loader(name):
        raise RuntimeError("secret detail at /srv/models/x.py line 3")

    demo = build_demo(broken_loader)
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False)
    try:
        with pytest.raises(AppError) as info:
            client.predict(*args(), api_name="/generate")
        assert "secret" not in str(info.value) and "Something went wrong on the server" in str(info.value)
    finally:
        client.close()
        demo.close()


# -- the real default target -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_short_generation_on_the_default_target_with_a_random_draft_is_lossless(real_engine):
    """The session's engine (conftest): the real target with a random draft of the default's shape, block 8."""
    from ui.engines import load_preset
    from ui.text import NO_DRAFT_NOTICE
    from dflash.loading.load import default_draft_available
    from dflash.loading.registry import get_preset

    torch.set_num_threads(2)
    engine = real_engine
    demo = build_demo({"default": engine})
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False)
    try:
        d = defaults(engine.draft.config.block_size)
        d.update(prompt="What is 2 + 2?", max_new_tokens=5, block_size=4)
        final = named(client.predict(*[d[k] for k in CONTROL_KEYS], api_name="/generate"))
        trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
        fin = trace.events[-1]
        assert fin.reason in ("length", "eos") and fin.stats["n_output_tokens"] >= 1
        ref = engine.generate(Request(prompt="What is 2 + 2?", max_new_tokens=5, use_draft=False))
        assert fin.output_ids == ref.output_ids  # greedy DFlash == the target's own output
        assert f'data-n-out="{fin.stats["n_output_tokens"]}"' in final["stats"]
    finally:
        client.close()
        demo.close()
    # The app's loader: the trained draft when it exists, else the target alone with a notice.
    loaded, notice = load_preset("default")
    if default_draft_available(get_preset("default").draft):
        # The notice states the draft's measured τ and speed, read from the committed evaluation file.
        doc = json.loads((Path(get_preset("default").draft) / "evaluation.json").read_text())
        mt, default = doc["evaluations"]["mtbench"], doc["default_policy"]
        assert loaded.drafter is not None and f"τ = {mt['tau']:.2f}" in notice and f"{mt['speedup']:.2f}×" in notice
        assert "default block-size policy" in notice and f"{default['speedup']:.2f}×" in notice
    else:
        assert loaded.drafter is None and notice == NO_DRAFT_NOTICE


def test_a_compare_stopped_during_the_baseline_says_so_in_words():
    pg = Playground(EngineProvider({"default": paced_text_engine(block_size=8, delay_s=0.02)}))
    *_, done = pg.generate(dict(zip(CONTROL_KEYS, args(max_new_tokens=40))), [], "s")
    statuses = []
    for out in pg.compare(done["trace"], done["history"], False, "s"):
        statuses.append(out.get("status", ""))
        if "Running the autoregressive baseline" in statuses[-1]:
            pg.stop("s")
    assert statuses[-1] == "**Baseline stopped by the user:** nothing compared.", statuses[-3:]
    assert not pg.engines.get("default")._lock.locked()
