"""`train fit` and `train eval` stages (added to `python -m dflash train`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from dflash.cli import DefaultsHelp
from dflash.errors import ModelLoadError, ValidationError
from dflash.training.data_config import check_run_out
from dflash.training.fit_config import FitConfig, read_data_meta

# `train fit --help`: each option's meaning; argparse adds its default.
FIT_HELP = {
    "layers": "the draft's depth: its number of decoder layers (not target layer ids, as in data/data-tf)",
    "block_size": "block size the draft is trained for (>= 2)",
    "gamma": "position-weight decay of the loss; 0: the paper's value for the block size",
    "steps": "optimizer steps of the cosine schedule",
    "seqs_per_step": "sequences per step",
    "anchors_per_seq": "blocks (anchors) per sequence",
    "lr": "peak learning rate",
    "weight_decay": "AdamW weight decay",
    "clip": "gradient-norm clip",
    "partial_prob": "probability of leaving some block positions unmasked (0-1)",
    "kl_weight": "weight of the KL term to the target's distribution",
    "draft_vocab": "draft vocabulary: the most frequent response tokens; 0: the target's full vocabulary",
    "mask_token_id": "token id of the MASK input",
    "intermediate_size": "draft MLP width; 0: the target's",
    "seed": "seed of the initialisation and the batches",
    "ckpt_every": "checkpoint every N steps",
    "eval_every": "teacher-forced held-out metrics every N steps",
    "holdout_shards": "last shards of each data directory held out for the metrics",
    "data_fraction": "train on this fraction of the training sequences (data-size ablation)",
    "threads": "CPU threads; 0: torch's default",
    "init_from": "a draft directory to warm-start from (weights and draft vocabulary); read at the start only",
    "residual_init": "zero: o_proj/down_proj start at 0; normal: N(0, 0.02)",
    "onpolicy_blocks": "1: supervise teacher-forced blocks only along the target's own path",
    "stop_at": "stop after this step (<= --steps; the schedule stays that of --steps); 0: at --steps",
    "snapshot_base": "keep the draft at steps base*2^k (log-spaced); 0: off",
    "copy_weight": "loss weight of blocks whose anchor ends a --copy-ngram seen before, which the copy-first chain "
                   "proposes by copying (0: train only on the blocks the chain hands to the draft)",
    "copy_ngram": "the n-gram length of --copy-weight (the chain's --lookup-ngram)",
    "hint_ngram": "> 0: train a hinted draft, whose masked slots read copy hints of n-grams up to this n (not z-lab's "
                  "format: vLLM and SGLang cannot serve it)",
    "train_only": "hint: train only a hinted draft's hint weights (needs --hint-ngram and --init-from)",
}


def cmd_fit(args: argparse.Namespace) -> int:
    kw = {f.name: getattr(args, f.name) for f in fields(FitConfig) if hasattr(args, f.name) and getattr(args, f.name) is not None}
    if args.layer_ids:
        try:
            kw["target_layer_ids"] = [int(x) for x in args.layer_ids.split(",")]
        except ValueError:
            raise ValidationError("--layer-ids", f"must be comma-separated integers, got {args.layer_ids!r}") from None
    cfg = FitConfig(**kw)  # checks the options before torch is imported; the Trainer checks them against the data
    read_data_meta(cfg.data)  # a missing data directory, or one without shards, too
    check_run_out(cfg.out)
    from dflash.training.fit import Trainer

    Trainer(cfg).fit()
    return 0


def eval_prompts(args: argparse.Namespace) -> list[str | list[int]]:
    """The prompts to evaluate (text, or a JSONL row's token ids as they are), after every option error that needs
    no model (one line naming the option)."""
    from dflash.cli import check_model_args, check_output_path
    from dflash.loading.datasets import prompt_rows
    from dflash.decode.request import Request

    check_model_args(args)  # --draft, --threads: as every command that loads a model checks them
    if args.limit < 1:  # prompt_rows would read 0 as "all" and -5 as "all but the last 5"
        raise ValidationError("--limit", f"must be >= 1, got {args.limit}")
    if args.output:  # not after the whole evaluation
        check_output_path("--output", args.output)
    if args.block_size is not None and args.block_size < 2:  # a block of 1 is the no-draft loop
        raise ValidationError("--block-size", f"must be >= 2 (a block of 1 drafts nothing), got {args.block_size}")
    # A request field's error names the field; the CLI prints the option it stands for (dflash.cli.option_name).
    Request(prompt_ids=(0,), max_new_tokens=args.max_new_tokens, block_size=args.block_size,
            diffusion_steps=args.steps, temperature=args.temperature, seed=args.seed)
    return [r.text if r.ids is None else r.ids for r in prompt_rows(args.prompts, args.limit)]


def check_eval_draft(args: argparse.Namespace) -> None:
    """A local draft directory's config.json (read without its weights) and --block-size against its trained block,
    before the target loads; a hub id is left to the loader."""
    from pathlib import Path

    from dflash.loading.registry import get_preset

    draft = args.draft or get_preset(args.preset).draft
    if not draft or not Path(draft).is_dir():
        return
    from dflash.models.draft import read_draft_config

    try:
        trained = read_draft_config(draft).block_size
    except ModelLoadError as exc:
        raise ValidationError("--draft", f"{draft}: {str(exc).removeprefix('draft: ')}") from None
    if args.block_size is not None and args.block_size > trained:
        raise ValidationError("--block-size", f"must be in [2, {trained}] (the draft's trained block size), "
                                              f"got {args.block_size}")


def cmd_eval(args: argparse.Namespace) -> int:
    """τ and acceptance histogram with the real loop, greedy, and speed vs the no-draft run (same process,
    interleaved per prompt)."""
    prompts = eval_prompts(args)  # before torch is imported
    check_eval_draft(args)
    from tqdm import tqdm

    from dflash.bench.machine import machine_info
    from dflash.loading.load import load_engine
    from dflash.training.evaluate import evaluate_draft

    # float32: the exact mode, so "identical" counts outputs equal to the no-draft loop's token for token.
    try:
        engine, info = load_engine(args.preset, draft=args.draft, dtype="float32", threads=args.threads)
    except ModelLoadError as exc:  # the draft's weights unreadable (a save cut short): named as the option
        if not str(exc).startswith("draft: "):
            raise
        raise ValidationError("--draft", str(exc).removeprefix("draft: ")) from None
    with tqdm(total=len(prompts), desc=f"eval {args.prompts}", disable=args.quiet) as bar:  # closed on Ctrl-C too
        res = evaluate_draft(engine, prompts, args.max_new_tokens, args.block_size, args.steps, not args.no_baseline,
                             on_prompt=lambda _row: bar.update(1), temperature=args.temperature, seed=args.seed)
    rows = res.pop("rows")
    out = {"prompts": args.prompts, "draft": info.get("draft"), "max_new_tokens": args.max_new_tokens,
           "block_size": args.block_size or engine.trained_block_size,  # the block used: the draft's when not given
           "steps": args.steps, "temperature": args.temperature, **res,
           "machine": machine_info(info["device"]), "settings": info.get("host")}
    print(json.dumps(out))
    if not args.quiet:  # stdout keeps the one JSON line for scripts; a person reads this
        print(eval_summary(out), file=sys.stderr)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({**out, "rows": rows, "command": " ".join(sys.argv)}, f, indent=1)
    return 0


def eval_summary(out: dict) -> str:
    """`train eval`'s result in a few lines for a person: τ, how often each length was committed, the speed."""
    hist = out["histogram"]
    total = sum(hist.values()) or 1
    lines = [f"τ = {out['tau']:.2f} tokens per verify over {out['n_prompts']} prompt(s), {out['n_verify']} verifies "
             f"(block {out['block_size']}, {out['steps']} step(s))",
             "tokens committed per verify: " + ", ".join(f"{k}: {100 * v / total:.0f} %" for k, v in hist.items())]
    if "speedup" in out:
        sp = out["speedup_spread"]
        lines.append(f"speed vs no draft: {out['speedup']:.2f}× (per prompt {sp['min']:.2f}–{sp['max']:.2f}×); "
                     f"outputs identical to the no-draft run: {out['identical']}/{out['n_prompts']}")
    return "\n".join(lines)


def add_stages(stages) -> None:
    f = stages.add_parser("fit", help="train the draft on a data directory (resumes from --out with the same settings)")
    f.add_argument("--data", required=True, help="data directories of `train data`/`data-tf`, comma-separated")
    f.add_argument("--out", required=True, help="run directory: the draft, checkpoints, logs (resumed if it holds a run)")
    for fld in fields(FitConfig):
        if fld.name in ("data", "out", "target_layer_ids"):
            continue
        # The parser's own default is None ("not given": FitConfig's applies); the help shows FitConfig's.
        f.add_argument("--" + fld.name.replace("_", "-"), type=type(fld.default), dest=fld.name,
                       help=f"{FIT_HELP[fld.name]} (default: {fld.default!r})".replace("%", "%%"))
    f.add_argument("--layer-ids", help="target layers to fuse, comma-separated (default: the z-lab rule for --layers)")
    f.set_defaults(func=cmd_fit, _parser=f)
    e = stages.add_parser("eval", help="tau / histogram / speed vs no-draft with the real loop",
                          formatter_class=DefaultsHelp)
    e.add_argument("--preset", default="default", help="the registry preset whose target (and draft) to load")
    e.add_argument("--draft", help="draft directory (default: the preset's)")
    e.add_argument("--prompts", default="mt-bench", help="a set's name or FILE.jsonl, as bench's (docs/bench.md)")
    e.add_argument("--limit", type=int, default=20, help="first N prompts of the set (>= 1)")
    e.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt, at most")
    e.add_argument("--block-size", type=int, help="block size (default: the draft's trained one)")
    e.add_argument("--steps", type=int, default=1, help="denoising steps per block")
    e.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: seeded sampling (lossless match rule)")
    e.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    e.add_argument("--threads", type=int, help="CPU threads (default: the host probe's choice)")
    e.add_argument("--no-baseline", action="store_true", help="skip the no-draft runs (no speedup measured)")
    e.add_argument("--quiet", action="store_true", help="no progress bar and no summary on stderr (the JSON line stays)")
    e.add_argument("--output", help="also write the result, with every prompt's row, to this JSON file")
    e.set_defaults(func=cmd_eval, _parser=e)
