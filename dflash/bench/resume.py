"""`bench --resume`: continue an interrupted result, only under the conditions its prompts were measured in.

A resumed file mixes prompts timed by two processes, so everything that changes a timing or an output must be the
same in both: the configuration, the models and how they were loaded, the CPU settings the host probe chose, the
machine and the library versions. What differs is named in the refusal. The original `machine` and `command` stay
(they describe the run that made the file); the resume's own command line is recorded as `resumed_command`.
"""

from __future__ import annotations

import json

from dflash.errors import ValidationError

# Dotted paths into the result document (docs/bench.md); a dict is compared leaf by leaf, so a refusal names the leaf.
CONDITIONS = (
    "config",
    "models.target", "models.draft", "models.dtype", "models.device", "models.quantize", "models.device_map",
    "models.host.dtype", "models.host.threads", "models.host.layout", "models.host.float32_from_rows",
    "machine.cpu_model", "machine.gpu", "machine.torch", "machine.transformers", "machine.torch_threads", "machine.env",
)


def resume(result: dict, old: dict, output: str, items: list) -> None:
    """Continue `old`, an interrupted result, in `result` (this run's document, no prompts measured yet): keep the
    prompts of `old` that still match `items`; refuse when the conditions differ."""
    from dflash.bench.machine import now_iso

    differ = differences(old, result)
    if differ:
        raise ValidationError("resume", f"{output} was made under other conditions: {'; '.join(differ)}; "
                                        "use --overwrite to start again")
    result["prompts"] = [p for p in old["prompts"] if p["index"] < len(items) and p["prompt_ids"] == items[p["index"]].ids]
    result["resumed_command"] = result["command"]
    result["command"], result["machine"] = old["command"], old["machine"]
    result["started_at"], result["resumed_at"] = old.get("started_at"), now_iso()


def differences(old: dict, new: dict) -> list[str]:
    """'machine.torch_threads (was 2, now 1)' for every condition leaf that differs."""
    old = {**old, "config": upgrade_config(old.get("config") or {})}
    out = []
    for path in CONDITIONS:
        was, now = dict(_leaves(_get(old, path), path)), dict(_leaves(_get(new, path), path))
        out += [f"{k} (was {_short(was.get(k))}, now {_short(now.get(k))})"
                for k in sorted(was.keys() | now.keys()) if was.get(k) != now.get(k)]
    return out


def upgrade_config(config: dict) -> dict:
    """A config as this version records it. Before `config.lookup_ngram`, `request.lookup_ngram` held --lookup-ngram
    as given (0: not given), and dflash-lookup ran with that n, or 2; no other method copied."""
    if "lookup_ngram" in config or "request" not in config:
        return config
    request = dict(config["request"])
    n = request.pop("lookup_ngram", 0)
    return {**config, "request": request, "lookup_ngram": (n or 2) if "dflash-lookup" in config.get("methods", []) else None}


def _get(doc, path: str):
    for key in path.split("."):
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _leaves(value, path: str):
    """(dotted path, value) of every leaf; an absent value, null or {} has none (so that absent equals null)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif value is not None:
        yield path, value


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
