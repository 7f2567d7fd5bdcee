#!/usr/bin/env bash
# The GPU suite (what `ninja -C build check-kvc-gpu` runs) without ctest:
# first the kernel tests (kvc-gpu-kernel-*: the KIVI and 16-bit decode
# kernels, the prefill bodies and the fold's slot work alone, each against
# its double-precision host reference, as the CUDA emulator runs them), then
# kvc-gpu-tests-g1, -g3 and -g8, every bundled policy's CUDA kernels side by
# side with the CPU backend, one geometry each, and kvc-gpu-tests-g3-grid
# and -g8-grid, the policies with a decode fold built with their statistics
# folded in the attention grid (KVC_CUDA_FOLD_IN_GRID=1). Builds them first,
# unless KVC_GPU_BIN names a folder of prebuilt executables
# (scripts/gpu-pack.sh).
#
# Usage: scripts/gpu-test.sh [kernels g1 g3 g8 g3-grid g8-grid]
#        (default: all six)
# Environment: KVC_BUILD_DIR, KVC_GPU_BIN, KVC_GPU_TEST_POLICIES (a comma-
#        separated subset of the policies; default every one, and for the
#        grid geometries those with a decode fold; a name that is not a
#        policy of the test fails the run).
# Exit status: 0 every geometry passed, 1 one failed, 77 no usable GPU.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
geometries=("$@")
[ ${#geometries[@]} -gt 0 ] || geometries=(kernels g1 g3 g8 g3-grid g8-grid)
for g in "${geometries[@]}"; do
  case $g in
    kernels | g1 | g3 | g8 | g3-grid | g8-grid) ;;
    *) echo "gpu-test: unknown geometry '$g' (kernels, g1, g3, g8, g3-grid or g8-grid)" >&2; exit 2 ;;
  esac
done
# The policies whose decode has a fold (kvc_gpu_grid_policies of
# test/gpu/GpuPolicies.cmake; duo_small at G = 3 only).
grid_policies=streaming_llm,h2o,tova,h2o_merge,d2o,scissorhands,rpc_small
kernel_tests=(kvc-gpu-kernel-mma-fragments kvc-gpu-kernel-kivi-decode
              kvc-gpu-kernel-decode-kernel
              kvc-gpu-kernel-prefill-kernel kvc-gpu-kernel-fold-slots)

# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
targets=()
for g in "${geometries[@]}"; do
  if [ "$g" = kernels ]; then
    targets+=("${kernel_tests[@]}")
  else
    targets+=("kvc-gpu-tests-$g")
  fi
done
# The G = 8 grid suite is built where KVC_TEST_GRID_G8 is on, the G = 3
# suites where KVC_TEST_GPU_G3 is (the pack turns both on; CI's build
# leaves them out): turn them on in this build when asked.
# enable OPTION GEOMETRY...: OPTION on in $build if one of GEOMETRY is asked.
enable() {
  local option=$1 g
  shift
  [ -z "${KVC_GPU_BIN:-}" ] && [ -f "$build/CMakeCache.txt" ] || return 0
  grep -q "^$option:BOOL=ON\$" "$build/CMakeCache.txt" && return 0
  for g in "$@"; do
    if [[ " ${geometries[*]} " == *" $g "* ]]; then
      echo "gpu-test: turning $option on in $build for $g" >&2
      cmake "-D$option=ON" "$build" >/dev/null || exit 1
      return 0
    fi
  done
}
enable KVC_TEST_GRID_G8 g8-grid
enable KVC_TEST_GPU_G3 g3 g3-grid
gpu_executables "${targets[@]}" || exit 1

passed=0
skipped=0
failed=0
# run NAME EXE: one executable, tallied.
run() {
  local name=$1 exe=$2
  if [ ! -x "$exe" ]; then
    echo "gpu-test: $exe is missing" >&2
    failed=$((failed + 1))
    return
  fi
  local start status seconds
  start=$(date +%s)
  "$exe"
  status=$?
  seconds=$(($(date +%s) - start))
  case $status in
    0) echo "-- $name: passed ($seconds s)"; passed=$((passed + 1)) ;;
    77) echo "-- $name: skipped (no usable CUDA device)"; skipped=$((skipped + 1)) ;;
    *) echo "-- $name: FAILED (exit $status, $seconds s)"; failed=$((failed + 1)) ;;
  esac
}
for g in "${geometries[@]}"; do
  if [ "$g" = kernels ]; then
    for t in "${kernel_tests[@]}"; do
      echo "== $t =="
      run "$t" "$bin/$t"
    done
  elif [ "${g%-grid}" != "$g" ]; then
    policies=${KVC_GPU_TEST_POLICIES:-$grid_policies}
    [ "$g" = g3-grid ] && [ -z "${KVC_GPU_TEST_POLICIES:-}" ] &&
      policies=$policies,duo_small
    echo "== kvc-gpu-tests-$g (policies: $policies) =="
    KVC_GPU_TEST_POLICIES=$policies run "kvc-gpu-tests-$g" "$bin/kvc-gpu-tests-$g"
  else
    echo "== kvc-gpu-tests-$g (policies: ${KVC_GPU_TEST_POLICIES:-all}) =="
    run "kvc-gpu-tests-$g" "$bin/kvc-gpu-tests-$g"
  fi
done
gpu_finish gpu-test passed "$passed" "$skipped" "$failed"
