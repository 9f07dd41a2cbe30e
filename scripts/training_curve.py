"""τ with the real loop at the log-spaced snapshots of a training run, against supervised positions seen.

    python scripts/training_curve.py --run runs/main --out results/training/curve-main.jsonl \
        --png assets/draft-smollm2-135m/tau_curve.png

Each snapshot (`RUN/snapshots/step_N`, written by `train fit` at steps base·2^k) is evaluated greedily on a fixed
held-out prompt set with the engine (no baseline run: τ only). Resumable: steps already in --out are skipped.
The x axis comes from the run's own log: the sum of the `positions` field up to the snapshot's step, plus, for a
run warm-started from others (`--after RUN,RUN`), every position its parent runs supervised.
`--plot-only` redraws the PNG from --out (one line per `--label`, several files may be given).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def positions_by_step(log_path: Path, offset: int = 0) -> dict[int, int]:
    seen, total = {}, offset
    for line in log_path.read_text().splitlines():
        row = json.loads(line)
        total += row.get("positions", 0)
        seen[row["step"]] = total
    return seen


def evaluate_snapshots(args) -> None:
    from dflash.loading.datasets import load_prompts
    from dflash.models.draft import load_draft
    from dflash.decode.engine import Engine
    from dflash.loading.load import load_engine
    from dflash.training.evaluate import evaluate_draft

    out = Path(args.out)
    done = {json.loads(x)["step"] for x in out.read_text().splitlines()} if out.is_file() else set()
    snaps = sorted((Path(args.run) / "snapshots").glob("step_*"))
    todo = [p for p in snaps if int(p.name[5:]) not in done and (not args.steps or int(p.name[5:]) in args.steps)]
    if not todo:
        return
    base, _ = load_engine("default", no_draft=True, threads=args.threads)
    prompts = load_prompts(args.prompts, args.limit)
    parents = [Path(r) for r in args.after.split(",")] if args.after else []
    offset = sum(max(positions_by_step(r / "train_log.jsonl").values()) for r in parents)
    positions = positions_by_step(Path(args.run) / "train_log.jsonl", offset)
    out.parent.mkdir(parents=True, exist_ok=True)
    for snap in todo:
        step = int(snap.name[5:])
        draft, vocab = load_draft(snap)
        res = evaluate_draft(Engine(base.target, draft, vocab), prompts, args.max_new_tokens, baseline=False)
        row = {"label": args.label, "step": step, "positions": positions.get(step), "tau": res["tau"],
               "histogram": res["histogram"], "n_verify": res["n_verify"], "prompts": args.prompts,
               "limit": args.limit, "max_new_tokens": args.max_new_tokens}
        print(json.dumps(row), flush=True)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def plot(paths: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for path in paths:
        rows = sorted((json.loads(x) for x in Path(path).read_text().splitlines()), key=lambda r: r["step"])
        rows = [r for r in rows if r.get("positions")]
        if rows:
            ax.plot([r["positions"] for r in rows], [r["tau"] for r in rows], marker="o", label=rows[0]["label"])
    ax.set_xscale("log")
    ax.set_xlabel("supervised positions seen (log scale)")
    ax.set_ylabel("τ (real loop, greedy, held-out prompts)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", help="training output directory (with snapshots/ and train_log.jsonl)")
    ap.add_argument("--out", required=True, nargs="+", help="curve JSONL (several with --plot-only)")
    ap.add_argument("--label", default="main")
    ap.add_argument("--after", help="the runs this one warm-started from, comma-separated, oldest first "
                    "(their positions are added to the x axis)")
    ap.add_argument("--prompts", default="sharegpt-heldout")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--steps", type=lambda t: {int(x) for x in t.split(",")}, help="only these snapshot steps")
    ap.add_argument("--png")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if not args.plot_only:
        if not args.run or len(args.out) != 1:
            ap.error("--run and exactly one --out are needed to evaluate")
        args.out = args.out[0]
        evaluate_snapshots(args)
        args.out = [args.out]
    if args.png:
        plot(args.out, args.png)


if __name__ == "__main__":
    main()
