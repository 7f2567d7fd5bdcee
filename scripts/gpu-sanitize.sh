#!/usr/bin/env bash
# compute-sanitizer over the CUDA backend: memcheck (out-of-bounds and
# misaligned accesses, leaks) and racecheck (shared-memory hazards) on the
# GPU test executables (test/gpu) and a small run of the GPU benchmark.
#
# Representative subset, to keep the sanitizers' slowdown affordable (on an
# H100: about 12 s per memcheck run below, 35 s for racecheck on H2O; the
# whole of kvc-gpu-tests-g1 under racecheck takes well over 2 minutes):
#  - memcheck: kvc-gpu-tests-g1 (f32, G=1, 2 kv-heads) and kvc-gpu-tests-g8
#    (bf16, head dim 128, G=8) on the policies of KVC_SANITIZE_POLICIES
#    (one of each kind of kernel: streaming, accumulated attention, window
#    statistics, last-query, merging, KIVI pages, two page classes), and
#    kvc-bench-gpu-smoke (f16, head dim 128, G=4; batch 2, context 1k,
#    prefill 1k, and the kernel alternatives at 1k: the decodes on CUDA
#    cores that the tensor-core paths replaced, and the prefills on CUDA
#    cores, prefill_cc and h2o_cc);
#  - both: kvc-gpu-kernel-kivi-decode (the KIVI decode kernel alone, every
#    path: the tensor-core and CUDA-core tiles, whose warps stage each tile
#    in shared memory between __syncwarp, and the row groups; a few
#    seconds);
#  - racecheck: kvc-gpu-tests-g1 and kvc-gpu-tests-g8 on
#    KVC_SANITIZE_RACE_POLICIES (H2O: its prefill and decode kernels use
#    every shared-memory tile and reduction of the backend; g8's decode
#    attention runs on tensor cores, decodeMmaRows; about 5 minutes on an
#    H100 for g8; both prefill on tensor cores, prefillAttentionMma and
#    prefillColumnStatsMma), and kvc-bench-gpu-smoke's prefill table at 1k
#    with one small plain decode (the CUDA-core prefill kernels' shared-
#    memory tiles: prefillAttentionTiles, prefillColumnStatsTiles).
# The test executables take the policy list from KVC_GPU_TEST_POLICIES.
#
# Usage: scripts/gpu-sanitize.sh
# Environment: KVC_BUILD_DIR, KVC_GPU_BIN (a folder of prebuilt executables,
# scripts/gpu-pack.sh: nothing is built), KVC_SANITIZE_TOOLS (default "memcheck
# racecheck"; synccheck and initcheck also work, with the memcheck subset),
# KVC_SANITIZE_POLICIES, KVC_SANITIZE_RACE_POLICIES ("all": every policy),
# KVC_SANITIZE_TIMEOUT (seconds per run, default 3600), KVC_SANITIZE_SUBSET
# (all, the default, or kernel: kvc-gpu-kernel-kivi-decode alone under each
# tool, a few seconds each).
# Exit status: 0 clean, 1 a sanitizer or test failed, 77 skipped (no GPU or
# no compute-sanitizer).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
tools=${KVC_SANITIZE_TOOLS:-memcheck racecheck}
policies=${KVC_SANITIZE_POLICIES:-streaming_llm,h2o,snapkv,tova,merge_nearest,kivi2,mixed_precision}
race_policies=${KVC_SANITIZE_RACE_POLICIES:-h2o}
limit=${KVC_SANITIZE_TIMEOUT:-3600}
subset=${KVC_SANITIZE_SUBSET:-all}
case $subset in
  all | kernel) ;;
  *) echo "gpu-sanitize: KVC_SANITIZE_SUBSET is '$subset', not all or kernel" >&2; exit 2 ;;
esac

sanitizer=$(command -v compute-sanitizer || true)
for candidate in /usr/local/cuda/bin/compute-sanitizer \
                 /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$sanitizer" ] && [ -x "$candidate" ] && sanitizer=$candidate
done
if [ -z "$sanitizer" ]; then
  echo "gpu-sanitize: SKIP: compute-sanitizer not found (PATH, /usr/local/cuda);" \
       "it ships with the CUDA toolkit."
  exit 77
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-sanitize: SKIP: no CUDA device (nvidia-smi lists none); compute-sanitizer needs one."
  exit 77
fi

# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
gpu_executables kvc-gpu-kernel-kivi-decode kvc-gpu-tests-g1 kvc-gpu-tests-g8 \
  kvc-bench-gpu-smoke || exit 1

bench_args=(--batch=2 --context=1k --prefill-context=1k --alt-context=1k --min-ms=1 --steps=2)
# racecheck: the prefill table (every prefill, the CUDA-core ones
# included) and the least of the rest that --check allows.
race_bench_args=(--check --variants=plain --model-context=none --alt-context=none --prefill-context=1k)
failures=0
ran=0
skipped=0

# run <tool> <policies> <executable> [args...]: <policies> narrows a test
# executable (KVC_GPU_TEST_POLICIES; "all" or "-": every policy).
run() {
  local tool=$1 only=$2 exe=$3
  shift 3
  local extra=()
  [ "$tool" = memcheck ] && extra+=(--leak-check full)
  [ "$only" = all ] && only=-
  echo "== compute-sanitizer --tool $tool $(basename "$exe") $* (policies: $only) =="
  KVC_GPU_TEST_POLICIES=${only#-} timeout "$limit" "$sanitizer" --tool "$tool" \
    "${extra[@]}" --error-exitcode 99 "$exe" "$@"
  local status=$?
  case $status in
    0) echo "-- $tool $(basename "$exe"): clean"; ran=$((ran + 1)) ;;
    77) echo "-- $tool $(basename "$exe"): skipped (no usable device)"; skipped=$((skipped + 1)) ;;
    99) echo "-- $tool $(basename "$exe"): SANITIZER ERRORS"; failures=$((failures + 1)) ;;
    124) echo "-- $tool $(basename "$exe"): TIMEOUT after $limit s"; failures=$((failures + 1)) ;;
    *) echo "-- $tool $(basename "$exe"): FAILED (exit $status)"; failures=$((failures + 1)) ;;
  esac
}

for tool in $tools; do
  run "$tool" - "$bin/kvc-gpu-kernel-kivi-decode"
  [ "$subset" = kernel ] && continue
  if [ "$tool" = racecheck ]; then
    run "$tool" "$race_policies" "$bin/kvc-gpu-tests-g1"
    run "$tool" "$race_policies" "$bin/kvc-gpu-tests-g8"
    run "$tool" - "$bin/kvc-bench-gpu-smoke" "${race_bench_args[@]}"
    continue
  fi
  run "$tool" "$policies" "$bin/kvc-gpu-tests-g1"
  run "$tool" "$policies" "$bin/kvc-gpu-tests-g8"
  run "$tool" - "$bin/kvc-bench-gpu-smoke" "${bench_args[@]}"
done

gpu_finish gpu-sanitize clean "$ran" "$skipped" "$failures"
