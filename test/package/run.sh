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
  -DKVC_EXAMPLE_POLICY="$src/policies/streaming_llm.mlir" >/dev/null
cmake --build "$scratch/engine" >/dev/null
"$scratch/engine/engine"
if [ "$cuda" = ON ]; then
  "$scratch/engine/engine_gpu"
else
  echo "no nvcc: the CUDA backend of the example was not built"
fi
