"""The seed article's API, as its readers will type it — a thin facade over `Engine`:

    from dflash import DFlashConfig, DFlashModel
    config = DFlashConfig(draft_model_name="default", block_size=8, max_block_size=32, diffusion_steps=6,
                          acceptance_threshold=0.9)
    text = DFlashModel(config, "default").generate("Explain KV caches.", max_new_tokens=512, temperature=0.7, top_p=0.9)

Note: acceptance_threshold 0.9 (the article's value) is *lossy* here; 1.0 (the default) is exact.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

from dflash.adaptive import POLICIES
from dflash.errors import ValidationError
from dflash.request import Request


@dataclass(frozen=True)
class DFlashConfig:
    draft_model_name: str = "default"  # a preset name (its draft), a local draft directory, or a hub id
    block_size: int | None = None  # None: the draft's trained block size
    max_block_size: int | None = None  # above block_size: the block length adapts (slow start) up to this
    min_block_size: int = 2
    diffusion_steps: int = 1
    confidence_threshold: float = 0.9
    acceptance_threshold: float = 1.0  # 1.0 = exact (lossless); < 1 is lossy
    # auto | fixed | slow-start | cost; None: slow-start if max_block_size > block_size, else auto
    adaptive: str | None = None
    verify: str = "match"
    lookup_ngram: int = 0  # > 0: copy from the context first where the last n tokens recur (lossless)
    dtype: str | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        if self.adaptive is not None and self.adaptive not in POLICIES:
            raise ValidationError("adaptive", f"must be one of {', '.join(POLICIES)}, got {self.adaptive!r}")
        # Range checks are the request's: build one now so a bad config fails at construction.
        self.request(prompt="x")

    def policy(self, **kw: Any) -> str:
        """The block-size policy; `kw` (a call's block_size / max_block_size) override the config's, as in `request`."""
        if self.adaptive:
            return self.adaptive
        block, top = kw.get("block_size", self.block_size), kw.get("max_block_size", self.max_block_size)
        if top and (block is None or top > block):
            return "slow-start"
        return "auto"

    def request(self, **kw: Any) -> Request:
        """A request with this config's options; `kw` (the prompt, and any option given per call) overrides them."""
        fields = dict(block_size=self.block_size, max_block_size=self.max_block_size, min_block_size=self.min_block_size,
                      diffusion_steps=self.diffusion_steps, confidence_threshold=self.confidence_threshold,
                      acceptance_threshold=self.acceptance_threshold, adaptive=self.policy(**kw), verify=self.verify,
                      lookup_ngram=self.lookup_ngram)
        unknown = sorted(set(kw) - set(Request.__dataclass_fields__))
        if unknown:
            raise ValidationError(unknown[0], "is not a generation option")
        return Request(**{**fields, **kw})


class DFlashModel:
    """target: a preset name, a loaded transformers causal LM (pass its tokenizer too), or a dflash Engine."""

    def __init__(self, config: DFlashConfig, target: Any = "default", tokenizer: Any = None):
        from dflash.engine import Engine
        from dflash.load import load_engine, resolve_draft_dir
        from dflash.registry import PRESETS

        if not isinstance(config, DFlashConfig):
            raise ValidationError("config", f"must be a DFlashConfig, got {type(config).__name__}")
        if not isinstance(target, (str, Engine)) and not hasattr(target, "config"):
            raise ValidationError("target", f"must be a preset name, a directory, an Engine or a loaded transformers "
                                            f"model, got {type(target).__name__}")
        self.config = config
        self._last = None  # the latest generate's Result, whichever thread ran it
        self._mine = threading.local()  # each thread's own latest Result
        draft = config.draft_model_name
        draft_dir = PRESETS[draft].draft if draft in PRESETS else draft
        if isinstance(target, Engine):
            self.engine = target
        elif isinstance(target, str):
            self.engine, _ = load_engine(target if target in PRESETS else None, None if target in PRESETS else target,
                                         draft_dir, dtype=config.dtype, device=config.device)
        else:  # an already loaded transformers model
            from dflash.draft import load_draft
            from dflash.load import pick_device, pick_dtype
            from dflash.target import Target

            dev = pick_device(config.device)
            tgt = Target(target, tokenizer, name=getattr(target.config, "_name_or_path", ""), device=dev,
                         dtype=pick_dtype(config.dtype, dev))
            dmodel, vocab = load_draft(resolve_draft_dir(draft_dir))
            self.engine = Engine(tgt, dmodel, vocab)

    @property
    def last_result(self) -> Any:
        """The dflash.engine.Result of this thread's last `generate` (threads sharing a model each read their own), else
        the model's latest; None before the first."""
        return getattr(self._mine, "result", self._last)

    def stream(self, prompt: str, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0, cancel: threading.Event | None = None, **kw: Any) -> Iterator:
        """The events of one run (dflash.events), with `generate`'s defaults. `cancel`, set from any thread, stops it
        after the current block."""
        return self.engine.stream(self._request(prompt, max_new_tokens, temperature, top_p, top_k, seed, kw), cancel)

    def generate(self, prompt: str, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, cancel: threading.Event | None = None, **kw: Any) -> str:
        """Returns the generated text (the statistics are in `self.last_result`). `cancel` as in `stream`."""
        result = self.engine.generate(self._request(prompt, max_new_tokens, temperature, top_p, top_k, seed, kw), cancel)
        self._mine.result = self._last = result
        return result.text

    def _request(self, prompt: str, max_new_tokens: int, temperature: float, top_p: float, top_k: int, seed: int,
                 kw: dict[str, Any]) -> Request:
        return self.config.request(prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   top_k=top_k, seed=seed, **kw)
