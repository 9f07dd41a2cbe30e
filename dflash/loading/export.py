"""`python -m dflash draft export`: write a draft directory that vLLM (`method: "dflash"`) or SGLang
(`--speculative-algorithm DFLASH`) can serve.

Our drafts may ship `draft_vocab.safetensors` (our extension): the draft proposes only among those target token
ids, with the matching rows of the target's LM head. Neither server reads that file. What they read instead:
- vLLM's DFlash draft model accepts a reduced draft vocabulary in the EAGLE-3 form: `draft_vocab_size` in
  config.json, and in model.safetensors its own `lm_head.weight` [draft_vocab_size, hidden] plus `d2t`
  [draft_vocab_size] (int64 offsets: draft index i stands for target id i + d2t[i]); its logits outside the
  draft vocabulary are -inf, as in our engine. `--for vllm` writes that form, so vLLM drafts exactly as we do.
  The LM-head rows come from the target (`--target`, a Hugging Face directory with safetensors).
- SGLang's DFLASH worker always drafts with the target's full LM head and ignores extra tensors, so `--for
  sglang` (the same files as `--for full-head`) drops the draft vocabulary: same weights, full head, and an
  acceptance (τ) that differs from our engine's restricted head, for better or worse.
Neither server was run here (no GPU); the layouts follow their DFlash loaders' source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dflash.errors import ModelLoadError, ValidationError
from dflash.loading.registry import DEFAULT_DRAFT_DIR

if TYPE_CHECKING:  # torch and dflash.models.draft load where used: building the CLI's parser must not import torch
    import torch

    from dflash.models.draft import DraftConfig

TARGETS = ("vllm", "sglang", "full-head")
OUR_CONFIG_KEYS = ("dflash_training",)  # written by our trainer; no server reads them


def add_parser(sub) -> None:
    p = sub.add_parser("draft", help="work with a DFlash draft directory")
    actions = p.add_subparsers(dest="action", required=True)
    e = actions.add_parser("export", help="write a copy of a draft that vLLM or SGLang can serve")
    e.add_argument("--draft", default=str(DEFAULT_DRAFT_DIR), help="draft directory (default: the shipped draft)")
    e.add_argument("--for", dest="server", required=True, choices=TARGETS,
                   help="vllm: keeps the draft vocabulary (vLLM's d2t form, needs --target); sglang or full-head: "
                        "drafts over the target's full LM head")
    e.add_argument("--target", help="the target's Hugging Face directory (safetensors): its LM head, for --for vllm")
    e.add_argument("--out", required=True, help="new directory to write (must not exist, or be empty)")
    e.set_defaults(func=cmd_export, _parser=e)


def cmd_export(args: argparse.Namespace) -> int:
    written = export_draft(Path(args.draft), args.server, Path(args.out), Path(args.target) if args.target else None)
    print(f"wrote {written['form']} draft for {args.server} to {args.out}")
    return 0


def export_draft(draft: Path, server: str, out: Path, target: Path | None = None) -> dict:
    """Write the export (see the module docstring). Returns {"form": "draft-vocab" | "full-head", ...}."""
    if server not in TARGETS:
        raise ValidationError("--for", f"must be one of {', '.join(TARGETS)}, got {server!r}")
    config, vocab, draft_cfg = _read_draft(draft)
    if (config.get("dflash_config") or {}).get("hint_ngram"):
        raise ValidationError("--draft", "is a hinted draft (its masked slots read copy hints), which vLLM and SGLang "
                                         "cannot serve; it runs in this project's engine only")
    last = config.get("num_target_layers", 0) - 1
    if last in (config.get("dflash_config") or {}).get("target_layer_ids", []):
        raise ValidationError("--draft", f"fuses the target's last layer ({last}), which vLLM cannot serve: it reads a "
                                         "fused layer's output at the input of the next decoder layer, and the last has "
                                         "none; such a draft runs in this project's engine only")
    mapped = server == "vllm" and vocab is not None
    if target is not None and not mapped:
        raise ValidationError("--target", "is only used by --for vllm with a draft that has a draft vocabulary")
    if mapped and target is None:
        raise ValidationError("--target", "needed by --for vllm: the draft vocabulary's LM-head rows are the target's; "
                                          "give the target's Hugging Face directory, or use --for full-head")
    if mapped:
        _check_fits(draft_cfg, target, vocab)
    head = _target_head_rows(target, vocab, config) if mapped else None
    _check_out(out)
    config = {k: v for k, v in config.items() if k not in OUR_CONFIG_KEYS}
    if mapped:
        config["draft_vocab_size"] = len(vocab)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(draft, out, config, vocab if mapped else None, head)
        (out / "README.md").write_text(_readme(config, server, mapped, draft, draft_cfg.block_size))
    except OSError as exc:
        raise ValidationError("--out", f"cannot write {out}: {exc.strerror or exc}") from None
    return {"form": "draft-vocab" if mapped else "full-head", "draft_vocab_size": len(vocab) if mapped else None}


def _read_draft(draft: Path) -> tuple[dict, torch.Tensor | None, DraftConfig]:
    """(config.json as written, draft vocabulary ids or None, its DraftConfig), after checking the draft loads."""
    if not draft.is_dir():
        raise ValidationError("--draft", f"{draft} is not a directory")
    from dflash.models.draft import CONFIG_NAME, load_draft

    try:
        model, vocab = load_draft(draft)  # strict: a directory that is not our layout is refused here
        config = json.loads((draft / CONFIG_NAME).read_text())
    except ModelLoadError as exc:
        raise ValidationError("--draft", str(exc).removeprefix("draft: ")) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValidationError("--draft", f"{draft} is not a readable draft ({type(exc).__name__})") from None
    return config, vocab, model.config


def _check_fits(cfg: DraftConfig, target: Path, vocab: torch.Tensor) -> None:
    """The draft against the target's config.json (the checks the engine makes at load: a draft for another target
    would export without complaint and fail in the server)."""
    try:
        t = json.loads((target / "config.json").read_text())
        shape = (int(t["hidden_size"]), int(t["num_hidden_layers"]), int(t["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValidationError("--target", f"{target} is not a readable Hugging Face directory ({type(exc).__name__})") from None
    try:
        cfg.check_fits(*shape, vocab)
    except ModelLoadError as exc:
        raise ValidationError("--draft", f"{str(exc).removeprefix('draft: ')}: not a draft for {target}") from None


def _target_head_rows(target: Path, vocab: torch.Tensor, config: dict) -> torch.Tensor:
    """The target LM head's rows for the draft vocabulary: [len(vocab), hidden], read from the safetensors files
    without loading the model (a tied head may be stored as the embedding)."""
    try:
        head = _read_head(target)
    except Exception as exc:  # noqa: BLE001 — OSError, JSON errors, safetensors' own error class: one message
        raise ValidationError("--target", f"{target} is not a readable Hugging Face directory ({type(exc).__name__})") from None
    if head is None:
        raise ValidationError("--target", f"no LM head (lm_head.weight) in the safetensors files of {target}")
    return _rows(head, vocab, config)


def _read_head(target: Path) -> torch.Tensor | None:
    from safetensors import safe_open

    tied = json.loads((target / "config.json").read_text()).get("tie_word_embeddings", False)
    files = sorted(target.glob("*.safetensors"))
    for name in ["lm_head.weight"] + (["model.embed_tokens.weight"] if tied else []):
        for file in files:
            with safe_open(str(file), "pt") as f:
                if name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    return f.get_tensor(name)
    return None


def _rows(head: torch.Tensor, vocab: torch.Tensor, config: dict) -> torch.Tensor:
    want = (config["vocab_size"], config["hidden_size"])
    if tuple(head.shape) != want:
        raise ValidationError("--target", f"its LM head is {list(head.shape)}, the draft needs {list(want)} "
                                          "(vocabulary x hidden size): not the draft's target")
    return head[vocab].contiguous()


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValidationError("--out", f"{out} exists and is not an empty directory; choose a new one")


def _write(draft: Path, out: Path, config: dict, vocab: torch.Tensor | None, head: torch.Tensor | None) -> None:
    """config.json and model.safetensors: the same weights, plus the LM-head rows and d2t in the mapped form."""
    from dflash.models.draft import CONFIG_NAME, WEIGHTS_NAME

    if vocab is None:
        shutil.copyfile(draft / WEIGHTS_NAME, out / WEIGHTS_NAME)  # the same weights, byte for byte
    else:
        import torch
        from safetensors.torch import load_file, save_file

        state = load_file(str(draft / WEIGHTS_NAME))
        offsets = vocab.to(torch.int64) - torch.arange(len(vocab), dtype=torch.int64)  # target id = i + d2t[i]
        dtype = next(t.dtype for t in state.values() if t.is_floating_point())  # the head in the draft's dtype
        save_file({**state, "lm_head.weight": head.to(dtype), "d2t": offsets.contiguous()}, str(out / WEIGHTS_NAME))
        os.chmod(out / WEIGHTS_NAME, 0o644)  # readable by a server running as another user, as a copied file is
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def _readme(config: dict, server: str, mapped: bool, draft: Path, block: int) -> str:
    from dflash.models.draft import VOCAB_NAME

    head = (f"It keeps the draft vocabulary ({config.get('draft_vocab_size')} target tokens) in vLLM's form "
            "(`draft_vocab_size`, `lm_head.weight`, `d2t`), so vLLM drafts as this project's engine does."
            if mapped else
            "It drafts over the target's **full** LM head: the restricted draft vocabulary of this project's engine "
            f"(`{VOCAB_NAME}`) is not part of it, so acceptance (τ) differs from the engine's, for better or worse.")
    vllm = ('vllm serve TARGET --speculative-config '
            f'\'{{"method": "dflash", "model": "THIS_DIR", "num_speculative_tokens": {block - 1}}}\'')
    sglang = ("python -m sglang.launch_server --model-path TARGET --speculative-algorithm DFLASH "
              f"--speculative-draft-model-path THIS_DIR --speculative-num-draft-tokens {block}")
    commands = [(name, cmd) for name, cmd, servers in (("vLLM", vllm, ("vllm", "full-head")),
                                                       ("SGLang", sglang, ("sglang", "full-head"))) if server in servers]
    origin = (f"Exported from `{draft.name}` by `python -m dflash draft export --for {server}`: the same draft "
              "weights, config.json in the z-lab layout.")
    text = [f"# DFlash draft exported for {server}", "", origin, "", head, ""]
    for name, cmd in commands:
        text += [f"{name}:", "```bash", cmd, "```", ""]
    numbers = (f"The block size is {block}: vLLM's `num_speculative_tokens` is {block - 1} (the drafted positions), "
               f"SGLang's `--speculative-num-draft-tokens` is {block} (the whole block).")
    text += [numbers, ""]
    return "\n".join(text)
