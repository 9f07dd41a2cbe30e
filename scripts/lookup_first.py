"""What copying from the context first (the engine's `lookup_ngram=2`) adds to the shipped draft, measured with the
real loop.

    python scripts/lookup_first.py --prompts sharegpt-heldout --limit 16 --max-new-tokens 64 --threads 2 \
        --out results/training/lookup-first.jsonl

Per prompt, interleaved in one process: the no-draft loop (`ar`), DFlash with the shipped draft (`dflash`), and
`lookup-first`: where the anchor and the token before it occurred together earlier in the prompt or output, the block
proposes the tokens that followed that occurrence (as prompt-lookup decoding does) and the draft model is not run;
elsewhere the draft proposes as usual (dflash.lookup). Verification is the engine's own, so every output must equal
`ar`'s. `--adaptive fixed` (the default here) keeps every block at the draft's size, so τ compares like with like;
`--adaptive auto` measures what a user gets by default. A set already in --out (same prompts, limit, length and
policy) is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="sharegpt-heldout")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="float32", help="float32 (exact: every output must equal ar's) or auto")
    ap.add_argument("--adaptive", default="fixed", help="block-size policy (fixed: the draft's size every block)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from dflash.bench.machine import machine_info
    from dflash.datasets import load_prompts
    from dflash.load import load_engine
    from dflash.request import Request
    from dflash.stats import speedup

    out = Path(args.out)
    key = lambda r: (r["prompts"], r["limit"], r["max_new_tokens"], r.get("adaptive", "fixed"))  # noqa: E731
    if out.is_file() and any(key(json.loads(x)) == key(vars(args)) for x in out.read_text().splitlines()):
        return  # measured already (delete the line to measure again)
    engine, info = load_engine("default", threads=args.threads, dtype=args.dtype)
    prompts = load_prompts(args.prompts, args.limit)
    kw = dict(max_new_tokens=args.max_new_tokens, adaptive=args.adaptive)
    engine.generate(Request(prompt=prompts[0], max_new_tokens=4))  # warm-up
    per = {m: {"lengths": [], "ms": [], "identical": 0} for m in ("dflash", "lookup-first")}
    ar_ms, copied = [], 0
    for p in prompts:
        a = engine.generate(Request(prompt=p, use_draft=False, **kw))
        ar_ms.append(a.stats["decode_ms"] / max(a.stats["n_output_tokens"] - 1, 1))
        for method, ngram in (("dflash", 0), ("lookup-first", 2)):
            d = engine.generate(Request(prompt=p, lookup_ngram=ngram, **kw))
            per[method]["lengths"] += d.stats["acceptance_lengths"]
            per[method]["ms"].append(d.stats["decode_ms"] / max(d.stats["n_output_tokens"] - 1, 1))
            per[method]["identical"] += d.output_ids == a.output_ids
            copied += d.stats["copy_blocks"]
    row = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "copied_blocks": copied,
           "dtype": info["dtype"], "threads": torch.get_num_threads(), "adaptive": args.adaptive, "machine": machine_info()}
    for m, r in per.items():
        row[m] = {"tau": sum(r["lengths"]) / len(r["lengths"]), "n_verify": len(r["lengths"]),
                  "speedup_vs_ar": speedup(ar_ms, r["ms"])["speedup"], "identical": r["identical"]}
    print(json.dumps({k: v for k, v in row.items() if k != "machine"}), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
