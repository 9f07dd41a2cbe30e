"""The measuring half of `dflash.bench.sweep` (it imports the engine, so torch): each cell's plan checked against
the models before any run, the interleaved runs, one sample per prompt × repeat, and the host's costs for the
estimate. Called through `sweep.run_sweep` and `sweep.host_costs`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from dflash.bench.config import BenchConfig
from dflash.bench.runner import compare, prompt_items, run_method, warm_up
from dflash.bench.sweep import CellResult, SweepProgress, SweepSpec, cell_key, is_lossy, request_values
from dflash.decode.engine import Engine
from dflash.decode.request import DEFAULTS
from dflash.errors import DFlashError, ValidationError
from dflash.loading.datasets import PromptRow


@dataclass
class _Plan:
    setting: dict
    engine: Engine
    items: list
    cfg: BenchConfig  # methods ("ar", the cell's method); the cell's request
    method: str


def _plan(engine_for: Callable, spec: SweepSpec, setting: dict, items_by_engine: dict) -> _Plan:
    """What a cell runs, checked against the models for every prompt before any cell runs."""
    engine = engine_for({**spec.base, **setting}.get("dtype"))
    if id(engine) not in items_by_engine:
        rows = [PromptRow(None, p) if isinstance(p, str) else PromptRow(None, None, list(p)) for p in spec.prompts]
        items_by_engine[id(engine)] = prompt_items(engine, rows)
    values = {**request_values(spec.base, setting), "max_new_tokens": spec.max_new_tokens}
    n = values.pop("lookup_ngram", DEFAULTS["lookup_ngram"])
    method = "dflash-lookup" if n else "dflash"
    cfg = BenchConfig(methods=("ar", method), request=values, repeats=spec.repeats, warmup=False,
                      lookup_ngram=n or None)
    for item, use_draft in itertools.product(items_by_engine[id(engine)], (False, True)):
        try:
            engine.validate(cfg.make_request(item.ids, use_draft=use_draft))
        except ValidationError as exc:
            raise ValidationError(exc.param, f"{exc.message} (cell {cell_key(setting)}, prompt {item.index})") from None
    return _Plan(setting, engine, items_by_engine[id(engine)], cfg, method)


def _sample(plan: _Plan, index: int, repeat: int, base, out) -> dict:
    """One prompt × repeat of a cell from its run `out` and its baseline run `base` (runner.TimedOutput)."""
    for o in (base, out):
        if o.finish_reason == "error":  # a failed run measures nothing: the sweep stops, naming the cell
            raise DFlashError(f"cell {cell_key(plan.setting)}, prompt {index}: the run failed: {o.message}")

    def tok_s(o) -> float:
        return o.decode_tokens / (o.decode_ms / 1000) if o.decode_ms > 0 else 0.0

    dtype = plan.engine.target.numerics
    same = compare(base.output_ids, out.output_ids, out.finish_reason, base.target_gaps, out.target_gaps, dtype)
    rate, base_rate = tok_s(out), tok_s(base)
    return {"prompt": index, "repeat": repeat, "tau": float(out.stats.get("tau") or 0.0), "tok_s": rate,
            "base_tok_s": base_rate, "speedup": rate / base_rate if base_rate > 0 else 0.0,
            "n_tokens": len(out.output_ids), "identical": same["identical"], "first_diff": same["first_diff"],
            "verdict": (same["diagnosis"] or {}).get("verdict"), "drift_tokens": int(out.stats.get("drift_tokens") or 0)}


def measure(engine_for: Callable[[str | None], Engine], spec: SweepSpec, done: dict,
            should_stop: Callable[[], bool]) -> Iterator[SweepProgress]:
    """`sweep.run_sweep`."""
    cells = spec.cells()
    per_cell = 2 * len(spec.prompts) * spec.repeats
    total, count, items_by_engine, warmed = per_cell * len(cells), 0, {}, set()
    plans = {cell_key(s): _plan(engine_for, spec, s, items_by_engine) for s in cells if cell_key(s) not in done}
    for i, setting in enumerate(cells, 1):
        key, where = cell_key(setting), f"cell {i}/{len(cells)}"
        if key in done:
            count += per_cell
            yield SweepProgress(count, total, f"{where} read back ({key})", done[key])
            continue
        plan = plans[key]
        if id(plan.engine) not in warmed:  # first-call allocations and packing, untimed, once per engine
            yield SweepProgress(count, total, f"{where}: warming up")
            warm_up(plan.engine, plan.items, plan.cfg)
            warmed.add(id(plan.engine))
        samples = []
        for r, (j, item) in itertools.product(range(spec.repeats), enumerate(plan.items)):
            outs = {}
            for method in ("ar", plan.method)[:: 1 if r % 2 == 0 else -1]:  # order alternates by repeat
                if should_stop():
                    return
                outs[method] = run_method(plan.engine, method, item.ids, plan.cfg)
                count += 1
                yield SweepProgress(count, total, f"{where}, prompt {j + 1}/{len(plan.items)}, "
                                                  f"repeat {r + 1}/{spec.repeats}")
            samples.append(_sample(plan, j, r, outs["ar"], outs[plan.method]))
        cell = CellResult.from_samples(setting, samples, is_lossy(spec.base, setting))
        yield SweepProgress(count, total, f"{where} done ({key})", cell)



CONTEXT = 64  # cached positions while timing a forward (as the host probe times them)


def measured_costs(engine: Engine) -> tuple[float, float]:
    """(one-token step, block verify) in seconds: the host probe's timings of the settings in force where it made
    them (a CPU engine from `load_engine`), else timed here as it times them: the fastest of 3 cached forwards of 1
    and of the trained block's tokens after CONTEXT positions."""
    host = engine.host
    if host is not None:
        row = next((r for r in host.candidates if (r["dtype"], r["threads"]) == (host.dtype, host.threads)), None)
        if row and row.get("step_ms") and row.get("verify_ms"):
            return row["step_ms"] / 1000, row["verify_ms"] / 1000
    target, gen = engine.target, torch.Generator().manual_seed(0)
    block = engine.trained_block_size or 1
    cache = target.new_cache()
    _forward_s(target, cache, CONTEXT, gen)
    _forward_s(target, cache, 1, gen)  # warm-up: first-call allocations
    step, verify = (min(_forward_s(target, cache, n, gen) for _ in range(3)) for n in (1, block))
    return step, verify


def _forward_s(target, cache, n_tokens: int, gen: torch.Generator) -> float:
    """Seconds of one cached forward of `n_tokens` random ids; the cache is cropped back to CONTEXT afterwards (a
    first call fills it)."""
    ids = torch.randint(0, target.vocab_size, (1, n_tokens), generator=gen).to(target.device)
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    target.forward(ids, cache, capture=False)
    sync()
    seconds = time.perf_counter() - t0
    target.crop(cache, CONTEXT)
    return seconds
