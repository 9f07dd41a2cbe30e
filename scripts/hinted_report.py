"""TRAINING.md's section on the hinted draft, from the committed results in results/training/hinted/ (written by
`bash scripts/train_hinted_draft.sh`): its held-out accuracy against the shipped draft's, and the real loop.

Imported by scripts/training_report.py (this folder is on the path when it runs)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from doc_text import wrap

ROOT = Path(__file__).resolve().parent.parent
HINTED = ROOT / "results" / "training" / "hinted"
# The shipped draft's chain on the same prompts, host kind and command (BENCHMARKS.md's Xeon row).
SHIPPED_BENCH = ROOT / "results" / "mtbench-lookup-xeon.json"
SHIPPED_HUMANEVAL = ROOT / "results" / "humaneval-lookup.json"  # measured on the AMD EPYC host


def heldout_rows() -> list[str]:
    """Per draft: τ_tf and per-slot accuracy on the held-out shards of the regenerated data (`train diagnose`)."""
    rows = ["| draft | held-out blocks | τ teacher-forced | slot 1 / 2 / 3 right | accepted prefix 1 / 2 / 3 |",
            "|---|---:|---:|---|---|"]
    for name in ("shipped", "hinted"):
        path = HINTED / f"diagnose-{name}.json"
        if not path.is_file():
            continue
        d = json.loads(path.read_text())["draft"]
        acc = " / ".join(f"{x:.3f}" for x in d["slot_acc"][:3])
        pre = " / ".join(f"{x:.3f}" for x in d["prefix_acc"][:3])
        rows.append(f"| {name} | {d['blocks']:,} | **{d['tau_tf']:.2f}** | {acc} | {pre} |")
    return rows


def lookup_rows() -> list[str]:
    """How often copying alone is right on the target's own text (the baselines of the same `train diagnose`)."""
    path = HINTED / "diagnose-shipped.json"
    if not path.is_file():
        return []
    base = json.loads(path.read_text())["baselines"]
    return [f"lookup-{n}: covers {b['coverage']:.2f} of the anchors, right on {b['precision']:.2f} of those"
            for n, b in ((k.split("-")[1], v) for k, v in base.items() if k.startswith("lookup-"))]


def bench_row(label: str, path: Path) -> list[str]:
    """One bench result as a row: τ and speedup (bench's headline: decode time against its interleaved no-draft
    runs) of the draft alone and after copying, and how many outputs equal the no-draft output."""
    if not path.is_file():
        return []
    d = json.loads(path.read_text())
    s = d["summary"]
    cells = [f"**{s[m]['tau']:.2f}** ({s[m]['speedup']['decode']['speedup']:.2f}×)" if m in s else "—"
             for m in ("dflash", "dflash-lookup")]
    same = " · ".join(identical_words(s[m]["identical"]) for m in ("dflash", "dflash-lookup") if m in s)
    cpu = " ".join(d["machine"]["cpu_model"].split(" ")[:2])
    return [f"| {label} | {d['config']['prompts']} ×{len(d['prompts'])} | {cpu} | {d['config'].get('lookup_ngram', 2)} "
            f"| {' | '.join(cells)} | {s['ar']['tokens_per_s']:.1f} | {same} |"]


def identical_words(same: dict) -> str:
    """'4/20 (16 at ties)': outputs equal to the no-draft run's, and the others' diagnosis (bench's `identical`)."""
    rest = same["n_compared"] - same["n_identical"]
    if not rest:
        return f"{same['n_identical']}/{same['n_compared']}"
    odd = rest - same["n_ties"]
    return f"{same['n_identical']}/{same['n_compared']} ({same['n_ties']} at ties" + (f", {odd} NOT)" if odd else ")")


def fit_summary() -> str:
    starts = [json.loads(x) for x in (HINTED / "hinted" / "runs.jsonl").read_text().splitlines()]
    with gzip.open(HINTED / "hinted" / "train_log.jsonl.gz", "rt") as f:
        log = [json.loads(x) for x in f]
    cfg, last = starts[-1]["config"], log[-1]
    minutes = last["s_per_step"] * last["step"] / 60
    return (f"{last['step']:,} steps of {cfg['seqs_per_step']} sequences × {cfg['anchors_per_seq']} anchors at peak lr "
            f"{cfg['lr']:g}, {minutes:.0f} min on {starts[-1]['machine']['cpu_model']} ({starts[-1]['corpus_tokens']:,} "
            f"response tokens of {starts[-1]['corpus_sequences']} training sequences)")


def evaluations(run: str) -> list[tuple[int, float]]:
    """(step, held-out τ_tf) of a run's evaluations."""
    with gzip.open(HINTED / run / "train_log.jsonl.gz", "rt") as f:
        return [(r["step"], r["tau_tf"]) for r in map(json.loads, f) if "tau_tf" in r]


def full_text() -> str:
    """The run that trained every weight from the hinted draft (stopped: it stayed below the hint-only run)."""
    if not (HINTED / "hinted-full" / "runs.jsonl").is_file():
        return ""
    mine = ", ".join(f"{t:.2f} at step {s}" for s, t in evaluations("hinted-full"))
    hint = ", ".join(f"{t:.2f} at step {s}" for s, t in evaluations("hinted"))
    return wrap(f"Every weight trained as well (`full` stage, peak lr 2e-4, from the hinted run): held-out τ_tf {mine}, "
                f"against {hint} for the hint weights alone. On 100 k tokens the draft's own weights gain nothing, "
                "so that run was stopped and the hint-only draft is the one shipped.") + "\n\n"


def hinted_text() -> str:
    """The section's body, or a line saying it has not been measured."""
    if not (HINTED / "hinted" / "runs.jsonl").is_file():
        return "Not trained yet (`bash scripts/train_hinted_draft.sh data`, then `hint`)."
    intro = wrap(
        "A one-layer DFlash draft cannot copy: a masked slot's query cannot depend on the anchor. The hinted draft "
        "(`train fit --hint-ngram 3`) hands it the copy instead. Each masked slot's input also carries the token that "
        "a copy from the context offers there: the tokens that followed the most recent earlier occurrence of the "
        "longest recurring n-gram (n ≤ 3) ending at the anchor. A learned projection, a gate per n and an embedding "
        "of n carry it in. They start at zero, so the hinted draft starts as the shipped draft; only they train "
        "(`--train-only hint`). It trained on the target's own answers (`train data`), where copies are right more "
        f"often than in another writer's text: {fit_summary()}. It is not z-lab's format: `draft export` refuses it, "
        "and it runs in this engine only.")
    held = "\n".join(heldout_rows())
    copies = "; ".join(lookup_rows())
    bench = ["| draft | prompts | CPU | copy n | τ alone (speedup) | τ after copying (speedup) | no-draft tok/s "
             "| output identical |", "|---|---|---|---|---|---|---|---|"]
    for label, path in (("shipped", SHIPPED_BENCH), ("hinted", HINTED / "hinted-mt-bench.json"),
                        ("hinted", HINTED / "hinted-mt-bench-lookup3.json"), ("shipped", SHIPPED_HUMANEVAL),
                        ("hinted", HINTED / "hinted-humaneval.json")):
        bench += bench_row(label, path)
    bench.append("\n" + reading())
    return (f"{intro}\n\nHeld-out shards of the regenerated data (the target's own text):\n\n{held}\n\n"
            + (wrap(f"On the same anchors, copying alone: {copies}.") + "\n\n" if copies else "")
            + full_text()
            + wrap("The real loop: the first 20 prompts of each set, 128 new tokens, greedy, each method interleaved "
                   "with the no-draft loop in the host's default mode (bfloat16 on both CPUs). The shipped draft's rows "
                   "are BENCHMARKS.md's results with the same command.") + "\n\n" + "\n".join(bench) + "\n\n    " + "\n    ".join(commands()))


def reading() -> str:
    """What the MT-Bench rows say, from the same files."""
    shipped = json.loads(SHIPPED_BENCH.read_text())["summary"]
    mine = json.loads((HINTED / "hinted-mt-bench.json").read_text())["summary"]
    alone, chain = (mine[m]["tau"] for m in ("dflash", "dflash-lookup"))
    return wrap(f"On MT-Bench the hinted draft alone proposes τ {alone:.2f} against the shipped draft's "
                f"{shipped['dflash']['tau']:.2f}. After copying, the chain stays where it was ({chain:.2f} against "
                f"{shipped['dflash-lookup']['tau']:.2f}): copying first already takes the blocks whose anchor ends a "
                "recurring 2-gram, where the hints help most, without a draft pass. Leaving the draft more "
                "blocks (copy n = 3) is worse.")


def commands() -> list[str]:
    return ["bash scripts/train_hinted_draft.sh data    # " + first_line(HINTED / "data-regen.log"),
            "bash scripts/train_hinted_draft.sh hint    # " + json.loads((HINTED / "hinted" / "runs.jsonl").read_text()
                                                                       .splitlines()[0])["config"]["out"],
            "python -m dflash train diagnose --data data/regen --draft DRAFT --holdout-shards 2 --probe-steps 1 "
            "--out results/training/hinted/diagnose-NAME.json",
            "RUN=hinted bash scripts/train_hinted_draft.sh eval                       # mt-bench",
            "PROMPTS=humaneval RUN=hinted bash scripts/train_hinted_draft.sh eval     # humaneval",
            "python -m dflash bench --prompts mt-bench --limit 20 --max-new-tokens 128 --threads 2 --no-progress "
            "--methods ar,dflash-lookup --lookup-ngram 3 --draft runs/hinted --output "
            "results/training/hinted/hinted-mt-bench-lookup3.json --overwrite"]


def first_line(path: Path) -> str:
    return path.read_text().splitlines()[0].removeprefix("# command: ") if path.is_file() else ""
