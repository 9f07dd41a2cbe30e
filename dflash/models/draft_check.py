"""A draft directory checked before any of its tensors is allocated: config.json's sizes against sane bounds, then
against the shapes model.safetensors holds (read from its header only). A hand-edited or hostile config.json
(`hidden_size: 1000000000`, a size given as text, zero layers) is named here by its field, its value and what was
expected, instead of failing inside torch after gigabytes were allocated."""

from __future__ import annotations

from pathlib import Path

from dflash.errors import ModelLoadError, first_line

# A draft directory's files (the z-lab layout, and our restricted vocabulary) and our drafts' mask token.
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
VOCAB_NAME = "draft_vocab.safetensors"  # our extension: restricted draft vocabulary (FR-Spec style)
MASK_TOKEN_ID = 16  # our drafts' mask token: SmolLM2's <empty_output>, which never occurs in a chat answer

# Generous bounds (a 405B target's hidden size is 16384, its MLP 53248): a value past them is a typo or a hostile
# file. The draft's own weights then bound every size exactly (`check_weights`).
SIZE_BOUNDS = {"hidden_size": (1, 65536), "num_hidden_layers": (1, 64), "num_attention_heads": (1, 1024),
               "num_key_value_heads": (1, 1024), "head_dim": (2, 4096), "intermediate_size": (1, 1 << 20),
               "vocab_size": (1, 1 << 22), "num_target_layers": (1, 1024), "block_size": (2, 1024),
               "max_position_embeddings": (1, 1 << 24), "mask_token_id": (0, (1 << 22) - 1),
               "hint_ngram": (0, 8)}  # 8: dflash.decode.request.MAX_NGRAM (this layer sits below decode)


def _shown(value: object) -> str:
    kind = {str: "text", bool: "a boolean", float: "a fraction", type(None): "null"}.get(type(value))
    return f"{value!r}" + (f" ({kind})" if kind else "")


def check_sizes(values: dict) -> None:
    """The integer fields present in `values` are whole numbers within SIZE_BOUNDS, head_dim is even (rotary
    embedding) and the query heads are a multiple of the key/value heads. ValueError naming the field, else None."""
    for name, (lo, hi) in SIZE_BOUNDS.items():
        value = values.get(name, lo)
        if type(value) is not int or not lo <= value <= hi:
            raise ValueError(f"{name} is {_shown(value)}; expected a whole number in [{lo}, {hi}]")
    ids = values.get("target_layer_ids", [])
    if not isinstance(ids, list) or not all(type(j) is int for j in ids):
        raise ValueError(f"target_layer_ids is {_shown(ids)}; expected a list of whole numbers")
    if values.get("head_dim", 2) % 2:
        raise ValueError(f"head_dim is {values['head_dim']}; expected an even number (rotary embedding)")
    heads, kv = values.get("num_attention_heads", 1), values.get("num_key_value_heads", 1)
    if heads % kv:
        raise ValueError(f"num_key_value_heads is {kv}; expected a divisor of num_attention_heads ({heads})")


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape, from a safetensors file's header (nothing is read into memory); the "model." prefix of
    some checkpoints dropped. A truncated or unreadable file is a ModelLoadError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k.removeprefix("model."): tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(unreadable(path, exc)) from None


def unreadable(path: Path, exc: Exception) -> str:
    return f"draft: {path.name} is unreadable, truncated or not safetensors ({first_line(exc)})"


def held_sizes(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The config sizes that the weights themselves imply (a field whose tensor is missing is left out);
    "fused layers" is the number of target layers `fc` reads (len(target_layer_ids))."""
    held = {"num_hidden_layers": len({k.split(".")[1] for k in shapes if k.startswith("layers.")})}
    where = {"hidden_size": ("norm.weight", 0), "head_dim": ("layers.0.self_attn.q_norm.weight", 0),
             "intermediate_size": ("layers.0.mlp.gate_proj.weight", 0)}
    held |= {name: shapes[key][axis] for name, (key, axis) in where.items() if len(shapes.get(key, ())) > axis}
    hd, hidden = held.get("head_dim"), held.get("hidden_size")
    for name, key in (("num_attention_heads", "q_proj"), ("num_key_value_heads", "k_proj")):
        rows = shapes.get(f"layers.0.self_attn.{key}.weight", ())
        if hd and rows and rows[0] % hd == 0:
            held[name] = rows[0] // hd
    fc = shapes.get("fc.weight", ())
    if hidden and len(fc) == 2 and fc[1] % hidden == 0:
        held["fused layers"] = fc[1] // hidden
    return held


def check_weights(config: dict[str, int], expected: dict[str, tuple[int, ...]], held: dict[str, tuple[int, ...]]) -> None:
    """config.json's sizes (`config`, with "fused layers") against the weights' header shapes (`held`), then every
    tensor name and shape against the layout's (`expected`). ModelLoadError naming the first disagreement."""
    implied = held_sizes(held)
    for name, value in implied.items():
        if config[name] != value:
            if name == "fused layers":
                raise ModelLoadError(f"draft: {CONFIG_NAME} has target_layer_ids {config['target_layer_ids']}, but "
                                     f"{WEIGHTS_NAME} fuses {value} target layers (fc.weight)")
            raise ModelLoadError(f"draft: {CONFIG_NAME} has {name} {config[name]}, but {WEIGHTS_NAME} holds a draft "
                                 f"with {name} {value}")
    missing, extra = sorted(expected.keys() - held.keys()), sorted(held.keys() - expected.keys())
    for names, what in ((missing, "lacks"), (extra, "has tensors the DFlash layout does not:")):
        if names:
            more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
            raise ModelLoadError(f"draft: {WEIGHTS_NAME} {what} {', '.join(names[:3])}{more}")
    for name, shape in expected.items():
        if held[name] != shape:
            raise ModelLoadError(f"draft: {WEIGHTS_NAME} holds {name} as {list(held[name])}; {CONFIG_NAME} implies "
                                 f"{list(shape)}")
