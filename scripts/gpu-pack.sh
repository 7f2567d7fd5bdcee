#!/usr/bin/env bash
# Builds the GPU executables here and gathers them into one folder that a
# machine with a GPU but without kvc's build tools (no LLVM, no MLIR) can
# run from a copy of this repository:
#   DIR/bin: kvc-gpu-kernel-* and kvc-gpu-tests-g1, -g3, -g8 (the GPU
#            suite, check-kvc-gpu), kvc-bench-gpu (the sweep, 100 policy
#            libraries) and kvc-bench-gpu-smoke;
#   DIR/lib: the CUDA runtime they were linked against (libcudart.so.*);
#   DIR/MANIFEST: the commit, the toolkit and each file's SHA-256.
# On the GPU machine, from the repository root:
#   export KVC_GPU_BIN=$PWD/DIR/bin LD_LIBRARY_PATH=$PWD/DIR/lib
#   scripts/gpu-test.sh && scripts/gpu-sanitize.sh && scripts/gpu-bench.sh
# (each takes its executables from KVC_GPU_BIN and builds nothing).
#
# Usage: scripts/gpu-pack.sh [DIR]   (default: .gpu under the repository
#        root, which .gitignore leaves out of git)
# Environment: KVC_BUILD_DIR (default build), KVC_GPU_PACK_SMOKE_ONLY=1
#        leaves out the full kvc-bench-gpu (its 60 libraries take the
#        longest to compile), KVC_GPU_PACK_ARCHIVE=FILE also writes DIR as
#        a gzip tar archive (its members named as DIR is under the
#        repository root, or by its own name elsewhere): the folder is
#        about 80 MB, its archive about 35 MB (120 MB and 51 MiB with the
#        suite for "80;90a", below), for a transfer that limits the bytes;
#        unpack it with `tar -xzf FILE` in the repository root.
#        KVC_GPU_TEST_ARCHITECTURES=LIST sets the build's cache variable of
#        that name first (the GPU suite's architectures, default 80): with
#        "80;90a" an H100 or H200 runs the suite's sm_90a code, where the
#        decode steps launch their attention and fold as programmatic
#        dependents (docs/codegen-cuda.md), rather than the sm_80 PTX,
#        where they do not. The MANIFEST names the architectures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
dir=$(realpath -m "${1:-$root/.gpu}")
export CCACHE_BASEDIR=$root
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvc-ccache}

if [ -n "${KVC_GPU_TEST_ARCHITECTURES:-}" ]; then
  cmake -DKVC_GPU_TEST_ARCHITECTURES="$KVC_GPU_TEST_ARCHITECTURES" "$build" \
    >/dev/null
fi
archs=$(sed -n 's/^KVC_GPU_TEST_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")

targets=(kvc-gpu-kernel-kivi-decode kvc-gpu-kernel-decode-kernel
         kvc-gpu-kernel-prefill-kernel kvc-gpu-kernel-fold-slots
         kvc-gpu-tests-g1 kvc-gpu-tests-g3 kvc-gpu-tests-g8 kvc-bench-gpu-smoke)
[ "${KVC_GPU_PACK_SMOKE_ONLY:-0}" = 1 ] || targets+=(kvc-bench-gpu)
# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
# Always from this build, whatever KVC_GPU_BIN says.
KVC_GPU_BIN= gpu_executables "${targets[@]}"

rm -rf "$dir/bin" "$dir/lib"
mkdir -p "$dir/bin" "$dir/lib"
for t in "${targets[@]}"; do
  cp "$bin/$t" "$dir/bin/"
done
# The CUDA runtime the executables load (shared unless CMake linked it
# statically): the GPU machine's driver may come without the toolkit's.
cudart=$(ldd "$bin/kvc-gpu-tests-g1" | awk '/libcudart\.so/ {print $3; exit}')
if [ -n "$cudart" ]; then
  cp -L "$cudart" "$dir/lib/$(basename "$cudart")"
fi

{
  echo "kvc GPU pack, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
       "$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo '(with local changes)')"
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "nvcc: $("$nvcc" --version 2>/dev/null | tail -1 || echo unknown)"
  echo "GPU suite architectures: ${archs:-unknown}"
  (cd "$dir" && sha256sum bin/* lib/* 2>/dev/null)
} > "$dir/MANIFEST"
echo "gpu-pack: $(du -sh "$dir" | cut -f1) in $dir (MANIFEST lists the files)" >&2
if [ -n "${KVC_GPU_PACK_ARCHIVE:-}" ]; then
  archive=$(realpath -m "$KVC_GPU_PACK_ARCHIVE")
  mkdir -p "$(dirname "$archive")"
  case $dir in
    "$root"/*) tar -C "$root" -czf "$archive" "${dir#"$root"/}" ;;
    *) tar -C "$(dirname "$dir")" -czf "$archive" "$(basename "$dir")" ;;
  esac
  echo "gpu-pack: $(du -sh "$archive" | cut -f1) archive in $archive" >&2
fi
# Where the folder is inside the repository, the GPU machine's copy has it
# at the same place under its root.
case $dir in
  "$root"/*) there="\$PWD/${dir#"$root"/}" ;;
  *) there=$dir ;;
esac
echo "gpu-pack: on the GPU machine: export KVC_GPU_BIN=$there/bin" \
     "LD_LIBRARY_PATH=$there/lib" >&2
