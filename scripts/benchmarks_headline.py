"""Splice the headline tables (results/*.md written by `python -m dflash bench`) into BENCHMARKS.md."""

import json
import re
from pathlib import Path

root = Path(__file__).resolve().parent.parent
res = root / "results"


def table(name: str) -> str:
    md = (res / f"{name}.md").read_text().strip()
    return re.sub(r"^### ", "#### ", md, flags=re.M)


def knob_rows() -> str:
    rows = ["| knob (4 MT-Bench prompts × 64 tokens, greedy) | τ | speedup vs ar (spread) | draft share | drift tokens | identical to ar |",
            "|---|---|---|---|---|---|"]
    for p in sorted(res.glob("knob-*.json")):
        d = json.loads(p.read_text())
        s = d["summary"].get("dflash", {})
        if not s:
            continue
        runs = [r for pr in d["prompts"] for r in pr["methods"].get("dflash", {}).get("runs", [])]
        drift = sum(r["stats"].get("drift_tokens", 0) for r in runs)
        sp = s["speedup"]["decode"]
        ident = s["identical"]
        rows.append(f"| `{d['command'].split('--max-new-tokens 64')[-1].strip()}`{'' if d.get('complete') else ' (incomplete)'} | "
                    f"{s['tau']:.2f} | {sp['speedup']:.2f}× ({sp['min']:.2f}–{sp['max']:.2f}) | {s['draft_share']:.0%} | {drift} | "
                    f"{ident['n_identical']}/{ident['n_compared']} |")
    return "\n".join(rows)


body = f"""## Headline tables (default models, the previous draft)

**These tables were measured on 2026-11-29 with the draft shipped then (τ ≈ 1.2), not the current one.** The
current draft's real-loop evaluation — τ on all 80 MT-Bench first turns and 40 HumanEval problems, and on MT-Bench
its speed against the no-draft loop, interleaved in one process — is generated into
[assets/draft-smollm2-135m/TRAINING.md](assets/draft-smollm2-135m/TRAINING.md) from `results/training/`.
`scripts/final_bench.sh` re-measures these four-method tables with whatever draft is installed.

Measured with `scripts/final_bench.sh` (subsets sized to fit the shared machine; the full-set
commands are below). Each table's own command line is printed above it; `--preset default --threads 1` and
the defaults (`--prompts mt-bench`, all four methods, 128 new tokens) complete it.

**Verdict on that CPU: with the previous draft (τ ≈ 1.2) DFlash is slower than the autoregressive baseline
(0.59–0.64×), and so is transformers' prompt lookup (0.75×); `ar` is as fast as `hf-generate` (within the
spread); every greedy output is identical across `ar`, `dflash`, `hf-generate` and `hf-prompt-lookup`.** The
issue's targets (≥ 1.3× over `ar`, ≥ 1.5× over prompt lookup) are not met: a verify of 2+ tokens costs
1.7–2.2× a one-token step on this AVX2-only CPU (profile below), so break-even needs τ ≈ 1.8, and the draft
that 55 minutes of one shared core could train reaches 1.2 (see assets/draft-smollm2-135m/TRAINING.md).

{table("mtbench-greedy")}

{table("humaneval-greedy")}

{table("mtbench-t0.7")}

### The knobs on the previous draft

{knob_rows()}

Which knobs help on this CPU (same 4 prompts, fixed block 8 at S = 1 is ≈ 0.6× on them): the **cost-aware
controller helps most (0.82×)** — it measures that a verify costs about the same for 2–8 tokens and that
positions beyond 2 are almost never accepted, and settles on small blocks; a fixed `--block-size 4` gives
0.71×. Extra denoising steps cost a draft pass each and do not raise τ for a draft this weak (0.61× at S = 2,
0.52× at S = 4); slow start keeps growing back to 8 after each full acceptance (0.63×); relaxed acceptance
(0.9, 0.7) is lossy (3 emitted tokens differ from the target's own; 2 of 4 outputs differ) and barely moves τ.
None makes DFlash faster than `ar` with this draft. Raw JSON for every row: `results/`.

### Full-set commands (not run here: hours per method at ~0.13 s per target step)

```bash
python -m dflash bench --preset default --prompts mt-bench --max-new-tokens 256 --threads 1 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-greedy-full.json
python -m dflash bench --preset default --prompts humaneval --max-new-tokens 256 --threads 1 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/humaneval-greedy-full.json
python -m dflash bench --preset default --prompts mt-bench --max-new-tokens 256 --threads 1 --temperature 0.7 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-t0.7-full.json
```

"""
text = (root / "BENCHMARKS.md").read_text()
start = text.index("## Headline tables")
end = text.index("## Development measurements")
(root / "BENCHMARKS.md").write_text(text[:start] + body + text[end:])
print("ok")
