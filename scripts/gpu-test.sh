#!/usr/bin/env bash
# The GPU suite (what `ninja -C build check-kvc-gpu` runs) without ctest:
# kvc-gpu-tests-g1, -g3 and -g8, every bundled policy's CUDA kernels side by
# side with the CPU backend, one geometry each. Builds them first, unless
# KVC_GPU_BIN names a folder of prebuilt executables (scripts/gpu-pack.sh).
#
# Usage: scripts/gpu-test.sh [g1 g3 g8]
# Environment: KVC_BUILD_DIR, KVC_GPU_BIN, KVC_GPU_TEST_POLICIES (a comma-
#        separated subset of the policies; default every one; a name that
#        is not a policy of the test fails the run).
# Exit status: 0 every geometry passed, 1 one failed, 77 no usable GPU.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
geometries=("$@")
[ ${#geometries[@]} -gt 0 ] || geometries=(g1 g3 g8)
for g in "${geometries[@]}"; do
  case $g in
    g1 | g3 | g8) ;;
    *) echo "gpu-test: unknown geometry '$g' (g1, g3 or g8)" >&2; exit 2 ;;
  esac
done

# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
targets=()
for g in "${geometries[@]}"; do targets+=("kvc-gpu-tests-$g"); done
gpu_executables "${targets[@]}" || exit 1

passed=0
skipped=0
failed=0
for g in "${geometries[@]}"; do
  exe=$bin/kvc-gpu-tests-$g
  if [ ! -x "$exe" ]; then
    echo "gpu-test: $exe is missing" >&2
    failed=$((failed + 1))
    continue
  fi
  echo "== kvc-gpu-tests-$g (policies: ${KVC_GPU_TEST_POLICIES:-all}) =="
  start=$(date +%s)
  "$exe"
  status=$?
  seconds=$(($(date +%s) - start))
  case $status in
    0) echo "-- kvc-gpu-tests-$g: passed ($seconds s)"; passed=$((passed + 1)) ;;
    77) echo "-- kvc-gpu-tests-$g: skipped (no usable CUDA device)"; skipped=$((skipped + 1)) ;;
    *) echo "-- kvc-gpu-tests-$g: FAILED (exit $status, $seconds s)"; failed=$((failed + 1)) ;;
  esac
done
gpu_finish gpu-test passed "$passed" "$skipped" "$failed"
