"""`profile settings`: is the host probe's choice the fastest? With `--method ar` (the default): `ar` with the
default settings, `hf-generate` with the same settings, and `ar` with every fixed setting — dtype {float32,
bfloat16} × threads (1, half and all usable cores) × decoder layout {linear, transposed} — interleaved on each
prompt in one process. With a draft, the engine's settings are chosen for DFlash blocks, so `ar` also runs in the
settings an engine loaded without the draft gets (probed on the one-token step alone): "default, no draft".
With `--method dflash`: DFlash (the engine's default block policy) in the default settings and in every fixed
setting, and `ar` in the default settings ("default, ar") for the speedup in the same run.

Each fixed setting runs on its own copy of the weights, so switching between them costs nothing timed. The result
gives decode tokens/s per setting (total tokens / total decode time over the prompts), the default's ratio to the
fastest fixed setting (and to `hf-generate` or `ar`), and how many outputs equal the default's.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
from dataclasses import dataclass

import torch

from dflash.bench.runner import BenchConfig, PromptItem, prepare_prompts, run_method
from dflash.decode.engine import Engine
from dflash.errors import ValidationError
from dflash.loading.host import thread_candidates
from dflash.models.packed import LAYOUTS
from dflash.models.target import Target

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULTS = ("default", "default, no draft", "default, ar", "hf-generate")  # the rows that are not fixed settings
METHODS = ("ar", "dflash")


@dataclass(frozen=True)
class Setting:
    name: str  # "default", "hf-generate" or "float32, 2 threads, transposed"
    engine: Engine
    threads: int
    method: str = "ar"


def fixed_settings(model: torch.nn.Module, tokenizer, name: str, dtypes: list[str], threads: list[int],
                   like: Engine | None = None, method: str = "ar") -> list[Setting]:
    """One engine per (dtype, layout), each on its own copy of `model` (as loaded: float32, no hooks) and, for
    `method` dflash, of `like`'s draft; at each thread count."""
    out = []
    for dtype in dtypes:
        for layout in LAYOUTS:
            target = Target(copy.deepcopy(model), tokenizer, name=name, dtype=DTYPES[dtype], layout=layout)
            draft = dict(draft=copy.deepcopy(like.draft), draft_vocab=like.draft_vocab) if method == "dflash" else {}
            e = Engine(target, name=name, **draft)
            out += [Setting(f"{dtype}, {n} thread{'s' * (n != 1)}, {layout}", e, n, method) for n in threads]
    return out


def measure(engine: Engine, items: list[PromptItem], settings: list[Setting], max_new_tokens: int) -> dict:
    """Every setting on every prompt, the order rotated by one per prompt; greedy. Returns the summary dict."""
    cfg = BenchConfig(methods=("ar", "dflash", "hf-generate"), request={"max_new_tokens": max_new_tokens,
                                                                        "deadline_s": None})
    before = torch.get_num_threads()
    tokens = {s.name: 0 for s in settings}
    ms = {s.name: 0.0 for s in settings}
    same = {s.name: 0 for s in settings}
    ttft: dict[str, list[float]] = {s.name: [] for s in settings}  # the prompt's prefill + first token
    runs: dict[str, list[tuple[int, float]]] = {s.name: [] for s in settings}  # (decode tokens, ms) per prompt
    try:
        for s in settings:  # warm-up: first-call allocations and packing, untimed
            torch.set_num_threads(s.threads)
            run_method(s.engine, s.method, items[0].ids, cfg, max_new_tokens=min(8, max_new_tokens))
        for i, item in enumerate(items):
            k = i % len(settings)
            outputs = {}
            for s in settings[k:] + settings[:k]:
                torch.set_num_threads(s.threads)
                out = run_method(s.engine, s.method, item.ids, cfg)
                tokens[s.name] += out.decode_tokens
                ms[s.name] += out.decode_ms
                ttft[s.name].append(out.ttft_ms)
                runs[s.name].append((out.decode_tokens, out.decode_ms))
                outputs[s.name] = out.output_ids
            for name, ids in outputs.items():
                same[name] += ids == outputs["default"]
    finally:
        torch.set_num_threads(before)
    return summarize(settings, tokens, ms, same, len(items), ttft, runs)


def rate_ratio_interval(a: list[tuple[int, float]], b: list[tuple[int, float]], level: float = 0.95,
                        resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """How far the decode-rate ratio of runs `a` to runs `b` ((tokens, ms) per prompt, the same prompts in the same
    order) is resolved by these prompts: the central `level` interval of the ratio over bootstrap resamples of the
    prompts (each resample keeps a prompt's two runs together)."""
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        ta, ma = sum(a[i][0] for i in pick), sum(a[i][1] for i in pick)
        tb, mb = sum(b[i][0] for i in pick), sum(b[i][1] for i in pick)
        if ma > 0 and mb > 0 and tb > 0:
            ratios.append((ta / ma) / (tb / mb))
    ratios.sort()
    if not ratios:
        return 0.0, 0.0
    cut = (1 - level) / 2
    return ratios[int(cut * (len(ratios) - 1))], ratios[round((1 - cut) * (len(ratios) - 1))]


def summarize(settings: list[Setting], tokens: dict, ms: dict, same: dict, n_prompts: int,
              ttft: dict[str, list[float]] | None = None, runs: dict[str, list[tuple[int, float]]] | None = None) -> dict:
    rate = {n: tokens[n] / (ms[n] / 1000) if ms[n] > 0 else 0.0 for n in tokens}
    fixed = [s.name for s in settings if s.name not in DEFAULTS]
    best = max(fixed, key=lambda n: rate[n])
    rows = [{"setting": s.name, "method": s.method, "threads": s.threads, "decode_tokens": tokens[s.name],
             "decode_ms": round(ms[s.name], 1), "tokens_per_s": round(rate[s.name], 2),
             "vs_default": round(rate[s.name] / rate["default"], 3) if rate["default"] else None,
             "same_output_as_default": same[s.name],
             "ttft_ms_median": round(statistics.median(ttft[s.name]), 1) if ttft and ttft[s.name] else None}
            for s in settings]
    pairs = {key: (num, den or best) for key, (num, den) in RATIOS.items()}
    ratios = {key: round(rate[num] / rate[den], 3) if rate.get(num) and rate.get(den) else None
              for key, (num, den) in pairs.items()}
    intervals = ({key: [round(x, 3) for x in rate_ratio_interval(runs[num], runs[den])]
                  for key, (num, den) in pairs.items() if runs.get(num) and runs.get(den)}
                 if runs and n_prompts > 1 else {})
    return {"n_prompts": n_prompts, "rows": rows, "best_fixed": best, **ratios, "intervals": intervals}


# Each ratio of the summary (and its 95 % interval over the prompts): (its numerator's row, its denominator's row;
# None: the fastest fixed setting).
RATIOS = {"default_vs_best_fixed": ("default", None), "default_vs_hf_generate": ("default", "hf-generate"),
          "default_vs_ar": ("default", "default, ar"), "no_draft_default_vs_best_fixed": ("default, no draft", None)}


def profile_settings(args) -> dict:
    """`profile settings`: the engine of --preset/--target in its default (probed) settings against the rest,
    running `args.method`."""
    from dflash.cli import engine_from_args
    from dflash.loading.load import load_target_model

    if not 1 <= args.limit <= 1000:
        raise ValidationError("limit", f"must be in [1, 1000], got {args.limit}")
    if not 2 <= args.max_new_tokens <= 4096:
        raise ValidationError("max_new_tokens", f"must be in [2, 4096], got {args.max_new_tokens}")
    if args.method not in METHODS:
        raise ValidationError("method", f"must be one of {', '.join(METHODS)}, got {args.method!r}")
    engine, info = engine_from_args(args)
    if engine.target.device.type != "cpu":
        raise ValidationError("device", "profile settings compares CPU settings: run it on the CPU")
    if args.method == "dflash" and engine.draft is None:
        raise ValidationError("method", "dflash needs a draft model: give --draft (or a preset with one)")
    items = prepare_prompts(engine, args.prompts, args.limit)
    threads = _threads(engine)
    settings, plain_host = [Setting("default", engine, threads, args.method)], None
    if args.method == "dflash":
        settings.append(Setting("default, ar", engine, threads))
    else:
        settings.append(Setting("hf-generate", engine, threads, "hf-generate"))
        if engine.draft is not None:  # what plain decoding gets by default: an engine probed without the draft
            plain, plain_info = engine_from_args(argparse.Namespace(**{**vars(args), "no_draft": True}))
            settings.insert(1, Setting("default, no draft", plain, _threads(plain)))
            plain_host = plain_info.get("host")
    model, tokenizer = load_target_model(info["target"])  # a fresh float32 copy for the fixed settings
    settings += fixed_settings(model, tokenizer, engine.name, list(DTYPES), thread_candidates(), engine, args.method)
    del model
    return {"host": info.get("host"), "host_no_draft": plain_host, "method": args.method,
            "max_new_tokens": args.max_new_tokens, "prompts": args.prompts,
            **measure(engine, items, settings, args.max_new_tokens)}


def _threads(engine: Engine) -> int:
    return engine.host.threads if engine.host else torch.get_num_threads()


def add_parser(sub):
    s = sub.add_parser("settings", help="ar (or dflash) with the default settings vs every fixed dtype/threads/layout")
    s.add_argument("--method", default="ar", help=f"what every setting runs: {' or '.join(METHODS)}")
    s.add_argument("--prompts", default="mt-bench", help="a prompt set or a .jsonl file (as in `bench`)")
    s.add_argument("--limit", type=int, default=8)
    s.add_argument("--max-new-tokens", type=int, default=64)
    return s
