"""Compile every kernel variant ahead of time for an NVIDIA architecture — no GPU needed.

`python -m dflash.kernels.compile_check [--arch 90]` lowers each kernel (all constexpr branches the dispatch can pick)
through Triton's full pipeline to a cubin with the ptxas that ships in the triton wheel. The interpreter runs
kernels as NumPy and does not type-check them; this catches the compiled-mode errors (types, unsupported ops)
on a CPU-only machine. It must run without TRITON_INTERPRET=1 (the kernels must be real `triton.jit` functions).
"""

from __future__ import annotations

import argparse
import itertools
import os
import time


def _signature(kernel, types: dict[str, str]) -> dict[str, str]:
    return {name: types.get(name, "constexpr") for name in kernel.arg_names}


def variants():
    """(name, kernel, argument types, constexpr values) for every branch the wrappers can launch."""
    from dflash.kernels.greedy_verify_triton import _match_verify_kernel
    from dflash.kernels.spec_sample_triton import _spec_sample_kernel

    match_types = {"logits_ptr": "*bf16", "stride_lb": "i32", "stride_lr": "i32", "noise_ptr": "*fp32", "stride_nb": "i32",
                   "stride_nr": "i32", "draft_ptr": "*i64", "stride_db": "i32", "choice_ptr": "*i32", "accepted_ptr": "*i32",
                   "relaxed_ptr": "*i8", "V": "i32", "n_draft": "i32", "temperature": "fp32", "top_k": "i32",
                   "top_p": "fp32", "log_a": "fp32"}
    for logits_dtype, (sampling, top_k, top_p, relax) in itertools.product(
            ("fp32", "bf16"), [(False, False, False, False), (False, False, False, True), (True, False, False, False),
                               (True, True, True, True), (True, True, False, False), (True, False, True, False)]):
        flags = dict(SCALE=sampling, TOP_K=top_k, TOP_P=top_p, NOISE=sampling, RELAX=relax, BLOCK_V=2048, BLOCK_R=256)
        name = f"match[{logits_dtype}] " + " ".join(k for k, v in flags.items() if v is True)
        yield name, _match_verify_kernel, {**match_types, "logits_ptr": "*" + logits_dtype}, flags

    spec_types = {"logits_ptr": "*fp32", "stride_lb": "i32", "stride_lr": "i32", "q_ptr": "*fp32", "stride_qb": "i32",
                  "stride_qr": "i32", "noise_ptr": "*fp32", "stride_nb": "i32", "stride_nr": "i32", "draft_ptr": "*i64",
                  "stride_db": "i32", "u_ptr": "*fp64", "stride_ub": "i32", "ptok_ptr": "*i32", "cand_ptr": "*i32",
                  "accepted_ptr": "*i32", "V": "i32", "n_draft": "i32", "temperature": "fp32", "top_k": "i32", "top_p": "fp32"}
    for onehot, top_k, top_p in [(True, False, False), (False, False, False), (False, True, True), (False, True, False),
                                 (False, False, True)]:
        flags = dict(ONEHOT=onehot, SCALE=not onehot, TOP_K=top_k, TOP_P=top_p, BLOCK_V=2048, BLOCK_R=256)
        yield "spec_sample " + " ".join(k for k, v in flags.items() if v is True), _spec_sample_kernel, spec_types, flags


QUICK = ("match[fp32] ", "match[bf16] SCALE TOP_K TOP_P NOISE RELAX", "spec_sample ONEHOT",
         "spec_sample SCALE TOP_K TOP_P")


def compile_all(arch: int = 90, num_warps: int = 4, quick: bool = False) -> list[tuple[str, int, float]]:
    """Returns (variant, cubin bytes, seconds) per variant; raises on the first compile error.
    quick: only the plainest and the fullest variant of each kernel (the rest are subsets of their code)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the kernels with Python functions")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    results = []
    for name, kernel, types, consts in variants():
        if quick and name not in QUICK:
            continue
        t0 = time.perf_counter()
        src = ASTSource(fn=kernel, signature=_signature(kernel, types),
                        constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
        compiled = triton.compile(src, target=target, options={"num_warps": num_warps, "enable_fp_fusion": False})
        results.append((name, len(compiled.asm["cubin"]), time.perf_counter() - t0))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90 = Hopper, 80 = Ampere)")
    parser.add_argument("--quick", action="store_true", help="the plainest and fullest variant of each kernel only")
    args = parser.parse_args(argv)
    import triton

    print(f"triton {triton.__version__}, target sm_{args.arch}")
    for name, size, seconds in compile_all(args.arch, quick=args.quick):
        print(f"compiled {name}: cubin {size} bytes in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
