"""What `python -m dflash bench` runs: the methods and `BenchConfig`, checked when built. No torch here, so a bad
option is named before the models (or torch) load."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash.errors import ValidationError
from dflash.decode.request import CHAIN_NGRAM, MAX_NGRAM, Request

METHODS = ("ar", "dflash", "dflash-lookup", "hf-generate", "hf-prompt-lookup")
DRAFT_METHODS = ("dflash", "dflash-lookup")  # the methods that need the draft
ENGINE_METHODS = ("ar",) + DRAFT_METHODS
DEFAULT_LOOKUP_NGRAM = CHAIN_NGRAM  # dflash-lookup's n-gram length when none is given: the default chain's


@dataclass(frozen=True)
class BenchConfig:
    """What to run. `request`: the engine options (Request fields except prompt / prompt_ids / use_draft /
    lookup_ngram, which the method decides). `lookup_ngram`: dflash-lookup's n-gram length, only with dflash-lookup
    among the methods; after validation it is the one dflash-lookup runs with (None without it)."""

    methods: tuple[str, ...] = METHODS
    request: dict = field(default_factory=dict)
    repeats: int = 1
    warmup: bool = True
    warmup_tokens: int = 16
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    lookup_ngram: int | None = None

    def __post_init__(self) -> None:
        methods = tuple(self.methods)
        if not methods:
            raise ValidationError("methods", f"give at least one of {', '.join(METHODS)}")
        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise ValidationError("methods", f"unknown {', '.join(bad)}; choose from {', '.join(METHODS)}")
        if len(set(methods)) != len(methods):
            raise ValidationError("methods", "each method at most once")
        object.__setattr__(self, "methods", methods)
        for name, value, lo, hi in (("repeats", self.repeats, 1, 100), ("warmup_tokens", self.warmup_tokens, 1, 4096),
                                    ("prompt_lookup_num_tokens", self.prompt_lookup_num_tokens, 1, 128),
                                    ("max_matching_ngram_size", self.max_matching_ngram_size, 1, 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValidationError(name, f"must be an integer in [{lo}, {hi}], got {value!r}")
        self._resolve_lookup_ngram()
        bad_keys = {"prompt", "prompt_ids", "use_draft", "lookup_ngram"} & set(self.request)
        if bad_keys:
            raise ValidationError("request", f"must not set {', '.join(sorted(bad_keys))} (the method decides)")
        self.make_request((0,), use_draft=False)  # validates every engine option now, before any model runs

    def _resolve_lookup_ngram(self) -> None:
        """Only dflash-lookup copies: an n-gram length without it would be recorded but change nothing."""
        n = self.lookup_ngram
        if "dflash-lookup" not in self.methods:
            if n is not None:
                raise ValidationError("lookup_ngram", "only dflash-lookup copies from the context (dflash never does): "
                                                      "add dflash-lookup to --methods or leave --lookup-ngram out")
            return
        if n is None:
            object.__setattr__(self, "lookup_ngram", DEFAULT_LOOKUP_NGRAM)
        elif isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NGRAM:
            raise ValidationError("lookup_ngram", f"must be an integer in [1, {MAX_NGRAM}] (dflash-lookup always copies), "
                                                  f"got {n!r}")

    @property
    def baseline(self) -> str:
        return "ar" if "ar" in self.methods else self.methods[0]

    @property
    def greedy(self) -> bool:
        return float(self.request.get("temperature", 0.0)) == 0.0

    def compared(self, method: str) -> bool:
        """Whether `method`'s output is compared with ar's: every method's when greedy; when sampling, the engine's
        own methods under the match rule (the same noise per position gives the same tokens), not transformers'
        (its own random stream) nor the rejection rule (the same law, other tokens)."""
        if method == "ar" or "ar" not in self.methods:
            return False
        return self.greedy or (method in ENGINE_METHODS and self.request.get("verify", "match") == "match")

    def make_request(self, prompt_ids, use_draft: bool, **override) -> Request:
        return Request(prompt_ids=tuple(prompt_ids), use_draft=use_draft, **{**self.request, **override})

    def to_dict(self) -> dict:
        return {"methods": list(self.methods), "baseline": self.baseline, "greedy": self.greedy, "repeats": self.repeats,
                "warmup": self.warmup, "warmup_tokens": self.warmup_tokens, "request": dict(self.request),
                "prompt_lookup_num_tokens": self.prompt_lookup_num_tokens,
                "max_matching_ngram_size": self.max_matching_ngram_size, "lookup_ngram": self.lookup_ngram}
