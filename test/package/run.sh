#!/usr/bin/env bash
# Installs the kvc build tree into a scratch prefix, builds the example engine
# against the installed package and runs it.
# Usage: run.sh <kvc build dir> <kvc source dir> <scratch dir>
set -euo pipefail
build=$1 src=$2 scratch=$3
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
# The CUDA backend too where nvcc exists (built and linked; it needs no GPU).
cuda=OFF
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc" ]; then
  cuda=ON
fi
cmake -G Ninja -S "$src/test/package" -B "$scratch/engine" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DKVC_EXAMPLE_CUDA=$cuda \
  -DKVC_EXAMPLE_POLICY="$src/policies/streaming_llm.mlir" \
  -DKVC_EXAMPLE_SECOND_POLICY="$src/policies/h2o.mlir" >/dev/null
cmake --build "$scratch/engine" >/dev/null
"$scratch/engine/engine" | tee "$scratch/engine.out"
# The bundled library: the same output, and both policies' entry points.
"$scratch/engine/engine_bundled" > "$scratch/engine_bundled.out"
if ! cmp -s "$scratch/engine.out" "$scratch/engine_bundled.out"; then
  echo "engine_bundled differs from engine:" >&2
  diff "$scratch/engine.out" "$scratch/engine_bundled.out" >&2
  exit 1
fi
symbols=$(nm -g --defined-only "$scratch/engine/libengine_bundle.a")
for symbol in kvc_streaming_llm_cpu_decode kvc_h2o_cpu_decode; do
  if ! grep -q " T $symbol\$" <<<"$symbols"; then
    echo "libengine_bundle.a does not define $symbol" >&2
    exit 1
  fi
done
echo "engine_bundled (streaming_llm and h2o in one translation unit): same output"
if [ "$cuda" = ON ]; then
  "$scratch/engine/engine_gpu"
else
  echo "no nvcc: the CUDA backend of the example was not built"
fi
