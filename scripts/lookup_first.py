"""What copying from the context would add to the shipped draft, measured with the real loop (a diagnostic, not a
feature of the engine).

    python scripts/lookup_first.py --prompts sharegpt-heldout --limit 16 --max-new-tokens 64 --threads 2 \
        --out results/training/lookup-first.jsonl

Per prompt, interleaved in one process: the no-draft loop (`ar`), DFlash with the shipped draft (`dflash`), and
`lookup-first`: where the anchor and the token before it occurred together earlier in the prompt or output, the block
proposes the tokens that followed that occurrence (as prompt-lookup decoding does) and the draft model is not run;
elsewhere the draft proposes as usual. Verification is the engine's own, so every output must equal `ar`'s. The
lookup reads the committed tokens from `ar`'s output (identical by losslessness) and only up to the anchor. A set
already in --out (same prompts, limit and length) is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash.drafter import Drafter, Proposal  # noqa: E402
from dflash.training.copy_gap import copy_match  # noqa: E402


class LookupFirst(Drafter):
    """The draft model's proposals, except where the context holds the anchor's bigram: then the copied span."""

    def __init__(self, base: Drafter, full_sequence: list[int]):
        super().__init__(base.draft, base.embed, base.lm_head_weight, base.vocab_ids, base.vocab_size)
        self.full = full_sequence  # prompt + the target's output (only tokens up to each anchor are read)
        self.copied = 0

    def propose(self, cache, anchor: int, start: int, size: int, n_steps: int, threshold: float, sample) -> Proposal:
        ctx = self.full[: start + 1]
        kind, j = copy_match(ctx)
        if kind != "bigram":
            return super().propose(cache, anchor, start, size, n_steps, threshold, sample)
        span = (ctx[j + 1:] + ctx[j + 1:] * size)[: size - 1]  # a span reaching the anchor repeats itself
        self.copied += 1
        step = {"step": 0, "n_steps": 1, "start": start, "tokens": [anchor] + span, "confidences": [1.0] * size,
                "masked": [False] * size, "committed": [False] + [True] * (size - 1), "ms": 0.0}
        return Proposal(span, [1.0] * len(span), None, [step], 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="sharegpt-heldout")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32", help="float32 (exact: every output must equal ar's) or auto")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from dflash.bench.machine import machine_info
    from dflash.datasets import load_prompts
    from dflash.load import load_engine
    from dflash.request import Request
    from dflash.events import Started
    from dflash.stats import speedup

    out = Path(args.out)
    key = lambda r: (r["prompts"], r["limit"], r["max_new_tokens"])  # noqa: E731
    if out.is_file() and any(key(json.loads(x)) == key(vars(args)) for x in out.read_text().splitlines()):
        return  # measured already (delete the line to measure again)
    engine, info = load_engine("default", threads=args.threads, dtype=args.dtype)
    engine.use_drafter(None)
    base = engine.drafter
    prompts = load_prompts(args.prompts, args.limit)
    kw = dict(max_new_tokens=args.max_new_tokens, adaptive="fixed")
    engine.generate(Request(prompt=prompts[0], max_new_tokens=4))  # warm-up
    per = {m: {"lengths": [], "ms": [], "identical": 0} for m in ("dflash", "lookup-first")}
    ar_ms, copied = [], 0
    for p in prompts:
        engine.use_drafter(None)
        a = engine.generate(Request(prompt=p, use_draft=False, **kw))
        ar_ms.append(a.stats["decode_ms"] / max(a.stats["n_output_tokens"] - 1, 1))
        prompt_ids = next(e.prompt_ids for e in a.events if isinstance(e, Started))
        look = LookupFirst(base, list(prompt_ids) + list(a.output_ids))
        for method in ("dflash", "lookup-first"):
            engine.use_drafter(look if method == "lookup-first" else base)
            d = engine.generate(Request(prompt=p, **kw))
            per[method]["lengths"] += d.stats["acceptance_lengths"]
            per[method]["ms"].append(d.stats["decode_ms"] / max(d.stats["n_output_tokens"] - 1, 1))
            per[method]["identical"] += d.output_ids == a.output_ids
        copied += look.copied
    row = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "copied_blocks": copied,
           "dtype": info["dtype"], "threads": torch.get_num_threads(), "block": "fixed, the draft's", "machine": machine_info()}
    for m, r in per.items():
        row[m] = {"tau": sum(r["lengths"]) / len(r["lengths"]), "n_verify": len(r["lengths"]),
                  "speedup_vs_ar": speedup(ar_ms, r["ms"])["speedup"], "identical": r["identical"]}
    print(json.dumps({k: v for k, v in row.items() if k != "machine"}), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
