"""Splice the "Tuning sweep" section of BENCHMARKS.md from a committed sweep (results/sweep/block-copy.json, written
by the command the document records; its chart is results/sweep/block-copy.png, drawn by the same command).

    python scripts/sweep_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "results/sweep/block-copy"
START, END = "<!-- sweep:start -->", "<!-- sweep:end -->"
sys.path.insert(0, str(ROOT))

from dflash.bench.sweep import cell_key, load_sweep  # noqa: E402
from dflash.bench.sweep_plot import NAMES, ticks  # noqa: E402
from doc_text import wrap  # noqa: E402  (scripts/: this script's folder, on the path when it runs)


def cell_text(c: dict | None, best: str | None) -> str:
    if c is None:
        return "not measured"
    star = "★ " if c["key"] == best else ""
    return f"{star}{c['speedup'][0]:.2f}× (τ {c['tau'][0]:.2f})"


def table(doc: dict) -> str:
    """Rows: the first axis; columns: the second (one column for a one-axis sweep)."""
    axes, cells = doc["spec"]["axes"], {c["key"]: c for c in doc["cells"]}
    (rn, rv), cols = axes[0], axes[1] if len(axes) > 1 else None
    heads = [f"{NAMES[cols[0]]} {t}" for t in ticks(cols[0], cols[1])] if cols else ["speedup (τ)"]
    lines = [f"| {NAMES[rn]} | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for value, label in zip(rv, ticks(rn, rv), strict=True):
        keys = [cell_key({rn: value, cols[0]: v}) for v in cols[1]] if cols else [cell_key({rn: value})]
        lines.append(f"| {label} | " + " | ".join(cell_text(cells.get(k), doc["best"]) for k in keys) + " |")
    return "\n".join(lines)


def section(doc: dict) -> str:
    host, models, cells = doc["host"], doc["models"], doc["cells"]
    spec = doc["spec"]
    n = sorted({c["n"] for c in cells})
    differ, ties = sum(c["differs"] for c in cells), sum(c["ties"] for c in cells)
    runs = sum(c["n"] for c in cells)
    same = ("every output equals the no-draft one" if not differ else
            f"{differ} of {runs} outputs part from the no-draft one, {ties} of them at a diagnosed numerical tie")
    flags = ", ".join(f for f in host.get("cpu_flags", []) if f.startswith(("avx512_bf16", "amx_bf16", "avx2")))
    fixed = ", ".join(f"{k} {v}" for k, v in spec.get("base", {}).items()) or "the defaults"
    about = (f"What `python -m dflash sweep` (and the playground's Sweep tab) measures. Each cell is the median "
             f"speedup over the no-draft loop of {n[0]} runs ({len(spec['prompts'])} MT-Bench prompts × "
             f"{spec['repeats']} repeats, {spec['max_new_tokens']} new tokens, greedy), each run interleaved with a "
             f"no-draft run of the same prompt; τ in brackets; other settings: {fixed}. Host: {host['cpu_model']}, "
             f"{host['logical_cores']} cores ({flags}), {models['dtype']}, {host['torch_threads']} threads. ★ marks "
             f"the fastest lossless cell; {same}.")
    chart = "The sweep's chart: speedup per cell, the best lossless cell and the default marked"
    text = "\n".join([START, "## Tuning sweep: block size × copy n-gram", "", about, "", table(doc), "",
                      f"![{chart}]({NAME}.png)", "", "```", doc["command"], "```", END])
    return wrap(text)


def main() -> None:
    doc = load_sweep((ROOT / f"{NAME}.json").read_text(encoding="utf-8"))
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text(encoding="utf-8")
    if START in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
    else:  # the first time: after the CPU settings per host (the headline script rewrites what is above them)
        at = text.index("<!-- gpu:start -->")
        head, tail = text[:at], "\n\n" + text[at:]
    path.write_text(head + section(doc) + tail, encoding="utf-8")


if __name__ == "__main__":
    main()
