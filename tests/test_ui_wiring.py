"""ui/wiring.py on a built (not launched) page with a tiny real engine: the HTTP API's endpoints take their inputs
and return their outputs in the documented order, Generate receives the controls by name through Gradio's own
call path, and the small helpers (output packing, the lossy-acceptance label, preset block sizes)."""

from __future__ import annotations

import asyncio

import gradio as gr
import pytest
import torch

from tests.ui_support import PROMPT, tiny_text_engine
from ui import build_demo
from ui.handlers import CONTROL_KEYS, defaults
from ui.wiring import OUT_KEYS, acceptance_label, block_updates, pack

# The components behind OUT_KEYS, as the API returns them (the two States are not sent to clients).
OUT_IDS = ["token-legend", "token-stream", "block-inspector", "block-length-plot", "acceptance-histogram",
           "position-acceptance-plot", "throughput-plot", "stats", "status", None, None, "history", "replay-step",
           "replay-label", "inspect-block", "export-trace", "export-metrics", "export-history"]
CONTROL_IDS = ["prompt", "preset", "block-size", "steps", "confidence", "acceptance", "lookup", "adaptive", "min-block",
               "max-block", "temperature", "top-p", "max-new-tokens", "seed", "show-rejected", "step-mode", "numerics",
               "trace-attention"]


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    return build_demo({"default": tiny_text_engine(block_size=8)})


def fn(demo, api_name: str):
    return next(f for f in demo.fns.values() if f.api_name == api_name)


def test_generate_takes_the_controls_by_name_in_their_order(demo):
    gen = fn(demo, "generate")
    assert [getattr(c, "elem_id", None) for c in gen.inputs] == CONTROL_IDS + [None]  # + the history State
    params = demo.get_api_info()["named_endpoints"]["/generate"]["parameters"]
    assert [p["parameter_name"] for p in params] == list(CONTROL_KEYS)
    assert [p["label"] for p in params][:3] == ["Prompt", "Model preset", "Block size"]


def test_every_redrawing_endpoint_returns_the_same_outputs(demo):
    for name in ("generate", "load_trace", "upload_trace"):
        assert [getattr(c, "elem_id", None) for c in fn(demo, name).outputs] == OUT_IDS, name
    for name in ("compare", "compare_exactly"):  # … and the exact re-run's button, offered after a tie
        assert [getattr(c, "elem_id", None) for c in fn(demo, name).outputs] == OUT_IDS + ["exact-rerun"], name
    for name in ("show_frame", "step_prev", "step_next", "play"):  # … and the Play / Pause buttons they switch
        assert [getattr(c, "elem_id", None) for c in fn(demo, name).outputs] == OUT_IDS + ["play", "pause"], name
    assert fn(demo, "compare").concurrency_id == fn(demo, "generate").concurrency_id == "engine"


def call(demo, api_name: str, inputs: list) -> list:
    """Run an event through Gradio's own call path (preprocessing, keyword inputs, the session's request), no
    server; returns its updates."""
    from gradio.state_holder import SessionState

    block_fn, state, request = fn(demo, api_name), SessionState(demo), gr.Request(session_hash="wiring-test")

    async def run() -> list:
        updates, iterator = [], None
        while True:
            r = await demo.process_api(block_fn=block_fn, inputs=inputs, state=state, request=request,
                                       iterator=iterator, session_hash="wiring-test")
            if not r["is_generating"]:
                return updates
            updates.append(r["data"])
            iterator = r["iterator"]

    return asyncio.run(run())


def test_generate_receives_each_control_under_its_name(demo):
    d = defaults(8)
    d.update(prompt=PROMPT, max_new_tokens=6, block_size=4)
    final = dict(zip(OUT_KEYS, call(demo, "generate", [d[k] for k in CONTROL_KEYS] + [[]])[-1]))
    assert "6 tokens" in final["status"] and 'data-n-out="6"' in final["stats"]
    d.update(block_size=999)
    with pytest.raises(gr.Error, match=r"Block size: must be in \[1, 64\], got 999"):
        call(demo, "generate", [d[k] for k in CONTROL_KEYS] + [[]])


def test_a_threshold_typed_below_the_slider_is_labelled_lossy(demo):
    """Gradio's own range check refused 0 before the label changed: the box said 0, the label "exact (lossless)"."""
    from gradio.state_holder import SessionState

    acc = next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "acceptance")
    block_fn = next(f for f in demo.fns.values() if f.inputs == [acc] and f.outputs == [acc])
    for typed, label in ((0, "LOSSY"), (-0.5, "LOSSY"), (1.0, "exact (lossless)")):
        out = asyncio.run(demo.process_api(block_fn=block_fn, inputs=[typed], state=SessionState(demo),
                                           request=gr.Request(session_hash="wiring-test")))
        assert label in out["data"][0]["label"], typed


def test_pack_skips_the_outputs_a_handler_leaves_out():
    packed = pack({"status": "s", "replay": 3})
    assert len(packed) == len(OUT_KEYS)
    assert packed[OUT_KEYS.index("status")] == "s" and packed[OUT_KEYS.index("replay")] == 3
    skip = gr.skip()
    assert all(v == skip for k, v in zip(OUT_KEYS, packed) if k not in ("status", "replay"))


def test_acceptance_label_warns_below_one_and_tolerates_junk():
    assert "LOSSY" in acceptance_label(0.5) and "LOSSY" in acceptance_label("0.95")
    assert "exact (lossless)" in acceptance_label(1.0) and "exact (lossless)" in acceptance_label("junk")
    assert "exact (lossless)" in acceptance_label(None)


def test_block_updates_follow_the_presets_draft():
    assert [u["value"] for u in block_updates(16)] == [16, 16]
    assert block_updates(None) == (gr.skip(), gr.skip())


@pytest.mark.parametrize("moved, typed, expected", [
    ("block-size", 16, (16, 2, 16)),  # past the max: the max follows
    ("block-size", 1, (1, 1, 8)),  # below the min: the min follows
    ("block-size", 5, (5, 2, 8)),  # inside: nothing else moves
    ("max-block", 4, (4, 2, 4)),  # below the block size: it follows
    ("min-block", 12, (12, 12, 12)),  # above both: both follow
    ("block-size", "NaN", (8, 2, 8)),  # not a size: left for the request to name
    ("block-size", 100, (64, 2, 64)),  # past the slider's end: its end, as the box shows it after losing focus
    ("max-block", 0, (1, 1, 1)),
])
def test_the_block_size_and_its_range_move_together(demo, moved, typed, expected):
    """The defaults tie the max block size to the draft's, so moving the block size past it was refused at Generate
    ("block_size: must be in [2, 8]"); the user's move now takes the other two along."""
    from gradio.state_holder import SessionState

    ids = ("block-size", "min-block", "max-block")
    comps = [next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == i) for i in ids]
    block_fn = next(f for f in demo.fns.values() if f.inputs == comps and f.outputs == comps
                    and f.targets[0][0] == comps[ids.index(moved)]._id)
    start = {"block-size": 8, "min-block": 2, "max-block": 8}
    values = [typed if i == moved else start[i] for i in ids]
    out = asyncio.run(demo.process_api(block_fn=block_fn, inputs=values, state=SessionState(demo),
                                       request=gr.Request(session_hash="wiring-test")))["data"]
    got = tuple(v if not isinstance(v, dict) else (v.get("value") if "value" in v else values[k]) for k, v in enumerate(out))
    assert got == tuple(typed if isinstance(typed, str) and i == moved else e for i, e in zip(ids, expected))


def test_the_sliders_span_what_the_engine_accepts(demo):
    """An error quoted the engine's range beside a slider that stopped short of it ("Denoising steps: must be an
    integer in [1, 16]" by a slider ending at 8; the n-gram's at 4 of 8)."""
    from dflash.decode.request import MAX_BLOCK_SIZE, MAX_NGRAM, MAX_STEPS

    ends = {c.elem_id: c.maximum for c in demo.blocks.values() if isinstance(c, gr.Slider)}
    assert (ends["steps"], ends["lookup"]) == (MAX_STEPS, MAX_NGRAM)
    assert ends["block-size"] == ends["min-block"] == ends["max-block"] == MAX_BLOCK_SIZE


def test_the_apis_return_values_are_named(demo):
    """Clients saw `value_38`, `value_39`, … for the status, the token stream and the charts."""
    labels = [r.get("label") or "" for r in demo.get_api_info()["named_endpoints"]["/generate"]["returns"]]
    assert "Status" in labels and "Token stream" in labels and "Statistics" in labels
    assert not [x for x in labels if not x or x.startswith("value_")], labels
