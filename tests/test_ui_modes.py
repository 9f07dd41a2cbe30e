"""ui/modes.py and ui/race.py, and through the launched playground's API: the two modes, the numerics switch with
Compare's exact re-run, and the race after Compare."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client

from dflash.decode.engine import Engine
from dflash.loading.host import HostSettings
from dflash.decode.request import DEFAULT_MIN_BLOCK, DEFAULTS
from dflash.models.target import Target
from tests.ui_support import PROMPT, recorded_runs, tiny_text_engine
from ui import build_demo, launch_kwargs
from ui.engines import EngineProvider
from ui.handlers import CONTROL_KEYS, defaults
from ui.layout import OUT_KEYS
from ui.modes import CUSTOM, FASTEST, PAPER, mode_note, mode_of, mode_values, range_note
from ui.race import end_ms, race_html, playback, rate_at
from ui.render import run_stats
from ui.render_stats import comparison, compared_status, stats_html


def test_paper_method_is_the_draft_alone_at_its_trained_block_and_fastest_is_the_librarys_defaults():
    paper = mode_values(PAPER, 8, "bfloat16")
    assert paper == {"block_size": 8, "steps": 1, "lookup": 0, "adaptive": "fixed", "min_block": DEFAULT_MIN_BLOCK,
                     "max_block": 8, "acceptance": 1.0, "numerics": "bfloat16"}
    fast = mode_values(FASTEST, 8, "bfloat16")
    assert fast["adaptive"] == DEFAULTS["adaptive"] and fast["lookup"] == DEFAULTS["lookup_ngram"]
    assert fast["steps"] == DEFAULTS["diffusion_steps"] and fast["block_size"] == (DEFAULTS["block_size"] or 8)
    assert defaults(8, "bfloat16")["adaptive"] == "fixed" and defaults(8)["prompt"]  # the page opens in Paper method


def test_a_control_moved_away_from_its_mode_makes_it_custom_and_says_what_changed():
    values = mode_values(PAPER, 8, "float32")
    assert mode_of(values, 8, "float32") == PAPER and mode_of({**values, "block_size": 8.0}, 8, "float32") == PAPER
    assert mode_note(values, 8, "float32").startswith("**Paper method** sets Block size 8 · Denoising steps 1")
    moved = {**values, "block_size": 4}
    assert mode_of(moved, 8, "float32") == CUSTOM
    assert mode_note(moved, 8, "float32") == "**custom**: Paper method with Block size 4 (not 8)."


def test_every_block_size_the_page_moves_on_its_own_is_said():
    assert range_note("block_size", (16, 2, 8), (16, 2, 16)) == "Max block size set to 16, at least Block size (16)."
    assert range_note("block_size", (99, 2, 64), (64, 2, 64)) == "Block size 99 is out of range: 64 is used."
    assert range_note("min_block", (4, 2, 8), (4, 2, 8)) == ""


def test_the_race_ends_on_each_runs_own_tokens_per_second_and_comparisons_speedup():
    runs = recorded_runs()
    run, base = runs["mixed"], runs["baseline"]
    assert rate_at(run, 0.0) == (0, None)
    n, rate = rate_at(run, end_ms(run) + 1000)
    assert n == len(run[-1].output_ids) and rate == pytest.approx(run_stats(run)["tokens_per_s"])
    final = race_html(run, base, max(end_ms(run), end_ms(base)))
    speed = comparison(run, base)["speedup"]
    assert f'<b class="race-speedup">{speed:.2f}×</b>' in final and 'data-done="true"' in final
    clock = iter(range(10**6))  # one second per frame: the panes fill in order
    frames = list(playback(run, base, 0.0, clock=lambda: next(clock) / 1000 * max(end_ms(run), end_ms(base)) / 4,
                           sleep=lambda s: None))
    counts = [int(re.search(r"DFlash</b> · (\d+) token", f).group(1)) for f in frames]
    assert counts == sorted(counts) and counts[-1] == n and len(frames) >= 4


def test_a_tie_is_said_neutrally_and_a_real_difference_stays_an_error():
    base = recorded_runs()["baseline"]
    tie = {"identical": False, "first_diff": 43, "lossy": False, "dtype": "bfloat16", "n_compared": 64,
           "baseline_tokens_per_s": 10.0, "run_tokens_per_s": 12.0, "speedup": 1.2, "live_tokens_per_s": None,
           "diagnosis": {"verdict": "tie", "ref_token": 1, "run_token": 2, "ref_gap": 0.0, "run_gap": 0.01,
                         "bound": 0.5, "position": 43}}
    html = stats_html(base, tie)
    assert "≈ identical up to a numerical tie at token 43: the target&#x27;s top two tokens were equal in bfloat16" in html
    assert 'class="v tie" title="numerical tie (top-2 gaps 0 / 0.01' in html and "✗" not in html
    assert "outputs ≈ identical up to a numerical tie at token 43" in compared_status(tie, True, True)
    bug = {**tie, "diagnosis": {**tie["diagnosis"], "verdict": "error", "ref_gap": 3.0, "run_gap": 2.0}}
    assert 'class="v diff">✗ differs from the target&#x27;s own output at token 43: NOT a tie' in stats_html(base, bug)


# -- through the API: a bfloat16 engine whose float32 twin the numerics switch loads --------------------------------
def _engine(dtype: torch.dtype) -> Engine:
    """The tiny engine in `dtype` (a fresh model: the Target casts it in place), with the host settings a CPU load
    records, so that the page offers both numerics."""
    tiny = tiny_text_engine(block_size=8)
    target = Target(tiny.target.model, tiny.target.tokenizer, name="tiny", dtype=dtype)
    engine = Engine(target, tiny.draft, name="tiny")
    engine.host = HostSettings(dtype=str(dtype).removeprefix("torch."), threads=1, layout="linear", source="user")
    return engine


@pytest.fixture(scope="module")
def app():
    torch.set_num_threads(1)
    twins = []

    def twin(name, dtype, engine):
        twins.append((name, dtype))
        return _engine(getattr(torch, dtype))

    provider = EngineProvider({"default": _engine(torch.bfloat16)}, twin=twin)
    demo = build_demo(provider)
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False)
    yield SimpleNamespace(demo=demo, client=client, twins=twins)
    client.close()
    demo.close()


def _args(**over):
    d = {**defaults(8, "bfloat16"), "prompt": PROMPT, "max_new_tokens": 24, **over}
    return [d[k] for k in CONTROL_KEYS]


def _named(result) -> dict:
    return dict(zip([k for k in OUT_KEYS if k not in ("trace", "history")], result))


def test_numerics_run_in_the_chosen_dtype_and_the_exact_rerun_compares_in_float32(app):
    out = _named(app.client.predict(*_args(), api_name="/generate"))
    assert "bfloat16 (fast" in out["stats"] and app.twins == []
    compared = _named(app.client.predict(False, api_name="/compare"))
    assert "Compared with autoregressive" in compared["status"] and "bfloat16" in compared["stats"]
    exact = _named(app.client.predict(False, api_name="/compare_exactly"))
    assert app.twins == [("default", "float32")]  # loaded once, on first use
    assert "outputs ✓ identical" in exact["status"] and "float32 (exact)" in exact["stats"]
    again = _named(app.client.predict(*_args(numerics="float32"), api_name="/generate"))
    assert "float32 (exact)" in again["stats"] and app.twins == [("default", "float32")]


def test_numerics_the_host_does_not_offer_are_refused_by_name(app):
    with pytest.raises(Exception, match=r"Numerics: must be one of float32, bfloat16 for preset 'default', got 'float16'"):
        app.client.predict(*_args(numerics="float16"), api_name="/generate")
