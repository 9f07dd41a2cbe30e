"""Where the time goes: measurements behind the engine's performance choices (BENCHMARKS.md quotes them).

    python -m dflash.bench.profile forward [--dtypes float32,bfloat16] [--tokens 1,16] [--context 256] [--reps 10]
        cost of one cached target forward over T tokens per dtype; for T > 1 also with the LM head through plain
        MKL (`F.linear`) instead of the oneDNN pre-packed copy (dflash.models.packed.PackedLinear), interleaved.
    python -m dflash.bench.profile prefill [--tokens 64,256,1024] [--reps 2]
        a prompt's prefill as the engine runs it (chunks of dflash.decode.engine.PREFILL_CHUNK, the last position's logits)
        in float32, in bfloat16, and in bfloat16 with the decoder's matmuls in float32 (dflash.models.packed.Float32Matmul),
        interleaved: what the host probe's float32_from_rows decides between.
    python -m dflash.bench.profile ops [--no-draft | --random-draft 2] [--max-new-tokens 32]
        torch.profiler over one generation: top operators, and decode time split into draft / verify / the rest.
    python -m dflash.bench.profile head-ab --random-draft 2 [--limit 3] [--max-new-tokens 32] [--repeats 2]
        generations interleaved with the packed head on and off: verify and draft ms per block, same outputs.
    python -m dflash.bench.profile gemm [--rows 1,2,4,8,16] [--reps 3]
        the target's decoder-layer weight products alone (every linear of every layer, float32) for M rows: MKL
        `F.linear`, a oneDNN pre-packed copy, and one `F.linear` per row — what a verify of M tokens costs in
        its matrix products, compared with one decode step.
    python -m dflash.bench.profile logit-drift [--dtypes float32,bfloat16] [--prompts mt-bench] [--limit 4]
            [--max-new-tokens 48] [--block 8] [--device cuda]
        the logits of a `--block`-token verify vs the one-token step on the no-draft greedy output, per dtype:
        what the tie bounds of dflash.decode.stats.TIE_BOUND are set from (dflash.bench.drift).
    python -m dflash.bench.profile settings [--method ar|dflash] [--prompts mt-bench] [--limit 8] [--max-new-tokens 64]
        `ar` in the default (host-probed) settings vs `hf-generate` in the same settings and `ar` in every fixed
        dtype × threads × layout, interleaved (dflash.bench.settings); `--method dflash`: DFlash in each.
    python -m dflash.bench.profile host-work [--device cuda] [--vocabs 49152,151936] [--layers 4] [--block 16]
        per verified block: host↔device copies and synchronising calls, by vocabulary size, and the block's noise
        drawn on the device vs on the CPU and copied (dflash.bench.host_work).

Options shared with the CLI: --preset/--target/--draft/--dtype/--threads. Keep runs small on a shared CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from dflash.bench import drift, host_work, settings
from dflash.bench.machine import machine_info
from dflash.cli import add_model_args, engine_from_args
from dflash.errors import DFlashError


def _median_min(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), min(values)


def forward_costs(args) -> list[dict]:
    """One cached forward of each size, per dtype, decoder layout (dflash.models.packed) and LM-head path, interleaved."""
    from dflash.loading.load import load_target_model
    from dflash.models.packed import set_layout
    from dflash.loading.registry import get_preset
    from dflash.models.target import Target

    source = args.target or get_preset(args.preset).target
    model, tok = load_target_model(source)
    rows = []
    layouts = args.layouts.split(",")
    for dtype in args.dtypes.split(","):
        tg = Target(model, tok, dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
        ctx = torch.randint(100, min(tg.vocab_size, 40000), (1, args.context))
        cache = tg.new_cache()
        tg.forward(ctx, cache, last_only=True, capture=False)
        sizes = [int(t) for t in args.tokens.split(",")]
        variants = [(t, packed) for t in sizes for packed in ((True, False) if t > 1 and dtype == "float32" else (True,))]
        times: dict[tuple[str, int, bool], list[float]] = {(lay, *v): [] for lay in layouts for v in variants}
        ids = {t: torch.randint(100, min(tg.vocab_size, 40000), (1, t)) for t in sizes}
        for rep in range(args.reps + 1):  # interleaved; repetition 0 is a warm-up
            for layout in layouts:
                set_layout(tg.model.model.layers, layout)
                for t, packed in variants:
                    tg.head.enabled = packed
                    t0 = time.perf_counter()
                    tg.forward(ids[t], cache, capture=False)
                    dt = (time.perf_counter() - t0) * 1000
                    tg.crop(cache, args.context)
                    if rep:
                        times[(layout, t, packed)].append(dt)
        tg.head.enabled = True
        set_layout(tg.model.model.layers, "linear")
        for (layout, t, packed), v in times.items():
            one = statistics.median(times[(layout, 1, True)]) if (layout, 1, True) in times else None
            med, lo = _median_min(v)
            head = "onednn-packed" if packed and t > 1 and dtype == "float32" else "mkl"
            rows.append({"dtype": dtype, "layout": layout, "tokens": t, "head": head,
                         "median_ms": round(med, 1), "min_ms": round(lo, 1),
                         "vs_1_token": round(med / one, 2) if one else None})
        model = tg.model  # the next dtype casts the same weights
    return rows


PREFILL_WAYS = (("float32", 0), ("bfloat16", 0), ("bfloat16", 1))  # (dtype, float32_from_rows)


def prefill_costs(args) -> list[dict]:
    """The engine's prefill of prompts of each length in each of PREFILL_WAYS, interleaved; reps after a warm-up."""
    import copy

    from dflash.decode.engine import Engine
    from dflash.loading.load import load_target_model
    from dflash.loading.registry import get_preset
    from dflash.models.target import Target

    model, tok = load_target_model(args.target or get_preset(args.preset).target)
    half = copy.deepcopy(model)  # both bfloat16 ways share one copy of the weights
    engines = {(d, f): Engine(Target(model if d == "float32" else half, tok, dtype=getattr(torch, d), float32_from_rows=f))
               for d, f in PREFILL_WAYS}
    sizes = [int(t) for t in args.tokens.split(",")]
    top = min(engines[PREFILL_WAYS[0]].target.vocab_size, 40000)
    ids = {n: torch.randint(top // 4, top, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in sizes}
    times: dict[tuple, list[float]] = {(way, n): [] for way in PREFILL_WAYS for n in sizes}
    for rep in range(args.reps + 1):  # repetition 0 is a warm-up
        for n in sizes:
            for way, engine in engines.items():
                t0 = time.perf_counter()
                engine._prefill(ids[n], engine.target.new_cache(), False, lambda: None)  # the engine's own chunked prefill
                if rep:
                    times[(way, n)].append((time.perf_counter() - t0) * 1000)
    return [{"dtype": d, "float32_matmuls": bool(f), "tokens": n, "median_ms": round(statistics.median(v), 1),
             "min_ms": round(min(v), 1)} for ((d, f), n), v in times.items()]


def gemm_costs(args) -> list[dict]:
    import torch.nn.functional as F
    from torch import nn

    from dflash.loading.load import load_target_model
    from dflash.loading.registry import get_preset

    model, _ = load_target_model(args.target or get_preset(args.preset).target)
    weights = [m.weight.detach().float().contiguous() for m in model.model.layers.modules() if isinstance(m, nn.Linear)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    del model

    def run(m: int, how: str) -> float:
        xs = {k: torch.randn(m, k) for k in {w.shape[1] for w in weights}}
        t0 = time.perf_counter()
        for w, p in zip(weights, packed, strict=True):
            x = xs[w.shape[1]]
            if how == "mkl":
                F.linear(x, w)
            elif how == "onednn-packed":
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
            else:  # one row at a time: M matrix-vector products, the later ones from cache
                for i in range(m):
                    F.linear(x[i : i + 1], w)
        return (time.perf_counter() - t0) * 1000

    rows = [int(r) for r in args.rows.split(",")]
    times: dict[tuple[int, str], list[float]] = {}
    for rep in range(args.reps + 1):  # interleaved; repetition 0 is a warm-up
        for m in rows:
            for how in ("mkl", "onednn-packed", "per-row"):
                if how == "per-row" and m == 1:
                    continue
                dt = run(m, how)
                if rep:
                    times.setdefault((m, how), []).append(dt)
    one = statistics.median(times[(1, "mkl")]) if (1, "mkl") in times else None
    return [{"rows": m, "kernel": how, "n_matrices": len(weights), "median_ms": round(statistics.median(v), 1),
             "vs_1_row_mkl": round(statistics.median(v) / one, 2) if one else None} for (m, how), v in times.items()]


def op_profile(args) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from dflash.decode.request import Request

    engine = _engine(args)
    use_draft = engine.draft is not None
    req = Request(prompt=args.prompt, max_new_tokens=args.max_new_tokens, use_draft=use_draft)
    engine.generate(Request(prompt=args.prompt, max_new_tokens=4, use_draft=use_draft))  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        res = engine.generate(req)
    s = res.stats
    other = s["decode_ms"] - s["draft_ms"] - s["verify_ms"]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[: args.top]
    return {"draft": use_draft, "n_output_tokens": s["n_output_tokens"], "n_verify": s["n_verify"], "tau": s["tau"],
            "decode_ms": s["decode_ms"], "draft_ms_per_block": s["draft_ms"] / max(s["n_verify"], 1),
            "verify_ms_per_block": s["verify_ms"] / max(s["n_verify"], 1),
            "other_ms_per_block": other / max(s["n_verify"], 1),
            "top_ops": [{"op": e.key, "self_cpu_share": round(e.self_cpu_time_total / total, 3), "calls": e.count}
                        for e in top], "table": table}


def head_ab(args) -> dict:
    from dflash.bench.runner import prepare_prompts
    from dflash.decode.request import Request

    engine = _engine(args)
    if engine.draft is None:
        raise SystemExit("head-ab needs a draft: --draft DIR or --random-draft LAYERS")
    items = prepare_prompts(engine, args.prompts, args.limit)
    per: dict[bool, dict[str, list[float]]] = {True: {"verify": [], "draft": []}, False: {"verify": [], "draft": []}}
    same = True
    engine.generate(Request(prompt_ids=tuple(items[0].ids), max_new_tokens=8))  # warm-up (packs the head)
    for item in items:
        outs = {}
        for rep in range(args.repeats):
            for packed in ((True, False) if rep % 2 == 0 else (False, True)):
                engine.target.head.enabled = packed
                # fixed blocks: both heads verify the same block sizes
                res = engine.generate(Request(prompt_ids=tuple(item.ids), max_new_tokens=args.max_new_tokens,
                                              adaptive="fixed"))
                n = max(res.stats["n_verify"], 1)
                per[packed]["verify"].append(res.stats["verify_ms"] / n)
                per[packed]["draft"].append(res.stats["draft_ms"] / n)
                outs.setdefault(packed, res.output_ids)
        same &= outs[True] == outs[False]
    engine.target.head.enabled = True
    out = {"outputs_identical": same}
    for packed, name in ((True, "onednn_packed_head"), (False, "mkl_head")):
        out[name] = {k: round(statistics.median(v), 1) for k, v in per[packed].items()}
    out["verify_ratio"] = round(out["mkl_head"]["verify"] / out["onednn_packed_head"]["verify"], 2)
    out["draft_ratio"] = round(out["mkl_head"]["draft"] / out["onednn_packed_head"]["draft"], 2)
    return out


def _engine(args):
    from dflash.bench.cli import _random_draft, check_random_draft

    layers = getattr(args, "random_draft", None)
    check_random_draft(layers)  # before the load; 0 is refused, not taken for "no random draft"
    engine, _ = engine_from_args(argparse.Namespace(**{**vars(args), "no_draft": args.no_draft or layers is not None}))
    if layers is not None:
        engine = _random_draft(engine, layers)
    return engine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash.bench.profile", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--dtypes", default="float32,bfloat16")
    f.add_argument("--tokens", default="1,16")
    f.add_argument("--context", type=int, default=256)
    f.add_argument("--reps", type=int, default=10)
    f.add_argument("--layouts", default="linear,transposed", help="decoder weight layouts (dflash.models.packed.set_layout)")
    pf = sub.add_parser("prefill")
    pf.add_argument("--tokens", default="64,256,1024")
    pf.add_argument("--reps", type=int, default=2)
    o = sub.add_parser("ops")
    o.add_argument("--prompt", default="Write a short story about a robot who learns to paint.")
    o.add_argument("--max-new-tokens", type=int, default=32)
    o.add_argument("--top", type=int, default=15)
    g = sub.add_parser("gemm")
    g.add_argument("--rows", default="1,2,4,8,16")
    g.add_argument("--reps", type=int, default=3)
    h = sub.add_parser("head-ab")
    h.add_argument("--prompts", default="mt-bench")
    h.add_argument("--limit", type=int, default=3)
    h.add_argument("--max-new-tokens", type=int, default=32)
    h.add_argument("--repeats", type=int, default=2)
    d = drift.add_parser(sub)
    s = settings.add_parser(sub)
    host_work.add_parser(sub)  # its own options: random models, no --preset/--target
    for q in (f, pf, o, g, h, d, s):
        add_model_args(q)
        if q not in (d, s, pf):
            q.add_argument("--random-draft", type=int, metavar="LAYERS", help="a random draft sized for the target")
        q.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    modes = {"forward": forward_costs, "prefill": prefill_costs, "ops": op_profile, "gemm": gemm_costs, "head-ab": head_ab,
             "logit-drift": drift.logit_drift, "settings": settings.profile_settings, "host-work": host_work.host_work}
    try:
        result = modes[args.mode](args)
    except DFlashError as exc:  # a bad option or model: the message names it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The host beside every number (CPU model and flags, torch): a result file is read on other machines.
    result = {"mode": args.mode, "threads": torch.get_num_threads(), "argv": sys.argv[1:] if argv is None else argv,
              "load_average": list(__import__("os").getloadavg()), "machine": machine_info(), "result": result}
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        res = result["result"]
        if isinstance(res, dict) and "table" in res:
            print(res.pop("table"))
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
