"""Run a method set over a prompt set: warm-up, then on each prompt every method in turn (interleaved), repeated.

Every method gets the same chat-templated prompt ids. `ar` and `dflash` are `Engine.generate` (the one loop)
without and with the draft, `dflash-lookup` with the draft and copying from the context first (`BenchConfig.lookup_ngram`,
2 unless set; `dflash` never copies); `hf-generate` and `hf-prompt-lookup` are transformers' own `generate()` on the same
model object (dflash.bench.baselines). The result is a plain dict (schema in docs/bench.md) handed to a callback
after every prompt, so a long run is written incrementally and can be resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dflash.bench.baselines import TimedOutput, hf_generate
from dflash.bench.config import DRAFT_METHODS, ENGINE_METHODS, BenchConfig
from dflash.bench.machine import RssSampler, load_average
from dflash.loading.datasets import PromptRow, prompt_rows
from dflash.decode.engine import Engine
from dflash.errors import ValidationError
from dflash.decode.request import Request
from dflash.decode.stats import diagnose_difference, output_gaps


@dataclass(frozen=True)
class PromptItem:
    index: int
    text: str | None  # None when the set gives token ids only
    ids: list[int]
    line: int | None = None  # its line in a JSONL file (None: a named set)

    @property
    def where(self) -> str:
        return _where(self.index, self.line)


def _where(index: int, line: int | None) -> str:
    """How an error names a prompt: its line in the user's file, else its index in the set."""
    return f"line {line}" if line is not None else f"prompt {index}"


def prepare_prompts(engine: Engine, spec: str, limit: int | None = None) -> list[PromptItem]:
    """A named set (mt-bench, humaneval, sharegpt-heldout) or a .jsonl file → chat-templated prompt ids."""
    return prompt_items(engine, prompt_rows(spec, limit))


def prompt_items(engine: Engine, rows: list[PromptRow]) -> list[PromptItem]:
    """Prompt rows (checked by dflash.loading.datasets.prompt_rows before any model loads) → prompt ids: a JSONL row's
    "prompt_ids" used as they are (targets without a tokenizer), text through the chat template."""
    return [PromptItem(i, r.text, r.ids, r.line) if r.ids is not None else _text_item(engine, i, r.line, r.text)
            for i, r in enumerate(rows)]


def _text_item(engine: Engine, index: int, line: int | None, text: str) -> PromptItem:
    try:
        return PromptItem(index, text, engine.prompt_ids(Request(prompt=text)), line)
    except ValidationError as exc:
        raise ValidationError("prompts", f"{_where(index, line)}: {exc}") from None


def validate_prompts(engine: Engine, items: list[PromptItem], cfg: BenchConfig) -> None:
    """Every prompt as every kind of run the methods make will see it (token ids within the vocabulary; prompt, new
    tokens and the largest block within the context budget), so that a bad prompt fails before the warm-up, not
    hours into a run after the prompts before it were measured. transformers' methods need no more than `ar`."""
    for item in items:
        for use_draft in sorted({m in DRAFT_METHODS for m in cfg.methods}):
            try:
                engine.validate(cfg.make_request(item.ids, use_draft=use_draft))
            except ValidationError as exc:
                raise ValidationError("prompts", f"{item.where}: {exc}") from None


def run_method(engine: Engine, method: str, ids: list[int], cfg: BenchConfig, max_new_tokens: int | None = None) -> TimedOutput:
    """One generation with one method; returns its output and timings."""
    override = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    if method in DRAFT_METHODS:  # dflash is the draft alone; dflash-lookup copies from the context first
        override["lookup_ngram"] = cfg.lookup_ngram if method == "dflash-lookup" else 0
    req = cfg.make_request(ids, use_draft=method in DRAFT_METHODS, **override)
    if method in ENGINE_METHODS:
        res = engine.generate(req)
        s = res.stats
        return TimedOutput(res.output_ids, res.finish_reason, s["ttft_ms"], s["decode_ms"], s["total_ms"],
                           max(s["n_output_tokens"] - 1, 0), s, res.message, output_gaps(res.events))
    lookup = cfg.prompt_lookup_num_tokens if method == "hf-prompt-lookup" else None
    return hf_generate(engine.target, ids, req.max_new_tokens, set(req.stop_ids) | engine.target.stop_ids(),
                       req.temperature, req.top_k, req.top_p, req.seed, lookup, cfg.max_matching_ngram_size)


def run_record(out: TimedOutput, repeat: int, mem: RssSampler, load1: float | None) -> dict:
    return {
        "repeat": repeat,
        "finish_reason": out.finish_reason,
        "message": out.message,
        "n_output_tokens": len(out.output_ids),
        "ttft_ms": out.ttft_ms,
        "decode_ms": out.decode_ms,
        "total_ms": out.total_ms,
        "decode_tokens": out.decode_tokens,
        "ms_per_token": out.decode_ms / out.decode_tokens if out.decode_tokens else 0.0,
        "tokens_per_s": out.decode_tokens / (out.decode_ms / 1000) if out.decode_ms > 0 else 0.0,
        "rss_before_mb": round(mem.before_mb, 1),
        "rss_peak_mb": round(mem.peak_mb, 1),
        "load1": load1,
        "stats": out.stats,
    }


def compare(reference: list[int], output: list[int], finish_reason: str = "", ref_gaps: list[float] | None = None,
            run_gaps: list[float] | None = None, dtype: str = "float32") -> dict:
    """Greedy identity against the reference (`ar`) output, and the diagnosis of a difference: numerical tie or
    error (`stats.diagnose_difference`, from both runs' top-2 gaps; transformers' methods take theirs from
    generate's own logits). A run cut short by the deadline is compared on what it produced. EOS is part of both
    outputs (both stop on the same stop ids)."""
    diag = diagnose_difference(reference, ref_gaps, output, run_gaps, dtype,
                               cut_short=finish_reason in ("timeout", "cancelled"))
    return {"identical": diag is None, "first_diff": diag["position"] if diag else None,
            "same_length": len(reference) == len(output), "diagnosis": diag}


def run_prompt(engine: Engine, item: PromptItem, cfg: BenchConfig, on_run: Callable[[str, int], None] | None = None) -> dict:
    """All methods × repeats on one prompt, interleaved; method order rotates by one each repeat."""
    runs: dict[str, list[dict]] = {m: [] for m in cfg.methods}
    outputs: dict[str, list[TimedOutput]] = {m: [] for m in cfg.methods}
    for r in range(cfg.repeats):
        k = r % len(cfg.methods)
        for method in cfg.methods[k:] + cfg.methods[:k]:
            if on_run:
                on_run(method, r)
            load1 = load_average()
            with RssSampler() as mem:
                out = run_method(engine, method, item.ids, cfg)
            runs[method].append(run_record(out, r, mem, load1))
            outputs[method].append(out)
    record = {"index": item.index, "text": item.text, "n_prompt_tokens": len(item.ids), "prompt_ids": item.ids,
              "methods": {}}
    dtype = engine.target.numerics
    for m in cfg.methods:
        first = outputs[m][0].output_ids
        rec = {"output_ids": first, "text": engine.decode(first), "finish_reason": runs[m][0]["finish_reason"],
               "repeats_agree": all(o.output_ids == first for o in outputs[m]), "identical": None, "first_diff": None,
               "same_length": None, "diagnosis": None, "runs": runs[m]}
        if cfg.compared(m):
            ref, out = outputs["ar"][0], outputs[m][0]
            rec.update(compare(ref.output_ids, first, rec["finish_reason"], ref.target_gaps, out.target_gaps, dtype))
        record["methods"][m] = rec
    return record


def warm_up(engine: Engine, items: list[PromptItem], cfg: BenchConfig) -> None:
    """One short untimed run of every method (first-call allocations, oneDNN packing, lazy imports)."""
    n = min(cfg.warmup_tokens, int(cfg.request.get("max_new_tokens", 128)))
    for method in cfg.methods:
        run_method(engine, method, items[0].ids, cfg, max_new_tokens=n)


def check_methods(engine: Engine, cfg: BenchConfig) -> None:
    needs = [m for m in cfg.methods if m in DRAFT_METHODS]
    if needs and engine.draft is None:
        raise ValidationError("methods", f"{', '.join(needs)} needs a draft model: give --draft (or a preset with a "
                                         "trained draft), or leave it out of --methods")
