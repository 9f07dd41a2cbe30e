"""Parameter sweeps: a grid over one to three engine settings, each cell measured over prompts × repeats with the
no-draft loop interleaved as its baseline (`python -m dflash sweep`, the playground's Sweep tab).

A cell's run and its baseline run use the same prompt ids, the same request but for the draft, and the same repeat,
one right after the other (their order alternating by repeat), so a slow moment of a shared machine hits both.
Per sample (prompt × repeat): τ, tokens/s and speedup = tokens/s over the baseline's; a cell gives the median and
the quartiles over its samples, whether every output equals its baseline's, and the ties among those that do not.
The runs themselves are `dflash.bench.runner`'s (`run_method`, `compare`). No torch is imported here until a sweep
runs, so a bad grid is named before any model loads. The JSON document's schema: `sweep_result`.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash.decode.request import DEFAULTS, Request
from dflash.errors import ValidationError

if TYPE_CHECKING:  # annotations only: importing the engine loads torch
    from dflash.decode.engine import Engine

SCHEMA = "dflash-sweep/1"
# The parameters a grid may vary, with their types. All but dtype are Request fields; dtype picks the engine.
SWEEP_PARAMS: dict[str, type] = {"block_size": int, "diffusion_steps": int, "confidence_threshold": float,
                                 "acceptance_threshold": float, "adaptive": str, "lookup_ngram": int, "dtype": str,
                                 "temperature": float}
DTYPES = ("float32", "bfloat16")
MAX_AXES, MAX_VALUES, MAX_CELLS = 3, 16, 256
# Request fields a sweep decides itself (the prompt, the draft on or off per run, the length from the spec).
NOT_BASE = ("prompt", "prompt_ids", "use_draft", "max_new_tokens", "chat_template")
REQUEST_FIELDS = {f.name for f in dataclasses.fields(Request)}


# -- the grid -----------------------------------------------------------------------------------------------------
def _value(name: str, raw: Any) -> Any:
    """One value of parameter `name`, converted to its type (text from a command line or a form) and checked by the
    engine's own rules (a Request holding it). ValidationError naming the parameter."""
    kind = SWEEP_PARAMS[name]
    try:
        if isinstance(raw, bool) or (kind is str and not isinstance(raw, str)):
            raise ValueError
        value = kind(raw.strip()) if isinstance(raw, str) else kind(raw)
        if kind is int and isinstance(raw, float) and raw != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        word = {int: "an integer", float: "a number", str: "a word"}[kind]
        raise ValidationError(name, f"must be {word}, got {raw!r}") from None
    if name == "dtype":
        if value not in DTYPES:
            raise ValidationError(name, f"must be one of {', '.join(DTYPES)}, got {value!r}")
    else:
        Request(prompt_ids=(0,), **{name: value})
    return value


def parse_set(text: str) -> tuple[str, tuple]:
    """'block_size=2,4,8' → ('block_size', (2, 4, 8)). ValidationError naming the parameter (or `set` when the name
    itself is wrong)."""
    name, eq, values = str(text).partition("=")
    name = name.strip()
    if not eq or not name:
        raise ValidationError("set", f"expected NAME=V1,V2,... got {text!r}")
    if name not in SWEEP_PARAMS:
        raise ValidationError("set", f"unknown parameter {name!r}; choose from {', '.join(SWEEP_PARAMS)}")
    parts = [v.strip() for v in values.split(",")]
    if not any(parts) or not all(parts):
        raise ValidationError(name, f"give comma-separated values with none empty, got {values!r}")
    return name, tuple(_value(name, v) for v in parts)


def cell_key(setting: dict) -> str:
    """A cell's id within its sweep: 'block_size=4|lookup_ngram=2' (axis order)."""
    return "|".join(f"{k}={v}" for k, v in setting.items())


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep measures. axes: ((name, values), ...), x then y then facet. prompts: texts (the chat template is
    applied by the engine) or token-id tuples (used as they are). base: other Request values (and dtype) shared by
    every cell. conditions: what else the measurements depend on (the models and the host identity, `conditions`),
    so that `key()` changes with them."""

    axes: tuple[tuple[str, tuple], ...]
    prompts: tuple
    repeats: int = 2
    max_new_tokens: int = 64
    base: dict = field(default_factory=dict)
    conditions: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        axes = tuple(self.axes) if isinstance(self.axes, (list, tuple)) else ()
        if not 1 <= len(axes) <= MAX_AXES:
            raise ValidationError("axes", f"give 1 to {MAX_AXES} parameters to vary, got {len(axes)}")
        object.__setattr__(self, "axes", tuple(_axis(a) for a in axes))
        names = [n for n, _ in self.axes]
        if len(set(names)) != len(names):
            raise ValidationError("axes", f"each parameter at most once, got {', '.join(names)}")
        object.__setattr__(self, "prompts", _prompts(self.prompts))
        for name, value, hi in (("repeats", self.repeats, 100), ("max_new_tokens", self.max_new_tokens, 4096)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ValidationError(name, f"must be an integer in [1, {hi}], got {value!r}")
        object.__setattr__(self, "base", self._checked_base())
        if not isinstance(self.conditions, dict):
            raise ValidationError("conditions", "must be a dict")
        n = math.prod(len(v) for _, v in self.axes)
        if n > MAX_CELLS:
            raise ValidationError("axes", f"{n} cells; the limit is {MAX_CELLS}")
        for setting in self.cells():  # combinations too (verify='rejection' with acceptance < 1 …)
            Request(prompt_ids=(0,), max_new_tokens=self.max_new_tokens, **request_values(self.base, setting))

    def _checked_base(self) -> dict:
        if not isinstance(self.base, dict):
            raise ValidationError("base", "must be a dict of Request values")
        bad = [k for k in self.base if k != "dtype" and (k not in REQUEST_FIELDS or k in NOT_BASE)]
        if bad:
            raise ValidationError("base", f"not settable here: {', '.join(map(str, bad))}")
        both = [n for n, _ in self.axes if n in self.base]
        if both:
            raise ValidationError("base", f"{', '.join(both)} is varied by the grid: leave it out of the fixed values")
        return {k: _value(k, v) if k in SWEEP_PARAMS else v for k, v in self.base.items()}

    def cells(self) -> list[dict]:
        """Every cell's setting {name: value} in grid order: the x axis varies fastest, the facet slowest."""
        names = [n for n, _ in self.axes]
        combos = itertools.product(*[v for _, v in reversed(self.axes)])
        return [dict(zip(names, reversed(c), strict=True)) for c in combos]

    def to_dict(self) -> dict:
        return {"axes": [[n, list(v)] for n, v in self.axes], "prompts": [p if isinstance(p, str) else list(p)
                                                                          for p in self.prompts],
                "repeats": self.repeats, "max_new_tokens": self.max_new_tokens, "base": dict(self.base),
                "conditions": dict(self.conditions)}

    @staticmethod
    def from_dict(d: dict) -> SweepSpec:
        if not isinstance(d, dict) or not isinstance(d.get("axes"), list):
            raise ValidationError("spec", "must be an object with axes, prompts, repeats, max_new_tokens")
        return SweepSpec(tuple((a[0], tuple(a[1])) if isinstance(a, list) and len(a) == 2 else a for a in d["axes"]),
                         d.get("prompts"), d.get("repeats"), d.get("max_new_tokens"), d.get("base", {}),
                         d.get("conditions", {}))

    def key(self) -> str:
        """A stable hash of everything that determines the measurements."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _axis(axis: Any) -> tuple[str, tuple]:
    if not (isinstance(axis, (list, tuple)) and len(axis) == 2 and isinstance(axis[1], (list, tuple))):
        raise ValidationError("axes", f"each axis is (name, values), got {axis!r}")
    name, values = axis
    if name not in SWEEP_PARAMS:
        raise ValidationError("axes", f"unknown parameter {name!r}; choose from {', '.join(SWEEP_PARAMS)}")
    if not 1 <= len(values) <= MAX_VALUES:
        raise ValidationError(name, f"give 1 to {MAX_VALUES} values, got {len(values)}")
    values = tuple(_value(name, v) for v in values)
    if len(set(values)) != len(values):
        raise ValidationError(name, f"each value at most once, got {', '.join(map(str, values))}")
    return name, values


def _prompts(prompts: Any) -> tuple:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValidationError("prompts", "give at least one prompt")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (list, tuple)):
            p = Request(prompt_ids=tuple(p)).prompt_ids  # non-empty, non-negative token ids
        elif not isinstance(p, str) or not p.strip():
            raise ValidationError("prompts", f"prompt {i}: must be non-empty text or a list of token ids")
        out.append(p)
    return tuple(out)


def request_values(base: dict, setting: dict) -> dict:
    """A cell's Request values (dtype, which picks the engine, left out)."""
    return {k: v for k, v in {**base, **setting}.items() if k != "dtype"}


def is_lossy(base: dict, setting: dict) -> bool:
    """Relaxed acceptance (acceptance_threshold < 1) or sampling (temperature > 0)."""
    values = {**DEFAULTS, **base, **setting}
    return values["acceptance_threshold"] < 1.0 or values["temperature"] > 0.0


def estimate_seconds(spec: SweepSpec, step_s: float, verify_s: float, *, skip: Any = ()) -> float:
    """Upper estimate of a sweep's time from the host's costs of a one-token step and a block verify: per sample
    the no-draft run (a step per token) and the cell's run at τ = 1 (a verify and `diffusion_steps` draft passes,
    each taken at a step's cost, per token). `skip`: cell keys read back, not measured."""
    total = 0.0
    for setting in spec.cells():
        if cell_key(setting) not in skip:
            steps = {**spec.base, **setting}.get("diffusion_steps", DEFAULTS["diffusion_steps"])
            total += spec.max_new_tokens * (step_s + verify_s + steps * step_s)
    return total * len(spec.prompts) * spec.repeats


def conditions(models: dict, host: dict) -> dict:
    """The identity of the models and the host that a sweep's measurements depend on (for `SweepSpec.conditions`)."""
    return {**{k: models.get(k) for k in ("target", "draft", "dtype", "device")},
            **{k: host.get(k) for k in ("cpu_model", "gpu", "torch", "transformers", "torch_threads")}}


# -- results ------------------------------------------------------------------------------------------------------
def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile), linearly interpolated (numpy's default); zeros for no values."""
    xs = sorted(values)
    if not xs:
        return 0.0, 0.0, 0.0

    def q(p: float) -> float:
        at = p * (len(xs) - 1)
        lo = math.floor(at)
        return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)

    return q(0.5), q(0.25), q(0.75)


@dataclass
class CellResult:
    """One cell's measurements. n: samples (prompts × repeats); tau, tok_s, speedup: (median, q25, q75) over them;
    drift_tokens: over every sample, tokens accepted against the target's own choice (lossy runs' statistics);
    identical: every output equals its baseline's; ties: the differing ones whose first difference is a numerical
    tie; differs: how many differ; samples: the per-sample numbers."""

    setting: dict
    key: str
    n: int
    tau: tuple[float, float, float]
    tok_s: tuple[float, float, float]
    speedup: tuple[float, float, float]
    drift_tokens: int
    identical: bool
    ties: int
    lossy: bool
    differs: int = 0
    samples: list = field(default_factory=list)

    @staticmethod
    def from_samples(setting: dict, samples: list[dict], lossy: bool) -> CellResult:
        def of(k: str) -> tuple[float, float, float]:
            return spread([s[k] for s in samples])

        differ = [s for s in samples if not s["identical"]]
        return CellResult(dict(setting), cell_key(setting), len(samples), of("tau"), of("tok_s"), of("speedup"),
                          sum(s["drift_tokens"] for s in samples), not differ,
                          sum(s["verdict"] == "tie" for s in differ), lossy, len(differ), samples)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {**d, **{k: list(d[k]) for k in ("tau", "tok_s", "speedup")}}

    @staticmethod
    def from_dict(d: dict) -> CellResult:
        """A cell of a document; ValueError naming the field that is missing or wrong."""
        if not isinstance(d, dict):
            raise ValueError("a cell must be an object")
        kinds = {"setting": dict, "key": str, "n": int, "drift_tokens": int, "identical": bool, "ties": int,
                 "lossy": bool, "differs": int, "samples": list}
        for k, kind in kinds.items():
            if k not in d and k not in ("differs", "samples"):
                raise ValueError(f"{k} is missing")
            if k in d and (not isinstance(d[k], kind) or (kind is int and isinstance(d[k], bool))):
                raise ValueError(f"{k} must be {kind.__name__}, got {d[k]!r}")
        triples = {}
        for k in ("tau", "tok_s", "speedup"):
            v = d.get(k)
            if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                                 for x in v)):
                raise ValueError(f"{k} must be [median, q25, q75], got {v!r}")
            triples[k] = tuple(float(x) for x in v)
        if d["key"] != cell_key(d["setting"]):
            raise ValueError(f"key {d['key']!r} does not match its setting")
        return CellResult(**{**{k: d[k] for k in kinds if k in d}, **triples})


@dataclass
class SweepProgress:
    done: int  # runs done (a read-back cell counts all of its runs)
    total: int  # runs planned: cells × prompts × repeats × 2 (the cell's run and its baseline)
    message: str  # "cell 3/9, prompt 2/4, repeat 1/2"
    cell: CellResult | None = None  # set when a cell has just finished (or was read back)


# -- measuring (dflash.bench.sweep_run, which imports the engine) --------------------------------------------------
def run_sweep(engine_for: Callable[[str | None], Engine], spec: SweepSpec, *, done: dict | None = None,
              should_stop: Callable[[], bool] = lambda: False) -> Iterator[SweepProgress]:
    """Measure every cell of `spec` not in `done` (cell key → CellResult of the same spec key: read back, not run).
    engine_for(dtype or None) gives the engine of a cell (None: the default numerics). For each cell, prompt and
    repeat, the no-draft run and the cell's run, interleaved. should_stop() is checked between runs: a stop ends
    the sweep keeping every finished cell (the partial one is dropped). Every cell is checked against the models
    before the first run (ValidationError naming the parameter); a run that fails stops it (DFlashError)."""
    from dflash.bench.sweep_run import measure

    return measure(engine_for, spec, dict(done or {}), should_stop)


def host_costs(engine: Engine) -> tuple[float, float]:
    """(one-token step, block verify) in seconds on `engine`, for `estimate_seconds` (`sweep_run.measured_costs`)."""
    from dflash.bench.sweep_run import measured_costs

    return measured_costs(engine)


# -- the document -------------------------------------------------------------------------------------------------
def default_key(spec: SweepSpec, models: dict) -> str | None:
    """The cell whose every axis holds its default: the Request's, the draft's trained block size, the models'
    dtype. None when the grid has no such cell."""
    defaults = {**DEFAULTS, "block_size": models.get("trained_block_size"), "dtype": models.get("dtype")}
    want = {n: defaults.get(n) for n, _ in spec.axes}
    return cell_key(want) if want in spec.cells() else None


def sweep_result(spec: SweepSpec, cells: list[CellResult], *, host: dict, models: dict) -> dict:
    """The JSON document: schema, spec, spec_key, host, models, cells (grid order), complete, best (`best_cell`) and default (`default_key`), each a cell key or
    None."""
    order = {cell_key(s): i for i, s in enumerate(spec.cells())}
    cells = sorted(cells, key=lambda c: order[c.key])
    doc = {"schema": SCHEMA, "spec": spec.to_dict(), "spec_key": spec.key(), "host": host, "models": models,
           "cells": [c.to_dict() for c in cells], "complete": len(cells) == len(order), "best": None,
           "default": default_key(spec, models)}
    doc["best"] = best_cell(doc)
    return doc


def best_cell(result: dict) -> str | None:
    """The fastest lossless cell whose outputs all equal the no-draft ones, up to diagnosed numerical ties (a
    bfloat16 verify can round a tie the other way; that is the numerics, not the setting)."""
    ok = [c for c in result["cells"] if not c["lossy"] and (c["identical"] or c["ties"] == c.get("differs"))]
    return max(ok, key=lambda c: c["speedup"][0])["key"] if ok else None


def load_sweep(text: str) -> dict:
    """A sweep document, parsed and checked; ValueError naming what is wrong."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"schema: expected {SCHEMA!r}, got {got!r}")
    try:
        spec = SweepSpec.from_dict(doc.get("spec"))
    except ValidationError as exc:
        raise ValueError(f"spec: {exc}") from None
    if not isinstance(doc.get("cells"), list):
        raise ValueError("cells: must be a list")
    keys = {cell_key(s) for s in spec.cells()}
    for i, c in enumerate(doc["cells"]):
        try:
            cell = CellResult.from_dict(c)
        except ValueError as exc:
            raise ValueError(f"cells[{i}]: {exc}") from None
        if cell.key not in keys:
            raise ValueError(f"cells[{i}]: {cell.key!r} is not a cell of the spec")
    for k in ("best", "default"):
        if doc.get(k) is not None and doc[k] not in keys:
            raise ValueError(f"{k}: {doc[k]!r} is not a cell of the spec")
    for k in ("host", "models"):
        if not isinstance(doc.get(k), dict):
            raise ValueError(f"{k}: must be an object")
    return doc


def to_csv(result: dict) -> str:
    """One row per cell: the axes' values, then the measurements (median, q25, q75 of each)."""
    names = [n for n, _ in result["spec"]["axes"]]
    head = names + ["key", "n"] + [f"{m}{s}" for m in ("tau", "tok_s", "speedup") for s in ("", "_q25", "_q75")]
    head += ["drift_tokens", "identical", "ties", "lossy", "best", "default"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for c in result["cells"]:
        w.writerow([c["setting"][n] for n in names] + [c["key"], c["n"], *c["tau"], *c["tok_s"], *c["speedup"],
                   c["drift_tokens"], c["identical"], c["ties"], c["lossy"], c["key"] == result.get("best"),
                   c["key"] == result.get("default")])
    return buf.getvalue()
