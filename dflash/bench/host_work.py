"""The decode loop's per-block host work on an accelerator: what crosses between host and device per verified block,
and whether it grows with the vocabulary.

For each vocabulary size a random-weight target of SmolLM2-135M's width (`--layers` deep: the host work does not
depend on depth) and a random one-layer draft sample `--max-new-tokens` tokens (temperature 0.7, so the per-position
noise is drawn every block; fixed blocks of `--block`) under torch.profiler. Per verified block it counts the
host→device and device→host copies (and their device time) and the host's synchronising CUDA calls, and times a
block without the profiler. Beside that, the block's noise [block + 1, V] both ways, synchronised, median of
`--reps`: drawn on the device from the seed (what the engine does, `dflash.verification.sampling.gumbel_noise`) and drawn on
the CPU and copied over (what it did before the noise moved to the device).

    python -m dflash.bench.profile host-work --device cuda --vocabs 49152,151936 [--layers 4] [--block 16]
        [--max-new-tokens 64] [--reps 20] [--json]

On a CPU (`--device cpu`) the same code runs; there is nothing to copy and the copy counts are 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from dflash.errors import ValidationError
from dflash.verification.sampling import GUMBEL_TARGET, gumbel_noise
from dflash.verification.verify_dispatch import median_us, sync

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("host-work", help="per-block host↔device traffic and syncs, by vocabulary size")
    p.add_argument("--vocabs", default="49152,151936", help="vocabulary sizes, comma-separated")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def smollm2_shaped(vocab: int = 49152, layers: int = 30):
    """A random-weight Llama of SmolLM2-135M's exact shapes (seed 0), `vocab` entries and `layers` deep: the
    stand-in where the real model cannot be had (here, and in scripts/gpu_check.py on a bare device machine)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                      tie_word_embeddings=True, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    return LlamaForCausalLM(cfg)


def _engine(vocab: int, layers: int, block: int, device: torch.device):
    """An engine over random weights: SmolLM2-135M's width, `layers` deep, `vocab` entries; a 1-layer draft."""
    from dflash.models.draft import DFlashDraftModel, DraftConfig
    from dflash.decode.engine import Engine
    from dflash.models.target import Target

    model = smollm2_shaped(vocab, layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = Target(model, None, name=f"random-v{vocab}", device=device, dtype=dtype)
    draft = DFlashDraftModel(DraftConfig.for_target(model.config, vocab, layers=1, block_size=block))
    return Engine(target, draft, name=target.name)


def _traffic(prof, blocks: int) -> dict:
    """Per block: copies each way (count, device µs) and synchronising host calls, from the profiler's averages."""
    out = {"htod_copies": 0.0, "htod_us": 0.0, "dtoh_copies": 0.0, "dtoh_us": 0.0, "sync_calls": 0.0}
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", 0.0) or 0.0
        for way, prefix in (("htod", "Memcpy HtoD"), ("dtoh", "Memcpy DtoH")):  # e.g. "Memcpy HtoD (Pageable -> Device)"
            if e.key.startswith(prefix):
                out[f"{way}_copies"] += e.count
                out[f"{way}_us"] += dev_us
        if e.key in SYNC_CALLS:
            out["sync_calls"] += e.count
    return {k: round(v / blocks, 2) for k, v in out.items()}


def _one_vocab(vocab: int, args, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from dflash.decode.request import Request

    engine = _engine(vocab, args.layers, args.block, device)
    req = Request(prompt_ids=tuple(range(1, 33)), max_new_tokens=args.max_new_tokens, temperature=0.7, seed=0,
                  adaptive="fixed", block_size=args.block)
    engine.generate(dataclasses.replace(req, max_new_tokens=8))  # warm-up: kernels compiled, caches filled
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        res = engine.generate(req)
        sync(device)
    blocks = max(res.stats["n_verify"], 1)
    t0 = time.perf_counter()
    timed = engine.generate(req)
    sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3
    positions = list(range(100, 101 + args.block))  # a block's verify rows: block + 1 positions
    on_device = median_us(lambda: gumbel_noise(7, positions, vocab, GUMBEL_TARGET, device), device, args.reps) / 1e3
    copied = median_us(lambda: gumbel_noise(7, positions, vocab, GUMBEL_TARGET, "cpu").to(device), device, args.reps) / 1e3
    return {"vocab": vocab, "blocks": blocks, "tokens": len(res.output_ids), **_traffic(prof, blocks),
            "ms_per_block": round(wall_ms / max(timed.stats["n_verify"], 1), 2),
            "noise_on_device_ms": round(on_device, 3), "noise_cpu_copied_ms": round(copied, 3)}


def host_work(args) -> dict:
    try:
        vocabs = [int(v) for v in args.vocabs.split(",")]
    except ValueError:
        raise ValidationError("--vocabs", f"whole numbers separated by commas, got {args.vocabs!r}") from None
    if any(v < 2 for v in vocabs):
        raise ValidationError("--vocabs", "each size must be at least 2")
    for name in ("layers", "block", "max_new_tokens", "reps"):
        if getattr(args, name) < 1:
            raise ValidationError("--" + name.replace("_", "-"), "must be at least 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError("--device", "CUDA is not available on this machine")
    rows = [_one_vocab(v, args, device) for v in vocabs]
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": "bfloat16" if device.type == "cuda" else "float32", "layers": args.layers, "block": args.block,
            "rows": rows, "table": table(rows)}


def table(rows: list[dict]) -> str:
    """Markdown: one row per vocabulary size (what BENCHMARKS.md shows)."""
    head = ("| vocabulary | blocks | host→device copies / block (device µs) | device→host copies / block (device µs) "
            "| sync calls / block | ms / block | block noise on device | drawn on CPU + copied |")
    lines = [head, "|" + "---:|" * 8]
    for r in rows:
        lines.append(f"| {r['vocab']:,} | {r['blocks']} | {r['htod_copies']:g} ({r['htod_us']:g}) | {r['dtoh_copies']:g} "
                     f"({r['dtoh_us']:g}) | {r['sync_calls']:g} | {r['ms_per_block']:g} | {r['noise_on_device_ms']:g} ms "
                     f"| {r['noise_cpu_copied_ms']:g} ms |")
    return "\n".join(lines)
