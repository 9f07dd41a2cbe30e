"""`python -m dflash generate|bench|train|draft`. Bad arguments exit non-zero with one line, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import threading
from typing import NoReturn
from pathlib import Path

from dflash.decode.adaptive import POLICIES
from dflash.errors import DFlashError, ValidationError
from dflash.loading.registry import draft_dir_problem, looks_like_hub_id
from dflash.decode.request import DEFAULTS, VERIFY_RULES

# Subcommands living in their own packages: module path → function adding the parser.
SUBCOMMANDS = {"bench": "dflash.bench.cli", "sweep": "dflash.bench.sweep_cli", "train": "dflash.training.cli",
               "draft": "dflash.loading.export"}


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--preset", default="default", help="model preset from the registry (default: %(default)s)")
    g.add_argument("--target", help="target: local transformers directory (safetensors) or hub id; overrides --preset")
    g.add_argument("--draft", help="DFlash draft: local directory or hub id")
    g.add_argument("--no-draft", action="store_true", help="autoregressive baseline (same loop, no draft)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "int4"], default="auto",
                   help="auto = bfloat16 on GPU; on a CPU the fastest of float32 (exact), bfloat16 and int4 (the "
                        "GGUF's own Q4_1 weights; both fast: identical except at numerical ties), measured once per "
                        "machine by the host probe and cached; DFLASH_DTYPE also fixes it")
    g.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda when available)")
    g.add_argument("--threads", type=int, help="torch CPU threads (default: chosen by the host probe; DFLASH_THREADS "
                                               "also fixes it)")
    g.add_argument("--quantize", choices=["4bit", "8bit"], help="load the target with bitsandbytes (CUDA only)")
    g.add_argument("--device-map", choices=["auto"], help="split a target larger than one GPU with accelerate (CUDA only)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"], help="most tokens to generate")
    g.add_argument("--block-size", type=int, help="tokens verified per step (default: the draft's trained size)")
    g.add_argument("--temperature", type=float, default=DEFAULTS["temperature"],
                   help="0 = greedy; a value below 1e-5 is greedy too (as in vLLM), in [0, 2]")
    g.add_argument("--top-p", type=float, default=DEFAULTS["top_p"],
                   help="nucleus sampling: keep the most likely tokens up to this mass")
    g.add_argument("--top-k", type=int, default=DEFAULTS["top_k"], help="keep only the k most likely tokens (0 = all)")
    g.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                   help="seed of the sampling noise (same seed, same tokens)")
    g.add_argument("--verify", choices=list(VERIFY_RULES), default=DEFAULTS["verify"],
                   help="sampling rule: match = target's own seeded sample (exact, reproducible); rejection = Leviathan")
    g.add_argument("--steps", type=int, default=DEFAULTS["diffusion_steps"],
                   help="denoising steps per block (1 = the paper's single pass)")
    g.add_argument("--confidence-threshold", type=float, default=DEFAULTS["confidence_threshold"],
                   help="commit positions at least this confident (steps > 1)")
    g.add_argument("--adaptive", choices=list(POLICIES), default=DEFAULTS["adaptive"],
                   help="block-size controller (auto: cost on a CPU, fixed on a GPU)")
    g.add_argument("--min-block-size", type=int,
                   help="smallest block an adaptive policy may choose (default: 2, or --block-size when smaller); "
                        "--block-size may not be below a minimum given here")
    g.add_argument("--max-block-size", type=int,
                   help="largest block an adaptive policy may choose (default: the draft's trained size)")
    g.add_argument("--acceptance-threshold", type=float, default=DEFAULTS["acceptance_threshold"],
                   help="1.0 = exact; < 1 relaxed and LOSSY")
    g.add_argument("--lookup-ngram", type=int, default=DEFAULTS["lookup_ngram"], metavar="N",
                   help="copy from the context first: where the last N tokens occurred earlier, propose what followed "
                        "them instead of running the draft (lossless; 0 = the draft alone, the paper's method)")
    g.add_argument("--deadline", type=float, default=DEFAULTS["deadline_s"],
                   help="wall-clock limit per request, seconds, counted from when it is made: time waiting for the "
                        "engine counts (default: %(default)s)")


def request_kwargs(args: argparse.Namespace) -> dict:
    """Engine options shared by generate and bench (everything but the prompt)."""
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                seed=args.seed, use_draft=not args.no_draft, block_size=args.block_size, diffusion_steps=args.steps,
                confidence_threshold=args.confidence_threshold, acceptance_threshold=args.acceptance_threshold,
                adaptive=args.adaptive, min_block_size=args.min_block_size, max_block_size=args.max_block_size,
                verify=args.verify, deadline_s=args.deadline, lookup_ngram=args.lookup_ngram)


# The decoding options that only shape drafted blocks (`generate --no-draft` names those given).
DRAFT_ONLY = ("block_size", "steps", "confidence_threshold", "adaptive", "min_block_size", "max_block_size",
              "acceptance_threshold", "lookup_ngram")


def draft_only_options(args: argparse.Namespace) -> list[str]:
    """The draft-only options given a value other than their parser's default, as command-line flags."""
    return ["--" + k.replace("_", "-") for k in DRAFT_ONLY if getattr(args, k) != args._parser.get_default(k)]


def check_output_path(param: str, path: str | Path, shown: str | None = None) -> None:
    """A file a command writes once its work is done (a result, a table), checked before any model loads, not after
    the work. `shown`: how the message names the path (default: as given)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValidationError(param, f"directory {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise ValidationError(param, f"{shown or path} is a directory; give a file path")


def check_draft_option(args: argparse.Namespace) -> None:
    """A --draft naming a local folder that cannot be a draft, named before any model loads (the loader said it only
    after the target had loaded). A hub id (owner/name, not an existing path) is left to the loader."""
    draft = getattr(args, "draft", None)
    if draft and not looks_like_hub_id(draft) and (problem := draft_dir_problem(draft)):
        raise ValidationError("draft", problem)


def check_model_args(args: argparse.Namespace) -> None:
    """Option errors found before any model loads: one line naming the option, exit status 2."""
    check_draft_option(args)
    if args.threads is not None and args.threads < 1:
        raise ValidationError("--threads", f"must be >= 1, got {args.threads}")
    if args.threads is not None:  # the upper bound needs dflash.loading.host (torch): only when --threads is given
        from dflash.loading.host import threads_problem

        if problem := threads_problem(args.threads):
            raise ValidationError("--threads", problem)
    if getattr(args, "device", None):  # the loader's own check (it imports torch: only when a device is named)
        from dflash.loading.load import pick_device

        pick_device(args.device)


def engine_from_args(args: argparse.Namespace):
    """The engine the model options name; a draft the user named that cannot be loaded is named as --draft."""
    from dflash.errors import ModelLoadError
    from dflash.loading.load import load_engine

    check_model_args(args)
    try:
        return load_engine(args.preset, args.target, args.draft, args.no_draft, args.dtype, args.device, args.threads,
                           quantize=args.quantize, device_map=getattr(args, "device_map", None))
    except ModelLoadError as exc:  # not a ValidationError: its config field names are no request fields to rename
        if args.draft and str(exc).startswith("draft: "):
            raise ModelLoadError(f"--draft: {str(exc).removeprefix('draft: ')}") from None
        raise


def cmd_generate(args: argparse.Namespace) -> int:
    from dflash.decode.events import Commit, Finished, event_to_dict
    from dflash.decode.request import Request

    if (args.prompt is None) == (args.prompt_ids is None):
        raise ValidationError("--prompt", "give --prompt TEXT or --prompt-ids 1,2,3 (one of them, not both)")
    ids = None
    if args.prompt == "-":  # `echo … | python -m dflash generate --prompt -`: stdin is the message (echo's last
        if sys.stdin.isatty():  # newline left out, as a shell's "$(cat file)" would)
            print("reading the message from standard input (end it with Ctrl-D)", file=sys.stderr)
        args.prompt = sys.stdin.read().rstrip("\n")
    if args.prompt_ids is not None:
        try:
            ids = tuple(int(x) for x in args.prompt_ids.split(",") if x.strip())
        except ValueError:
            raise DFlashError("--prompt-ids: must be comma-separated integers") from None
    if args.trace_attention and not args.trace:
        raise ValidationError("--trace-attention", "needs --trace FILE (the attention is recorded in the trace)")
    request = Request(prompt=args.prompt or "", prompt_ids=ids, trace_attention=args.trace_attention,
                      **request_kwargs(args))
    check_model_args(args)
    unused = draft_only_options(args) if args.no_draft else []
    if unused:  # accepted (the same command line can time both runs) but said, never silently dropped
        print(f"note: no effect with --no-draft (they shape drafted blocks only): {', '.join(unused)}", file=sys.stderr)
    check_trace_path(args.trace)  # before the model loads: a bad path fails in a second, not after the load
    engine, info = engine_from_args(args)
    if not args.json:
        print(f"[loaded {info['target']} in {info['target_load_s']:.1f} s on {info['device']}/{info['dtype']}"
              + (f"; draft {info['draft']}" if "draft" in info else "; no draft")
              + (f"; {engine.host.summary()}" if engine.host else "") + "]", file=sys.stderr)
    cancel = threading.Event()
    fin = None
    # Ctrl-C asks the engine to stop after the current block (or prefill chunk): it finishes with reason "cancelled",
    # so the partial output is printed and the trace ends with its Finished line.
    events = engine.stream(request, cancel)  # checks the request against the models (a refusal raises here)
    trace = TraceFile(args.trace) if args.trace else None  # only now: a refused command leaves an old trace alone
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        for event in events:
            if trace:
                trace.write(event_to_dict(event))
            if isinstance(event, Commit) and not args.json:
                print(event.text_delta, end="", flush=True)
            if isinstance(event, Finished):
                fin = event
    finally:
        signal.signal(signal.SIGINT, previous)
        if trace:
            trace.close()
    if args.json:
        print(json.dumps({"output_ids": fin.output_ids, "text": fin.text, "finish_reason": fin.reason,
                          "message": fin.message, "stats": fin.stats, "settings": info.get("host")}))
    else:
        s = fin.stats
        print(flush=True)  # the streamed text ends its line on stdout, wherever stderr goes
        print(f"\n[{fin.reason}{': ' + fin.message if fin.message else ''}] {s['n_output_tokens']} tokens, "
              f"tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} tok/s, TTFT {s['ttft_ms']:.0f} ms, "
              f"draft {s['draft_ms']:.0f} ms / verify {s['verify_ms']:.0f} ms"
              + (f", {s['copy_blocks']} blocks copied (tau {s['copy_tau']:.2f})" if s["copy_blocks"] else "")
              + (f", LOSSY: {s['drift_tokens']} tokens differ from the target's own choice" if s["lossy"] else ""),
              file=sys.stderr)
    status = {"error": 1, "cancelled": 130}.get(fin.reason, 0)
    return status or int(bool(trace and trace.failed))  # the result printed, an incomplete trace still exits 1


def check_trace_path(path: str | None) -> None:
    """Refuse a --trace file that could not be written, without creating or truncating it."""
    if not path:
        return
    p = Path(path)
    problem = ("is a directory" if p.is_dir() else "its directory does not exist" if not p.parent.is_dir() else
               "is not writable" if not os.access(p if p.exists() else p.parent, os.W_OK) else None)
    if problem:
        raise DFlashError(f"--trace: cannot write {path}: {problem}")


class TraceFile:
    """--trace, written one line per event as the run goes (line-buffered). A write that fails (a full disk,
    /dev/full) is said at once in one line and writing stops; the run goes on and its result is still printed."""

    def __init__(self, path: str):
        self.path, self.failed = path, False
        try:
            self.file = open(path, "w", buffering=1)
        except OSError as exc:
            raise DFlashError(f"--trace: cannot write {path}: {exc.strerror}") from None

    def write(self, event: dict) -> None:
        if not self.failed:
            try:
                self.file.write(json.dumps(event) + "\n")
            except OSError as exc:
                self._fail(exc)

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            if not self.failed:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = True
        print(f"error: --trace: writing {self.path} failed ({exc.strerror or exc}); the trace is incomplete",
              file=sys.stderr, flush=True)
        try:
            self.file.close()  # drops what could not be written
        except OSError:
            pass


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default after its meaning, where it has one (not for a required option, a flag, or
    one whose help says what "not given" means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None or action.default is False else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, an invalid choice, a value that is not a number) in the one line our
    option errors use, `error: --option: …`, pointing to --help instead of printing the usage first. Subcommands'
    parsers are of this class too (add_subparsers makes them of the parent's class)."""

    def __init__(self, *args, **kwargs):
        # No prefixes of long options: `--conversation 3` was taken as --conversations, and an error then quoted a
        # value under a name the user never typed.
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message.removeprefix('argument ')} (usage: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m dflash", description="DFlash block-diffusion speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream one answer and print statistics", formatter_class=DefaultsHelp)
    g.add_argument("--prompt", help="user message (the chat template is applied); - reads it from standard input")
    g.add_argument("--prompt-ids", help="raw prompt token ids, comma-separated (no template)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g.add_argument("--trace", help="write every event as JSON lines to this file")
    g.add_argument("--trace-attention", action="store_true",
                   help="with --trace: also record what the draft attends to (per draft layer, each drafted slot's "
                        "top context positions and its row over the block)")
    add_model_args(g)
    add_engine_args(g)
    g.set_defaults(func=cmd_generate, _parser=g)
    for name, module in SUBCOMMANDS.items():
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as exc:
            if not module.startswith(exc.name or "-"):
                raise
    return parser


# Request fields whose command-line option has another name (the inverse of request_kwargs' renames).
FIELD_DESTS = {"diffusion_steps": "steps", "deadline_s": "deadline", "use_draft": "no_draft"}


def option_name(args: argparse.Namespace, param: str) -> str:
    """The option a ValidationError's parameter stands for on this command (`top_p` → `--top-p`), so the message
    names what the user typed; the parameter itself where the command has no such option."""
    dest = FIELD_DESTS.get(param, param)
    parser = getattr(args, "_parser", None)
    for action in parser._actions if parser and not param.startswith("-") else ():
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return param


def option_words(args: argparse.Namespace, message: str) -> str:
    """The request fields a message cites, as this command's options ("must be >= min_block_size (4)" →
    "--min-block-size"). Not use_draft (its option, --no-draft, means the opposite), nor a word inside quotes or a
    path, nor one the user typed as a value (`--draft no_draft`)."""
    import dataclasses

    from dflash.decode.request import Request

    fields = {f.name for f in dataclasses.fields(Request)} - {"use_draft"}
    typed = " ".join(v for v in vars(args).values() if isinstance(v, str))

    def named(m: re.Match) -> str:
        word = m.group()
        return option_name(args, word) if word in fields and word not in typed else word

    return re.sub(r"(?<![\w/.'\"-])[a-z]+(?:_[a-z]+)+(?![\w/.'\"-])", named, message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a result file records its command
    if extra:  # said by the subcommand's parser: its --help lists the options (the top level's lists subcommands)
        (getattr(args, "_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except ValidationError as exc:
        print(f"error: {option_name(args, exc.param)}: {option_words(args, exc.message)}", file=sys.stderr)
        return 2
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while a model loads (generation itself stops cleanly on Ctrl-C)
        print("interrupted", file=sys.stderr)
        return 130
