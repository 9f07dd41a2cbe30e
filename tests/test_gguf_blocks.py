"""The GGUF's Q4_1 blocks read as they are (dflash.models.gguf_blocks), on a tiny GGUF written here with the gguf
package's own Q4_1 quantizer and llama.cpp's row permutation of the q and k projections."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash.models.gguf_blocks import (GROUP, Int4Linear, Q4Matrix, decode_q4_1, linears_are_q4_1, read_q4_linears,
                                       unpermute_rows)

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER, LAYERS = 4, 2, 16, 64, 128, 2
SHAPES = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
          "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to a Llama q or k projection [out, in] before it quantizes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, weights: dict[str, np.ndarray], types: dict[str, object] | None = None) -> None:
    """A GGUF with the decoder linears `weights` ("blk.{i}.{name}" → float32 [out, in], in transformers' row order),
    permuted and quantized as llama.cpp writes them (Q4_1 unless `types` says otherwise), plus a float32 norm."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(str(path), "llama")
    for name, w in weights.items():
        kind = name.split(".")[2]
        stored = llama_cpp_permute(w, HEADS if kind == "attn_q" else KV_HEADS) if kind in ("attn_q", "attn_k") else w
        qtype = (types or {}).get(name, GGMLQuantizationType.Q4_1)
        data = quantize(stored, qtype) if qtype != GGMLQuantizationType.F32 else stored
        writer.add_tensor(name, data, raw_dtype=qtype)  # the shape: from the bytes per row and the type
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"blk.{i}.{name}.weight": rng.normal(0, 0.05, shape).astype(np.float32)
            for i in range(LAYERS) for name, shape in SHAPES.items()}


def q4_reference(w: np.ndarray) -> np.ndarray:
    """gguf's own round trip of `w` through Q4_1: the weight llama.cpp computes with."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    return dequantize(quantize(w, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    weights = random_weights()
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    write_tiny_gguf(path, weights)
    return path, weights


def test_every_linear_reads_back_as_d_times_q_plus_m_in_transformers_row_order(tiny_gguf):
    path, weights = tiny_gguf
    layers = read_q4_linears(path, HEADS, KV_HEADS)
    assert layers is not None and len(layers) == LAYERS
    ours = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
            "ffn_down": "down"}
    for i, layer in enumerate(layers):
        for gguf_name, name in ours.items():
            w = weights[f"blk.{i}.{gguf_name}.weight"]
            mat = layer[name]
            assert mat.codes.dtype == torch.uint8 and int(mat.codes.max()) <= 15
            assert mat.codes.shape == w.shape and mat.d.shape == (w.shape[0], w.shape[1] // GROUP)
            # Quantizing the permuted rows and un-permuting equals quantizing the rows as they are (blocks are
            # within rows), so the reference is gguf's round trip of the unpermuted weight: bit for bit.
            assert torch.equal(mat.dequantize(), torch.from_numpy(q4_reference(w))), (i, name)


def test_unpermute_rows_undoes_llama_cpp_s_permutation():
    rows = np.arange(48)[:, None].astype(np.float32)
    for heads in (1, 2, 3):
        permuted = llama_cpp_permute(rows, heads)
        assert np.array_equal(permuted[unpermute_rows(48, heads).numpy()], rows)


def test_decode_reads_the_nibbles_low_half_first():
    """One block by hand: d = 0.5, m = -1, codes 0..15 in the low nibbles and 15..0 in the high ones."""
    d, m = np.float16(0.5), np.float16(-1.0)
    low, high = np.arange(16, dtype=np.uint8), np.arange(15, -1, -1, dtype=np.uint8)
    raw = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), low | (high << 4)])[None]
    mat = decode_q4_1(raw)
    assert mat.codes.tolist() == [list(range(16)) + list(range(15, -1, -1))]
    assert mat.dequantize()[0, :3].tolist() == [-1.0, -0.5, 0.0]


def test_a_gguf_with_another_type_is_not_read_as_q4_1(tmp_path):
    from gguf import GGMLQuantizationType

    weights = random_weights(1)
    path = tmp_path / "mixed.gguf"
    write_tiny_gguf(path, weights, {"blk.1.ffn_down.weight": GGMLQuantizationType.Q8_0})
    assert not linears_are_q4_1(path) and read_q4_linears(path, HEADS, KV_HEADS) is None
    write_tiny_gguf(tmp_path / "all.gguf", weights)
    assert linears_are_q4_1(tmp_path / "all.gguf")


@pytest.mark.parametrize("rows", [1, 8])
def test_the_int4_product_equals_the_float32_product_of_the_dequantized_weight(tiny_gguf, rows):
    """torch's int4 kernel with scale d and zero m + 8d: exact to float32 rounding with float32 activations, within
    bfloat16's rounding of the activations and the scales with bfloat16 ones."""
    path, _ = tiny_gguf
    mat = read_q4_linears(path, HEADS, KV_HEADS)[1]["gate"]
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    ref = x @ mat.dequantize().t()
    assert torch.allclose(Int4Linear(mat, torch.float32)(x), ref, atol=1e-5, rtol=1e-5)
    fast = Int4Linear(mat, torch.bfloat16)(x.bfloat16()).float()
    assert fast.shape == (rows, INTER)
    assert ((fast - ref).norm() / ref.norm()).item() < 1e-2
    # Against the product of the bfloat16-rounded weight, the int4 one is no further from the float32 reference.
    rounded = x.bfloat16() @ mat.dequantize().bfloat16().t()
    assert (fast - ref).norm() <= 1.5 * (rounded.float() - ref).norm()


def test_fused_rows_stack_in_order(tiny_gguf):
    path, _ = tiny_gguf
    layer = read_q4_linears(path, HEADS, KV_HEADS)[0]
    fused = Q4Matrix.cat([layer["q"], layer["k"], layer["v"]])
    assert torch.equal(fused.dequantize(), torch.cat([layer[n].dequantize() for n in ("q", "k", "v")]))
