"""Write assets/draft-smollm2-135m/TRAINING.md and evaluation.json from the committed results in results/training/.

    python scripts/training_report.py

Every number in TRAINING.md comes from these files (nothing is typed by hand):
  data-*.log                     the data stage's own progress log (throughput, tokens)
  <run>/runs.jsonl               one line per start/resume of `train fit`: config, corpus size, machine + CPU flags
  <run>/train_log.jsonl.gz       the fit's per-step log
  <run>/curve.jsonl              real-loop τ at the log-spaced snapshots (scripts/training_curve.py)
  eval-*.json                    `train eval --output` (real loop, interleaved with the no-draft loop)
  copy-gap.jsonl                 first drafted position against copying from the context (scripts/copy_gap.py)
  lookup-*.json                  the shipped draft with copying first (`python -m dflash bench` results)
The shipped draft comes from the runs named in results/training/shipped.json ({"lineage": [first run, warm-started
run, ...], "also": [runs on the τ curve that were not shipped], "ablations": [...]}; an older file names one "run").
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RES = ROOT / "results" / "training"
DRAFT = ROOT / "assets" / "draft-smollm2-135m"


def jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(x) for x in f if x.strip()]


def optional_jsonl(path: Path) -> list[dict]:
    """`jsonl`, or no rows for a measurement not made yet."""
    return jsonl(path) if path.is_file() else []


def data_logs() -> list[tuple[str, tuple[str, str, str, str], str]]:
    """Each data stage's log: (set name, its last progress line's (shard, of, tokens, tok/s), its command). A log
    counts the tokens of its own run (a resumed run starts at 0)."""
    out = []
    for log in sorted(RES.glob("data-*.log")):
        text = log.read_text()
        hits = re.findall(r"shard (\d+)/(\d+).*?: (\d+) response tokens, ([\d.]+) tok/s", text)
        cmd = re.search(r"^# command: (.*)$", text, re.M)
        if hits:
            out.append((log.stem[5:], hits[-1], cmd.group(1) if cmd else "?"))
    return out


def data_rows() -> list[str]:
    rows = ["| set | shards | response tokens | wall time | response tok/s | command |", "|---|---|---|---|---|---|"]
    for name, (shard, total, tokens, rate), cmd in data_logs():
        secs = int(tokens) / float(rate)
        # A log's command line may end in a note, "  (…)": outside the code span, so what is quoted runs as pasted.
        run, note = (re.match(r"(.*?)\s{2,}(\(.*\))$", cmd) or re.match(r"(.*)()$", cmd)).groups()
        rows.append(f"| {name} | {shard} of {total} | {int(tokens):,} | {secs / 60:.0f} min | {float(rate):.0f} | "
                    f"`{run}` {note} |")
    return rows


def window_mean(log: list[dict], step: int, key: str, width: int = 50) -> float | None:
    vals = [r[key] for r in log if step - width < r["step"] <= step and key in r]
    return sum(vals) / len(vals) if vals else None


def nearest(log: list[dict], step: int, key: str) -> float | None:
    have = [r for r in log if key in r and r["step"] <= step]
    return have[-1][key] if have else None


def fmt(x, spec: str = ".3f") -> str:
    return "" if x is None else format(x, spec)


def curve_rows(runs: list[str], not_shipped: tuple[str, ...] = ()) -> list[str]:
    """One row per snapshot of every run in the lineage (and of the runs not shipped); positions count the earlier
    runs' too (a warm start)."""
    rows = ["| run | step | supervised positions | loss (50-step mean) | train acc | held-out τ_tf | real-loop τ "
            "| histogram (accepted + 1) |",
            "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        log = jsonl(RES / run / "train_log.jsonl.gz")
        for c in sorted(jsonl(RES / run / "curve.jsonl"), key=lambda r: r["step"]):
            hist = " / ".join(f"{k}: {v}" for k, v in c["histogram"].items())
            name = f"{run} (not shipped)" if run in not_shipped else run
            rows.append(f"| {name} | {c['step']:,} | {int(c['positions']):,} | {fmt(window_mean(log, c['step'], 'loss'))} | "
                        f"{fmt(window_mean(log, c['step'], 'acc'))} | {fmt(nearest(log, c['step'], 'tau_tf'))} | "
                        f"**{c['tau']:.3f}** | {hist} |")
    return rows


def eval_rows() -> tuple[list[str], dict]:
    rows = ["| prompts | n | new tokens | temperature | τ | histogram (accepted + 1) | speedup vs no-draft "
            "| identical to no-draft |",
            "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for path in sorted(RES.glob("eval-*.json")):
        d = json.loads(path.read_text())
        hist = " / ".join(f"{k}: {v}" for k, v in d["histogram"].items())
        sp = f"{d['speedup']:.2f}×" if "speedup" in d else "(not run)"
        ident = f"{d['identical']}/{d['n_prompts']}" if "identical" in d else ""
        rows.append(f"| {d['prompts']} | {d['n_prompts']} | {d['max_new_tokens']} | {d.get('temperature', 0.0)} | "
                    f"**{d['tau']:.2f}** | {hist} | {sp} | {ident} |")
        summary[path.stem[5:]] = {k: d.get(k) for k in ("prompts", "n_prompts", "max_new_tokens", "temperature", "tau",
                                                          "speedup", "identical")}
        summary[path.stem[5:]]["cpu"] = d["machine"]["cpu_model"]
        summary[path.stem[5:]]["settings"] = settings_words(d["settings"]) if d.get("settings") else "settings not recorded"
        summary[path.stem[5:]]["cpu_flags"] = d["machine"].get("cpu_flags")
    return rows, summary


def tau_standard_error(histogram: dict) -> float:
    """Standard error of τ from a histogram {accepted + 1: blocks}, blocks taken as independent draws."""
    counts = {int(k): v for k, v in histogram.items()}
    n = sum(counts.values())
    mean = sum(k * c for k, c in counts.items()) / n
    var = sum(c * (k - mean) ** 2 for k, c in counts.items()) / max(n - 1, 1)
    return math.sqrt(var / n)


def run_host(run: str) -> str:
    """The CPU a training run's last (re)start ran on (its runs.jsonl)."""
    return jsonl(RES / run / "runs.jsonl")[-1]["machine"]["cpu_model"]


def home_host() -> str:
    """The CPU of the shipped draft's training, named in the report's first lines: other hosts are named where used."""
    shipped = json.loads((RES / "shipped.json").read_text())
    return run_host((shipped.get("lineage") or [shipped["run"]])[-1])


def ablation_rows(runs: list[dict], at: int) -> list[str]:
    rows = [f"| run | change | real-loop τ at step {at:,} (± s.e.) | held-out τ_tf | supervised positions | s/step |",
            "|---|---|---|---|---|---|"]
    for run in runs:
        curve = {r["step"]: r for r in jsonl(RES / run["run"] / "curve.jsonl")}
        log = jsonl(RES / run["run"] / "train_log.jsonl.gz")
        if at in curve:
            se = tau_standard_error(curve[at]["histogram"])
            rows.append(f"| {run['run']} | {run['change']} | **{curve[at]['tau']:.3f}** ± {se:.3f} | "
                        f"{fmt(nearest(log, at, 'tau_tf'))} | {int(curve[at]['positions']):,} | "
                        f"{fmt(window_mean(log, at, 's_per_step'), '.2f')}{host_note(run_host(run['run']))} |")
    return rows


def host_note(cpu: str) -> str:
    return "" if cpu == home_host() else f" (on {cpu})"


def ablation_sections(shipped: dict) -> str:
    """Each ablation group of shipped.json: its description, then its table at the group's step."""
    groups = shipped.get("ablations", [])
    if groups and "run" in groups[0]:  # the older layout: one group of runs
        groups = [{"step": shipped.get("ablation_step", 1000), "text": "", "runs": groups}]
    body = "\n\n".join((g["text"] + "\n\n" if g["text"] else "") + "\n".join(ablation_rows(g["runs"], g["step"]))
                         for g in groups)
    cmds = shipped.get("ablation_commands", [])
    return body + ("\n\nCommands:\n\n" + "\n".join(f"    {c}" for c in cmds) if cmds else "")


def budget_text() -> str:
    """The campaign's spend over every committed run (ablation runs included) and data set."""
    steps = sum(jsonl(p)[-1]["step"] for p in RES.glob("*/train_log.jsonl.gz"))
    tokens = sum(int(last[2]) for _, last, _ in data_logs())
    return (f"Spent by the campaign so far, over every committed run and data log: **{steps:,} fit steps** and "
            f"**{tokens:,} target-labelled response tokens** generated (held-out shards included).")


def copy_gap_text(shipped: dict) -> str:
    """The copy-gap table (scripts/copy_gap.py), what it says of the shipped draft, and the lookup-first measurements
    (bench results), with the commands that measured them."""
    from dflash.training.copy_gap import markdown_table

    rows = optional_jsonl(RES / "copy-gap.jsonl")
    if not rows:
        return "Not measured yet."
    dtypes = ", ".join(sorted({r.get("dtype", "?") for r in rows}))
    cpus = ", ".join(sorted({(r.get("machine") or {}).get("cpu_model", "?") for r in rows}))
    text = "\n".join(markdown_table(rows)) + (
        f"\n\nMeasured on {cpus} in {dtypes}, the engine's settings for that host. The τ curve's points were measured "
        "with their own host's settings, so the same draft's τ can differ a little between the two tables: a greedy "
        "answer that parts at a numerical tie of another dtype goes on differently.")
    ship = next((r for r in rows if r["label"] == "shipped"), None)
    if ship:
        b, a = ship["bigram"], ship["all"]
        text += (f"\n\nFor the shipped draft, **{b['share']:.0%}** of blocks have an anchor whose bigram occurred earlier; "
                 f"there copying proposes the target's next token **{b['copy']:.0%}** of the time and the draft "
                 f"**{b['draft']:.0%}**. Over all blocks copying alone is right {a['copy']:.0%} of the time, the draft "
                 f"{a['draft']:.0%}, one or the other {a['either']:.0%}.")
    cmds = shipped.get("copy_gap_commands", [])
    text += "\n\n" + "\n".join(f"    {c}" for c in cmds) if cmds else ""
    benches = [json.loads(p.read_text()) for p in RES.glob("lookup-*.json")]
    for bench in sorted(benches, key=lambda b: b["config"]["request"]["adaptive"] != "fixed"):  # like for like first
        text += "\n\n" + lookup_text(bench)
    return text


def diagnostics_text() -> str:
    """The `train diagnose` result (results/training/diagnostics.json) as a table and what it says."""
    from doc_text import wrap  # scripts/: this script's folder, on the path when it runs

    path = RES / "diagnostics.json"
    if not path.is_file():
        return "Not measured yet."
    r = json.loads(path.read_text())
    d, p, c = r["draft"], r["probes"], r["config"]
    rows = ["| proposer of slot 1 | anchors right | anchors covered | right where it proposes |", "|---|---:|---:|---:|"]
    rows += [f"| {name} | {b['accuracy']:.3f} | {b['coverage']:.3f} | {b['precision']:.3f} |"
             for name, b in r["baselines"].items()]
    rows.append(f"| the draft (shipped) | {d['slot_acc'][0]:.3f} | 1.000 | {d['slot_acc'][0]:.3f} |")
    rows.append(f"| probe (i): features at a−1 + anchor | {p['mlp']['heldout_acc']:.3f} | 1.000 | — |")
    rows.append(f"| probe (ii): (i) + a lookup by the anchor | {p['lookup']['heldout_acc']:.3f} | 1.000 | — |")
    slots = ", ".join(f"{x:.2f}" for x in d["slot_acc"])
    prefix = ", ".join(f"{x:.2f}" for x in d["prefix_acc"])
    text = (f"{d['blocks']:,} held-out blocks of {r['block_size']} ({r['heldout_sequences']} sequences; the probes "
            f"trained {p['steps']} steps × {p['seqs_per_step']} sequences × {p['anchors_per_seq']} anchors on "
            f"{r['train_response_tokens']:,} training tokens). The draft's accuracy per slot, unconditional: {slots}; "
            f"as an accepted prefix: {prefix} (τ teacher-forced {d['tau_tf']:.2f}). The lookup probe's gain over the "
            f"anchor-blind one is **{p['gap']:+.3f}** of slot-1 accuracy, and its final training loss "
            f"{p['lookup']['final_train_loss']:.2f} against {p['mlp']['final_train_loss']:.2f}. At this budget both probes "
            f"stay below the shipped draft, which trained far longer on more data, so the gap is what the lookup is worth "
            f"this early in training, not its ceiling.")
    command = (f"python -m dflash train diagnose --data {c['data']} --draft {c['draft']} --out "
               f"results/training/diagnostics.json --holdout-shards {c['holdout_shards']} --probe-steps "
               f"{c['probe_steps']} --probe-seqs {c['probe_seqs']}")
    return "\n".join(rows) + "\n\n" + wrap(text) + "\n\n    " + command + overfit_text()


def overfit_text() -> str:
    """The overfit check (results/training/overfit/overfit.json): can the recipe memorise a small set?"""
    path = RES / "overfit" / "overfit.json"
    if not path.is_file():
        return ""
    from doc_text import wrap  # scripts/: this script's folder, on the path when it runs

    r = json.loads(path.read_text())
    last = r["evaluations"][-1]
    slots = ", ".join(f"{x:.3f}" for x in last["slot_acc"][:3])
    return ("\n\n" + wrap(f"Overfit check: the same recipe on {r['data']}, every position an anchor. At step "
                          f"{last['step']} slots 1–3 are right on {slots} of the {last['blocks']:,} training blocks (the "
                          "bar is 0.9): the objective and the pipeline learn what they are shown, so the held-out "
                          "accuracy is not held back by a bug in them.") + f"\n\n    {r['command']}")


def lookup_text(bench: dict) -> str:
    """One `python -m dflash bench --methods ar,dflash,dflash-lookup` result: what copying first adds to the draft."""
    cfg, s = bench["config"], bench["summary"]
    d, lf, n = s["dflash"], s["dflash-lookup"], cfg["n_prompts"]
    policy = cfg["request"]["adaptive"]
    blocks = "the draft's block size, fixed" if policy == "fixed" else f"the `{policy}` block policy"
    copied = round(lf["copy_share"] * sum(lf["acceptance_histogram"].values()))
    return (f"Lookup first ({cfg['prompts']}, {n} prompts × {cfg['request']['max_new_tokens']} tokens, "
            f"{bench['machine']['cpu_model']}, {bench['models']['dtype']}, {bench['machine']['torch_threads']} threads, "
            f"{blocks}, interleaved with the "
            f"no-draft loop; {copied} blocks copied, {lf['copy_share']:.0%} of its blocks): τ **{lf['tau']:.2f}** and "
            f"**{lf['speedup']['decode']['speedup']:.2f}×** the no-draft loop, against the draft alone's τ {d['tau']:.2f} and "
            f"{d['speedup']['decode']['speedup']:.2f}×; outputs identical to the no-draft loop: "
            f"{lf['identical']['n_identical']}/{n} and {d['identical']['n_identical']}/{n}.\n\n    {bench['command']}")


def wall_seconds(log: list[dict], starts: list[int]) -> float:
    """Fit time: `s_per_step` is the running mean since each (re)start, so each segment's last row times its length."""
    ends = starts[1:] + [log[-1]["step"]]
    by_step = {r["step"]: r for r in log}
    return sum(by_step[e]["s_per_step"] * (e - s) for s, e in zip(starts, ends) if e in by_step and e > s)


RESOLVED = 0.08  # τ differences below this are not resolved by the held-out set (two standard errors of a difference)


def continuations_text(lineage: list[str], also: list[str]) -> str:
    """Where every run that continued the shipped draft ended (its last curve point), against the shipped draft."""
    ends = {run: jsonl(RES / run / "curve.jsonl")[-1] for run in also if (RES / run / "curve.jsonl").exists()}
    shipped = jsonl(RES / lineage[-1] / "curve.jsonl")[-1]["tau"]
    if not ends:
        return ""
    lo, hi = min(e["tau"] for e in ends.values()), max(e["tau"] for e in ends.values())
    names = ", ".join(f"`{r}`" for r in ends)
    within = max(abs(lo - shipped), abs(hi - shipped)) < RESOLVED
    return (f"\n\nEvery run that continued the shipped draft with another lever ({names}) ended between τ {lo:.3f} and "
            f"{hi:.3f} on this set (the shipped draft: {shipped:.3f})" +
            (", all within this set's resolution (see Ablation): none of those levers moved τ measurably." if within
             else "."))


def slope_per_doubling(runs: list[str]) -> tuple[float, float, float]:
    """Least-squares slope of real-loop τ against log2(supervised positions) over the curve's points from step
    1,000 of each run on (the first points of a run are its warm-up). Returns (slope, last τ, last positions)."""
    import math

    pts = sorted((r["positions"], r["tau"]) for run in runs for r in jsonl(RES / run / "curve.jsonl") if r["step"] >= 1000)
    xs, ys = [math.log2(x) for x, _ in pts], [y for _, y in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return slope, pts[-1][1], pts[-1][0]


def lineage_text(segs: list[tuple[str, list[dict], list[dict]]]) -> str:
    """One sentence per run of the lineage: its steps, corpus, learning rate and where it started from."""
    parts = []
    for run, starts, log in segs:
        cfg = starts[-1]["config"]
        origin = f"warm-started from `{cfg['init_from']}`" if cfg.get("init_from") else "from random weights"
        parts.append(f"`{run}`: {log[-1]['step']:,} steps {origin}, peak learning rate {cfg['lr']:g}, on "
                     f"{starts[0]['corpus_tokens']:,} response tokens (`{cfg['data']}`)")
    return "; then ".join(parts) + "."


def draft_table() -> list[str]:
    cfg = json.loads((DRAFT / "config.json").read_text())
    size = sum(p.stat().st_size for p in DRAFT.glob("*.safetensors")) / 1e6
    vocab = ""
    if (DRAFT / "draft_vocab.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(DRAFT / "draft_vocab.safetensors"), "pt") as f:
            vocab = f"{f.get_slice('token_ids').get_shape()[0]:,}"
    return ["| | |", "|---|---|",
            "| format | z-lab DFlash checkpoint (`config.json`, `model.safetensors`, bf16) |",
            f"| extension | `draft_vocab.safetensors`: the {vocab} most frequent target tokens; our engine computes the draft "
            "head only over them (vLLM / SGLang ignore the file and use the full head) |",
            f"| draft layers | {cfg['num_hidden_layers']}, hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads / "
            f"{cfg['num_key_value_heads']} KV heads, MLP {cfg['intermediate_size']} |",
            f"| target features | layers {', '.join(map(str, cfg['dflash_config']['target_layer_ids']))} of "
            f"{cfg['num_target_layers']}, fused by `fc` + `hidden_norm` |",
            f"| block size | {cfg['block_size']} |",
            f"| mask token | id {cfg['dflash_config']['mask_token_id']} |",
            f"| size | {size:.1f} MB |"]


def verdict(ev: dict) -> str:
    """The issue's targets against the measured numbers."""
    checks = []
    for key, name, need in (("mtbench", "MT-Bench", 2.0), ("humaneval", "HumanEval", 2.2)):
        if key in ev:
            ok = "met" if ev[key]["tau"] >= need else "**not met**"
            checks.append(f"{name} τ = {ev[key]['tau']:.2f} (target ≥ {need}: {ok})")
    if ev.get("mtbench", {}).get("speedup"):
        sp = ev["mtbench"]["speedup"]
        checks.append(f"DFlash at {sp:.2f}× the no-draft loop's speed on MT-Bench ({'faster' if sp > 1 else '**slower**'})")
    return "**Status:** " + "; ".join(checks) + "." if checks else ""


def main() -> None:
    from default_eval_report import evaluated_text  # scripts/: this script's folder, on the path when it runs
    from hinted_report import hinted_text

    shipped = json.loads((RES / "shipped.json").read_text())
    runs = shipped.get("lineage") or [shipped["run"]]  # a warm-started run follows the run it started from
    segs = [(r, jsonl(RES / r / "runs.jsonl"), jsonl(RES / r / "train_log.jsonl.gz")) for r in runs]
    _, starts, log = segs[-1]
    cfg, machine = starts[-1]["config"], starts[-1]["machine"]  # the last (re)start: the config that finished
    steps = sum(lg[-1]["step"] for _, _, lg in segs)
    seconds = sum(wall_seconds(lg, [r["step"] for r in st]) for _, st, lg in segs)
    hours = seconds / 3600
    ev_rows, ev = eval_rows()
    also = shipped.get("also", [])  # runs on the same held-out set that were not shipped (they still inform the curve)
    slope, last_tau, last_pos = slope_per_doubling(runs + also)
    flags = ", ".join(machine.get("cpu_flags") or [])
    fit_cmds = shipped.get("fit_commands") or [shipped.get("fit_command", "")]
    text = TEMPLATE.format(
        data_table="\n".join(data_rows()), lineage=lineage_text(segs),
        steps=steps, positions=int(sum(r.get("positions", 0) for _, _, lg in segs for r in lg)), hours=hours,
        corpus_tokens=starts[0]["corpus_tokens"], corpus_seqs=starts[0]["corpus_sequences"],
        vocab=starts[0]["draft_vocab"], cfg=json.dumps({k: v for k, v in cfg.items() if k not in ("data", "out")}),
        fit_cmd="\n    ".join(fit_cmds), curve_table="\n".join(curve_rows(runs + also, tuple(also))), curve_cmd="\n    ".join(
            shipped.get("curve_commands") or [shipped.get("curve_command", "")]),
        ablation_sections=ablation_sections(shipped), copy_gap=copy_gap_text(shipped), budget=budget_text(),
        diagnostics=diagnostics_text(), hinted=hinted_text(), evaluated=evaluated_text(slope),
        layers=cfg["layers"],
        eval_table="\n".join(ev_rows), eval_cmds="\n".join(f"    {c}" for c in shipped.get("eval_commands", [])),
        cpu=machine["cpu_model"], flags=flags, torch=machine["torch"], threads=cfg.get("threads"),
        s_per_step=seconds / steps, verdict=verdict(ev),
        draft_table="\n".join(draft_table()), first_loss=segs[0][2][0]["loss"], ln_v=math.log(starts[0]["draft_vocab"]),
        slope=slope, last_tau=last_tau, x10_tau=last_tau + slope * math.log2(10), last_pos=last_pos,
        doublings=(2.0 - last_tau) / slope if slope > 0 else float("inf"),
        factor=2 ** ((2.0 - last_tau) / slope) if slope > 0 else float("inf"),
        continuations=continuations_text(runs, also), resolved=RESOLVED)
    (DRAFT / "TRAINING.md").write_text(text)
    policy = default_policy()
    readme_status(ev, policy, starts[0]["corpus_tokens"], steps, hours)
    doc = {"run": runs[-1], "evaluations": ev, "default_policy": policy}
    (DRAFT / "evaluation.json").write_text(json.dumps(doc, indent=1) + "\n")


def default_policy() -> dict | None:
    """DFlash with the engine's default block policy (`auto`) in the headline benchmark, when it ran with it: the
    speed a user of the defaults gets (the evaluations above run the draft at its fixed trained block)."""
    path = ROOT / "results" / "mtbench-greedy.json"
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    policy, dflash = d["config"]["request"].get("adaptive"), d["summary"].get("dflash")
    if policy != "auto" or not dflash:
        return None
    return {"policy": "auto", "n_prompts": d["config"]["n_prompts"], "tau": round(dflash["tau"], 4),
            "speedup": round(dflash["speedup"]["decode"]["speedup"], 4), "identical": dflash["identical"]["n_identical"],
            "cpu": d["machine"]["cpu_model"], "source": "results/mtbench-greedy.json",
            "settings": settings_words(d["models"].get("host") or {"dtype": d["models"]["dtype"]})}


def settings_words(host: dict) -> str:
    """A run's CPU settings in words: `float32, linear layout` (the layout only where the run recorded one)."""
    return host["dtype"] + (f", {host['layout']} layout" if host.get("layout") else "")


def default_policy_words(p: dict | None) -> str:
    if p is None:
        return ""
    return (f" With the engine's default block policy (`auto`) DFlash ran at **{p['speedup']:.2f}×** plain decoding on "
            f"the same prompts in the headline benchmark ({p['cpu']}, {p['settings']}; `{p['source']}`).")


def readme_status(ev: dict, policy: dict | None, tokens: int, steps: int, hours: float) -> None:
    """The README's paragraph on the default draft, between its draft-status markers."""
    from doc_text import wrap  # scripts/: this script's folder, on the path when it runs

    readme = ROOT / "README.md"
    text = readme.read_text()
    begin, end = "<!-- draft-status:begin (scripts/training_report.py) -->", "<!-- draft-status:end -->"
    if begin not in text or "mtbench" not in ev:
        return
    mt = ev["mtbench"]
    names = {"humaneval": "HumanEval", "sharegpt-heldout": "held-out ShareGPT"}
    others = "".join(f"; on {names[k]}, {ev[k]['tau']:.2f}" for k in names if k in ev)
    sp = mt["speedup"]
    body = (f"> **The default draft** was trained by this repository's pipeline on a 2-core CPU ({tokens:,} "
            f"target-labelled tokens, {steps:,} steps, {hours:.1f} h of fit). On {mt['n_prompts']} MT-Bench first "
            f"turns its τ is **{mt['tau']:.2f}** tokens per target step{others}.{default_policy_words(policy)} "
            f"At its fixed trained block of 8 it ran at {sp:.2f}× ({mt['cpu']}; {mt['settings']}), greedy output "
            f"identical on {mt['identical']}/{mt['n_prompts']} prompts. Speed depends on the CPU: the playground's "
            "\"Compare with autoregressive\" measures it on yours ([TRAINING.md](assets/draft-smollm2-135m/TRAINING.md)).")
    head, rest = text.split(begin, 1)
    readme.write_text(head + begin + "\n" + wrap(body) + "\n" + end + rest.split(end, 1)[1])


TEMPLATE = (Path(__file__).parent / "training_report.md").read_text()  # str.format fields: see main()

if __name__ == "__main__":
    main()
