"""Summaries (pure functions of the recorded runs), the Markdown table, and atomic writes of both files.

Speedup = baseline decode time / method decode time on the same prompts, measured in the
same process with interleaved runs (`dflash.decode.stats.speedup`: ratio of the totals, plus the spread of per-prompt
ratios). Each prompt's time is the median over its repeats; the spread over repeats is the same ratio computed
on repeat r alone, for every r.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from dflash.decode.stats import difference_words, speedup


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _per_prompt(prompts: list[dict], method: str, key: str) -> dict[int, float]:
    """prompt index → median over repeats of runs[key]."""
    return {p["index"]: _median([r[key] for r in p["methods"][method]["runs"]])
            for p in prompts if method in p["methods"]}


def _ratio(prompts: list[dict], baseline: str, method: str, key: str, repeat: int | None = None) -> dict:
    common = [p for p in prompts if baseline in p["methods"] and method in p["methods"]]
    if repeat is None:
        base, meth = _per_prompt(common, baseline, key), _per_prompt(common, method, key)
        b, m = [base[p["index"]] for p in common], [meth[p["index"]] for p in common]
    else:
        pairs = [(p["methods"][baseline]["runs"], p["methods"][method]["runs"]) for p in common]
        pairs = [(bs[repeat], ms[repeat]) for bs, ms in pairs if len(bs) > repeat and len(ms) > repeat]
        b, m = [x[key] for x, _ in pairs], [y[key] for _, y in pairs]
    return speedup(b, m)


def summarize_method(prompts: list[dict], method: str, baseline: str, repeats: int, greedy: bool) -> dict:
    mine = [p for p in prompts if method in p["methods"]]
    runs = [r for p in mine for r in p["methods"][method]["runs"]]
    decode_ms = _per_prompt(mine, method, "decode_ms")
    decode_tokens = sum(p["methods"][method]["runs"][0]["decode_tokens"] for p in mine)
    lengths = [n for r in runs for n in r["stats"].get("acceptance_lengths", [])]
    hist: dict[str, int] = {}
    for r in runs:
        for k, v in r["stats"].get("acceptance_histogram", {}).items():
            hist[k] = hist.get(k, 0) + v
    draft = sum(r["stats"].get("draft_ms", 0.0) for r in runs)
    verify = sum(r["stats"].get("verify_ms", 0.0) for r in runs)
    reasons: dict[str, int] = {}
    for p in mine:
        reason = p["methods"][method]["finish_reason"]
        reasons[reason] = reasons.get(reason, 0) + 1
    out = {
        "n_prompts": len(mine),
        "n_runs": len(runs),
        "finish_reasons": reasons,
        "decode_tokens": decode_tokens,
        "decode_s": sum(decode_ms.values()) / 1000,
        "tokens_per_s": decode_tokens / (sum(decode_ms.values()) / 1000) if sum(decode_ms.values()) > 0 else 0.0,
        "ttft_ms_median": _median(list(_per_prompt(mine, method, "ttft_ms").values())),
        "tau": statistics.fmean(lengths) if lengths else None,
        "acceptance_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))) if hist else None,
        "draft_share": draft / (draft + verify) if draft + verify > 0 else None,
        # share of the verify steps whose block was copied from the context (dflash-lookup), not drafted
        "copy_share": sum(r["stats"].get("copy_blocks", 0) for r in runs) / len(lengths) if lengths else None,
        "rss_peak_mb": max((r["rss_peak_mb"] for r in runs), default=0.0),
        "rss_increase_mb": round(max((r["rss_peak_mb"] - r["rss_before_mb"] for r in runs), default=0.0), 1),
        "repeats_agree": all(p["methods"][method]["repeats_agree"] for p in mine),
        "identical": None,
        "speedup": None,
    }
    if method != "ar" and any(p["methods"][method]["identical"] is not None for p in mine):  # compared runs
        same = [p["index"] for p in mine if p["methods"][method]["identical"]]
        differ = [p["index"] for p in mine if p["methods"][method]["identical"] is False]
        verdicts = [_verdict(p["methods"][method]) for p in mine]
        ties, lossy = verdicts.count("tie"), verdicts.count("lossy")
        out["identical"] = {"n_identical": len(same), "n_compared": len(same) + len(differ), "differing_prompts": differ,
                            "n_ties": ties, "n_lossy": lossy, "n_errors": len(differ) - ties - lossy}
    if method != baseline:
        by_repeat = [_ratio(prompts, baseline, method, "decode_ms", r)["speedup"] for r in range(repeats)]
        out["speedup"] = {
            "baseline": baseline,
            "decode": _ratio(prompts, baseline, method, "decode_ms"),
            "by_repeat": by_repeat,
            "repeat_min": min(by_repeat, default=0.0),
            "repeat_max": max(by_repeat, default=0.0),
            "per_token": _ratio(prompts, baseline, method, "ms_per_token"),
            "end_to_end": _ratio(prompts, baseline, method, "total_ms"),
        }
    return out


def _verdict(rec: dict) -> str | None:
    """Why a compared output (greedy, or sampled by the engine) differs from `ar`: "lossy" when the compared run
    accepted drafts by the relaxed rule (acceptance threshold < 1: its stats count tokens that differ from the
    target's own choice, so the difference is the opt-in loss, not a fault), else the numerical diagnosis, "tie" or
    "error" (a record written before diagnoses: "error", nothing shows it to be a tie). None when it does not differ."""
    if rec["identical"] is not False:
        return None
    if _drift_tokens(rec):
        return "lossy"
    return (rec.get("diagnosis") or {}).get("verdict", "error")


def _drift_tokens(rec: dict) -> int:
    """Tokens the compared run (the first repeat, the one diffed against `ar`) emitted against the target's choice."""
    stats = rec["runs"][0].get("stats") if rec["runs"] else None
    return int((stats or {}).get("drift_tokens") or 0)


def differences(prompts: list[dict]) -> list[dict]:
    """Every prompt × method whose compared output differs from `ar`, with where, what and the diagnosis (both runs'
    top-2 gaps there, the dtype's tie bound, "tie" or "error"). A token is None past the end of its output."""
    out = []
    for p in prompts:
        ref = p["methods"].get("ar")
        for m, rec in p["methods"].items():
            if rec["identical"] is False:
                k, diag = rec["first_diff"], rec.get("diagnosis") or {}
                out.append({"prompt": p["index"], "method": m, "first_diff": k,
                            "ar_token": _token(ref["output_ids"], k) if ref else None,
                            "method_token": _token(rec["output_ids"], k), "same_length": rec["same_length"],
                            "verdict": _verdict(rec), "ar_gap": diag.get("ref_gap"), "method_gap": diag.get("run_gap"),
                            "bound": diag.get("bound"), "drift_tokens": _drift_tokens(rec)})
    return out


def _token(ids: list[int], k: int) -> int | None:
    return ids[k] if k < len(ids) else None


def _gap(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def summarize(result: dict) -> dict:
    cfg = result["config"]
    return {m: summarize_method(result["prompts"], m, cfg["baseline"], cfg["repeats"], cfg["greedy"]) for m in cfg["methods"]}


def _fmt_speedup(s: dict | None, greedy: bool) -> tuple[str, str, str]:
    if s is None:
        return "1.00× (baseline)", "—", "—"
    main = s["decode"] if greedy else s["per_token"]
    return (f"{main['speedup']:.2f}×", f"{main['min']:.2f} / {main['median']:.2f} / {main['max']:.2f}",
            f"{s['repeat_min']:.2f}–{s['repeat_max']:.2f}")


def _fmt_identical(ident: dict) -> str:
    """'3/4 (1 tie, 0 errors)': identical outputs of those compared, and how the others were diagnosed; a lossy
    run's differences are counted apart ('1/4 (0 ties, 0 errors, 3 lossy)')."""
    text = f"{ident['n_identical']}/{ident['n_compared']}"
    ties, errors, lossy = ident["n_ties"], ident["n_errors"], ident.get("n_lossy", 0)
    if ties or errors or lossy:
        kinds = [f"{ties} tie{'s' * (ties != 1)}", f"{errors} error{'s' * (errors != 1)}"] + [f"{lossy} lossy"] * bool(lossy)
        text += f" ({', '.join(kinds)})"
    return text


def why(d: dict, dtype: str) -> str:
    """One difference of `differences` in words (`dflash.decode.stats.difference_words`), with both runs' top-2 gaps at
    the first differing token."""
    if d.get("verdict") == "lossy":
        n = d["drift_tokens"]
        gaps = f"top-2 gaps {_gap(d.get('ar_gap'))} / {_gap(d.get('method_gap'))}"
        return f"expected, the run is lossy ({n} token{'s' * (n != 1)} accepted by the relaxed rule; {gaps})"
    diag = {"ref_token": d["ar_token"], "run_token": d["method_token"], "ref_gap": d.get("ar_gap"),
            "run_gap": d.get("method_gap"), "bound": d.get("bound"), "verdict": d.get("verdict")}
    return difference_words(diag, dtype)


def markdown(result: dict) -> str:
    cfg, summ, mach, models = result["config"], result["summary"], result["machine"], result["models"]
    req = cfg["request"]
    mode = "greedy" if cfg["greedy"] else f"sampling, temperature {req.get('temperature')}, seed {req.get('seed')}"
    n = len(result["prompts"])
    lines = [
        f"### {models.get('name') or models.get('target')} — {cfg['prompts']} ({n} prompt{'s' * (n != 1)}"
        f"{'' if result['complete'] else ', INCOMPLETE'}), max {req.get('max_new_tokens')} new tokens, {mode}",
        "",
        f"`{result['command']}`",
        "",
        f"{mach['cpu_model']}, {mach['logical_cores']} cores, {models.get('device')}/{models.get('dtype')}, "
        f"{mach['torch_threads']} torch threads, torch {mach['torch']}, transformers {mach['transformers']}; "
        f"load average at start {_load(mach.get('load_average'))}, at end {_load(result.get('load_average_end'))}; "
        f"{cfg['repeats']} repeat(s), runs interleaved, warm-up {'on' if cfg['warmup'] else 'off'}.",
        "",
        f"| Method | Speedup vs {cfg['baseline']} ({'decode time' if cfg['greedy'] else 'time per token'}) "
        "| Per prompt min / median / max | Over repeats | Decode tok/s | τ | TTFT ms (median) "
        "| Identical to ar | RSS peak MB (run +MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in cfg["methods"]:
        s = summ[m]
        sp, spread, reps = _fmt_speedup(s["speedup"], cfg["greedy"])
        ident = "—" if s["identical"] is None else _fmt_identical(s["identical"])
        tau = "—" if s["tau"] is None else f"{s['tau']:.2f}"
        lines.append(f"| {m} | {sp} | {spread} | {reps} | {s['tokens_per_s']:.1f} | {tau} | {s['ttft_ms_median']:.0f} "
                     f"| {ident} | {s['rss_peak_mb']:.0f} (+{s['rss_increase_mb']:.0f}) |")
    diffs = result.get("differences") or []
    if diffs:
        lines += ["", f"{'Greedy outputs' if cfg['greedy'] else 'Outputs (same seed)'} that differ from `ar`:", ""]
        lines += [f"- prompt {d['prompt']}, {d['method']}: first difference at output token {d['first_diff']} "
                  f"(ar {d['ar_token']}, {d['method']} {d['method_token']}): {why(d, models.get('dtype') or '')}" for d in diffs]
    elif cfg["greedy"] and "ar" in cfg["methods"] and len(cfg["methods"]) > 1:
        lines += ["", "Every greedy output equals the `ar` output."]
    elif any(result["summary"][m]["identical"] for m in cfg["methods"]):  # sampled: the engine's methods, compared
        lines += ["", "Every compared output (the engine's methods, same seed and noise per position) equals the `ar` "
                      "output."]
    return "\n".join(lines) + "\n"


def _load(values) -> str:
    return "?" if not values else f"{values[0]:.1f}"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_result(result: dict, json_path: Path, md_path: Path | None) -> None:
    result["summary"] = summarize(result)
    result["differences"] = differences(result["prompts"])
    write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    if md_path is not None:
        write_atomic(md_path, markdown(result))
