#!/usr/bin/env bash
# Builds the GPU executables here and gathers them into one folder that a
# machine with a GPU but without kvc's build tools (no LLVM, no MLIR) can
# run from a copy of this repository:
#   DIR/bin: kvc-gpu-kernel-*, kvc-gpu-tests-g1, -g3, -g8, -g3-grid and
#            -g8-grid (the GPU suite, check-kvc-gpu), kvc-bench-gpu (the
#            sweep, 104 policy
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
# Environment: KVC_GPU_PACK_ARCHITECTURES (default 90a: the H100 and H200
#        that the GPU machines are) sets the CUDA architectures of every
#        executable of the pack, the GPU suite's and the benchmark's policy
#        libraries alike: the driver runs the sm_90a code on an H100 or
#        H200 as it is, where the decode steps launch their attention and
#        fold as programmatic dependents (docs/codegen-cuda.md); "80" gives
#        an A100's, and "80;90a" both (about a third more compilation and
#        1.7 times the archive, docs/performance.md, for code an H100 never
#        runs). The pack builds in its own folder,
#        KVC_GPU_PACK_BUILD_DIR (default build-gpu-ARCHS, ';' as '-'),
#        configured as scripts/build.sh configures build/ with those
#        architectures, and builds only the pack's targets there (the host
#        code comes from ccache where build/ compiled it).
#        KVC_GPU_PACK_SMOKE_ONLY=1 leaves out the full kvc-bench-gpu (its
#        62 bundles, 104 policy libraries, take the longest to compile). KVC_GPU_PACK_ARCHIVE=FILE
#        also writes DIR as a gzip tar archive (its members named as DIR
#        is under the repository root, or by its own name elsewhere), for
#        a transfer that limits its bytes (the device tool: 64 MiB with
#        the repository); unpack it with `tar -xzf FILE` in the repository
#        root. docs/performance.md ("Commands") has the sizes and times.
#        The MANIFEST names the architectures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archs=${KVC_GPU_PACK_ARCHITECTURES:-90a}
if ! [[ $archs =~ ^[0-9]+[a-z]?(\;[0-9]+[a-z]?)*$ ]]; then
  echo "gpu-pack: KVC_GPU_PACK_ARCHITECTURES is '$archs', not a list of CUDA" \
       "architectures such as 90a or '80;90a'" >&2
  exit 2
fi
build=$(realpath -m "${KVC_GPU_PACK_BUILD_DIR:-$root/build-gpu-${archs//;/-}}")
dir=$(realpath -m "${1:-$root/.gpu}")
export CCACHE_BASEDIR=$root
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvc-ccache}

cached() { # cached VARIABLE: its value in the pack build's CMake cache
  sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"
}
configured() {
  [ "$(cached CMAKE_CUDA_FLAGS)" = -lineinfo ] &&
    [ "$(cached CMAKE_CUDA_ARCHITECTURES)" = "$archs" ] &&
    [ "$(cached KVC_GPU_TEST_ARCHITECTURES)" = "$archs" ] &&
    [ "$(cached KVC_GPU_BENCH_ARCHITECTURES)" = "$archs" ] &&
    [ "$(cached KVC_TEST_GRID_G8)" = ON ] &&
    [ "$(cached KVC_TEST_GPU_G3)" = ON ]
}
# The pack holds the suites that CI leaves out of its build too: the G = 8
# grid suite (KVC_TEST_GRID_G8; CI builds G = 3 on the emulator) and the
# G = 3 suites for the GPU (KVC_TEST_GPU_G3). Its device code carries line
# information (-lineinfo: the same machine code, with each instruction's
# file and line), which Nsight Compute's source counters
# (scripts/gpu-profile.sh's source pass) and compute-sanitizer's reports
# name.
arch_options=(-DCMAKE_CUDA_FLAGS=-lineinfo
              -DCMAKE_CUDA_ARCHITECTURES="$archs"
              -DKVC_GPU_TEST_ARCHITECTURES="$archs"
              -DKVC_GPU_BENCH_ARCHITECTURES="$archs"
              -DKVC_TEST_GRID_G8=ON -DKVC_TEST_GPU_G3=ON)
if [ ! -f "$build/build.ninja" ]; then
  "$root/scripts/setup.sh" >&2
  KVC_BUILD_DIR=$build KVC_BUILD_CONFIGURE_ONLY=1 \
    "$root/scripts/build.sh" "${arch_options[@]}" >/dev/null
elif ! configured; then
  cmake "${arch_options[@]}" "$build" >/dev/null
fi
if ! configured; then
  echo "gpu-pack: $build is not configured for $archs" \
       "(CMAKE_CUDA_FLAGS '$(cached CMAKE_CUDA_FLAGS)'," \
       "CMAKE_CUDA_ARCHITECTURES $(cached CMAKE_CUDA_ARCHITECTURES)," \
       "KVC_GPU_TEST_ARCHITECTURES $(cached KVC_GPU_TEST_ARCHITECTURES)," \
       "KVC_GPU_BENCH_ARCHITECTURES $(cached KVC_GPU_BENCH_ARCHITECTURES)," \
       "KVC_TEST_GRID_G8 $(cached KVC_TEST_GRID_G8)," \
       "KVC_TEST_GPU_G3 $(cached KVC_TEST_GPU_G3))" >&2
  exit 1
fi

targets=(kvc-gpu-kernel-mma-fragments kvc-gpu-kernel-kivi-decode
         kvc-gpu-kernel-decode-kernel
         kvc-gpu-kernel-prefill-kernel kvc-gpu-kernel-fold-slots
         kvc-gpu-tests-g1 kvc-gpu-tests-g3 kvc-gpu-tests-g8
         kvc-gpu-tests-g3-grid kvc-gpu-tests-g8-grid kvc-bench-gpu-smoke)
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
  echo "CUDA architectures (GPU suite and benchmark): $archs, with -lineinfo"
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
