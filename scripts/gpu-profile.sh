#!/usr/bin/env bash
# Nsight Compute figures of one decode cell's kernels, per variant: each
# kernel launch's GPU time, DRAM bytes read and written, and registers per
# thread, after kvc-bench-gpu's warm-up; for the KIVI variants (int2,
# int4) also why the warps stalled (the WarpStateStats and SchedulerStats
# sections). These are the figures docs/performance.md's "Where the time
# goes" quotes: the fold's DRAM bytes against the attention's, and what
# bounds the KIVI attention kernel.
#
# The caches are left as the kernel before left them (--cache-control
# none): the fold reads the logits and score state that the attention has
# just written, and whether those reads reach DRAM is what its byte counts
# are for. Nsight Compute's default (all) empties L2 before every profiled
# kernel, so that every kernel reads all its bytes from DRAM; the profiles
# of 2026-11-26 and 2026-11-28 (docs/perf/h200-ncu-*.txt) were taken that
# way. KVC_GPU_PROFILE_CACHE=all takes them so again.
#
# Then, per variant, a source pass: where the decode kernels' warps
# stall, instruction by instruction (the SourceCounters section's warp
# samples per stall reason and instructions executed; the pack's kernels
# are built with -lineinfo, so that each instruction has its file and
# line): 4 launches of the kernels whose names begin with "decode" (the
# attention, the fold), after 8 of them, into a report that
# scripts/ncu-source.py reads there (with Nsight Compute's own Python
# module) into OUT/ncu-VARIANT-source.txt (by function and by line) and
# OUT/ncu-VARIANT-source.json.gz (every instruction's counters, which
# ncu-source.py reads back here without Nsight Compute). The report itself
# is kept only where ncu-source.py found no module to read it, and only
# up to 4 MB (the device tool returns files of 16 MiB at most, the whole
# archive of a GPU run being one). KVC_GPU_PROFILE_SOURCE=0 leaves the
# source pass out.
#
# Usage: scripts/gpu-profile.sh [VARIANT...]   (default: fused int2; any
#        --variants value of kvc-bench-gpu)
# Environment: KVC_GPU_BIN (prebuilt executables, scripts/gpu-pack.sh) or
#        KVC_BUILD_DIR; KVC_GPU_PROFILE_OUT (folder of the reports, default
#        build/gpu-profile); KVC_GPU_PROFILE_CELL (the cell, as
#        kvc-bench-gpu options; default --batch=8 --context=32k --dim=128
#        --group=4, the cell of docs/perf/h200-ncu-decode.txt);
#        KVC_GPU_PROFILE_CACHE (ncu's --cache-control, none or all;
#        default none); KVC_GPU_PROFILE_SOURCE (1, the default, or 0).
# Output: OUT/ncu-VARIANT.txt per variant, the command at its head; with
#        the source pass OUT/ncu-VARIANT-source.txt and .json.gz.
# Exit status: 0 when every variant was profiled, 1 when one failed, 77
#        when there is no CUDA device or no ncu (nothing measured).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
out=$(realpath -m "${KVC_GPU_PROFILE_OUT:-$build/gpu-profile}")
read -r -a cell <<< "${KVC_GPU_PROFILE_CELL:---batch=8 --context=32k --dim=128 --group=4}"
variants=("$@")
cache=${KVC_GPU_PROFILE_CACHE:-none}
case $cache in
  none | all) ;;
  *) echo "gpu-profile: KVC_GPU_PROFILE_CACHE must be none or all, not '$cache'"
     exit 1 ;;
esac
source_pass=${KVC_GPU_PROFILE_SOURCE:-1}
case $source_pass in
  0 | 1) ;;
  *) echo "gpu-profile: KVC_GPU_PROFILE_SOURCE must be 0 or 1, not '$source_pass'"
     exit 1 ;;
esac
[ ${#variants[@]} -eq 0 ] && variants=(fused int2)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-profile: SKIP: no CUDA device (nvidia-smi lists none)"
  exit 77
fi
if ! ncu=$(command -v ncu); then
  echo "gpu-profile: SKIP: Nsight Compute (ncu) is not installed"
  exit 77
fi
# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
gpu_executables kvc-bench-gpu || exit 1
bench=$bin/kvc-bench-gpu
mkdir -p "$out"

metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,launch__registers_per_thread
failed=0
for variant in "${variants[@]}"; do
  sections=()
  case $variant in
    int2 | int4) sections=(--section WarpStateStats --section SchedulerStats) ;;
  esac
  # 40 launches skipped (the copy-bandwidth kernel's 21 and the warm-up
  # round), then 12: four to six steps of two or three kernels each.
  # Rounds of 8 steps, so that a run makes enough launches (more than 60)
  # at two or three kernels a step.
  command=("$ncu" --clock-control none --cache-control "$cache"
           --launch-skip 40 --launch-count 12
           --metrics "$metrics" "${sections[@]}"
           "$bench" "${cell[@]}" --variants="$variant" --prefill-context=none
           --model-context=none --alt-context=none --host-context=none
           --min-ms=1 --steps=8)
  report=$out/ncu-$variant.txt
  {
    echo "# Nsight Compute, $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)," \
         "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "# ${command[*]}"
    echo "# (the table that the profiled run prints is not a measurement:" \
         "every kernel ran under the profiler)"
  } > "$report"
  echo "== gpu-profile: $variant -> $report =="
  "${command[@]}" >> "$report" 2>&1
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "gpu-profile: ncu failed on $variant with status $status (see $report)"
    failed=1
  fi
  grep -E '^  [A-Za-z_]+.*\(|gpu__time_duration|dram__bytes|registers_per_thread|Stall|Issued Warp|No Eligible|Active Warps|Eligible Warps' \
    "$report" | head -120
  [ "$source_pass" = 1 ] || continue

  # The source pass (above): the decode kernels' launches 9 to 12.
  stem=$out/ncu-$variant-source
  command=("$ncu" --clock-control none --cache-control "$cache"
           --kernel-name regex:^decode --launch-skip 8 --launch-count 4
           --section SourceCounters --section WarpStateStats
           --import-source no --force-overwrite --export "$stem"
           "$bench" "${cell[@]}" --variants="$variant" --prefill-context=none
           --model-context=none --alt-context=none --host-context=none
           --min-ms=1 --steps=8)
  echo "== gpu-profile: $variant, source pass -> $stem.txt =="
  {
    echo "# ${command[*]}"
    "${command[@]}" 2>&1
  } > "$stem.log"
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "gpu-profile: ncu's source pass failed on $variant with status" \
         "$status (see $stem.log)"
    failed=1
    continue
  fi
  python3 "$root/scripts/ncu-source.py" --top=40 --sass=20 \
    --dump="$stem.json.gz" "$stem.ncu-rep" > "$stem.txt" 2>&1
  status=$?
  case $status in
    0) rm -f "$stem.ncu-rep"
       head -40 "$stem.txt" ;;
    77) # No ncu_report module: the report stays for reading elsewhere.
       cat "$stem.txt"
       if [ -f "$stem.ncu-rep" ] &&
          [ "$(stat -c %s "$stem.ncu-rep")" -gt 4000000 ]; then
         rm -f "$stem.ncu-rep"
         echo "gpu-profile: $stem.ncu-rep left out (over 4 MB)"
       fi ;;
    *) echo "gpu-profile: scripts/ncu-source.py failed on $variant with" \
            "status $status (see $stem.txt)"
       failed=1 ;;
  esac
done
exit "$failed"
