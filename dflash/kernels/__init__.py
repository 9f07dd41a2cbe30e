"""Triton kernels for speculative-decoding verification, with their launch code. Nothing else.

- `greedy_verify_triton.match_verify_batched`: the *match* rule (greedy, the target's own Gumbel-max sample,
  the relaxed threshold) over a block of B sequences.
- `spec_sample_triton.speculative_verify_batched`: lossless speculative sampling (accept / residual / bonus).
- `_triton_common`: the shared per-row building blocks (top-k / top-p by radix select, running argmax).
- `compile_check`: compiles every kernel variant for an NVIDIA architecture without a GPU.

This package imports no other `dflash` module (imports run one way: engine → verification → kernels). The PyTorch
reference each kernel must match, and the choice between kernels and reference (`DFLASH_KERNELS`), live in
`dflash.verification.verify` and `dflash.verification.verify_dispatch`. Importing the package imports neither torch
nor Triton; the kernel modules import both.
"""
