"""How often each draft's first proposal is right, split by what copying from the context could do there.

    python scripts/copy_gap.py --draft shipped=assets/draft-smollm2-135m \
        --draft scratch2@2000=runs/scratch2/snapshots/step_002000 --out results/training/copy-gap.jsonl

Greedy real loop with a fixed block (the training curve's set-up: same prompts, same τ), one JSON line per draft
appended to --out (a label already there is skipped, so the script resumes). See dflash/training/copy_gap.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", action="append", required=True, metavar="LABEL=DIR", help="a draft directory to measure")
    ap.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    ap.add_argument("--prompts", default="sharegpt-heldout")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype", default="auto", help="auto: the engine's settings for this host, as the τ curve")
    args = ap.parse_args()
    drafts = [d.split("=", 1) for d in args.draft]
    if any(len(d) != 2 for d in drafts):
        ap.error("--draft: expected LABEL=DIR")

    from dflash.bench.machine import machine_info
    from dflash.loading.datasets import load_prompts
    from dflash.models.draft import load_draft
    from dflash.decode.engine import Engine
    from dflash.loading.load import load_engine
    from dflash.training.copy_gap import copy_gap

    out = Path(args.out)
    done = {json.loads(x)["label"] for x in out.read_text().splitlines()} if out.is_file() else set()
    todo = [(label, path) for label, path in drafts if label not in done]
    if not todo:
        return
    base, info = load_engine("default", no_draft=True, threads=args.threads, dtype=args.dtype)
    prompts = load_prompts(args.prompts, args.limit)
    out.parent.mkdir(parents=True, exist_ok=True)
    for label, path in todo:
        t0 = time.time()
        draft, vocab = load_draft(path)
        res = copy_gap(Engine(base.target, draft, vocab), prompts, args.max_new_tokens)
        row = {"label": label, "draft": path, "prompts": args.prompts, "limit": args.limit,
               "max_new_tokens": args.max_new_tokens, "dtype": info["dtype"], **res, "seconds": round(time.time() - t0, 1),
               "machine": machine_info()}
        print(json.dumps({k: v for k, v in row.items() if k != "machine"}), flush=True)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
