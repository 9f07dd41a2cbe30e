"""`train fit` and `train eval` stages (added to `python -m dflash train`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from dflash.errors import ValidationError
from dflash.training.fit_config import FitConfig, read_data_meta


def cmd_fit(args: argparse.Namespace) -> int:
    kw = {f.name: getattr(args, f.name) for f in fields(FitConfig) if hasattr(args, f.name) and getattr(args, f.name) is not None}
    if args.layer_ids:
        try:
            kw["target_layer_ids"] = [int(x) for x in args.layer_ids.split(",")]
        except ValueError:
            raise ValidationError("--layer-ids", f"must be comma-separated integers, got {args.layer_ids!r}") from None
    cfg = FitConfig(**kw)  # checks the options before torch is imported; the Trainer checks them against the data
    read_data_meta(cfg.data)  # a missing data directory, too
    from dflash.training.fit import Trainer

    Trainer(cfg).fit()
    return 0


def eval_prompts(args: argparse.Namespace) -> list[str | list[int]]:
    """The prompts to evaluate (text, or a JSONL row's token ids as they are), after every option error that needs
    no model (one line naming the option)."""
    from dflash.cli import check_model_args, check_output_path
    from dflash.datasets import prompt_rows
    from dflash.request import Request

    check_model_args(args)  # --draft, --threads: as every command that loads a model checks them
    if args.limit < 1:  # prompt_rows would read 0 as "all" and -5 as "all but the last 5"
        raise ValidationError("--limit", f"must be >= 1, got {args.limit}")
    if args.output:  # not after the whole evaluation
        check_output_path("--output", args.output)
    # A request field's error names the field; the CLI prints the option it stands for (dflash.cli.option_name).
    Request(prompt_ids=(0,), max_new_tokens=args.max_new_tokens, block_size=args.block_size,
            diffusion_steps=args.steps, temperature=args.temperature, seed=args.seed)
    return [r.text if r.ids is None else r.ids for r in prompt_rows(args.prompts, args.limit)]


def cmd_eval(args: argparse.Namespace) -> int:
    """τ and acceptance histogram with the real loop, greedy, and speed vs the no-draft run (same process,
    interleaved per prompt)."""
    prompts = eval_prompts(args)  # before torch is imported
    from tqdm import tqdm

    from dflash.bench.machine import machine_info
    from dflash.load import load_engine
    from dflash.training.evaluate import evaluate_draft

    # float32: the exact mode, so "identical" counts outputs equal to the no-draft loop's token for token.
    engine, info = load_engine(args.preset, draft=args.draft, dtype="float32", threads=args.threads)
    with tqdm(total=len(prompts), desc=f"eval {args.prompts}", disable=args.quiet) as bar:  # closed on Ctrl-C too
        res = evaluate_draft(engine, prompts, args.max_new_tokens, args.block_size, args.steps, not args.no_baseline,
                             on_prompt=lambda _row: bar.update(1), temperature=args.temperature, seed=args.seed)
    rows = res.pop("rows")
    out = {"prompts": args.prompts, "draft": info.get("draft"), "max_new_tokens": args.max_new_tokens,
           "block_size": args.block_size, "steps": args.steps, "temperature": args.temperature, **res,
           "machine": machine_info(info["device"]), "settings": info.get("host")}
    print(json.dumps(out))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({**out, "rows": rows, "command": " ".join(sys.argv)}, f, indent=1)
    return 0


def add_stages(stages) -> None:
    f = stages.add_parser("fit", help="train the draft on a data directory (resumes from --out with the same settings)")
    f.add_argument("--data", required=True)
    f.add_argument("--out", required=True)
    for fld in fields(FitConfig):
        if fld.name in ("data", "out", "target_layer_ids"):
            continue
        f.add_argument("--" + fld.name.replace("_", "-"), type=type(fld.default), dest=fld.name)
    f.add_argument("--layer-ids", help="target layers to fuse, comma-separated (default: the z-lab rule)")
    f.set_defaults(func=cmd_fit, _parser=f)
    e = stages.add_parser("eval", help="tau / histogram / speed vs no-draft with the real loop")
    e.add_argument("--preset", default="default")
    e.add_argument("--draft", help="draft directory (default: the preset's)")
    e.add_argument("--prompts", default="mt-bench", help="a set's name or FILE.jsonl, as bench's (docs/bench.md)")
    e.add_argument("--limit", type=int, default=20, help="first N prompts of the set (>= 1)")
    e.add_argument("--max-new-tokens", type=int, default=128)
    e.add_argument("--block-size", type=int)
    e.add_argument("--steps", type=int, default=1)
    e.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: seeded sampling (lossless match rule)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int)
    e.add_argument("--no-baseline", action="store_true")
    e.add_argument("--quiet", action="store_true")
    e.add_argument("--output")
    e.set_defaults(func=cmd_eval, _parser=e)
