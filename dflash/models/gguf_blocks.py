"""The GGUF's own 4-bit weights: a Llama GGUF's Q4_1 linear layers read as they are and mapped onto torch's CPU int4
kernel, with no rounding of their values.

A Q4_1 block holds 32 weights of one row: a scale d and a minimum m (float16 each), then 32 codes q in 0..15 (low
nibbles first), and w = d·q + m. torch's `_weight_int4pack_mm_for_cpu` computes w = (q − 8)·scale + zero per group
of 32, so scale = d and zero = m + 8·d is Q4_1 exactly (up to the scales' rounding to the activation dtype).

llama.cpp stores a Llama's q and k projections with their rows permuted (rotary halves interleaved); transformers
undoes it on load, and so does `read_q4_linears`, on the rows of codes and scales alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GROUP = 32  # weights per Q4_1 block
_BLOCK_BYTES = 20  # 2 (d) + 2 (m) + 16 (32 nibbles)
# GGUF tensor name → the Llama linear it is, per layer
LINEARS = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
           "ffn_down": "down"}


@dataclass
class Q4Matrix:
    """One linear layer's weight [out, in] as Q4_1 blocks: codes [out, in] uint8 in 0..15, d and m [out, in/32]
    float32 (exactly the file's float16 values)."""

    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """w = d·q + m, float32 [out, in]: the weight llama.cpp computes with."""
        out, n = self.codes.shape
        q = self.codes.view(out, n // GROUP, GROUP).float()
        return (self.d[..., None] * q + self.m[..., None]).view(out, n)

    def rows(self, index: torch.Tensor) -> Q4Matrix:
        return Q4Matrix(self.codes[index], self.d[index], self.m[index])

    @staticmethod
    def cat(parts: list[Q4Matrix]) -> Q4Matrix:
        """Stacked along the output rows (a fused projection: q, k, v or gate, up)."""
        return Q4Matrix(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "d", "m")))


def decode_q4_1(raw: np.ndarray) -> Q4Matrix:
    """raw [out, in/32·20] uint8, the GGUF reader's bytes of one Q4_1 tensor → its Q4Matrix."""
    out = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(out, -1, _BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]  # [out, n_blocks, 16]: element i in the low nibble of byte i, element 16 + i in its high one
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, -1)
    return Q4Matrix(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m))


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's permutation of a q or k projection with `heads` heads: row r of the
    result is row index[r] of the GGUF's tensor (the same reordering transformers applies to the dequantized
    weight)."""
    dim = rows // heads // 2
    return torch.arange(rows).view(heads, dim, 2).transpose(1, 2).reshape(rows)


Q4_1, _SCALARS = 3, {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type → bytes


def tensor_table(path: str | Path) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """name → (ggml type, dims as GGUF lists them (innermost first), absolute byte offset of its data), read from
    the header alone. gguf's GGUFReader decodes every metadata value first (the tokenizer's 100k strings: ~6 s
    here), which only its metadata needs."""
    import struct

    with open(path, "rb") as f:
        buf = f.read(64 << 20)  # the header (metadata and tensor table) lies within its first megabytes
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    at = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, at)
    at += 16

    def string() -> str:
        nonlocal at
        (n,) = struct.unpack_from("<Q", buf, at)
        at += 8 + n
        return buf[at - n:at].decode("utf-8", "replace")

    def skip(kind: int) -> None:
        nonlocal at
        if kind == 8:
            string()
        elif kind == 9:
            inner, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if inner in _SCALARS:
                at += count * _SCALARS[inner]
            else:
                for _ in range(count):
                    skip(inner)
        else:
            at += _SCALARS[kind]

    alignment = 32
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", buf, at)
        at += 4
        if key == "general.alignment" and kind == 4:
            (alignment,) = struct.unpack_from("<I", buf, at)
        skip(kind)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = struct.unpack_from("<I", buf, at)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, at + 4)
        kind, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        infos.append((name, kind, dims, offset))
    data = -(-at // alignment) * alignment
    return {name: (kind, dims, data + offset) for name, kind, dims, offset in infos}


def _linears(table: dict) -> list[tuple[int, str, str]]:
    """(layer, our name, GGUF name) for each decoder linear layer's weight in a `tensor_table`."""
    out = []
    for full in table:
        parts = full.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in LINEARS and parts[1].isdigit():
            out.append((int(parts[1]), LINEARS[parts[2]], full))
    return out


def linears_are_q4_1(path: str | Path) -> bool:
    """Whether every decoder linear layer of the GGUF at `path` is stored as Q4_1 (reads the header only)."""
    table = tensor_table(path)
    linears = _linears(table)
    return bool(linears) and all(table[full][0] == Q4_1 for _, _, full in linears)


def read_q4_linears(path: str | Path, heads: int, kv_heads: int) -> list[dict[str, Q4Matrix]] | None:
    """Every decoder layer's linear weights as Q4Matrix, by name (q, k, v, o, gate, up, down), in transformers' row
    order; None when any of them is not Q4_1 (that GGUF is used dequantized)."""
    table = tensor_table(path)
    linears = _linears(table)
    if not linears or any(table[full][0] != Q4_1 for _, _, full in linears):
        return None
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    layers: dict[int, dict[str, Q4Matrix]] = {}
    for i, name, full in linears:
        _, (cols, rows), offset = table[full]
        size = rows * cols // GROUP * _BLOCK_BYTES
        mat = decode_q4_1(raw[offset:offset + size].reshape(rows, -1))
        if name in ("q", "k"):
            mat = mat.rows(unpermute_rows(rows, heads if name == "q" else kv_heads))
        layers.setdefault(i, {})[name] = mat
    if any(len(layer) != len(LINEARS) for layer in layers.values()):
        return None
    return [layers[i] for i in range(len(layers))]


class Int4Module(torch.nn.Module):
    """An `Int4Linear` in place of a transformers model's nn.Linear: x [..., in] → [..., out], so transformers' own
    forward (its generate, the benchmark's baselines) runs the same 4-bit weights as the lean step."""

    def __init__(self, linear: Int4Linear):
        super().__init__()
        self.linear = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)


class Int4Linear:
    """y = x @ W.T for a Q4Matrix W through torch's CPU int4 kernel; x [M, in] in `dtype` (bfloat16: the fast
    case) → [M, out]. The scales are held in `dtype`, as the kernel requires."""

    def __init__(self, mat: Q4Matrix, dtype: torch.dtype = torch.bfloat16):
        self.out_features, self.in_features = mat.codes.shape
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(mat.codes.to(torch.int32), 1)
        zero = mat.m + 8 * mat.d
        self.scales_zeros = torch.stack([mat.d.t(), zero.t()], -1).to(dtype).contiguous()  # [in/32, out, 2]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes
