"""TRAINING.md's section on the default chain, evaluated: the bench results of `scripts/evaluate_default.sh` in
results/eval/ (one file per prompt set and mode), against the drafting system's targets. Imported by
training_report.py, which writes TRAINING.md."""

from __future__ import annotations

import json
from pathlib import Path

from hinted_report import identical_words  # scripts/: this script's folder, on the path when it runs

EVAL = Path(__file__).resolve().parent.parent / "results" / "eval"
SETS = {"mt-bench": "MT-Bench", "humaneval": "HumanEval"}
TAU_TARGET, DRAFT_TAU_TARGET = 2.2, 1.7
SPEED_TARGET = {"auto": 1.5, "float32": 1.2}  # the default chain on MT-Bench: the host's default mode, float32


def load(set_name: str, mode: str, draft: str = "") -> dict | None:
    path = EVAL / f"{draft + '-' if draft else ''}{set_name}-{mode}.json"
    doc = json.loads(path.read_text()) if path.exists() else None
    return doc if doc and doc.get("complete") else None


def proposers(doc: dict, method: str) -> dict[str, tuple[int, float]]:
    """Blocks and τ of each proposer of `method` over every prompt: {name: (blocks, τ)}."""
    blocks: dict[str, int] = {}
    tokens: dict[str, float] = {}
    for prompt in doc["prompts"]:
        for run in prompt["methods"][method]["runs"]:
            for name, s in (run["stats"].get("proposers") or {}).items():
                blocks[name] = blocks.get(name, 0) + s["blocks"]
                tokens[name] = tokens.get(name, 0.0) + s["blocks"] * s["tau"]
    return {name: (n, tokens[name] / n) for name, n in blocks.items() if n}


def needed_draft_tau(doc: dict) -> tuple[float, float, float] | None:
    """(copy's share of the chain's blocks, the draft's τ on the blocks copying leaves, the draft τ there that would
    give the chain τ = TAU_TARGET with copying as it is)."""
    p = proposers(doc, "dflash-lookup")
    if "copy" not in p or "draft" not in p:
        return None
    (nc, tc), (nd, td) = p["copy"], p["draft"]
    return nc / (nc + nd), td, (TAU_TARGET * (nc + nd) - nc * tc) / nd


def row(set_name: str, doc: dict, draft: str = "shipped") -> str:
    s = doc["summary"]
    ar, alone, chain = s["ar"], s["dflash"], s["dflash-lookup"]

    def cell(m: dict) -> str:
        return f"**{m['tau']:.2f}** ({m['speedup']['decode']['speedup']:.2f}×)"

    split = needed_draft_tau(doc)
    copy = f"{split[0]:.0%}, draft τ there {split[1]:.2f}" if split else "–"
    return (f"| {SETS[set_name]} ×{s['ar']['n_prompts']} | {draft} | {doc['models']['dtype']} | {ar['tokens_per_s']:.1f} | "
            f"{cell(alone)} | {cell(chain)} | {copy} | {identical_words(alone['identical'])} · {identical_words(chain['identical'])} |")


def targets(docs: dict) -> list[str]:
    """The targets, each met or not, from the files present."""
    out = []
    for set_name, label in SETS.items():
        if doc := docs.get((set_name, "auto")):
            tau = doc["summary"]["dflash-lookup"]["tau"]
            out.append(f"default τ on {label} ≥ {TAU_TARGET}: {tau:.2f} ({'met' if tau >= TAU_TARGET else '**not met**'})")
    for mode, need in SPEED_TARGET.items():
        if doc := docs.get(("mt-bench", mode)):
            sp = doc["summary"]["dflash-lookup"]["speedup"]["decode"]["speedup"]
            words = "the default mode" if mode == "auto" else "float32"
            out.append(f"default ≥ {need}× on MT-Bench in {words}: {sp:.2f}× ({'met' if sp >= need else '**not met**'})")
    for key, name in ((("mt-bench", "auto"), "the shipped draft"), (("mt-bench", "hinted"), "the hinted draft")):
        if doc := docs.get(key):
            tau = doc["summary"]["dflash"]["tau"]
            out.append(f"{name} alone on MT-Bench ≥ {DRAFT_TAU_TARGET}: {tau:.3f} "
                       f"({'met' if tau >= DRAFT_TAU_TARGET else '**not met**'})")
    return out


def needed_text(docs: dict, slope: float | None) -> str:
    """What the τ target asks of the draft, and (given the τ curve's slope per doubling of supervised positions)
    how much more training of the same recipe that would take if the slope held."""
    parts, gaps = [], []
    for set_name, label in SETS.items():
        doc = docs.get((set_name, "auto"))
        if doc and (split := needed_draft_tau(doc)):
            share, now, need = split
            gaps.append(need - now)
            parts.append(f"on {label} copying makes {share:.0%} of the blocks; for the chain to reach τ {TAU_TARGET} "
                         f"with copying as it is, the draft's τ on the other blocks would have to rise from {now:.2f} "
                         f"to **{need:.2f}**")
    if not parts:
        return ""
    text = "What the target asks of the draft: " + "; ".join(parts) + "."
    if slope and slope > 0 and gaps:
        doublings = min(gaps) / slope
        text += (f" The τ curve above rose {slope:.3f} per doubling of supervised positions; at that slope the smaller "
                 f"of these gains needs {doublings:.1f} doublings, about {2 ** doublings:,.0f}× the shipped draft's "
                 "training.")
    return text


def evaluated_text(slope: float | None = None) -> str:
    docs = {(s, m): d for s in SETS for m in ("auto", "float32") if (d := load(s, m))}
    hinted = load("mt-bench", "auto", "hinted")  # not a mode: kept apart from the default's rows and targets
    if not docs:
        return "(not measured yet: `bash scripts/evaluate_default.sh`)"
    any_doc = next(iter(docs.values()))
    host = any_doc["machine"]["cpu_model"]
    flags = ", ".join(f for f in any_doc["machine"].get("cpu_flags") or [] if f.startswith(("avx512_bf16", "amx")))
    lines = [
        f"Greedy, 128 new tokens, every prompt of each set run by the no-draft loop (`ar`), the draft alone "
        f"(`dflash`) and the chain (`dflash-lookup`: copy from the context first, then the draft; with the shipped "
        f"draft, the default), interleaved, with the engine's default block policy. Host: {host} "
        f"({flags or 'no native bfloat16'}), 2 threads; the default mode is the host probe's choice.",
        "",
        "| prompts | draft | dtype | no-draft tok/s | draft alone τ (speedup) | chain τ (speedup) | copied blocks, "
        "draft τ on the rest | identical to no-draft: alone · chain |",
        "|---|---|---|---:|---|---|---|---|",
    ]
    lines += [row(s, d) for (s, m), d in docs.items()]
    if hinted:
        lines.append(row("mt-bench", hinted, "hinted"))
    targets_now = targets({**docs, **({("mt-bench", "hinted"): hinted} if hinted else {})})
    lines += ["", "Targets: " + "; ".join(targets_now) + ".", "", needed_text(docs, slope), "",
              "    bash scripts/evaluate_default.sh          # results/eval/{mt-bench,humaneval}-{auto,float32}.json",
              "    bash scripts/evaluate_default.sh hinted   # results/eval/hinted-mt-bench-auto.json"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(evaluated_text())
