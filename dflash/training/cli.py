"""`python -m dflash train data|data-tf|fit|eval` — the draft training pipeline."""

from __future__ import annotations

import argparse
import logging

from dflash.errors import ValidationError
from dflash.registry import SMOLLM2_GGUF

DEFAULT_LAYERS = "1,8,14,15,21,27"  # a superset, so drafts of 1-3 layers can be ablated on one data set


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def cmd_data(args: argparse.Namespace) -> int:
    from dflash.training.data import run_data

    run_data(args.target, args.out, args.prompts, _ints(args.layers), args.batch_size, args.max_prompt_tokens,
             args.max_new_tokens, args.sampled_every, args.temperature, args.seed, args.threads)
    return 0


def cmd_data_tf(args: argparse.Namespace) -> int:
    from dflash.training.data import run_teacher_forced

    if not 0 <= args.min_prompt_tokens < args.max_prompt_tokens:
        raise ValidationError("--min-prompt-tokens", "must be >= 0 and below --max-prompt-tokens")
    run_teacher_forced(args.target, args.out, args.conversations, _ints(args.layers), args.batch_size,
                       args.max_prompt_tokens, args.max_response_tokens, args.threads, args.turns, args.min_prompt_tokens)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a DFlash draft: data → fit → eval")
    stages = p.add_subparsers(dest="stage", required=True)
    d = stages.add_parser("data", help="regenerate ShareGPT responses with the target, capturing its features")
    d.add_argument("--target", default=SMOLLM2_GGUF)
    d.add_argument("--out", required=True, help="data directory (resumable: existing shards are kept)")
    d.add_argument("--prompts", type=int, default=2000, help="number of training prompts")
    d.add_argument("--layers", default=DEFAULT_LAYERS, help="target layers whose outputs are stored")
    d.add_argument("--batch-size", type=int, default=32)
    d.add_argument("--max-prompt-tokens", type=int, default=256)
    d.add_argument("--max-new-tokens", type=int, default=192)
    d.add_argument("--sampled-every", type=int, default=4, help="every Nth shard is sampled (T=--temperature), the rest greedy")
    d.add_argument("--temperature", type=float, default=0.7)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int)
    d.set_defaults(func=cmd_data)
    t = stages.add_parser("data-tf", help="cheap extra data: teacher-forced target pass over ShareGPT's recorded replies")
    t.add_argument("--target", default=SMOLLM2_GGUF)
    t.add_argument("--out", required=True)
    t.add_argument("--conversations", type=int, default=4000)
    t.add_argument("--layers", default=DEFAULT_LAYERS)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--max-prompt-tokens", type=int, default=160)
    t.add_argument("--min-prompt-tokens", type=int, default=0,
                   help="keep only prompts longer than this (a set disjoint from one made with --max-prompt-tokens N=this)")
    t.add_argument("--max-response-tokens", type=int, default=256)
    t.add_argument("--threads", type=int)
    t.add_argument("--turns", choices=("first", "later", "all"), default="first",
                   help="which replies: each conversation's first, the later ones (earlier turns as history), or all")
    t.set_defaults(func=cmd_data_tf)
    from dflash.training.fit_cli import add_stages  # fit/eval: their own module (the trainer's options)

    add_stages(stages)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
