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
#        policy of the test fails the run), KVC_GPU_TEST_JOBS (how many
#        test executables run at once, default 1: one after another; with
#        more, each one's output is held until it ends and then printed
#        whole, in the order of a sequential run; stopped by a signal, the
#        script prints what each had written so far).
# Exit status: 0 every geometry passed, 1 one failed (or the run was
#        stopped), 2 an unknown geometry or KVC_GPU_TEST_JOBS, 77 no usable
#        GPU.
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
at_once=${KVC_GPU_TEST_JOBS:-1}
if ! [[ $at_once =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu-test: KVC_GPU_TEST_JOBS='$at_once' is not a whole number of executables (1 or more)" >&2
  exit 2
fi
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

# The executables to run, in order: a name, its path and its policies
# ('-': KVC_GPU_TEST_POLICIES as given; the title says "all" when unset).
names=()
exes=()
policies=()
for g in "${geometries[@]}"; do
  if [ "$g" = kernels ]; then
    for t in "${kernel_tests[@]}"; do
      names+=("$t")
      exes+=("$bin/$t")
      policies+=(-)
    done
  elif [ "${g%-grid}" != "$g" ]; then
    list=${KVC_GPU_TEST_POLICIES:-$grid_policies}
    [ "$g" = g3-grid ] && [ -z "${KVC_GPU_TEST_POLICIES:-}" ] &&
      list=$list,duo_small
    names+=("kvc-gpu-tests-$g")
    exes+=("$bin/kvc-gpu-tests-$g")
    policies+=("$list")
  else
    names+=("kvc-gpu-tests-$g")
    exes+=("$bin/kvc-gpu-tests-$g")
    policies+=(-)
  fi
done
# title I: the line before executable I's output.
title() {
  local name=${names[$1]} list=${policies[$1]}
  case $name in
    kvc-gpu-kernel-*) echo "== $name ==" ;;
    *) [ "$list" = - ] && list=${KVC_GPU_TEST_POLICIES:-all}
       echo "== $name (policies: $list) ==" ;;
  esac
}
# execute I: runs executable I (its output to stdout), then prints its
# verdict line; returns 0 passed, 77 skipped, 1 failed.
execute() {
  local name=${names[$1]} exe=${exes[$1]} list=${policies[$1]}
  if [ ! -x "$exe" ]; then
    echo "gpu-test: $exe is missing" >&2
    return 1
  fi
  local start status seconds
  start=$(date +%s)
  if [ "$list" = - ]; then
    "$exe"
  else
    KVC_GPU_TEST_POLICIES=$list "$exe"
  fi
  status=$?
  seconds=$(($(date +%s) - start))
  case $status in
    0) echo "-- $name: passed ($seconds s)"; return 0 ;;
    77) echo "-- $name: skipped (no usable CUDA device)"; return 77 ;;
    *) echo "-- $name: FAILED (exit $status, $seconds s)"; return 1 ;;
  esac
}
passed=0
skipped=0
failed=0
# tally STATUS: counts an execute's return status.
tally() {
  case $1 in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
}
if [ "$at_once" -eq 1 ]; then
  for i in "${!names[@]}"; do
    title "$i"
    execute "$i"
    tally $?
  done
else
  held=$(mktemp -d "${TMPDIR:-/tmp}/kvc-gpu-test.XXXXXX") || exit 1
  started=0
  # show_held: every started executable's title and output so far, in
  # order, with its verdict where it ended (a stopped run's record).
  show_held() {
    local i
    for ((i = 0; i < started; ++i)); do
      title "$i"
      cat "$held/$i.out" 2>/dev/null
      [ -f "$held/$i.status" ] || echo "-- ${names[$i]}: stopped before it ended"
    done
  }
  # stop: the main shell's answer to a signal (a subshell that has not yet
  # reset the trap it was forked with only ends). It ignores the signals
  # that follow: timeout(1) signals the script, then its whole process
  # group, the script included.
  stop() {
    [ "$BASHPID" = "$$" ] || exit 1
    trap '' TERM INT
    kill $(jobs -p) 2>/dev/null
    show_held
    rm -rf "$held"
    exit 1
  }
  trap stop TERM INT
  for i in "${!names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$at_once" ]; do
      wait -n
    done
    ( trap - TERM INT
      execute "$i" > "$held/$i.out" 2>&1
      echo $? > "$held/$i.status.partial" && mv "$held/$i.status.partial" "$held/$i.status" ) &
    started=$((started + 1))
  done
  wait
  trap - TERM INT
  for i in "${!names[@]}"; do
    title "$i"
    cat "$held/$i.out"
    tally "$(cat "$held/$i.status")"
  done
  rm -rf "$held"
fi
gpu_finish gpu-test passed "$passed" "$skipped" "$failed"
