"""The seed article's API, as its readers will type it — a thin facade over `Engine`:

    from dflash import DFlashConfig, DFlashModel
    config = DFlashConfig(draft_model_name="default", block_size=8, max_block_size=32, diffusion_steps=6,
                          acceptance_threshold=0.9)
    text = DFlashModel(config, "default").generate("Explain KV caches.", max_new_tokens=512, temperature=0.7, top_p=0.9)

Note: acceptance_threshold 0.9 (the article's value) is *lossy* here; 1.0 (the default) is exact.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from dflash.decode.adaptive import POLICIES
from dflash.errors import ValidationError
from dflash.loading.registry import PRESETS, draft_dir_problem, looks_like_hub_id
from dflash.decode.request import DEFAULTS, Request

NO_DRAFT_HINT = "to run without a draft, pass use_draft=False to generate or stream (the no-draft baseline)"


@dataclass(frozen=True)
class DFlashConfig:
    draft_model_name: str = "default"  # a preset name (its draft), a local draft directory, or a hub id
    block_size: int | None = None  # None: the draft's trained block size
    max_block_size: int | None = None  # above block_size: the block length adapts (slow start) up to this
    min_block_size: int | None = None  # None: 2, or block_size when smaller
    diffusion_steps: int = DEFAULTS["diffusion_steps"]
    confidence_threshold: float = DEFAULTS["confidence_threshold"]
    acceptance_threshold: float = DEFAULTS["acceptance_threshold"]  # 1.0 = exact (lossless); < 1 is lossy
    # auto | fixed | slow-start | cost; None (here or per call): slow-start if max_block_size > block_size, else auto
    adaptive: str | None = None
    verify: str = DEFAULTS["verify"]
    lookup_ngram: int = DEFAULTS["lookup_ngram"]  # > 0: copy from the context first where the last n tokens recur (lossless)
    trace_attention: bool = False  # record what the draft attends to at each denoising step (DraftStep.attention)
    # How the target loads (None: the loader's choice). With an existing Engine they must agree with it (or be None).
    dtype: str | None = None  # auto, float32 or bfloat16 (the loader also takes fp32, bf16, float16, fp16)
    device: str | None = None  # cpu, cuda, cuda:N (None: cuda when available)

    def __post_init__(self) -> None:
        _check_draft_name(self.draft_model_name)
        if self.dtype is not None or self.device is not None:  # the loader's own checks; they import torch, so only here
            from dflash.loading.load import check_dtype, pick_device

            check_dtype(self.dtype)
            if self.device is not None:
                pick_device(self.device)
        if self.adaptive is not None and self.adaptive not in POLICIES:
            raise ValidationError("adaptive", f"must be one of {', '.join(POLICIES)}, got {self.adaptive!r}")
        # Range checks are the request's: build one now so a bad config fails at construction.
        self.request(prompt="x")

    def policy(self, **kw: Any) -> str:
        """The block-size policy; `kw` (a call's adaptive / block_size / max_block_size) override the config's, as in
        `request`: a call's adaptive=None means what the config's None means."""
        adaptive = kw.get("adaptive", self.adaptive)
        if adaptive is not None:
            return adaptive
        block, top = kw.get("block_size", self.block_size), kw.get("max_block_size", self.max_block_size)
        if top and (block is None or top > block):
            return "slow-start"
        return "auto"

    def request(self, **kw: Any) -> Request:
        """A request with this config's options; `kw` (the prompt, and any option given per call) overrides them."""
        fields = dict(block_size=self.block_size, max_block_size=self.max_block_size, min_block_size=self.min_block_size,
                      diffusion_steps=self.diffusion_steps, confidence_threshold=self.confidence_threshold,
                      acceptance_threshold=self.acceptance_threshold, adaptive=self.policy(**kw), verify=self.verify,
                      lookup_ngram=self.lookup_ngram, trace_attention=self.trace_attention)
        unknown = sorted(set(kw) - set(Request.__dataclass_fields__))
        if unknown:
            raise ValidationError(unknown[0], "is not a generation option")
        return Request(**{**fields, **kw, "adaptive": fields["adaptive"]})


class DFlashModel:
    """target: a preset name, a loaded transformers causal LM (pass its tokenizer too), or a dflash Engine."""

    def __init__(self, config: DFlashConfig, target: Any = "default", tokenizer: Any = None):
        from dflash.decode.engine import Engine
        from dflash.loading.load import draft_source, load_engine, resolve_draft_dir

        if not isinstance(config, DFlashConfig):
            raise ValidationError("config", f"must be a DFlashConfig, got {type(config).__name__}")
        if not isinstance(target, (str, Engine)) and not hasattr(target, "config"):
            raise ValidationError("target", f"must be a preset name, a directory, an Engine or a loaded transformers "
                                            f"model, got {type(target).__name__}")
        self.config = config
        self._last = None  # the latest generate's Result, whichever thread ran it
        self._mine = threading.local()  # each thread's own latest Result
        draft_dir = _draft_dir(config.draft_model_name)
        if isinstance(target, Engine):
            _check_engine_agrees(config, target)
            self.engine = target
            return
        if isinstance(target, str):
            if target not in PRESETS and difflib.get_close_matches(target, PRESETS, n=1, cutoff=0.75):
                # a preset's name misspelt: the hub would be asked for it as a model id, and retried for ~20 s
                raise ValidationError("target", f"unknown preset or model {target!r}: a preset ({', '.join(PRESETS)}), "
                                                f"a local model directory or a hub id (owner/name)")
            self.engine, _ = load_engine(target if target in PRESETS else None, None if target in PRESETS else target,
                                         draft_dir, dtype=config.dtype, device=config.device)
        else:  # an already loaded transformers model
            from dflash.models.draft import load_draft
            from dflash.loading.load import pick_device, pick_dtype
            from dflash.models.target import Target

            dev = pick_device(config.device)
            if config.dtype == "int4":
                raise ValidationError("dtype", "int4 runs the Q4_1 layers of a GGUF target; a loaded transformers model "
                                               "has none (load the preset, or choose float32 or bfloat16)")
            tgt = Target(target, tokenizer, name=getattr(target.config, "_name_or_path", ""), device=dev,
                         dtype=pick_dtype(config.dtype, dev))
            dmodel, vocab = load_draft(resolve_draft_dir(draft_dir))
            self.engine = Engine(tgt, dmodel, vocab)
        self.engine.draft_source = draft_source(draft_dir)  # what a later DFlashModel(config, this engine) checks

    @property
    def last_result(self) -> Any:
        """The dflash.decode.engine.Result of this thread's last `generate` (threads sharing a model each read their own), else
        the model's latest; None before the first."""
        return getattr(self._mine, "result", self._last)

    def stream(self, prompt: str, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0, cancel: threading.Event | None = None, **kw: Any) -> Iterator:
        """The events of one run (dflash.decode.events), with `generate`'s defaults. `cancel`, set from any thread, stops it
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


def _draft_dir(name: str) -> str | None:
    """Where a draft_model_name loads from: a preset's draft, else the name itself (a directory or a hub id)."""
    return PRESETS[name].draft if name in PRESETS else name


def _check_draft_name(name: Any) -> None:
    if name is None:
        raise ValidationError("draft_model_name", f"must name a draft (None is not one); {NO_DRAFT_HINT}")
    if not isinstance(name, str) or not name.strip():
        raise ValidationError("draft_model_name", f"must be a preset name ({', '.join(PRESETS)}), a draft directory or a "
                                                  f"hub id, got {name!r}")
    if name not in PRESETS and not looks_like_hub_id(name) and (problem := draft_dir_problem(name)):
        raise ValidationError("draft_model_name", problem)


def _check_engine_agrees(config: DFlashConfig, engine: Any) -> None:
    """DFlashModel(config, engine) runs the engine as it was loaded: a load option saying otherwise is refused rather
    than ignored. The defaults (dtype/device None, draft "default") leave the engine's."""
    from dflash.loading.load import draft_source, numerics_name, pick_device

    tg = engine.target
    if config.dtype not in (None, "auto") and numerics_name(config.dtype, tg.device) != tg.numerics:
        raise ValidationError("dtype", f"this engine runs in {tg.numerics}, got {config.dtype!r} "
                                       f"(leave it None with an engine)")
    if config.device is not None:
        dev = pick_device(config.device)
        if dev.type != tg.device.type or dev.index not in (None, tg.device.index or 0):
            raise ValidationError("device", f"this engine runs on {tg.device}, got {config.device!r} (leave it None with an "
                                            f"engine)")
    draft = config.draft_model_name
    if draft != "default" and (engine.draft is None or draft_source(_draft_dir(draft)) != engine.draft_source):
        has = f"has no draft; {NO_DRAFT_HINT}" if engine.draft is None else "runs the draft it was built with"
        raise ValidationError("draft_model_name", f"leave it 'default' with an engine: this engine {has}, not {draft!r}")
