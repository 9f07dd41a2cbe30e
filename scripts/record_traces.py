"""Record the playground's bundled traces (assets/traces/*.json) from real runs of the engine.

    .venv/bin/python scripts/record_traces.py [--tokens 48] [--out assets/traces]

Each trace is one run on the default target (SmolLM2-135M-Instruct) plus its no-draft baseline (for the
speedup and the identical ✓ check), so a class with no compute can replay it in the playground; the trace list
names each one's measured speed. The traces: the Paper method (the draft alone, its trained block, fixed, one
denoising step) on the prose prompt; two denoising steps; the slow-start controller; copying from the context; and
the library's default (the playground's "Fastest here") on each example prompt, of which the fastest is kept.
With the trained draft in assets/draft-smollm2-135m/ the runs use it. Without it, the prose trace is the target
alone and the others use a RANDOM, UNTRAINED draft of the default draft's shape — real engine runs, but the draft
almost never guesses right (τ ≈ 1). Re-run this script once the trained draft exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash.models.draft import DFlashDraftModel, DraftConfig  # noqa: E402
from dflash.decode.engine import Engine  # noqa: E402
from dflash.loading.load import default_draft_available, load_engine  # noqa: E402
from dflash.loading.registry import get_preset  # noqa: E402
from dflash.decode.request import Request  # noqa: E402
from ui.live import hardware  # noqa: E402
from ui.replay import TRACES_DIR, Trace, dumps_trace, speed_words  # noqa: E402
from ui.text import EXAMPLES  # noqa: E402

UNTRAINED_NOTE = ("Recorded with a RANDOM, UNTRAINED draft (the trained one was not available yet): the draft's guesses "
                  "are almost always rejected. Re-record with scripts/record_traces.py once the trained draft exists.")


def random_draft(engine: Engine, block_size: int = 8, seed: int = 0) -> DFlashDraftModel:
    """A random draft with the default draft's shape (the target's layer shape, one layer, its mask id)."""
    t = engine.target
    torch.manual_seed(seed)
    return DFlashDraftModel(DraftConfig.for_target(t.config, t.vocab_size, block_size=block_size))


def recorded(engine: Engine, request: Request, meta: dict) -> Trace:
    """One run of `request` and, with a draft, its no-draft baseline for as many tokens."""
    run = list(engine.stream(request))
    base_req = Request(**{**request.to_dict(), "use_draft": False, "max_new_tokens": max(1, len(run[-1].output_ids))})
    baseline = list(engine.stream(base_req)) if request.use_draft else None
    meta = {**meta, "hardware": hardware(engine), "recorded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    return Trace(run, meta, baseline)


def speedup(trace: Trace) -> float:
    run, base = (t[-1].stats["tokens_per_s"] for t in (trace.events, trace.baseline or trace.events))
    return run / base if base > 0 else 0.0


def save(trace: Trace, path: Path) -> None:
    path.write_text(dumps_trace(trace), encoding="utf-8")
    s = trace.events[-1].stats
    print(f"{path.name}: {s['n_output_tokens']} tokens, tau {s['tau']:.2f}, {speed_words(trace)} ({trace.events[-1].reason})")


def record(engine: Engine, request: Request, meta: dict, path: Path) -> None:
    save(recorded(engine, request, meta), path)


def record_best_default(engine: Engine, prompts: dict[str, str], tokens: int, meta: dict, path: Path) -> None:
    """The library's default request (copy, then draft; the block policy for this host) on each example prompt; the
    one with the best speedup over plain decoding is kept, named after its prompt."""
    runs = {name: recorded(engine, Request(prompt=p, max_new_tokens=tokens, deadline_s=None), meta)
            for name, p in prompts.items()}
    name, best = max(runs.items(), key=lambda kv: speedup(kv[1]))
    for other, trace in runs.items():
        print(f"  default on {other}: {speed_words(trace)}")
    best.meta["title"] = f"{name} · {best.meta['title']}"
    save(best, path)


NAMES = ("prose", "code", "maths", "copy", "default")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=48, help="max new tokens per trace")
    p.add_argument("--out", default=str(TRACES_DIR))
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is much faster than 2 on a 2-core machine shared with other jobs)")
    p.add_argument("--only", nargs="+", choices=NAMES, help="record only these traces (default: all)")
    args = p.parse_args(argv)
    only = set(args.only or NAMES)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = dict(EXAMPLES)
    trained = default_draft_available(get_preset("default").draft)
    if trained:
        engine, _ = load_engine("default")
        draft_words, note = "trained DFlash draft", ""
    else:
        engine, _ = load_engine("default", no_draft=True)
        draft_words, note = "random untrained draft", UNTRAINED_NOTE
    base = dict(max_new_tokens=args.tokens, deadline_s=None, lookup_ngram=0)  # the draft alone, unless a trace says
    # 1. Prose: the Paper method (the trained draft alone, its trained block, fixed, one denoising step), or (without
    # it) the target alone — the autoregressive baseline.
    if trained and "prose" in only:
        record(engine, Request(prompt=prompts["Prose"], adaptive="fixed", diffusion_steps=1, **base),
               {"title": "Prose · Paper method: SmolLM2 + trained draft alone, its block, fixed", "model": engine.name,
                "draft": draft_words, "note": note}, out / "prose.json")
    elif "prose" in only:
        record(engine, Request(prompt=prompts["Prose"], use_draft=False, **base),
               {"title": "Prose · SmolLM2 alone (no draft, autoregressive)", "model": engine.name, "draft": "none",
                "note": "The target alone: one token per step, τ = 1. Re-record with the trained draft when it exists."},
               out / "prose.json")
    if not trained:
        engine = Engine(engine.target, random_draft(engine), name=engine.name)
    tag = "trained draft" if trained else "UNTRAINED random draft"
    # 2. Code: two denoising passes per block, so the inspector shows MASK cells being filled.
    if "code" in only:
        record(engine, Request(prompt=prompts["Code"], block_size=8, diffusion_steps=2, confidence_threshold=0.5,
                               adaptive="fixed", **base),
               {"title": f"Code · SmolLM2 + {tag}, block 8, 2 denoising steps", "model": engine.name,
                "draft": draft_words, "note": note}, out / "code.json")
    # 3. Maths: the slow-start controller adapting the block size.
    if "maths" in only:
        record(engine, Request(prompt=prompts["Maths"], block_size=8, adaptive="slow-start", min_block_size=2,
                               max_block_size=8, **base),
               {"title": f"Maths · SmolLM2 + {tag}, slow-start adaptive block", "model": engine.name,
                "draft": draft_words, "note": note}, out / "maths.json")
    # 4. Copy: copying from the context first (lookup_ngram=2) on the code prompt, whose answer repeats its names.
    if "copy" in only:
        record(engine, Request(prompt=prompts["Code"], block_size=8, adaptive="fixed", **{**base, "lookup_ngram": 2}),
               {"title": f"Code · SmolLM2 + {tag}, copying from the context first (2-gram), block 8", "model": engine.name,
                "draft": draft_words, "note": note}, out / "copy.json")
    # 5. The library's default (the playground's "Fastest here"), the best of the example prompts.
    if "default" in only:
        record_best_default(engine, prompts, args.tokens, {"title": f"Fastest here: SmolLM2 + {tag}, the library's "
                            "default (copy, then draft)", "model": engine.name, "draft": draft_words, "note": note},
                            out / "default.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
