"""The DFlash draft model in the z-lab checkpoint format, loadable by vLLM / SGLang: `config.json` as written
by `DraftConfig.to_hf_dict`, and `model.safetensors` whose tensor names are this module's parameter names.

A few Qwen3-style decoder layers run non-causally over one block. Target features from several target layers
are fused (`fc` + `hidden_norm`) and injected as extra keys/values into every layer; queries come only from the
block. Embedding and LM head are the target's (not stored here).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dflash.errors import ModelLoadError
from dflash.models.draft_check import (CONFIG_NAME, MASK_TOKEN_ID, VOCAB_NAME, WEIGHTS_NAME, check_sizes, check_weights,
                                       unreadable, weight_shapes)



def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab default: one draft layer → [L // 2]; n > 1 → n layers spread from layer 1 to layer L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def extract_context_feature(hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of target layers `layer_ids` from a transformers `hidden_states` tuple.

    Index 0 of that tuple is the embedding output, so decoder layer j's output is hidden_states[j + 1]
    (an off-by-one here stays lossless but ruins acceptance). Returns [B, T, len(layer_ids) * H].
    """
    return torch.cat([hidden_states[j + 1] for j in layer_ids], dim=-1)


@dataclass
class DraftConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    block_size: int = 16
    mask_token_id: int = 0
    target_layer_ids: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    hint_ngram: int = 0  # 0: z-lab's draft. n > 0: a hinted draft (not z-lab's format): masked slots also read copy hints

    def __post_init__(self) -> None:
        check_sizes(asdict(self))  # before anything computes with them (a size given as text, or absurd)
        if not self.target_layer_ids:
            self.target_layer_ids = build_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        bad = [j for j in self.target_layer_ids if not 0 <= j < self.num_target_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} outside [0, {self.num_target_layers})")
        if self.block_size < 2:
            raise ValueError("block_size must be >= 2")

    @classmethod
    def for_target(cls, tc: Any, vocab_size: int, layers: int = 1, block_size: int = 16, **over: Any) -> DraftConfig:
        """A draft whose layers have the target's shape (`tc`: its transformers config: heads, KV heads, head_dim,
        MLP width), as ours are trained and as a random stand-in is built; `over` replaces any field. The mask token
        is MASK_TOKEN_ID where the vocabulary has it, else the last id."""
        heads = tc.num_attention_heads
        fields = dict(hidden_size=tc.hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
                      head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
                      intermediate_size=tc.intermediate_size, vocab_size=vocab_size,
                      num_target_layers=tc.num_hidden_layers, block_size=block_size,
                      mask_token_id=MASK_TOKEN_ID if vocab_size > MASK_TOKEN_ID else vocab_size - 1)
        return cls(**{**fields, **over})

    def check_fits(self, hidden_size: int, num_layers: int, vocab_size: int, vocab: torch.Tensor | None) -> None:
        """Against the target's shape: a draft trained for another target fails here with a message (ModelLoadError),
        not later with an IndexError mid-run. `vocab`: the draft vocabulary's target ids, or None."""
        if self.hidden_size != hidden_size:
            raise ModelLoadError(f"draft: hidden_size {self.hidden_size} does not match the target's hidden_size {hidden_size}")
        bad = [j for j in self.target_layer_ids if not 0 <= j < num_layers]
        if bad:
            raise ModelLoadError(f"draft: target_layer_ids {bad} do not exist in the target ({num_layers} layers)")
        if not 0 <= self.mask_token_id < vocab_size:
            raise ModelLoadError(f"draft: mask_token_id {self.mask_token_id} is outside the target's vocabulary ({vocab_size})")
        if vocab is not None and vocab.numel() and not (0 <= int(vocab.min()) and int(vocab.max()) < vocab_size):
            raise ModelLoadError(f"draft: its draft vocabulary has ids outside the target's vocabulary ({vocab_size})")

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json in the z-lab layout."""
        d = asdict(self)
        dflash = {"mask_token_id": d.pop("mask_token_id"), "target_layer_ids": d.pop("target_layer_ids")}
        if d.pop("hint_ngram"):  # only a hinted draft carries the key: z-lab's format stays as it is
            dflash["hint_ngram"] = self.hint_ngram
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            **d,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "dflash_config": dflash,
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "DraftConfig":
        dflash = d.get("dflash_config") or {}
        keys = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in keys}
        # Some checkpoints keep block_size / num_target_layers inside dflash_config (SGLang accepts both).
        for k in ("block_size", "num_target_layers"):
            if k in dflash:
                kw[k] = dflash[k]
        # transformers 5 writes RoPE as "rope_parameters" {rope_theta, rope_type, ...} instead of top-level keys.
        rope = d.get("rope_parameters") or {}
        if "rope_theta" not in kw and "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        if not kw.get("rope_scaling") and rope.get("rope_type", "default") != "default":
            kw["rope_scaling"] = dict(rope)
        kw["mask_token_id"] = dflash.get("mask_token_id", d.get("mask_token_id", 0))
        kw["target_layer_ids"] = dflash.get("target_layer_ids") or []
        kw["hint_ngram"] = dflash.get("hint_ngram", 0)
        check_sizes(kw)  # before head_dim is computed from them
        kw.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        return cls(**kw)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: DraftConfig) -> torch.Tensor:
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":  # LLaMA-3.1 frequency-dependent scaling
        factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = rs.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, hd]; positions: [T] absolute positions."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(h, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of x [B, T, H] → ([B, kv, T, hd], [B, kv, T, hd]), k normed and rotated."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        return apply_rope(k, positions, inv_freq), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                ctx_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                attention: list[torch.Tensor] | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.hd)).transpose(1, 2)
        q = apply_rope(q, positions, inv_freq)  # [B, nh, t, hd]
        k_blk, v_blk = self.kv(x, positions, inv_freq)
        k = torch.cat([ctx_kv[0], k_blk], dim=2)  # [B, kv, ctx + t, hd]
        v = torch.cat([ctx_kv[1], v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, enable_gqa=self.n_heads != self.n_kv)
        if attention is not None:  # asked for (a traced request): the weights recomputed; `out` stays SDPA's own
            attention.append(attention_weights(q, k, mask, self.n_heads // self.n_kv))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, groups: int) -> torch.Tensor:
    """The softmax weights scaled_dot_product_attention applies, recomputed in float32: q [B, nh, t, hd],
    k [B, kv, T, hd] (query head h reads key head h // groups, as enable_gqa does) → [B, nh, t, T]."""
    k = k.repeat_interleave(groups, dim=1) if groups > 1 else k
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return scores.softmax(-1)


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x, positions, inv_freq, ctx_kv, mask, attention=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, inv_freq, ctx_kv, mask, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        k = len(cfg.target_layer_ids)
        self.fc = nn.Linear(k * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.hint_ngram:  # a hinted draft: see `block_inputs`
            self.hint_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
            self.hint_gate = nn.Parameter(torch.ones(cfg.hint_ngram + 1))
            self.hint_len = nn.Embedding(cfg.hint_ngram + 1, cfg.hidden_size)
        self.inv_freq = rope_inv_freq(cfg)  # float32 on purpose: not a buffer, so .to(bfloat16) leaves it exact

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer injected K/V for target features [B, T, k*H] at absolute `positions` [T]."""
        ctx = self.hidden_norm(self.fc(features))  # [B, T, H]
        inv = self.inv_freq.to(features.device)
        return [layer.self_attn.kv(ctx, positions, inv) for layer in self.layers]

    def block_inputs(self, embeds: torch.Tensor, hint_embeds: torch.Tensor | None = None,
                     hint_n: torch.Tensor | None = None) -> torch.Tensor:
        """The block's input [..., t, H]: the target embedding of its tokens (`embeds`). A hinted draft adds, per
        slot, the embedding of the token a copy from the context proposes there (`hint_embeds` [..., t, H]) through
        `hint_proj`, scaled by a gate per match length `hint_n` [..., t] (0: no hint), and an embedding of that
        length. Why: a masked slot's query cannot depend on the anchor, so a one-layer draft cannot find the
        anchor in the context itself; the hint brings what a lookup finds into the slot, and the draft learns when
        to trust it. With hint_proj and hint_len at 0 (a warm start) the draft is the one it started from."""
        if not self.config.hint_ngram or hint_embeds is None:
            return embeds
        has = (hint_n > 0).unsqueeze(-1).to(embeds.dtype)  # [..., t, 1]
        gate = self.hint_gate[hint_n].unsqueeze(-1).to(embeds.dtype)
        return embeds + has * gate * self.hint_proj(hint_embeds) + self.hint_len(hint_n) * has

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None,
                attention: list[torch.Tensor] | None = None) -> torch.Tensor:
        """block_embeds [B, t, H] (target embedding of the block tokens) → final hidden [B, t, H].

        mask: additive or boolean [B|1, 1, t, ctx + t] (training packs many blocks); None = see everything.
        attention: a list to receive each layer's attention weights [B, nh, t, ctx + t] (keys: the injected context,
        then the block); None (the default) computes nothing extra.
        """
        x = block_embeds
        inv = self.inv_freq.to(x.device)
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, positions, inv, kv, mask, attention)
        return self.norm(x)


class DraftCache:
    """Injected context K/V of the committed tokens, per layer. Block K/V are never stored."""

    def __init__(self) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __len__(self) -> int:
        return self.kv[0][0].shape[2] if self.kv else 0

    def append(self, new: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not self.kv:
            self.kv = list(new)
        else:
            self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]

    def crop(self, n: int) -> None:
        self.kv = [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv]


def save_draft(model: DFlashDraftModel, directory: str | Path, vocab_ids: torch.Tensor | None = None,
               extra_config: dict[str, Any] | None = None) -> None:
    """Each file is written under a temporary name and renamed into place, config.json last: a reader during a save
    (an eval of a run's directory while it trains) or a save cut short sees the previous files or the new ones,
    never a truncated one, and a directory with a config.json has its weights."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf_dict()
    if extra_config:
        cfg.update(extra_config)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    _replace(directory / WEIGHTS_NAME, lambda tmp: save_file(state, str(tmp)))
    if vocab_ids is not None:
        _replace(directory / VOCAB_NAME, lambda tmp: save_file({"token_ids": vocab_ids.to(torch.int64).contiguous()}, str(tmp)))
    _replace(directory / CONFIG_NAME, lambda tmp: tmp.write_text(json.dumps(cfg, indent=2) + "\n"))


def _replace(path: Path, write) -> None:
    """`write(tmp)` to a temporary name in `path`'s directory (a rename within one file system is atomic), then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def read_draft_config(directory: str | Path) -> DraftConfig:
    """config.json of a draft directory, checked without reading the weights (cheap: before a target loads).
    ModelLoadError "draft: …" when it is missing or not a DFlash draft's config."""
    directory = Path(directory)
    if not (directory / CONFIG_NAME).is_file():
        raise ModelLoadError(f"draft: no {CONFIG_NAME} in the draft directory")
    if not (directory / WEIGHTS_NAME).is_file():
        raise ModelLoadError(f"draft: weights must be {WEIGHTS_NAME} (safetensors); other formats are refused")
    try:
        return DraftConfig.from_hf_dict(json.loads((directory / CONFIG_NAME).read_text()))
    except OSError as exc:
        raise ModelLoadError(f"draft: cannot read {CONFIG_NAME} ({exc.strerror or exc})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # not JSON, a missing key, a value out of range
        why = f"no {exc} entry" if isinstance(exc, KeyError) else str(exc)
        raise ModelLoadError(f"draft: {CONFIG_NAME} is not a valid DFlash draft config: {why}") from None


def inspect_draft(directory: str | Path) -> DraftConfig:
    """The draft's config, checked against the shapes its weights hold (read from the safetensors header) before any
    tensor is allocated: ModelLoadError naming the first field or tensor that disagrees."""
    directory = Path(directory)
    cfg = read_draft_config(directory)
    with torch.device("meta"):  # the layout's names and shapes, with no memory behind them
        expected = {k: tuple(v.shape) for k, v in DFlashDraftModel(cfg).state_dict().items()}
    config = {**asdict(cfg), "fused layers": len(cfg.target_layer_ids)}
    check_weights(config, expected, weight_shapes(directory / WEIGHTS_NAME))
    return cfg


def load_draft(directory: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> tuple[DFlashDraftModel, torch.Tensor | None]:
    """Load config.json + model.safetensors with strict key matching. Returns (model, draft vocab ids or None)."""
    directory = Path(directory)
    model = DFlashDraftModel(inspect_draft(directory))
    state = {k.removeprefix("model."): v for k, v in _read_tensors(directory / WEIGHTS_NAME).items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # inspect_draft checked names and shapes: what is left, in one line
        raise ModelLoadError(f"draft: checkpoint does not match the DFlash layout ({' '.join(str(exc).split())})") from None
    vocab = _read_tensors(directory / VOCAB_NAME).get("token_ids") if (directory / VOCAB_NAME).is_file() else None
    if (directory / VOCAB_NAME).is_file() and vocab is None:
        raise ModelLoadError(f"draft: {VOCAB_NAME} has no token_ids tensor")
    return model.to(device=device, dtype=dtype).eval(), vocab


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file; a truncated or unreadable one (a copy cut short) is a ModelLoadError, not a traceback."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(unreadable(path, exc)) from None
