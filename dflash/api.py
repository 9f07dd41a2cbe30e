"""The seed article's API, as its readers will type it — a thin facade over `Engine`:

    from dflash import DFlashConfig, DFlashModel
    config = DFlashConfig(draft_model_name="default", block_size=8, max_block_size=32, diffusion_steps=6,
                          acceptance_threshold=0.9)
    text = DFlashModel(config, "default").generate("Explain KV caches.", max_new_tokens=512, temperature=0.7, top_p=0.9)

Note: acceptance_threshold 0.9 (the article's value) is *lossy* here; 1.0 (the default) is exact.
"""

from __future__ import annotations

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

    def policy(self) -> str:
        if self.adaptive:
            return self.adaptive
        if self.max_block_size and (self.block_size is None or self.max_block_size > self.block_size):
            return "slow-start"
        return "auto"

    def request(self, **kw: Any) -> Request:
        """A request with this config's options; `kw` (the prompt, and any option given per call) overrides them."""
        fields = dict(block_size=self.block_size, max_block_size=self.max_block_size, min_block_size=self.min_block_size,
                      diffusion_steps=self.diffusion_steps, confidence_threshold=self.confidence_threshold,
                      acceptance_threshold=self.acceptance_threshold, adaptive=self.policy(), verify=self.verify,
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

        self.config = config
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

    def stream(self, prompt: str, **kw: Any) -> Iterator:
        return self.engine.stream(self.config.request(prompt=prompt, **kw))

    def generate(self, prompt: str, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, **kw: Any) -> str:
        """Returns the generated text (the statistics are in `self.last_result`)."""
        self.last_result = self.engine.generate(self.config.request(prompt=prompt, max_new_tokens=max_new_tokens,
                                                                    temperature=temperature, top_p=top_p, top_k=top_k,
                                                                    seed=seed, **kw))
        return self.last_result.text
