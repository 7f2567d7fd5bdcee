#!/usr/bin/env bash
# Configures and builds kvc into ${KVC_BUILD_DIR:-build}; arguments are
# CMake options for a first configuration. KVC_BUILD_CONFIGURE_ONLY=1
# configures and builds nothing (scripts/gpu-pack.sh builds its targets
# alone).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
export CCACHE_BASEDIR=$root
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvc-ccache}
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    -DLLVM_USE_LINKER=lld \
    -DPython3_EXECUTABLE=/usr/bin/python3 \
    "$@"
fi
[ "${KVC_BUILD_CONFIGURE_ONLY:-0}" = 1 ] && exit 0
ninja -C "$build"
