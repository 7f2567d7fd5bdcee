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
#  4. Predictions: ranges inside, below and across the measured ratios of
#     fused_lru at head dim 64, G = 4 (0.95 to 1.13 over 6 cells), one
#     that names no measured cell; the bundled next.predictions reads
#     whole; a malformed line stops the run (exit 2, naming the line).
#  5. Against the run before (--before: the H200 run of 2026-11-26, whose
#     CSV names its third time column as it was then): the cells
#     docs/performance.md compares ("Decode against the 2026-11-26 run",
#     "The changes since 654ce4a, measured").
#  6. The model step, prefill and host rows: the model step of the H200 run
#     of 2026-11-26 and the prefill of the H100 run of 2026-11-22 as
#     docs/performance.md states them ("Model step (8 layers per token)",
#     "Prefill compression"); a file of a graph column, a CUDA-core prefill
#     and host rows; the model and prefill cells against the run before,
#     and the warning where the two runs' devices differ (an H200 run
#     before an H100 one), not where they match.
# Usage: gpu_verdicts_test.sh SOURCE_DIR SCRATCH_DIR
test_name="gpu-verdicts"
. "$(dirname "$0")/script_test.sh"
run=$src/scripts/gpu-verdicts.py
record=$src/docs/perf/h200-kvc-bench-gpu-2026-11-28.csv
# verdicts NAME ARG...: gpu-verdicts.py ARG... into $scratch/NAME.txt, which
# must exit 0.
verdicts() {
  local name=$1
  shift
  python3 "$run" "$@" > "$scratch/$name.txt" 2>&1 ||
    fail "$name: exit $?: $(cat "$scratch/$name.txt")"
}
# refused NAME ARG...: the same, which must exit 2 (bad input).
refused() {
  local name=$1 status
  shift
  python3 "$run" "$@" > "$scratch/$name.txt" 2>&1
  status=$?
  [ "$status" -eq 2 ] || fail "$name: exit $status (expected 2): $(cat "$scratch/$name.txt")"
}

# 1.
verdicts record "$record"
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
verdicts two "$record" "$scratch/later.csv"
expect "bandwidth (>= 85% of copy, batch >= 8, context >= 4k): 1 of 24 cells met, 27.3% to 86.8%" "$scratch/two.txt"

# 3.
refused none "$scratch/none.csv"
grep -q "gpu-verdicts: cannot read $scratch/none.csv: No such file or directory" "$scratch/none.txt" ||
  fail "a missing file: $(cat "$scratch/none.txt")"
{
  head -1 "$record"
  echo "decode,128,one,8,32,32768,1,us,1,1,1,1,1"
} > "$scratch/bad.csv"
refused bad "$scratch/bad.csv"
grep -q "gpu-verdicts: $scratch/bad.csv:2: cannot read the row" "$scratch/bad.txt" ||
  fail "a bad row: $(cat "$scratch/bad.txt")"

# 4.
cat > "$scratch/predictions" <<'END'
# a comment line, then STEP COLUMN ALTERNATIVE DIMS GROUPS BATCHES CONTEXTS LOW HIGH
a lru/fu fused_lru 64 4 1,8,32 4096,32768 0.90 1.20
b lru/fu fused_lru 64 4 1,8,32 4096,32768 1.20 1.30   # a trailing comment
c lru/fu fused_lru 64 4 1,8,32 4096,32768 1.00 1.05
d gr/fu fused_grid 64 4 1 4096 0.90 1.10
END
verdicts predicted --predictions="$scratch/predictions" "$record"
expect "  step a lru/fu d64 G4 B1,8,32 4k,32k: 0.90-1.20, measured 0.95-1.13 (6): inside" "$scratch/predicted.txt"
expect "  step b lru/fu d64 G4 B1,8,32 4k,32k: 1.20-1.30, measured 0.95-1.13 (6): below" "$scratch/predicted.txt"
expect "  step c lru/fu d64 G4 B1,8,32 4k,32k: 1.00-1.05, measured 0.95-1.13 (6): across" "$scratch/predicted.txt"
expect "  step d gr/fu d64 G4 B1 4k: 0.90-1.10, not measured" "$scratch/predicted.txt"
bundled=$src/scripts/gpu-plans/next.predictions
verdicts bundled --predictions="$bundled" "$record"
lines=$(grep -c '^ *[0-9]' "$bundled")
read=$(grep -c '^  step ' "$scratch/bundled.txt")
[ "$lines" -eq "$read" ] || fail "next.predictions: $read of $lines expectations read"
printf 'e lru/fu fused_lru 64 4\n' > "$scratch/short"
refused short --predictions="$scratch/short" "$record"
grep -q "gpu-verdicts: $scratch/short:1: expected STEP COLUMN ALTERNATIVE DIMS GROUPS BATCHES CONTEXTS LOW HIGH (5 fields, not 9)" "$scratch/short.txt" ||
  fail "a short prediction: $(cat "$scratch/short.txt")"

# 5.
verdicts before --before="$src/docs/perf/h200-kvc-bench-gpu.csv" "$record"
expect "  decode d64 G1 B8 4k: plain 56.7 -> 40.2 us, fused 68.8 -> 47.0 us, copy 23.6% -> 34.5%, overhead +21.3% -> +17.0%" "$scratch/before.txt"
expect "  decode d128 G1 B32 32k: plain 1120.7 -> 1139.7 us, fused 1313.9 -> 1223.2 us, copy 77.7% -> 83.6%, overhead +17.2% -> +7.3%" "$scratch/before.txt"
expect "  int2 d128 G1 B32 32k: 655.4 -> 475.0 us, x16b 1.71x -> 2.40x" "$scratch/before.txt"
expect "  int2 d128 G4 B8 32k: 316.5 -> 302.7 us, x16b 1.17x -> 1.17x" "$scratch/before.txt"

# 6.
verdicts model "$src/docs/perf/h200-kvc-bench-gpu.csv"
expect "model step overhead (pipelined / plain - 1 <= 5%, per token): 0 of 36 cells met, +9.7% to +65.4%" "$scratch/model.txt"
expect "  synchronized / pipelined: 1.07x-1.57x (36)" "$scratch/model.txt"
h100=$src/docs/perf/h100-kvc-bench-gpu-2026-11-22.csv
verdicts prefill "$h100"
expect "  1k: snapkv +24.2%-+106.4% (6), h2o +138.2%-+184.7% (6)" "$scratch/prefill.txt"
expect "  16k: snapkv +0.5%-+0.8% (6), h2o +52.1%-+56.8% (6)" "$scratch/prefill.txt"
{
  head -1 "$record"
  echo "model,128,1,8,8,4096,,us_per_token,200.0,260.0,190.0,160.0,"
  echo "prefill,128,4,32,1,4096,,ms,2.0000,2.2000,3.0000,,"
  echo "alt_prefill_cc,128,4,32,1,4096,,ms,5.0000,,9.0000,,"
  echo "host,128,1,8,1,4096,,us,18.000,26.000,,,"
  echo "host,128,4,32,1,4096,,us,20.000,30.000,40.000,,"
  echo "host,128,1,8,32,4096,,us,50.000,70.000,nan,,"
} > "$scratch/rest.csv"
verdicts rest "$scratch/rest.csv"
expect "model step overhead (pipelined / plain - 1 <= 5%, per token): 0 of 1 cells met, +5.3% to +5.3%" "$scratch/rest.txt"
expect "  synchronized / pipelined: 1.30x-1.30x (1)" "$scratch/rest.txt"
expect "  pipelined / graph: 1.25x-1.25x (1)" "$scratch/rest.txt"
expect "  4k: snapkv +10.0%-+10.0% (1), h2o +50.0%-+50.0% (1)" "$scratch/rest.txt"
expect "  CUDA-core plain / plain: 2.50x-2.50x (1)" "$scratch/rest.txt"
expect "  B1: plain 18.0-20.0 (2), fused 26.0-30.0 (2), int2 40.0-40.0 (1)" "$scratch/rest.txt"
expect "  B32: plain 50.0-50.0 (1), fused 70.0-70.0 (1)" "$scratch/rest.txt"
verdicts rest-before --before="$h100" "$src/docs/perf/h100-kvc-bench-gpu.csv"
expect "  model d64 G1 B1 4k: pipelined 488.6 -> 354.7 us/token, overhead +84.1% -> -2.7%" "$scratch/rest-before.txt"
grep -q "^  prefill d128 G8 B1 16k: plain [0-9.]* -> 418.51 ms, snapkv " "$scratch/rest-before.txt" ||
  fail "--before, a prefill cell: $(cat "$scratch/rest-before.txt")"
grep -q "warning" "$scratch/rest-before.txt" &&
  fail "--before, two H100 runs: a device warning: $(cat "$scratch/rest-before.txt")"
verdicts devices --before="$record" "$h100"
expect "  warning: copy bandwidth 4264 -> 3006 GB/s: another device; compare % of copy and ratios, not times" "$scratch/devices.txt"

echo "gpu-verdicts: 6 scenarios passed"
