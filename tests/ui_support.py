"""Engines with text for the playground tests: the tiny random models of conftest.py plus a real character
tokenizer (so prompts are text, as in the app). The real default target: conftest's session fixtures.

No downloads. The character tokenizer maps each of 256 ids to one printable character; it is a genuine
`tokenizers` BPE model with no merges, so encode/decode round-trip exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch

from dflash.decode.engine import Engine
from dflash.models.target import Target
from tests.conftest import VOCAB, tiny_draft, tiny_target


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = ["<unk>", "\n"] + [chr(c) for c in range(32, 127)] + [chr(c) for c in range(161, 256) if c != 173]
    chars += [chr(c) for c in range(0x391, 0x3CA) if chr(c).isalpha()]  # Greek to fill up the vocabulary
    chars = chars[:VOCAB]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def tiny_text_engine(block_size: int = 8, seed: int = 0, name: str = "tiny", draft: bool = True) -> Engine:
    """A tiny random Llama target with a character tokenizer and (unless draft=False) a tiny random DFlash draft."""
    base = tiny_target("llama", seed=seed)
    target = Target(base.model, char_tokenizer(), name=name)
    return Engine(target, tiny_draft(target, block_size=block_size, seed=seed + 1) if draft else None, name=name)


PROMPT = "Once upon a time"


def _partly_right_drafter():
    from tests.engine_helpers import ScriptedDrafter

    class PartlyRight(ScriptedDrafter):
        """The target's own continuation, except a wrong token at every 7th absolute position."""

        def token_at(self, t: int) -> int:
            ref = self.reference(t)
            return ref if t % 7 else (ref + 1) % self.vocab_size

    return PartlyRight


@lru_cache(maxsize=1)
def recorded_runs() -> dict[str, list]:
    """Event streams recorded from real engine runs on the tiny models, shared by the UI test modules:
    - mixed: proposals right except at every 7th position (accepted, corrected and bonus tokens; slow-start);
    - baseline: the same prompt without a draft (autoregressive);
    - denoise: the random tiny draft with 3 denoising steps, one position committed per step until the last;
    - lossy: the random tiny draft with acceptance threshold 0.05 (relaxed, lossy acceptances);
    - copy: the random tiny draft, copying from the context first (lookup_ngram=1: copied and drafted blocks).
    The draft runs before `copy` run the draft alone (lookup_ngram=0), as the paper does."""
    from tests.engine_helpers import with_drafter
    from dflash.decode.request import Request

    torch.set_num_threads(1)
    engine = tiny_text_engine(block_size=8)
    base = engine.generate(Request(prompt=PROMPT, max_new_tokens=40, use_draft=False))
    full = engine.prompt_ids(Request(prompt=PROMPT)) + base.output_ids
    with_drafter(engine, _partly_right_drafter(), full)
    try:
        mixed = engine.generate(Request(prompt=PROMPT, max_new_tokens=40, block_size=4, adaptive="slow-start",
                                        min_block_size=2, max_block_size=8, lookup_ngram=0))
    finally:
        with_drafter(engine, None, full)
    denoise = engine.generate(Request(prompt=PROMPT, max_new_tokens=16, block_size=8, diffusion_steps=3,
                                      confidence_threshold=1.0, lookup_ngram=0))
    lossy = engine.generate(Request(prompt=PROMPT, max_new_tokens=30, block_size=4, acceptance_threshold=0.05,
                                    lookup_ngram=0))
    copy = engine.generate(Request(prompt=PROMPT, max_new_tokens=40, block_size=4, lookup_ngram=1))
    return {"mixed": mixed.events, "baseline": base.events, "denoise": denoise.events, "lossy": lossy.events,
            "copy": copy.events}


class PacedTarget(Target):
    """A real target whose every forward pass also waits `delay_s`: the tiny model is too fast to press Stop
    in the middle of a run from a browser on a busy machine. Outputs are unchanged."""

    delay_s = 0.05

    def forward(self, ids, cache, last_only=False, capture=True):
        import time

        time.sleep(self.delay_s)
        return super().forward(ids, cache, last_only=last_only, capture=capture)


def paced_text_engine(block_size: int = 8, delay_s: float = 0.05) -> Engine:
    engine = tiny_text_engine(block_size)
    target = PacedTarget(engine.target.model, engine.target.tokenizer, name="tiny-paced")
    target.delay_s = delay_s
    return Engine(target, engine.draft, name="tiny-paced")


@contextmanager
def paced(engine: Engine, delay_s: float = 0.05) -> Iterator[None]:
    """A paced engine's forward passes wait `delay_s` inside the block only (a test that must press Stop or queue
    behind a run), so the module's other tests do not wait on every token."""
    before, engine.target.delay_s = engine.target.delay_s, delay_s
    try:
        yield
    finally:
        engine.target.delay_s = before


@contextmanager
def served_tiny_app(play_delay_s: float) -> Iterator[str]:
    """The playground on the tiny text engine (blocks of 8), served on a free port; yields its URL. `play_delay_s`:
    Play's pause between frames."""
    from ui import build_demo, launch_kwargs
    from ui.handlers import Settings

    torch.set_num_threads(1)
    demo = build_demo({"default": tiny_text_engine(block_size=8)}, settings=Settings(play_delay_s=play_delay_s))
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    try:
        yield url
    finally:
        demo.close()
