#!/usr/bin/env bash
# scripts/ncu-source.py without Nsight Compute: records as --dump writes
# them (two launches of a kernel, one of another) over a source file of
# the constructs its function scan has to tell apart.
#  1. The whole table, byte for byte: the samples of both launches summed
#     per instruction, the reasons' shares (selected included, the
#     *_not_issued counters left out), instructions executed, the
#     functions (a constructor with an initializer list, a member function,
#     a kernel under __launch_bounds__, a lambda's line counted in its
#     enclosing function, a template with a default argument, nothing from
#     a macro, a comment or a string),
#     the lines with their source text, the instructions with --sass.
#  2. --kernel picks a kernel; one that matches none exits 1.
#  3. --dump of the records reads back to the same table; a gzip dump too.
#  4. Bad input: no file, a file that is not records, a launch without its
#     counters, an unknown option (exits 1, 1, 1, 2, naming the file or
#     option); a .ncu-rep without the ncu_report module exits 77.
# Usage: ncu_source_test.sh SOURCE_DIR SCRATCH_DIR
test_name="ncu-source"
. "$(dirname "$0")/script_test.sh"
mkdir -p "$scratch/root/runtime" "$scratch/root/build-gpu-90a"
run=$src/scripts/ncu-source.py

# The source the records name (line numbers matter: see the records).
cat > "$scratch/root/runtime/kernel.cuh" <<'CUH'
#define KVC_BRACES(x) { if (x) { return; } }
// void notAFunction(int x) { the comment's braces }
struct Walk {
  int a, b;
  __device__ Walk(int x) : a(x), b(2 * x) {
    a += b;
  }
  __device__ int step(int y) const {
    const char *s = "}{ not code";
    if constexpr (sizeof(int) == 4) {
      y += a;
    }
    return y + b;
  }
};
template <int G>
__global__ void __launch_bounds__(128, 4) decodeThing(const float *p) {
  Walk w(threadIdx.x);
  auto f = [&](int i) {
    return w.step(i) * G;
  };
  for (int i = 0; i < G; ++i) {
    combine(p, i, [&](float v) {
      return v + f(i);
    });
  }
}
template <int kHeads = 4, int kBlocks>
__device__ void rescale(float (&o)[kBlocks][4], float r) {
  o[0][0] *= r;
}
CUH

# Two launches of decodeThing<4> and one of decodeOther. Instructions:
# 0x10 line 6 (Walk's constructor), 0x20 line 11 (step, in an if
# constexpr), 0x30 line 20 (the lambda f: decodeThing), 0x40 line 24 (the
# lambda passed to combine: decodeThing), 0x50 no line; decodeOther's
# path is a build folder's (scripts/gpu-pack.sh compiles in build-gpu-90a),
# shown from the root; its 0x20 is in a template with a default argument
# (no assignment: the function rescale).
cat > "$scratch/records.json" <<JSON
{"format": "kvc-ncu-source 1", "launches": [
 {"name": "decodeThing<4>", "duration_ns": 10000,
  "pcs": {"0x10": ["IMAD R1, R2, R3, R4", "/elsewhere/runtime/kernel.cuh", 6],
          "0x20": ["LDG.E R5, [R6]", "/elsewhere/runtime/kernel.cuh", 11],
          "0x30": ["FFMA R7, R8, R9, R7", "/elsewhere/runtime/kernel.cuh", 20],
          "0x40": ["HMMA.16816 R10, R12, R14, R10", "/elsewhere/runtime/kernel.cuh", 24],
          "0x50": ["BRA 0x10", "", 0]},
  "counters": {
   "smsp__pcsamp_warps_issue_stalled_long_scoreboard": {"0x20": 300, "0x40": 20},
   "smsp__pcsamp_warps_issue_stalled_long_scoreboard_not_issued": {"0x20": 999},
   "smsp__pcsamp_warps_issue_stalled_selected": {"0x10": 50, "0x30": 40, "0x40": 30, "0x50": 10},
   "smsp__pcsamp_warps_issue_stalled_math_pipe_throttle": {"0x40": 100},
   "inst_executed": {"0x10": 8, "0x20": 4, "0x30": 4, "0x40": 16, "0x50": 2}}},
 {"name": "decodeThing<4>", "duration_ns": 12000,
  "pcs": {"0x20": ["LDG.E R5, [R6]", "/elsewhere/runtime/kernel.cuh", 11],
          "0x30": ["FFMA R7, R8, R9, R7", "/elsewhere/runtime/kernel.cuh", 20]},
  "counters": {
   "smsp__pcsamp_warps_issue_stalled_long_scoreboard": {"0x20": 100},
   "smsp__pcsamp_warps_issue_stalled_wait": {"0x30": 50}}},
 {"name": "decodeOther", "duration_ns": null,
  "pcs": {"0x10": ["EXIT", "/elsewhere/build-gpu-90a/../runtime/kernel.cuh", 13],
          "0x20": ["FMUL R1, R1, R2", "/elsewhere/build-gpu-90a/../runtime/kernel.cuh", 30]},
  "counters": {"smsp__pcsamp_warps_issue_stalled_selected": {"0x10": 5, "0x20": 3}}}
]}
JSON

# 1. The whole table. decodeThing: 700 samples (0x10 50, 0x20 400, 0x30
# 90, 0x40 150, 0x50 10); long_scoreboard 420, selected 130,
# math_pipe_throttle 100, wait 50.
python3 "$run" --root="$scratch/root" --top=4 --sass=2 "$scratch/records.json" \
  > "$scratch/all.txt" 2> "$scratch/all.err"
status=$?
[ "$status" -eq 0 ] || fail "records: exit $status; $(cat "$scratch/all.err")"
cat > "$scratch/expected.txt" <<'TXT'
== decodeThing<4>
2 launches, 11.0 us each, 700 warp samples, 34 warp instructions executed
reasons: long_scoreboard 60.0%, selected 18.6%, math_pipe_throttle 14.3%, wait 7.1%
functions (samples, share, largest reasons):
        400  57.1%  step (runtime/kernel.cuh:8)  long_scoreboard 100%
        240  34.3%  decodeThing (runtime/kernel.cuh:17)  math_pipe_throttle 42%, selected 29%, wait 21%
         50   7.1%  Walk (runtime/kernel.cuh:5)  selected 100%
         10   1.4%  ? (?)  selected 100%
lines, the 4 with the most samples:
        400  57.1%  runtime/kernel.cuh:11 [step] executed 4  long_scoreboard 100%
             | y += a;
        150  21.4%  runtime/kernel.cuh:24 [decodeThing] executed 16  math_pipe_throttle 67%, selected 20%, long_scoreboard 13%
             | return v + f(i);
         90  12.9%  runtime/kernel.cuh:20 [decodeThing] executed 4  wait 56%, selected 44%
             | return w.step(i) * G;
         50   7.1%  runtime/kernel.cuh:6 [Walk] executed 8  selected 100%
             | a += b;
instructions, the 2 with the most samples:
        400  57.1%  0x0020  LDG.E R5, [R6]  (runtime/kernel.cuh:11)  long_scoreboard 100%
        150  21.4%  0x0040  HMMA.16816 R10, R12, R14, R10  (runtime/kernel.cuh:24)  math_pipe_throttle 67%, selected 20%, long_scoreboard 13%

== decodeOther
1 launch, 8 warp samples
reasons: selected 100.0%
functions (samples, share, largest reasons):
          5  62.5%  step (runtime/kernel.cuh:8)  selected 100%
          3  37.5%  rescale (runtime/kernel.cuh:29)  selected 100%
lines, the 4 with the most samples:
          5  62.5%  runtime/kernel.cuh:13 [step]  selected 100%
             | return y + b;
          3  37.5%  runtime/kernel.cuh:30 [rescale]  selected 100%
             | o[0][0] *= r;
instructions, the 2 with the most samples:
          5  62.5%  0x0010  EXIT  (runtime/kernel.cuh:13)  selected 100%
          3  37.5%  0x0020  FMUL R1, R1, R2  (runtime/kernel.cuh:30)  selected 100%

TXT
diff "$scratch/expected.txt" "$scratch/all.txt" > "$scratch/all.diff" ||
  fail "records: the table differs from the expected one: $(cat "$scratch/all.diff")"

# 2. --kernel.
python3 "$run" --root="$scratch/root" --kernel='Other$' "$scratch/records.json" \
  > "$scratch/other.txt" 2>&1 || fail "--kernel: exit $?"
grep -q "^== decodeOther$" "$scratch/other.txt" || fail "--kernel: decodeOther missing"
if grep -q "decodeThing" "$scratch/other.txt"; then
  fail "--kernel: decodeThing printed: $(cat "$scratch/other.txt")"
fi
python3 "$run" --kernel=nothing "$scratch/records.json" > "$scratch/none.txt" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "--kernel matching nothing: exit $status (expected 1)"
grep -q "^ncu-source: no kernel matches --kernel=nothing$" "$scratch/none.txt" ||
  fail "--kernel matching nothing: $(cat "$scratch/none.txt")"

# 3. --dump reads back to the same table, plain and gzip-compressed.
for dump in dump.json dump.json.gz; do
  python3 "$run" --root="$scratch/root" --dump="$scratch/$dump" \
    "$scratch/records.json" > /dev/null || fail "--dump=$dump: exit $?"
  python3 "$run" --root="$scratch/root" --top=4 --sass=2 "$scratch/$dump" \
    > "$scratch/$dump.txt" 2>&1 || fail "reading $dump: exit $?"
  cmp -s "$scratch/expected.txt" "$scratch/$dump.txt" ||
    fail "the table of $dump differs: $(diff "$scratch/expected.txt" "$scratch/$dump.txt")"
done
gzip -t "$scratch/dump.json.gz" 2>/dev/null || fail "dump.json.gz is not gzip"

# 4. Bad input.
refused() { # refused NAME STATUS MESSAGE ARG...: exit STATUS and MESSAGE on stderr
  local name=$1 expected=$2 message=$3
  shift 3
  python3 "$run" "$@" > "$scratch/$name.out" 2> "$scratch/$name.err"
  local status=$?
  [ "$status" -eq "$expected" ] ||
    fail "$name: exit $status (expected $expected); $(cat "$scratch/$name.err")"
  grep -qF -- "$message" "$scratch/$name.err" ||
    fail "$name: no '$message' in $(cat "$scratch/$name.err")"
}
refused missing 1 "ncu-source: $scratch/nothing.json: no such file" "$scratch/nothing.json"
echo '{"launches": []}' > "$scratch/plain.json"
refused notrecords 1 "$scratch/plain.json: not a records file of --dump" "$scratch/plain.json"
echo '{"format": "kvc-ncu-source 1", "launches": [{"name": "k", "pcs": {}}]}' \
  > "$scratch/nocounters.json"
refused nocounters 1 "$scratch/nocounters.json: launch 0 lacks its name, pcs or counters" \
  "$scratch/nocounters.json"
refused option 2 "ncu-source: --tops=3: unknown option '--tops=3'" --tops=3 "$scratch/records.json"
refused noinput 2 "ncu-source: no input" --top=3
if ! python3 -c 'import ncu_report' 2>/dev/null; then
  : > "$scratch/report.ncu-rep"
  PATH=/usr/bin:/bin KVC_NCU_PYTHON=$scratch/none \
    refused nomodule 77 "ncu-source: SKIP: reading a .ncu-rep needs" "$scratch/report.ncu-rep"
fi

echo "ncu-source: 4 scenarios passed"
