#!/usr/bin/env bash
# scripts/gpu-verdicts.py against a GPU run of record: the kvc-bench-gpu CSV
# of the H200 run of 2026-11-28 (docs/perf), whose verdicts
# docs/performance.md states from the benchmark's own table.
#  1. The four targets: the counts and ranges of docs/performance.md
#     ("Decode against the 2026-11-26 run"), the closest miss of each, and
#     an alternative's range ("The changes since 654ce4a, measured":
#     fused_lru at head dim 64).
#  2. Two files: a cell of the later one replaces the earlier one's (one
#     bandwidth cell raised past 85%: 1 of 24 met).
#  3. Bad input: a file that is not there, a row that does not parse
#     (exit 2, naming the file and line).
# Usage: gpu_verdicts_test.sh SOURCE_DIR SCRATCH_DIR
set -uo pipefail
src=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
fail() {
  echo "gpu-verdicts test: $*" >&2
  exit 1
}
run=$src/scripts/gpu-verdicts.py
record=$src/docs/perf/h200-kvc-bench-gpu-2026-11-28.csv

# 1.
python3 "$run" "$record" > "$scratch/record.txt" 2>&1 ||
  fail "the 2026-11-28 CSV: exit $?: $(cat "$scratch/record.txt")"
expect() {
  grep -Fxq -- "$1" "$2" || fail "expected the line '$1' in: $(cat "$2")"
}
expect "copy bandwidth: 4264 GB/s ($record)" "$scratch/record.txt"
expect "bandwidth (>= 85% of copy, batch >= 8, context >= 4k): 0 of 24 cells met, 27.3% to 83.6%" "$scratch/record.txt"
expect "overhead (fused / plain - 1 <= 5%): 1 of 36 cells met, +4.5% to +52.1%" "$scratch/record.txt"
expect "unfused (unfused / fused >= 1.5x): 36 of 36 cells met, 1.51x to 1.96x" "$scratch/record.txt"
expect "int2 (16-bit / int2 >= 3x, context >= 16k): 0 of 18 cells met, 0.72x to 2.40x" "$scratch/record.txt"
grep -q "^  missed: d128 G1 B32 32k 83.6%, d128 G1 B8 32k 82.4%," "$scratch/record.txt" ||
  fail "the bandwidth misses, closest first: $(cat "$scratch/record.txt")"
grep -q "^  missed: d128 G1 B8 32k +6.0%, " "$scratch/record.txt" ||
  fail "the overhead misses, closest first: $(cat "$scratch/record.txt")"
expect "  fused_lru: d64 G4 0.95-1.13 (6); d64 G8 0.97-1.05 (5)" "$scratch/record.txt"

# 2. The cell d128 G1 B32 32k at 3700 GB/s (86.8% of 4264).
{
  head -1 "$record"
  grep '^copy,' "$record"
  grep '^decode,128,1,8,32,32768,' "$record" |
    awk -F, 'BEGIN { OFS = "," } { $12 = "3700.0"; print }'
} > "$scratch/later.csv"
python3 "$run" "$record" "$scratch/later.csv" > "$scratch/two.txt" 2>&1 ||
  fail "two files: exit $?: $(cat "$scratch/two.txt")"
expect "bandwidth (>= 85% of copy, batch >= 8, context >= 4k): 1 of 24 cells met, 27.3% to 86.8%" "$scratch/two.txt"

# 3.
python3 "$run" "$scratch/none.csv" > "$scratch/none.txt" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "a missing file: exit $status (expected 2)"
grep -q "gpu-verdicts: cannot read $scratch/none.csv: No such file or directory" "$scratch/none.txt" ||
  fail "a missing file: $(cat "$scratch/none.txt")"
{
  head -1 "$record"
  echo "decode,128,one,8,32,32768,1,us,1,1,1,1,1"
} > "$scratch/bad.csv"
python3 "$run" "$scratch/bad.csv" > "$scratch/bad.txt" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "a bad row: exit $status (expected 2)"
grep -q "gpu-verdicts: $scratch/bad.csv:2: cannot read the row" "$scratch/bad.txt" ||
  fail "a bad row: $(cat "$scratch/bad.txt")"

echo "gpu-verdicts: 3 scenarios passed"
