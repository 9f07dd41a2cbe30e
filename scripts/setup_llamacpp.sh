#!/usr/bin/env bash
# Optional: llama.cpp's Python binding (llama-cpp-python, built from its PyPI sdist, ~8 min on 2 cores) in .venv, for
# the benchmark's `llama-cpp` method. CI does not build it; `bench` skips that method with one line when it is absent.
#
# It is built for this CPU's SIMD flags, never AMX: a VM may report amx_tile while its kernel refuses the tile
# registers (llama.cpp's AMX path then dies with SIGILL), so -march=native is not used.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
flags=$(grep -m1 -E '^flags' /proc/cpuinfo | cut -d: -f2)
has() { [[ " $flags " == *" $1 "* ]]; }
args="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
has avx && args+=" -DGGML_AVX=ON"
has avx2 && args+=" -DGGML_AVX2=ON"
has fma && args+=" -DGGML_FMA=ON"
has f16c && args+=" -DGGML_F16C=ON"
has avx512f && args+=" -DGGML_AVX512=ON"
has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
echo "building llama-cpp-python 0.3.36 with: $args"
CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) .venv/bin/pip install -q --no-deps --force-reinstall \
  --no-cache-dir llama-cpp-python==0.3.36 diskcache==5.6.3
