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


HEADLINES = ("mtbench-greedy", "humaneval-greedy", "mtbench-t0.7")


def span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def verdict() -> str:
    """The headline verdict, computed from the result files (every number below comes from results/*.json)."""
    runs = [json.loads((res / f"{n}.json").read_text())["summary"] for n in HEADLINES]
    sp = {m: [s[m]["speedup"]["decode"]["speedup"] for s in runs if m in s] for m in ("dflash", "hf-prompt-lookup", "hf-generate")}
    tau = [s["dflash"]["tau"] for s in runs if "dflash" in s]
    same = [s[m]["identical"] for s in runs for m in s if m != "ar" and s[m].get("identical")]
    n_same, n_all = sum(i["n_identical"] for i in same), sum(i["n_compared"] for i in same)
    faster = "faster" if min(sp["dflash"]) > 1 else "slower" if max(sp["dflash"]) < 1 else "mixed"
    return (f"**Verdict on that CPU, from the tables below: with the previous draft (τ {span(tau)}) DFlash ran at "
            f"{span(sp['dflash'])}× the autoregressive baseline ({faster}); transformers' prompt lookup at "
            f"{span(sp['hf-prompt-lookup'])}× and `hf-generate` at {span(sp['hf-generate'])}× of `ar`; greedy outputs "
            f"identical to `ar`: {n_same} of {n_all} comparisons.** Break-even needs τ above the verify's cost ratio "
            "(see \"The verify's cost on a CPU\" below).")


def knob_verdict() -> str:
    rows = []
    for p in sorted(res.glob("knob-*.json")):
        d = json.loads(p.read_text())
        s = d["summary"].get("dflash")
        if s:
            drift = sum(r["stats"].get("drift_tokens", 0) for pr in d["prompts"]
                        for r in pr["methods"].get("dflash", {}).get("runs", []))
            rows.append((s["speedup"]["decode"]["speedup"], d["command"].split("--max-new-tokens 64")[-1].strip(), drift))
    rows.sort(reverse=True)
    lossy = [f"`{c}`" for _, c, dr in rows if dr]
    return (f"Fastest knob on these prompts: `{rows[0][1]}` ({rows[0][0]:.2f}×); slowest: `{rows[-1][1]}` "
            f"({rows[-1][0]:.2f}×). {sum(sp > 1 for sp, _, _ in rows)} of {len(rows)} knobs beat `ar` with this draft. "
            f"Lossy (emitted tokens that differ from the target's own): {', '.join(lossy) or 'none'}.")


body = f"""## Headline tables (default models, the previous draft)

**These tables were measured on 2026-11-29 with the draft shipped then (τ ≈ 1.2), not the current one.** The
current draft's real-loop evaluation — τ on all 80 MT-Bench first turns and 40 HumanEval problems, and on MT-Bench
its speed against the no-draft loop, interleaved in one process — is generated into
[assets/draft-smollm2-135m/TRAINING.md](assets/draft-smollm2-135m/TRAINING.md) from `results/training/`.
`scripts/final_bench.sh` re-measures these four-method tables with whatever draft is installed.

Measured with `scripts/final_bench.sh` (subsets sized to fit the shared machine; the full-set
commands are below). Each table's own command line is printed above it; `--preset default --threads 1` and
the defaults (`--prompts mt-bench`, all four methods, 128 new tokens) complete it.

{verdict()}

{table("mtbench-greedy")}

{table("humaneval-greedy")}

{table("mtbench-t0.7")}

### The knobs on the previous draft

{knob_rows()}

{knob_verdict()} Raw JSON for every row: `results/`.

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
