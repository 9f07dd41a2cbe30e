"""`python -m dflash bench`: methods × prompts → result JSON (schema: docs/bench.md) + a Markdown table.

The JSON is rewritten after every prompt (atomically), so an interrupted run keeps what it measured and
`--resume` continues it with the same settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dflash.bench.config import DRAFT_METHODS, BenchConfig
from dflash.cli import (DefaultsHelp, add_engine_args, add_model_args, check_model_args, check_output_path, engine_from_args,
                        request_kwargs)
from dflash.loading.datasets import prompt_rows
from dflash.errors import ValidationError

if TYPE_CHECKING:  # for annotations only: imported where used, so that parsing the command line loads no torch
    from dflash.decode.engine import Engine

DEFAULT_METHODS = "ar,dflash,dflash-lookup,hf-generate,hf-prompt-lookup"
RANDOM_DRAFT_MAX_LAYERS = 8


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="measure speedup against the baselines (ar, hf-generate, prompt lookup)",
                              description="Run methods over a prompt set; write a JSON result and a Markdown table.",
                              formatter_class=DefaultsHelp)
    g = p.add_argument_group("benchmark")
    g.add_argument("--prompts", default="mt-bench",
                   help="mt-bench | humaneval | sharegpt-heldout | FILE.jsonl (rows all with prompt text or all with "
                        "prompt_ids; docs/bench.md)")
    g.add_argument("--limit", type=int, help="first N prompts of the set (default: all)")
    g.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated methods from %(default)s (default: all of them)")
    g.add_argument("--repeats", type=int, default=1, help="runs of each method on each prompt (interleaved)")
    g.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each method")
    g.add_argument("--prompt-lookup-num-tokens", type=int, default=10, help="hf-prompt-lookup: tokens per lookup")
    g.add_argument("--max-matching-ngram-size", type=int, default=2, help="hf-prompt-lookup: n-gram size")
    g.add_argument("--output", default="bench-result.json", help="result JSON (a Markdown table is written next to it)")
    g.add_argument("--markdown", help="Markdown path (default: the output path with .md)")
    again = g.add_mutually_exclusive_group()  # continue a file or replace it: both at once would drop one silently
    again.add_argument("--resume", action="store_true",
                       help="continue an interrupted run with the same settings (a complete one: nothing to do)")
    again.add_argument("--overwrite", action="store_true", help="replace an existing result file")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--random-draft", type=int, metavar="LAYERS",
                   help="development only: a RANDOM draft with LAYERS layers sized for the target (measures draft "
                        "and verify overhead; tau is ~1, so dflash is slower than ar)")
    add_model_args(p)
    add_engine_args(p)
    _bench_lookup_ngram(p)
    p.set_defaults(func=cmd_bench, _parser=p)
    return p


def _bench_lookup_ngram(p: argparse.ArgumentParser) -> None:
    """generate's --lookup-ngram (shared, dflash.cli) turns copying on for the one request, 0 = off; here only
    dflash-lookup copies, always, so the option is that method's n-gram length and means nothing without it."""
    p.set_defaults(lookup_ngram=None)  # None: not given (dflash-lookup then uses DEFAULT_LOOKUP_NGRAM)
    action = next(a for a in p._actions if a.dest == "lookup_ngram")
    action.help = ("dflash-lookup's n-gram length, 1-8 (default 2): where the last N tokens occurred earlier, it "
                   "proposes what followed them instead of running the draft; only dflash-lookup copies, so this "
                   "needs it among --methods")


def command_line(args: argparse.Namespace) -> str:
    """The command, rebuilt from the parsed options that differ from their defaults (reproducible as shown)."""
    parts = ["python", "-m", "dflash", "bench"]
    for action in args._parser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            parts.append(flag)
        else:
            parts += [flag, str(value)]
    import shlex

    return shlex.join(parts)


def check_random_draft(layers: int | None) -> None:
    """--random-draft LAYERS, checked before any model loads (None: not given; 0 is refused, not ignored)."""
    if layers is not None and not 1 <= layers <= RANDOM_DRAFT_MAX_LAYERS:
        raise ValidationError("random_draft", f"must be in [1, {RANDOM_DRAFT_MAX_LAYERS}] layers, got {layers}")


def _random_draft(engine, layers: int):
    """A random DFlash draft sized like the target's own layers (development: overhead measurements only)."""
    import torch

    from dflash.models.draft import DFlashDraftModel, DraftConfig
    from dflash.decode.engine import Engine

    check_random_draft(layers)
    tg = engine.target
    torch.manual_seed(0)
    cfg = DraftConfig.for_target(tg.config, tg.vocab_size, layers=layers)
    return Engine(tg, DFlashDraftModel(cfg), name=engine.name)


def json_output(args) -> Path:
    """--output: a .json file in an existing folder, replaced only with --overwrite or continued with --resume (bench,
    sweep)."""
    out = Path(args.output)
    if out.suffix != ".json":
        raise ValidationError("output", f"must end in .json, got {args.output!r}")
    check_output_path("output", out)
    if out.exists() and not (args.resume or args.overwrite):
        raise ValidationError("output", f"{args.output} exists: pass --resume to continue it or --overwrite to replace it")
    return out


def _result_paths(args) -> tuple[Path, Path]:
    """Both output paths, checked before any model loads: the files are first written after the first prompt. The
    table's default path (the output's, with .md) is checked as a given --markdown is."""
    out = json_output(args)
    md = out.with_suffix(".md") if args.markdown is None else Path(args.markdown)
    shown = f"{md} (the default: --output with .md)" if args.markdown is None else args.markdown
    check_output_path("markdown", md, shown)
    if md.resolve() == out.resolve():
        raise ValidationError("markdown", "must differ from --output (the table would replace the JSON result)")
    if md.exists() and not (args.resume or args.overwrite):
        raise ValidationError("markdown", f"{shown} exists: pass --overwrite to replace it (or --resume)")
    return out, md


def cmd_bench(args: argparse.Namespace) -> int:
    cfg = _bench_config(args)  # every option error that needs no model, before torch is imported
    json_path, md_path = _result_paths(args)
    check_model_args(args)  # --draft, --threads
    needs = [m for m in cfg.methods if m in DRAFT_METHODS]
    if needs and args.no_draft:
        raise ValidationError("methods", f"--no-draft loads no draft: leave {', '.join(needs)} out of --methods")
    rows = prompt_rows(args.prompts, args.limit)  # every row's format; the ids against the model after it loads
    old = _read_result(json_path) if args.resume and json_path.exists() else None
    if old is not None and old.get("complete") is True:  # nothing to measure: no model load, the file left as it was
        _check_same_config(old, {"prompts": args.prompts, "limit": args.limit, "n_prompts": len(rows), **cfg.to_dict()},
                           json_path)
        print(f"nothing to resume: {json_path} is complete (pass --overwrite to measure again)", file=sys.stderr)
        return 0
    from dflash.bench.resume import resume
    from dflash.bench.runner import check_methods, prompt_items, validate_prompts, warm_up

    engine, info = _bench_engine(args)
    check_methods(engine, cfg)
    items = prompt_items(engine, rows)
    validate_prompts(engine, items, cfg)
    result = _new_result(args, engine, info, cfg, len(items))
    if old is not None:
        resume(result, old, args.output, items)
    done = {p["index"] for p in result["prompts"]}
    todo = [it for it in items if it.index not in done]
    if todo and cfg.warmup:
        warm_up(engine, todo, cfg)
    _run_prompts(engine, cfg, todo, result, (json_path, md_path), _progress_bar(len(items), len(done), args.no_progress))
    _finish(result, info["device"], json_path, md_path)
    return 0


def _read_result(json_path: Path) -> dict:
    """The result document `--resume` continues; a file that is not one is named, not a traceback."""
    try:
        doc = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValidationError("resume", f"{json_path} is not a readable bench result ({type(exc).__name__}); use "
                                        "--overwrite to start again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("prompts"), list):
        raise ValidationError("resume", f"{json_path} is not a bench result; use --overwrite to start again")
    return doc


def _check_same_config(old: dict, config: dict, json_path: Path) -> None:
    """A complete result asked to resume under another configuration (more prompts, say) is refused, as an
    incomplete one is: it would not be extended."""
    from dflash.bench.resume import differences

    differ = [d for d in differences(old, {"config": config}) if d.startswith("config")]
    if differ:
        raise ValidationError("resume", f"{json_path} is complete and was made under other conditions: "
                                        f"{'; '.join(differ)}; use --overwrite to measure again")


def _bench_config(args: argparse.Namespace) -> BenchConfig:
    if args.limit is not None and args.limit < 1:
        raise ValidationError("limit", f"must be >= 1, got {args.limit}")
    check_random_draft(args.random_draft)
    if args.random_draft is not None and (args.draft or args.no_draft):
        raise ValidationError("random_draft", "replaces the draft: leave out --draft and --no-draft")
    kwargs = request_kwargs(args)
    del kwargs["use_draft"], kwargs["lookup_ngram"]  # the method decides both
    return BenchConfig(methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), request=kwargs,
                       repeats=args.repeats, warmup=not args.no_warmup,
                       prompt_lookup_num_tokens=args.prompt_lookup_num_tokens,
                       max_matching_ngram_size=args.max_matching_ngram_size, lookup_ngram=args.lookup_ngram)


def _bench_engine(args: argparse.Namespace) -> tuple[Engine, dict]:
    """The engine to measure and its description. --random-draft: the target alone (the preset's draft may not
    exist yet), then the random draft attached."""
    random_draft = args.random_draft is not None
    engine, info = engine_from_args(argparse.Namespace(**{**vars(args), "no_draft": args.no_draft or random_draft}))
    if random_draft:
        engine = _random_draft(engine, args.random_draft)
        info["draft"] = f"RANDOM ({args.random_draft} layers, seed 0; development only)"
    return engine, info


def _new_result(args: argparse.Namespace, engine: Engine, info: dict, cfg: BenchConfig, n_prompts: int) -> dict:
    """The result document before any prompt is measured (schema: docs/bench.md)."""
    from dflash.bench.machine import machine_info, now_iso

    config = {"prompts": args.prompts, "limit": args.limit, "n_prompts": n_prompts, **cfg.to_dict()}
    models = {"name": engine.name, "preset": args.preset, **info, "trained_block_size": engine.trained_block_size}
    return {"schema": "dflash-bench/1", "command": command_line(args), "started_at": now_iso(), "finished_at": None,
            "complete": False, "machine": machine_info(info["device"]), "models": models, "config": config,
            "prompts": []}


def _progress_bar(total: int, done: int, disable: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="prompt", disable=disable, file=sys.stderr, dynamic_ncols=True)


def _run_prompts(engine: Engine, cfg: BenchConfig, todo: list, result: dict, paths: tuple[Path, Path], bar) -> None:
    """Measure the prompts of `todo`, rewriting the result files after each one (an interrupted run keeps them, and
    Ctrl-C says how many)."""
    from dflash.bench import report
    from dflash.bench.runner import run_prompt

    written = len(result["prompts"])  # the prompts the files hold: those resumed, then each one once written
    try:
        for item in todo:
            def on_run(method: str, repeat: int) -> None:
                bar.set_postfix_str(f"{method} (repeat {repeat + 1}/{cfg.repeats}) {_running(result)}", refresh=True)

            result["prompts"].append(run_prompt(engine, item, cfg, on_run))
            result["prompts"].sort(key=lambda p: p["index"])
            report.write_result(result, *paths)
            written = len(result["prompts"])
            bar.update(1)
        bar.set_postfix_str(_running(result))
    except KeyboardInterrupt:
        print(f"{written} of {bar.total} prompts saved in {paths[0]}; the same command with --resume continues it"
              if written else "no prompt finished: nothing saved", file=sys.stderr)
        raise
    finally:
        bar.close()


def _finish(result: dict, device: str, json_path: Path, md_path: Path) -> None:
    """Mark the result complete, write it, print the table and any output that differs from ar."""
    from dflash.bench import report
    from dflash.bench.machine import machine_info, now_iso

    result.update(complete=True, finished_at=now_iso(), load_average_end=machine_info(device)["load_average"])
    report.write_result(result, json_path, md_path)
    print(report.markdown(result))
    for d in result["differences"]:
        print(f"warning: prompt {d['prompt']}: {d['method']} differs from ar at output token {d['first_diff']}: "
              f"{report.why(d, result['models'].get('dtype') or '')}", file=sys.stderr)
    print(f"[wrote {json_path} and {md_path}]", file=sys.stderr)


def _running(result: dict) -> str:
    """'dflash 1.42x, hf-generate 0.98x' — the speedups over the prompts finished so far."""
    if not result["prompts"]:
        return ""
    from dflash.bench.report import summarize

    parts = []
    for m, s in summarize(result).items():
        if s["speedup"] is not None:
            key = "decode" if result["config"]["greedy"] else "per_token"
            parts.append(f"{m} {s['speedup'][key]['speedup']:.2f}x")
    return ", ".join(parts)
