"""`python -m dflash train data|data-tf|fit|eval|diagnose` — the draft training pipeline."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields

from dflash.cli import DefaultsHelp
from dflash.loading.registry import SMOLLM2_GGUF
from dflash.training.data_config import DEFAULT_LAYERS, DataConfig, TeacherForcedConfig, parse_layers


def _config(cls, args: argparse.Namespace):
    """The stage's config from its options (the same names); it validates itself before any model loads."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)} | {"layers": parse_layers(args.layers)})


def cmd_data(args: argparse.Namespace) -> int:
    cfg = _config(DataConfig, args)  # before torch is imported: a bad option is named at once
    from dflash.training.data import run_data

    run_data(cfg)
    return 0


def cmd_data_tf(args: argparse.Namespace) -> int:
    cfg = _config(TeacherForcedConfig, args)
    from dflash.training.data import run_teacher_forced

    run_teacher_forced(cfg)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    import sys

    from dflash.training.diagnose import DiagnoseConfig, run_diagnose, summary_lines

    cfg = DiagnoseConfig(**{f.name: getattr(args, f.name) for f in fields(DiagnoseConfig)})
    for line in summary_lines(run_diagnose(cfg)):
        print(line, file=sys.stderr)
    return 0


def add_diagnose(stages, helped: dict) -> None:
    g = stages.add_parser("diagnose", help="what limits the draft: baselines, per-slot accuracy, a probe pair", **helped)
    g.add_argument("--data", required=True, help="data directories (comma-separated) made by train data / data-tf")
    g.add_argument("--draft", required=True, help="the draft directory to measure (its layers select the features)")
    g.add_argument("--out", required=True, help="the JSON result file")
    g.add_argument("--holdout-shards", type=int, default=4, help="the last N shards of each data directory are held out")
    g.add_argument("--probe-steps", type=int, default=600, help="training steps of each probe")
    g.add_argument("--probe-seqs", type=int, default=8, help="sequences per probe step (64 anchors each)")
    g.add_argument("--seed", type=int, default=0, help="seed of the probes' initialisation and batches")
    g.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    g.set_defaults(func=cmd_diagnose, _parser=g)


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a DFlash draft: data → fit → eval")
    stages = p.add_subparsers(dest="stage", required=True)
    # Every option's meaning, and its default (argparse adds it), so a workshop can size a run from --help alone.
    helped = {"formatter_class": DefaultsHelp}
    d = stages.add_parser("data", help="regenerate ShareGPT responses with the target, capturing its features", **helped)
    d.add_argument("--target", default=SMOLLM2_GGUF, help="the target model whose features and labels the data holds")
    d.add_argument("--out", required=True, help="data directory (resumable with the same settings; --prompts may grow)")
    d.add_argument("--prompts", type=int, default=2000, help="number of training prompts: the size of the run")
    d.add_argument("--layers", default=",".join(map(str, DEFAULT_LAYERS)),
                   help="target layer ids whose outputs are stored (fit's --layers is the draft's depth)")
    d.add_argument("--batch-size", type=int, default=32, help="prompts generated together (one shard each batch)")
    d.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped")
    d.add_argument("--max-new-tokens", type=int, default=192, help="response tokens generated per prompt, at most")
    d.add_argument("--sampled-every", type=int, default=4, help="every Nth shard is sampled (T=--temperature), the rest greedy")
    d.add_argument("--temperature", type=float, default=0.7, help="temperature of the sampled shards")
    d.add_argument("--seed", type=int, default=0, help="seed of the prompt order and the sampling")
    d.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    d.set_defaults(func=cmd_data, _parser=d)
    t = stages.add_parser("data-tf", help="cheap extra data: teacher-forced target pass over ShareGPT's recorded replies",
                          **helped)
    t.add_argument("--target", default=SMOLLM2_GGUF, help="the target model whose features and labels the data holds")
    t.add_argument("--out", required=True, help="data directory (resumable with the same settings; --conversations may grow)")
    t.add_argument("--conversations", type=int, default=4000,
                   help="ShareGPT conversations read: the size of the run")
    t.add_argument("--layers", default=",".join(map(str, DEFAULT_LAYERS)),
                   help="target layer ids whose outputs are stored (fit's --layers is the draft's depth)")
    t.add_argument("--batch-size", type=int, default=16, help="replies run through the target together (one shard each)")
    t.add_argument("--max-prompt-tokens", type=int, default=160, help="replies after a longer prompt are skipped")
    t.add_argument("--min-prompt-tokens", type=int, default=0,
                   help="keep only prompts longer than this (a set disjoint from one made with --max-prompt-tokens N=this)")
    t.add_argument("--max-response-tokens", type=int, default=256, help="longer replies are cut to this")
    t.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    t.add_argument("--turns", choices=("first", "later", "all"), default="first",
                   help="which replies: each conversation's first, the later ones (earlier turns as history), or all")
    t.set_defaults(func=cmd_data_tf, _parser=t)
    from dflash.training.fit_cli import add_stages  # fit/eval: their own module (the trainer's options)

    add_stages(stages)
    add_diagnose(stages, helped)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
