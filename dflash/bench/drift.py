"""Logit drift: how far a multi-token verify forward's logits are from the one-token step's, per dtype.

In bfloat16 a forward over b tokens rounds differently from b forwards of one token, so greedy DFlash output can
differ from the no-draft output where the target's top-2 logits are nearly tied. This measures by how much: for
each prompt, the no-draft engine's greedy output is teacher-forced through the target one token per forward (the
no-draft step) and `block` tokens per forward (a verify), and the two sets of logits for the same positions are
compared. The tie bounds of `dflash.decode.stats.TIE_BOUND` are set from it (`stats.tie_bound_from`: 2 × the largest
per-logit difference, rounded up).

    python -m dflash.bench.profile logit-drift --dtypes float32,bfloat16 --prompts mt-bench --limit 4
        --max-new-tokens 48 --block 8 [--json]
"""

from __future__ import annotations

import copy

import torch

from dflash.errors import ValidationError
from dflash.decode.request import MAX_BLOCK_SIZE, Request
from dflash.decode.stats import tie_bound_from
from dflash.models.target import Target
from dflash.verification.verify import top2_gap

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int4": torch.bfloat16}


def teacher_forced(target: Target, prompt: list[int], out: list[int], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits predicting out[1:] given prompt + out, computed one token per forward and `block` tokens
    per forward after the same prefill: two float32 tensors [len(out) - 1, V] (the prefill's row, which predicts
    out[0], is the same computation in both and is left out)."""
    rows = {}
    for size in (1, block):
        cache = target.new_cache()
        target.forward(torch.tensor([prompt], device=target.device), cache, last_only=True, capture=False)
        parts = [torch.empty(0, target.vocab_size, device=target.device)]
        for i in range(0, len(out) - 1, size):
            ids = torch.tensor([out[i : min(i + size, len(out) - 1)]], device=target.device)
            parts.append(target.forward(ids, cache, capture=False)[0])  # [tokens, V]
        rows[size] = torch.cat(parts)
    return rows[1], rows[block]


class Drift:
    """The drift of one dtype over many prompts: the max and the 99.9th percentile of |logit difference| over every
    position and vocabulary entry, and the max difference of the top-2 gap. The percentile is the nearest rank
    (the smallest value with at least 99.9 % of the N values at or below it: the (N // 1000 + 1)-th largest), exact
    without keeping every difference: `n_max`, an upper bound on N, says how many of the largest can matter."""

    def __init__(self, n_max: int):
        self.keep = n_max // 1000 + 1
        self.top = torch.empty(0)  # the largest |differences| so far, at most `keep` of them
        self.n = self.n_positions = self.n_argmax_differs = 0
        self.max_gap_diff = 0.0

    def add(self, one: torch.Tensor, blk: torch.Tensor) -> None:
        """The logits of the same positions [n, V] from the one-token step and from the verify."""
        diff = (one - blk).abs().flatten()
        self.top = torch.cat([self.top, diff.topk(min(self.keep, diff.numel())).values.cpu()])
        self.top = self.top.topk(min(self.keep, self.top.numel())).values  # descending
        self.n += diff.numel()
        self.n_positions += one.shape[0]
        self.n_argmax_differs += int((one.argmax(-1) != blk.argmax(-1)).sum())
        gaps = [abs(a - b) for a, b in zip(top2_gap(one), top2_gap(blk))]
        self.max_gap_diff = max([self.max_gap_diff, *gaps])

    def result(self) -> dict:
        """max and nearest-rank percentile of |logit difference|, max difference of the top-2 gap, and the tie
        bound they suggest."""
        rank = self.n // 1000  # in the descending `top`
        if rank >= self.top.numel():  # nothing compared, or n_max was not an upper bound
            raise ValueError(f"Drift: {self.n} logits compared; the {self.keep} kept cannot give the percentile")
        top = self.top.tolist()
        return {"n_positions": self.n_positions, "n_logits": self.n, "max_abs_diff": top[0],
                "p999_abs_diff": top[rank], "max_gap_diff": self.max_gap_diff,
                "n_argmax_differs": self.n_argmax_differs, "suggested_bound": tie_bound_from(top[0])}


def check_options(dtypes: list[str], limit: int, max_new_tokens: int, block: int) -> None:
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValidationError("dtypes", f"choose from {', '.join(DTYPES)}, got {', '.join(bad) or 'none'}")
    if not 1 <= limit <= 1000:
        raise ValidationError("limit", f"must be in [1, 1000], got {limit}")
    if not 2 <= max_new_tokens <= 4096:
        raise ValidationError("max_new_tokens", f"must be in [2, 4096] (two tokens make one compared position), "
                                                f"got {max_new_tokens}")
    if not 2 <= block <= MAX_BLOCK_SIZE:
        raise ValidationError("block", f"must be in [2, {MAX_BLOCK_SIZE}], got {block}")


def measure_drift(model, tokenizer, device: torch.device, dtypes: list[str], prompts: str, limit: int,
                  max_new_tokens: int, block: int, q4=None) -> list[dict]:
    """One row per dtype (a copy of `model` cast to it): the drift over the first `limit` prompts of `prompts`.
    int4 needs `q4`, the target's GGUF Q4_1 layers (`dflash.loading.load.Q4Source`)."""
    from dflash.bench.runner import prepare_prompts
    from dflash.decode.engine import Engine
    from dflash.models.lean import LeanTarget

    check_options(dtypes, limit, max_new_tokens, block)
    if "int4" in dtypes and (q4 is None or not q4.available):
        raise ValidationError("dtypes", "int4 needs a target from a Q4_1 GGUF (the default preset's)")
    rows, items = [], None
    for name in dtypes:
        if name == "int4":
            target = LeanTarget(copy.deepcopy(model), tokenizer, name=name, dtype=DTYPES[name], q4=q4.layers())
        else:
            target = Target(copy.deepcopy(model), tokenizer, name=name, device=device, dtype=DTYPES[name])
        engine = Engine(target)
        items = items or prepare_prompts(engine, prompts, limit)
        drift = Drift(len(items) * (max_new_tokens - 1) * engine.target.vocab_size)
        for item in items:
            req = Request(prompt_ids=tuple(item.ids), max_new_tokens=max_new_tokens, use_draft=False, deadline_s=None)
            out = engine.generate(req).output_ids
            drift.add(*teacher_forced(engine.target, item.ids, out, block))
        if not drift.n:
            raise ValidationError("prompts", f"no {name} output had two tokens: there is nothing to compare")
        rows.append({"dtype": name, "n_prompts": len(items), "block": block, **drift.result()})
        del engine
    return rows


def logit_drift(args) -> list[dict]:
    """`profile logit-drift`: the target of --target / --preset on --device."""
    from dflash.loading.load import Q4Source, load_target_model, pick_device
    from dflash.loading.registry import get_preset

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    check_options(dtypes, args.limit, args.max_new_tokens, args.block)  # before the load
    source = args.target or get_preset(args.preset).target
    model, tokenizer = load_target_model(source)
    return measure_drift(model, tokenizer, pick_device(args.device), dtypes, args.prompts, args.limit,
                         args.max_new_tokens, args.block, Q4Source(source, model.config))


def add_parser(sub):
    d = sub.add_parser("logit-drift", help="logits of a block verify vs the one-token step, per dtype")
    d.add_argument("--dtypes", default="float32,bfloat16", help=f"comma-separated: {', '.join(DTYPES)}")
    d.add_argument("--prompts", default="mt-bench", help="a prompt set or a .jsonl file (as in `bench`)")
    d.add_argument("--limit", type=int, default=4)
    d.add_argument("--max-new-tokens", type=int, default=48)
    d.add_argument("--block", type=int, default=8, help="tokens per verify forward")
    return d
