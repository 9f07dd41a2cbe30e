"""The GPU check's first check (scripts/gpu_check.py): every Triton kernel against its PyTorch reference.

The reference runs on CPU copies (IEEE division, as the kernels' div_rn) over vocabularies 257 … 49152, blocks
1/4/16, batch 1 and 4, float32 and bfloat16 logits, greedy / Gumbel / relaxed / top-k / top-p / speculative
sampling; the engine's per-position noise computed on the device must equal the CPU's. On CUDA it also times one
verification call through the dispatch, with the kernel and with the reference, and the noise for a block.
`quick` (always on the CPU, where Triton's interpreter runs Python per tile): one small vocabulary, fewer settings.
"""

from __future__ import annotations

import os
import time

MATCH_SETTINGS = [(0.0, 0, 1.0, 1.0), (0.0, 0, 1.0, 0.6), (0.7, 0, 1.0, 1.0), (0.9, 50, 1.0, 1.0), (1.1, 0, 0.8, 1.0),
                  (1.3, 40, 0.6, 0.4)]  # (temperature, top_k, top_p, acceptance threshold)
SPEC_SETTINGS = [(0.0, 0, 1.0), (0.7, 0, 1.0), (0.9, 50, 1.0), (1.1, 0, 0.8), (1.3, 40, 0.6)]


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Tally:
    """Cases compared so far, and the names of those that differed."""

    def __init__(self):
        self.cases, self.failures = 0, []

    def record(self, name: str, agreed: bool) -> None:
        self.cases += 1
        if not agreed:
            self.failures.append(name)

    def compare(self, name: str, expected, got) -> None:
        self.record(name, all(e.cpu().long().equal(g.cpu().long()) for e, g in zip(expected, got)))

    def result(self) -> dict:
        return {"ok": not self.failures, "cases": self.cases, "mismatches": len(self.failures),
                "failures": self.failures[:10]}


def gumbel(gen, *shape):
    import torch

    return -torch.log(-torch.log(torch.rand(*shape, generator=gen).clamp(1e-20, 1 - 1e-7)))


def match_cases(tally: Tally, gen, device: str, vocab: int, n: int, dtype, bsz: int, settings) -> None:
    """The greedy / sampled / relaxed match rule: `bsz` rows of `n` drafts, the last row wrong from its middle on."""
    import torch

    from dflash.verification import verify as reference
    from dflash.kernels.greedy_verify_triton import match_verify_batched

    for t, k, p, a in settings:
        logits = (torch.randn(bsz, n + 1, vocab, generator=gen) * 3).to(dtype)
        g = gumbel(gen, bsz, n + 1, vocab) if t > 0 else None
        draft = (logits.float() / (t or 1.0) + (g if g is not None else 0)).argmax(-1)[:, :n].clone()
        if n:
            draft[-1, n // 2:] = torch.randint(0, vocab, (n - n // 2,), generator=gen)
        expected = reference.match_verify_batched(draft, logits, t, k, p, g, a)
        got = match_verify_batched(draft.to(device), logits.to(device), t, k, p, None if g is None else g.to(device), a)
        tally.compare(f"match V={vocab} n={n} {dtype} T={t} k={k} p={p} a={a}", expected, got)


def spec_cases(tally: Tally, gen, device: str, vocab: int, n: int, dtype, bsz: int, settings) -> None:
    """Leviathan's rejection rule with a draft distribution q near the target's."""
    import torch

    from dflash.verification import verify as reference
    from dflash.verification.sampling import target_probs
    from dflash.kernels.spec_sample_triton import speculative_verify_batched

    for t, k, p in settings:
        logits = (torch.randn(bsz, n + 1, vocab, generator=gen) * 2).to(dtype)
        q = target_probs(logits[:, :n].float() + torch.randn(bsz, n, vocab, generator=gen), max(t, 0.5))
        draft = (torch.log(q) + gumbel(gen, bsz, n, vocab)).argmax(-1)
        u = torch.rand(bsz, n, generator=gen, dtype=torch.float64)
        g = gumbel(gen, bsz, n + 1, vocab)
        expected = reference.speculative_verify_batched(draft, q, logits, t, k, p, u, g)
        got = speculative_verify_batched(draft.to(device), q.to(device), logits.to(device), t, k, p, u.to(device),
                                         g.to(device))
        tally.compare(f"spec V={vocab} n={n} {dtype} T={t} k={k} p={p}", expected, got)


def noise_cases(tally: Tally, device: str, vocabs) -> None:
    """The engine's noise computed on the device: the same numbers as on the CPU."""
    import torch

    from dflash.verification.sampling import gumbel_noise

    for vocab in vocabs:
        host, dev = (gumbel_noise(7, list(range(100, 116)), vocab, 2, where) for where in ("cpu", device))
        tally.record(f"gumbel_noise V={vocab}", torch.allclose(host, dev.cpu(), rtol=1e-6, atol=1e-6))


def dispatch_timings(gen, device: str) -> dict:
    """µs per verification call through the dispatch (one sequence, block 16, vocabularies 49,152 and 151,936),
    kernel and reference, and per block of noise; synchronised, after warm-up."""
    import torch

    from dflash.verification import verify_dispatch
    from dflash.verification.sampling import gumbel_noise

    def per_call(fn) -> float:
        for _ in range(5):
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        sync(device)
        return round((time.perf_counter() - t0) / 50 * 1e6, 1)

    timings, n = {}, 15
    for vocab in (49152, 151936):
        logits = torch.randn(n + 1, vocab, device=device) * 3
        draft = logits.argmax(-1)[:n].clone()
        g = gumbel(gen, n + 1, vocab).to(device)
        for label, extra in (("greedy", (0.0, 0, 1.0, None)), ("T0.8 top-k 50 top-p 0.9", (0.8, 50, 0.9, g))):
            for mode in ("triton", "reference"):
                os.environ["DFLASH_KERNELS"] = mode
                timings[f"V{vocab} match {label} [{mode}]"] = per_call(
                    lambda: verify_dispatch.match_verify(draft, logits, *extra))
        os.environ["DFLASH_KERNELS"] = "auto"
        timings[f"V{vocab} gumbel_noise for 16 positions"] = per_call(
            lambda: gumbel_noise(7, list(range(100, 116)), vocab, 0, device))
    return timings


def check_kernel_parity(args, device: str) -> dict:
    import torch

    quick = args.quick or device == "cpu"  # the interpreter runs Python per tile
    vocabs = (101,) if quick else (257, 1000, 32000, 49152)
    dtypes = (torch.float32,) if quick else (torch.float32, torch.bfloat16)
    gen, tally = torch.Generator().manual_seed(0), Tally()
    for vocab in vocabs:
        for n in (0, 3, 15):
            few = quick and n == 15  # the longest block, interpreted: one row, the first settings only
            bsz = 1 if few else (2 if quick else 4)
            for dtype in dtypes:
                match_cases(tally, gen, device, vocab, n, dtype, bsz, MATCH_SETTINGS[:3] if few else MATCH_SETTINGS)
                if n:
                    spec_cases(tally, gen, device, vocab, n, dtype, bsz, SPEC_SETTINGS[:2] if few else SPEC_SETTINGS)
    noise_cases(tally, device, vocabs)
    result = tally.result()
    if device == "cuda":
        result["us_per_call_block16"] = dispatch_timings(gen, device)
    return result
