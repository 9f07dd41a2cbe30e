"""The CPU settings the host probe chooses, recorded per machine and tabled in BENCHMARKS.md.

    python scripts/host_settings.py record   # a fresh probe of the default models on this machine (quiet machine!),
                                             # the forward-cost and prefill profiles, `ar` and `dflash` in every setting
                                             # against the default: results/host/<cpu>.json,
                                             # <cpu>-{forward,prefill,ar,dflash}.json
    python scripts/host_settings.py record --only probe,prefill   # re-record only those (a new probe version)
    python scripts/host_settings.py table    # splice the "CPU settings per host" section of BENCHMARKS.md from them
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "host"
FORWARD = ["forward", "--dtypes", "float32,bfloat16", "--tokens", "1,2,3,4,8,16", "--reps", "4", "--threads", "2", "--json"]
AR = ["settings", "--prompts", "mt-bench", "--limit", "10", "--max-new-tokens", "64", "--json"]
DFLASH = ["settings", "--method", "dflash", *AR[1:]]
PREFILL = ["prefill", "--tokens", "64,256,1024", "--reps", "2", "--threads", "2", "--json"]
PROFILES = (("forward", FORWARD), ("prefill", PREFILL), ("ar", AR), ("dflash", DFLASH))
START, END = "<!-- host-settings:start -->", "<!-- host-settings:end -->"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


PARTS = ("probe", *(suffix for suffix, _ in PROFILES))


def record(only: tuple[str, ...] = PARTS) -> None:
    sys.path.insert(0, str(ROOT))
    from dflash.loading.host import cpu_flags, cpu_model

    # One CPU model name comes with different SIMD sets (AMD EPYC: AVX2 only, or AVX-512 with BF16): name by both.
    simd = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "asimd") if f in cpu_flags()), "scalar")
    name = slug(f"{cpu_model()} {simd}")
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    if "probe" in only:
        # A fresh probe, cached as this machine's choice: the benchmarks run after it (scripts/final_bench.sh) use
        # the settings recorded here, not an older cached probe that may have chosen otherwise.
        from dflash.bench.machine import load_average
        from dflash.loading.load import load_engine

        before, os.environ["DFLASH_PROBE"] = os.environ.get("DFLASH_PROBE"), "refresh"
        try:
            _, info = load_engine()
            load_engine(no_draft=True)  # the engine without a draft is probed on its own (the step alone): refresh it too
        finally:  # the profiles below (subprocesses) read that cached choice, never probe again
            os.environ.pop("DFLASH_PROBE")
            if before is not None:
                os.environ["DFLASH_PROBE"] = before
        doc = {"command": "python scripts/host_settings.py record", "load_average": load_average(), **info["host"]}
        (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        written.append(f"{name}.json")
    for suffix, argv in PROFILES:
        if suffix not in only:
            continue
        prof = subprocess.run([sys.executable, "-m", "dflash.bench.profile", *argv], cwd=ROOT, capture_output=True,
                              text=True, check=True)
        doc = {"command": "python -m dflash.bench.profile " + " ".join(argv), **json.loads(prof.stdout)}
        (OUT / f"{name}-{suffix}.json").write_text(json.dumps(doc, indent=1) + "\n")
        written.append(f"{name}-{suffix}.json")
    print("wrote " + ", ".join(f"results/host/{w}" for w in written))


USAGE = "usage: host_settings.py record [--only " + ",".join(PARTS) + "] | table"


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)  # a usage error, as the CLI's


def parse_only(argv: list[str]) -> tuple[str, ...]:
    """`--only a,b` → those parts of a record (all of them without it); an unknown part exits naming the option."""
    if not argv:
        return PARTS
    if len(argv) != 2 or argv[0] != "--only":
        _fail(USAGE)
    parts = tuple(p.strip() for p in argv[1].split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        _fail(f"error: --only: each part must be one of {', '.join(PARTS)}, got {argv[1]!r}")
    return parts


def _ms(value: float | None) -> str:
    """A probe timing; "–" where the probe did not time it (dropped early, or an older probe version)."""
    return "–" if value is None else f"{value:.0f} ms"


def settings_rows() -> list[str]:
    rows = ["| host | candidate | 1-token step | 2-token verify | verify (block) | score | chosen | probe time |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(OUT.glob("*.json")):
        if path.stem.endswith(tuple(f"-{suffix}" for suffix, _ in PROFILES)):
            continue
        d = json.loads(path.read_text())
        host = path.stem  # the CPU model and its SIMD set (`record` names the file)
        for r in d["candidates"]:
            chosen = "**chosen**" if (r["dtype"], r["threads"], r["layout"]) == (d["dtype"], d["threads"], d["layout"]) else ""
            pair = _ms(r.get("verify2_ms"))  # not measured before probe version 5
            score = f"≥ {r['score_ms']:.0f}" if r.get("partial") else f"{r['score_ms']:.0f}"
            rows.append(f"| {host} | {r['dtype']}, {r['threads']} thread{'s' * (r['threads'] != 1)}, {r['layout']} | "
                        f"{r['step_ms']:.0f} ms | {pair} | {_ms(r['verify_ms'])} ({d['block']}) | {score} | "
                        f"{chosen} | {d['probe_s']:.1f} s (v{d['machine']['probe_version']}) |")
            host = ""
    return rows


def forward_rows() -> list[str]:
    rows = ["| host | dtype | layout | 1 | 2 | 3 | 4 | 8 | 16 tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(OUT.glob("*-forward.json")):
        d = json.loads(path.read_text())
        best: dict[tuple, dict[int, float]] = {}
        for r in d["result"]:  # the faster LM-head path per size, as the engine would take
            cell = best.setdefault((r["dtype"], r["layout"]), {})
            cell[r["tokens"]] = min(cell.get(r["tokens"], float("inf")), r["median_ms"])
        name = path.stem.removesuffix("-forward")
        for (dtype, layout), ms in best.items():
            rows.append(f"| {name} | {dtype} | {layout} | " + " | ".join(f"{ms[t]:.0f}" for t in sorted(ms)) + " |")
            name = ""
    return rows


def prefill_rows() -> list[str]:
    """A prompt's prefill per host in float32, bfloat16 and bfloat16 with float32 matmuls, and the probe's choice."""
    rows = ["| host | prompt tokens | float32 | bfloat16 | bfloat16, float32 matmuls | the probe (one 64-row product) |",
            "|---|---|---|---|---|---|"]
    for path in sorted(OUT.glob("*-prefill.json")):
        name = path.stem.removesuffix("-prefill")
        probe = json.loads((OUT / f"{name}.json").read_text())
        mm = probe.get("matmul_ms") or {}
        choice = (f"{'float32 matmuls' if probe.get('float32_from_rows') else 'native'} (native {mm['native']:.1f} ms, "
                  f"float32 {mm['float32']:.1f} ms)" if mm else f"not measured ({probe['dtype']} chosen)")
        cells: dict[int, dict[tuple, float]] = {}
        for r in json.loads(path.read_text())["result"]:
            cells.setdefault(r["tokens"], {})[(r["dtype"], r["float32_matmuls"])] = r["median_ms"]
        for n, c in sorted(cells.items()):
            rows.append(f"| {name} | {n:,} | " + " | ".join(f"{c[w]:,.0f} ms" for w in (
                ("float32", False), ("bfloat16", False), ("bfloat16", True))) + f" | {choice} |")
            name, choice = "", ""
    return rows


def _results(method: str):
    """(host name, result, the probe's choice) of every recorded `profile settings --method <method>` run."""
    for path in sorted(OUT.glob(f"*-{method}.json")):
        d = json.loads(path.read_text())["result"]
        yield path.stem.removesuffix(f"-{method}"), d, d["host"] or {}


SHOWN_FIXED = 2  # per host, the fastest fixed settings listed beside the defaults


def method_rows(method: str) -> list[str]:
    from dflash.bench.settings import DEFAULTS

    rows = ["| host | setting | decode tok/s | vs default | same tokens as default | TTFT (median) |",
            "|---|---|---|---|---|---|"]
    for host, d, _ in _results(method):
        name, ranked = host, sorted(d["rows"], key=lambda r: -r["tokens_per_s"])
        fixed = [r for r in ranked if r["setting"] not in DEFAULTS]
        slower = fixed[SHOWN_FIXED:]  # the slower fixed settings are counted, not listed: their file has them
        for r in (r for r in ranked if r not in slower):
            label = f"**{r['setting']}**" if r["setting"] in DEFAULTS else r["setting"]
            ttft = f"{r['ttft_ms_median']:.0f} ms" if r.get("ttft_ms_median") is not None else "–"  # not recorded before
            rows.append(f"| {name} | {label} | {r['tokens_per_s']:.1f} | {r['vs_default']:.2f}× | "
                        f"{r['same_output_as_default']}/{d['n_prompts']} | {ttft} |")
            name = ""
        if slower:
            rows.append(f"| | {len(slower)} slower fixed settings ([{host}-{method}.json](results/host/{host}-{method}.json)) "
                        f"| ≤ {slower[0]['tokens_per_s']:.1f} | ≤ {slower[0]['vs_default']:.2f}× | | |")
    return rows


def _chosen(host: dict) -> str:
    return f"{host.get('dtype')}, {host.get('threads')} thread{'s' * (host.get('threads') != 1)}, {host.get('layout')}"


def _within(d: dict, key: str) -> str:
    """The ratio's 95 % interval over the run's prompts (not recorded before: nothing)."""
    lo_hi = (d.get("intervals") or {}).get(key)
    return f" (95 % interval over the prompts {lo_hi[0]:.2f}–{lo_hi[1]:.2f})" if lo_hi else ""


def ar_verdicts() -> list[str]:
    out = []
    for name, d, host in _results("ar"):
        out.append(f"- {name}: the default ({_chosen(host)}) decodes at "
                   f"**{d['default_vs_best_fixed']:.2f}×**{_within(d, 'default_vs_best_fixed')} the fastest fixed "
                   f"setting ({d['best_fixed']}) and **{d['default_vs_hf_generate']:.2f}×**"
                   f"{_within(d, 'default_vs_hf_generate')} `hf-generate` in the same settings ({d['n_prompts']} "
                   f"MT-Bench prompts × {d['max_new_tokens']} tokens; the probe of that run took {host.get('probe_s')} s).")
        plain = d.get("host_no_draft")
        if plain and d.get("no_draft_default_vs_best_fixed"):
            out.append(f"  Loaded without the draft (plain decoding: probed on the one-token step alone) the engine "
                       f"chose {_chosen(plain)} ({plain['mode']}) and "
                       f"decodes at **{d['no_draft_default_vs_best_fixed']:.2f}×**"
                       f"{_within(d, 'no_draft_default_vs_best_fixed')} the fastest fixed setting."
                       + _missed(plain, host, d["best_fixed"], d["no_draft_default_vs_best_fixed"]))
    return out


def _missed(plain: dict, host: dict, best_fixed: str, ratio: float) -> str:
    """Why a no-draft probe missed the fastest setting: its step time for the winning dtype against the draft
    probe's in the same run (both timed on fresh copies of the weights)."""
    dtype = best_fixed.split(",")[0]
    steps = [next((r["step_ms"] for r in h["candidates"] if r["dtype"] == dtype), None) for h in (plain, host)]
    if ratio >= 0.95 or plain["dtype"] == dtype or None in steps:
        return ""
    return (f" That probe timed {dtype}'s one-token step at {steps[0]:.0f} ms, the draft engine's probe in the same "
            f"run at {steps[1]:.0f} ms: on this VM a fresh copy of the weights does not always run at the same speed, "
            f"so a probe can miss; `DFLASH_PROBE=refresh` measures again.")


def dflash_verdicts() -> list[str]:
    return [f"- {name}: DFlash in the default settings ({_chosen(host)}, {host.get('mode')}) runs at "
            f"**{d['default_vs_best_fixed']:.2f}×**{_within(d, 'default_vs_best_fixed')} the fastest fixed setting "
            f"({d['best_fixed']}) and **{d['default_vs_ar']:.2f}×**{_within(d, 'default_vs_ar')} `ar` in the same "
            f"settings ({d['n_prompts']} MT-Bench prompts × "
            f"{d['max_new_tokens']} tokens)." for name, d, host in _results("dflash")]


def table() -> None:
    sys.path.insert(0, str(ROOT))
    from doc_text import wrap  # scripts/: this script's folder, on the path when it runs
    from dflash.loading.probe import CONTEXT

    commands = sorted({json.loads(p.read_text())["command"] for p in OUT.glob("*.json")})
    body = wrap("\n".join([
        START,
        "Generated by `python scripts/host_settings.py table` from `results/host/*.json`, recorded on a quiet machine "
        f"by `python scripts/host_settings.py record` ({len(commands)} commands; each file keeps its own).",
        "",
        f"What the host probe measured (ms per cached forward after a {CONTEXT}-token context, the fastest of its "
        "timings; from probe version 6 on, a candidate dropped as soon as it could no longer win shows – for what it "
        "did not time and ≥ its best possible score):",
        "",
        *settings_rows(),
        "",
        "One target forward by number of tokens (ms, median, the faster LM-head path; 256-token context):",
        "",
        *forward_rows(),
        "",
        "A prompt's prefill as the engine runs it (ms, median; `python -m dflash.bench.profile " + " ".join(PREFILL)
        + "`), and what the probe chose for prefills from one decoder product of 64 rows timed both ways:",
        "",
        *prefill_rows(),
        "",
        "`ar` (the no-draft loop) in the default settings against every fixed setting and `hf-generate`, interleaved "
        "in one process (decode tokens/s; where a setting computes differently from the default — another dtype, or "
        "from probe version 6 on a bfloat16 prefill without the default's float32 matmuls, whose cache differs in the "
        "last bits — greedy tokens may part from the default's at a numerical tie):",
        "",
        *method_rows("ar"),
        "",
        *ar_verdicts(),
        "",
        "A ratio's 95 % interval (where a run recorded one) is the central 95 % of the ratio over 2,000 "
        "bootstrap resamples of the run's prompts, each prompt keeping all of its runs: how far that many prompts "
        "resolve the ratio on a machine whose speed drifts from minute to minute.",
        "",
        "DFlash (the shipped draft, the default block policy) in the default settings against every fixed setting, "
        "and `ar` in the default settings, interleaved in one process (decode tokens/s; recorded from probe version "
        "5 on):",
        "",
        *method_rows("dflash"),
        "",
        *dflash_verdicts(),
        "",
        "With a draft loaded the probe scores a setting by the expected milliseconds per committed token of a DFlash "
        "block, so it can choose a setting that is not the fastest for `ar` alone; an engine without a draft is probed "
        "on the step only (the \"default, no draft\" row). The probe's versions, and why each changed: "
        "[docs/bench.md](docs/bench.md#the-host-probe-cpu-settings-per-machine).",
        END,
    ]))
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    text = text[: text.index(START)] + body + text[text.index(END) + len(END):]
    path.write_text(text)
    print("ok")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "table"
    if command == "record":
        record(parse_only(sys.argv[2:]))
    elif command == "table" and len(sys.argv) <= 2:
        table()
    else:
        _fail(USAGE)
