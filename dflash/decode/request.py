"""The generation request: a frozen dataclass that validates itself in `__post_init__`.

Every bad value raises `ValidationError(param, message)` naming the field and the allowed range; NaN and
infinity are rejected explicitly (Gradio lets NaN through slider bounds). Limits that depend on the loaded
models (block size vs the draft, the context budget) are checked by `Engine.check`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from dflash.decode.adaptive import POLICIES
from dflash.errors import ValidationError

MAX_PROMPT_CHARS = 32_000
MAX_PROMPT_TOKENS = 8_192
MAX_NEW_TOKENS = 4_096
MAX_BLOCK_SIZE = 64
MAX_STEPS = 16
MAX_SEED = 2**63 - 1
MAX_NGRAM = 8  # longest n-gram `lookup_ngram` may match on
# The default chain copies from the context first on bigrams, then drafts: measured faster than the draft alone on
# every CPU host benchmarked (BENCHMARKS.md; `bench --methods ar,dflash,dflash-lookup` measures it on yours).
CHAIN_NGRAM = 2
MAX_DEADLINE_S = 86_400.0  # a day: the longest deadline_s a request may set
VERIFY_RULES = ("match", "rejection")
# A temperature below this is greedy (stored as 0.0), as in vLLM: logits / T can overflow float32 there (logits / 1e-38
# are inf, and a softmax of infinities is NaN), and such a run is greedy in all but name anyway.
GREEDY_BELOW = 1e-5
DEFAULT_MIN_BLOCK = 2  # min_block_size None: this, or the block size when smaller


def _int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(name, f"must be an integer in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValidationError(name, f"must be in [{lo}, {hi}], got {value}")


def _float(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(name, f"must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float range (e.g. 10**400 sent through the API)
        raise ValidationError(name, f"must be in [{lo}, {hi}], got a number too large to represent") from None
    if not finite:
        raise ValidationError(name, f"must be a finite number, got {value}")
    if (value <= lo if lo_open else value < lo) or value > hi:
        raise ValidationError(name, f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}")


def _token_ids(name: str, ids: Any) -> tuple[int, ...]:
    """Token ids as plain ints: any integer type (numpy's too) but bool, which is an int to Python."""
    if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0 for i in ids):
        raise ValidationError(name, "must contain non-negative integers")
    return tuple(int(i) for i in ids)


@dataclass(frozen=True)
class Request:
    prompt: str = ""
    prompt_ids: tuple[int, ...] | None = None  # raw token ids: bypasses the chat template
    chat_template: bool = True  # apply the target's chat template to `prompt`
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy; below GREEDY_BELOW (1e-5) also greedy, and stored as 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    use_draft: bool = True  # False: the autoregressive baseline (same loop, block size 1)
    block_size: int | None = None  # None: the draft's trained block size
    diffusion_steps: int = 1
    confidence_threshold: float = 0.9
    acceptance_threshold: float = 1.0  # < 1 is lossy (relaxed verification)
    adaptive: str = "auto"  # block-size policy; auto: cost on a CPU, fixed on a GPU (dflash.decode.adaptive.resolve)
    min_block_size: int | None = None  # None: 2, or block_size when smaller; given, block_size may not be below it
    max_block_size: int | None = None  # None: the draft's trained block size
    verify: str = "match"
    # Wall-clock limit from the stream()/generate() call, so time spent waiting for the engine (another request
    # running) counts; None: no limit.
    deadline_s: float | None = 600.0
    stop_ids: tuple[int, ...] = ()
    # > 0: copy from the context first (dflash.decode.lookup): a block whose anchor ends an n-gram of this length seen
    # earlier proposes the tokens that followed it, without running the draft model. Lossless; draft runs only.
    # 0: the draft alone (the paper's method).
    lookup_ngram: int = CHAIN_NGRAM
    # Record what the draft attends to in each DraftStep (dflash.decode.attention): bounded, and off by default since
    # it recomputes the attention weights of every draft layer.
    trace_attention: bool = False

    def __post_init__(self) -> None:
        self._check_prompt()
        _int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        _float("temperature", self.temperature, 0.0, 2.0)
        if self.temperature < GREEDY_BELOW:  # here, once: the trace, the stats and every sampler then see greedy
            object.__setattr__(self, "temperature", 0.0)
        _float("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _int("top_k", self.top_k, 0, 1_000_000)
        _int("seed", self.seed, 0, MAX_SEED)
        _int("diffusion_steps", self.diffusion_steps, 1, MAX_STEPS)
        _float("confidence_threshold", self.confidence_threshold, 0.0, 1.0, lo_open=True)
        _float("acceptance_threshold", self.acceptance_threshold, 0.0, 1.0, lo_open=True)
        if self.adaptive not in POLICIES:
            raise ValidationError("adaptive", f"must be one of {', '.join(POLICIES)}, got {self.adaptive!r}")
        self._check_block_sizes()
        if self.verify not in VERIFY_RULES:
            raise ValidationError("verify", f"must be one of {', '.join(VERIFY_RULES)}, got {self.verify!r}")
        if self.verify == "rejection" and self.diffusion_steps > 1:
            # Rejection sampling needs each position's proposal law q; with S > 1 a position depends on later ones.
            raise ValidationError("diffusion_steps", "must be 1 with verify='rejection' (use verify='match')")
        if self.verify == "rejection" and self.acceptance_threshold < 1.0:
            raise ValidationError("acceptance_threshold",
                                  "must be 1.0 with verify='rejection' (relaxed acceptance applies to 'match')")
        _int("lookup_ngram", self.lookup_ngram, 0, MAX_NGRAM)
        if self.deadline_s is not None:
            _float("deadline_s", self.deadline_s, 0.0, MAX_DEADLINE_S, lo_open=True)
        if not isinstance(self.stop_ids, (tuple, list)):
            raise ValidationError("stop_ids", f"must be a sequence of token ids, got {self.stop_ids!r}")
        object.__setattr__(self, "stop_ids", _token_ids("stop_ids", self.stop_ids))
        for name in ("use_draft", "chat_template", "trace_attention"):  # a string like "false" would otherwise count as true
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(name, f"must be true or false, got {getattr(self, name)!r}")

    def _check_prompt(self) -> None:
        if not isinstance(self.prompt, str):
            what = "a string (empty beside prompt_ids)" if self.prompt_ids is not None else "a non-empty string"
            raise ValidationError("prompt", f"must be {what}, got {type(self.prompt).__name__}")
        if self.prompt_ids is not None:
            if self.prompt:  # one of them would be ignored (prompt_ids bypasses the chat template)
                raise ValidationError("prompt", "give prompt or prompt_ids, not both")
            ids = self.prompt_ids
            if not isinstance(ids, (tuple, list)) or not ids:
                raise ValidationError("prompt_ids", "must be a non-empty sequence of token ids")
            if len(ids) > MAX_PROMPT_TOKENS:
                raise ValidationError("prompt_ids", f"has {len(ids)} tokens; the limit is {MAX_PROMPT_TOKENS}")
            object.__setattr__(self, "prompt_ids", _token_ids("prompt_ids", ids))
            return
        if not self.prompt.strip():
            raise ValidationError("prompt", "must be a non-empty string")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise ValidationError("prompt", f"is {len(self.prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        try:
            self.prompt.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (possible in JSON "\ud800"): no tokenizer can take it
            raise ValidationError("prompt", "contains text that is not valid Unicode (a lone surrogate)") from None

    def _check_block_sizes(self) -> None:
        """Each size in range, and block_size within the min and max given with it. Only what the request alone
        shows: the draft's trained size (the default block and maximum) is the engine's (`Engine.check`)."""
        for name in ("block_size", "min_block_size", "max_block_size"):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), 1, MAX_BLOCK_SIZE)
        lo, hi = self.min_block_size or 1, self.max_block_size or MAX_BLOCK_SIZE
        if hi < lo:
            raise ValidationError("max_block_size", f"must be >= min_block_size ({lo}), got {hi}")
        if self.block_size is not None and not lo <= self.block_size <= hi:
            raise ValidationError("block_size", f"must be in [{lo}, {hi}] (min/max block size), got {self.block_size}")

    @property
    def lossy(self) -> bool:
        return self.acceptance_threshold < 1.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["prompt_ids"] = list(self.prompt_ids) if self.prompt_ids is not None else None
        d["stop_ids"] = list(self.stop_ids)
        return d


# Each field's default, for the front ends that show or restate it (the CLI's options, DFlashConfig, the playground).
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Request)
                            if f.default is not dataclasses.MISSING}
