"""A lean decoding step for Llama-family targets on the CPU: a preallocated KV cache, fused projections (q, k, v in
one product; gate and up in another), a handful of operations per layer, and the draft's feature layers kept as the
loop passes them (no hooks).

On a 2-core CPU a 135M model's step is mostly per-operation overhead, not arithmetic, so fewer and larger
operations pay. The weights are either dense (float32 or bfloat16, from the transformers model) or the GGUF's own
Q4_1 blocks through torch's int4 kernel (`dflash.models.gguf_blocks`), with bfloat16 activations. transformers stays
the loader and the general path; `LeanTarget` is what the engine runs where the host probe chose it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash.models.gguf_blocks import Int4Linear, Int4Module, Q4Matrix
from dflash.models.target import Target

WEIGHTS = ("dense", "int4")
CAPACITY = 256  # positions a new cache holds; it doubles when a forward needs more


def lean_supported(config) -> bool:
    """Whether `LeanDecoder` computes this transformers config's model exactly: a Llama with SiLU MLPs and no biases."""
    return (getattr(config, "model_type", None) == "llama" and getattr(config, "hidden_act", None) == "silu"
            and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and getattr(config, "pretraining_tp", 1) == 1)


class KVCache:
    """Keys and values of every layer: k, v [layers, kv_heads, capacity, head_dim]; the first `length` positions are
    filled. Cropping only moves `length`; growing copies into a buffer twice as large."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = CAPACITY):
        self.k = torch.zeros(layers, kv_heads, capacity, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def reserve(self, total: int) -> None:
        """Room for `total` positions."""
        capacity = self.k.shape[2]
        if total <= capacity:
            return
        while capacity < total:
            capacity *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


class _Dense:
    """y = x @ W.T with W [out, in] held in the weights' dtype; x and y float32 (the activations' dtype)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return F.linear(x, w) if w.dtype == torch.float32 else F.linear(x.to(w.dtype), w).float()

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


class _Int4:
    """`Int4Linear` with float32 activations in and out (its kernel takes bfloat16 ones)."""

    def __init__(self, mat: Q4Matrix):
        self.linear = Int4Linear(mat, torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(torch.bfloat16)).float()

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes


class _Layer:
    """One decoder layer's weights: qkv and gate_up fused, o and down, the two RMSNorm weights."""

    def __init__(self, qkv, o, gate_up, down, norm1: torch.Tensor, norm2: torch.Tensor):
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.norm1, self.norm2 = norm1, norm2


def _dense_layers(model, dtype: torch.dtype) -> list[_Layer]:
    def w(module):
        return module.weight.detach().to(dtype)

    out = []
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        out.append(_Layer(_Dense(torch.cat([w(a.q_proj), w(a.k_proj), w(a.v_proj)])), _Dense(w(a.o_proj)),
                          _Dense(torch.cat([w(mlp.gate_proj), w(mlp.up_proj)])), _Dense(w(mlp.down_proj)),
                          layer.input_layernorm.weight.detach().float(),
                          layer.post_attention_layernorm.weight.detach().float()))
    return out


_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def swap_in_int4(model, q4: list[dict[str, Q4Matrix]], dtype: torch.dtype) -> None:
    """The model's decoder linear layers replaced by int4 ones of q4's blocks: its dense decoder weights are freed,
    and transformers' own forward computes with the same weights as the lean step."""
    for layer, mats in zip(model.model.layers, q4, strict=True):
        for name, path in _MODULES.items():
            parent, _, child = path.rpartition(".")
            setattr(layer.get_submodule(parent), child, Int4Module(Int4Linear(mats[name], dtype)))


def decoder_linear_weights(model) -> list[torch.Tensor]:
    """The weights `swap_in_int4` replaces (a copy made for int4 need not copy them)."""
    return [layer.get_submodule(path).weight for layer in model.model.layers for path in _MODULES.values()]


def _int4_layers(model, q4: list[dict[str, Q4Matrix]]) -> list[_Layer]:
    out = []
    for layer, mats in zip(model.model.layers, q4, strict=True):
        out.append(_Layer(_Int4(Q4Matrix.cat([mats["q"], mats["k"], mats["v"]])), _Int4(mats["o"]),
                          _Int4(Q4Matrix.cat([mats["gate"], mats["up"]])), _Int4(mats["down"]),
                          layer.input_layernorm.weight.detach().float(),
                          layer.post_attention_layernorm.weight.detach().float()))
    return out


class LeanDecoder:
    """The decoder of a transformers Llama-family model, rebuilt for few-row forwards. `forward` returns the final
    hidden states (after the last norm) and the outputs of the layers in `capture`.

    The activations, the norms, the rotary embedding, attention and the KV cache are float32, as llama.cpp keeps
    them; only the matmuls' weights are in `dtype` (or int4), their inputs cast to it. On a CPU this costs a cast
    per product and saves the casts that bfloat16 norms, softmax and residual adds do inside each op."""

    def __init__(self, model, dtype: torch.dtype, q4: list[dict[str, Q4Matrix]] | None = None):
        config = model.config
        self.dtype = dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.layers = _int4_layers(model, q4) if q4 is not None else _dense_layers(model, dtype)
        self.weights = "int4" if q4 is not None else "dense"
        self.norm = model.model.norm.weight.detach().float()
        self.embedding = model.get_input_embeddings().weight  # [V, H] shared with the model
        self.max_positions = getattr(config, "max_position_embeddings", 2048)
        # Rotary tables for every position from the model's own rotary module (whatever its rope type): [P, head_dim]
        with torch.no_grad():
            cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(self.max_positions)[None])
        self.cos, self.sin = cos[0].float(), sin[0].float()

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, torch.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the lean decoder's own weights (the embedding is the model's; int4 keeps the model's unfused
        int4 copy too, the same size again)."""
        return sum(m.nbytes for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x [T, H] (float32): five small ops, where F.rms_norm's dispatch costs several times more here."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(self.eps)) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] rotated by position (transformers' rotate_half convention); cos, sin [T, 1, D]."""
        half = self.head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, ids: torch.Tensor, cache: KVCache, capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, dict]:
        """ids [T] → (hidden [T, H] float32 after the final norm, {layer j: its output [T, H]}); extends `cache` by
        T. The last layer's captured output is, as in transformers' hidden_states, the one after the final norm."""
        T, start = ids.shape[0], cache.length
        end = start + T
        cache.reserve(end)
        nh, kvh, hd = self.heads, self.kv_heads, self.head_dim
        group, scale = nh // kvh, hd ** -0.5
        cos, sin = self.cos[start:end, None], self.sin[start:end, None]  # [T, 1, hd]
        # The query rows of one kv head's group attend together: q [kvh, group·T, hd] against k, v [kvh, S, hd].
        bias = None
        if T > 1:  # causal within the block: row t sees positions up to start + t
            allowed = torch.arange(end)[None] <= torch.arange(start, end)[:, None]  # [T, S]
            bias = torch.zeros(T, end).masked_fill_(~allowed, float("-inf")).repeat(group, 1)  # [group·T, S]
        x = self.embedding[ids].float()  # [T, H]
        feats = {}
        last = len(self.layers) - 1
        for j, layer in enumerate(self.layers):
            h = self._norm(x, layer.norm1)
            qk, v = layer.qkv(h).split([(nh + kvh) * hd, kvh * hd], -1)
            qk = self._rope(qk.view(T, nh + kvh, hd), cos, sin)  # q and k rotated at once
            cache.k[j, :, start:end] = qk[:, nh:].transpose(0, 1)
            cache.v[j, :, start:end] = v.view(T, kvh, hd).transpose(0, 1)
            q = qk[:, :nh].transpose(0, 1).reshape(kvh, group * T, hd)
            scores = torch.baddbmm(bias, q, cache.k[j, :, :end].transpose(1, 2), alpha=scale) if bias is not None \
                else torch.bmm(q, cache.k[j, :, :end].transpose(1, 2)).mul_(scale)  # [kvh, group·T, S]
            a = torch.bmm(scores.softmax(-1), cache.v[j, :, :end])  # [kvh, group·T, hd]
            x = x + layer.o(a.view(nh, T, hd).transpose(0, 1).reshape(T, nh * hd))
            h = self._norm(x, layer.norm2)
            gate, up = layer.gate_up(h).chunk(2, -1)
            x = x + layer.down(F.silu(gate) * up)
            if j in capture and j != last:
                feats[j] = x
        cache.length = end
        x = self._norm(x, self.norm)
        if last in capture:
            feats[last] = x
        return x, feats


class LeanTarget(Target):
    """A Target whose forwards run `LeanDecoder` (the CPU fast path for Llama-family models); the head, embedding,
    tokenizer and everything else are Target's. `weights`: "dense" (the model's weights in `dtype`) or "int4" (the
    GGUF's Q4_1 blocks `q4`, bfloat16 activations)."""

    def __init__(self, model, tokenizer, name: str = "", dtype: torch.dtype = torch.float32,
                 q4: list[dict[str, Q4Matrix]] | None = None):
        if q4 is not None:  # before Target casts the model: the dense decoder weights are never cast, only freed
            swap_in_int4(model, q4, dtype)
        super().__init__(model, tokenizer, name=name, device=torch.device("cpu"), dtype=dtype)
        self.decoder = LeanDecoder(self.model, dtype, q4)

    @property
    def layout(self) -> str:
        return f"lean-{self.decoder.weights}"

    @property
    def numerics(self) -> str:
        return "int4" if self.decoder.weights == "int4" else super().numerics

    def set_capture(self, layer_ids: list[int]) -> None:
        self.layer_ids = list(layer_ids)

    def new_cache(self) -> KVCache:
        return self.decoder.new_cache()

    @staticmethod
    def cache_len(cache: KVCache) -> int:
        return cache.length

    @staticmethod
    def crop(cache: KVCache, length: int) -> None:
        cache.crop(length)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, last_only: bool = False,
                capture: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [1, T] → (logits [T or 1, V] float32, features [1, T, k*H] or None), as Target.forward."""
        wanted = tuple(self.layer_ids) if capture else ()
        hidden, captured = self.decoder.forward(ids[0], cache, wanted)
        logits = self.head((hidden[-1:] if last_only else hidden).to(self.dtype))
        feats = torch.cat([captured[j] for j in self.layer_ids], -1)[None].to(self.dtype) if wanted else None
        return logits.float(), feats
