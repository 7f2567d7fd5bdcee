#!/usr/bin/env bash
# scripts/gpu-test.sh with KVC_GPU_TEST_JOBS, without a GPU: stand-ins for
# the suite's executables (a folder given as KVC_GPU_BIN).
#  1. Five at once: every stand-in waits until all five have started (so
#     a run one after another fails), and the output is the sequential
#     run's, line for line (the seconds aside): each title, its
#     executable's output and verdict, in the geometries' order.
#  2. Two at once: never more than two stand-ins run together.
#  3. One fails: exit 1, its verdict and the tally say so.
#  4. Stopped from outside (timeout, a TERM to the process group): every
#     started executable's output so far and "stopped before it ended",
#     exit status of the timeout, and no stand-in left running.
#  5. KVC_GPU_TEST_JOBS that is not a count: exit 2 and a message.
# Usage: gpu_test_jobs_test.sh SOURCE_DIR SCRATCH_DIR
test_name="gpu-test jobs"
. "$(dirname "$0")/script_test.sh"
suite=(g1 g3 g8 g3-grid g8-grid)
run_test=$src/scripts/gpu-test.sh

# standins DIR BODY: the five executables in DIR, each running BODY (sh)
# with NAME set to its geometry.
standins() {
  mkdir -p "$1"
  local g
  for g in "${suite[@]}"; do
    printf '#!/bin/sh\nNAME=%s\n%s\n' "$g" "$2" > "$1/kvc-gpu-tests-$g"
    chmod +x "$1/kvc-gpu-tests-$g"
  done
}
seconds() { sed -E 's/\(([a-z0-9 ,]*)[0-9]+ s\)/(\1N s)/'; }

# 1.
mkdir -p "$scratch/barrier"
standins "$scratch/together" "touch $scratch/barrier/\$NAME
n=0
while [ \$(ls $scratch/barrier | wc -l) -lt 5 ]; do
  n=\$((n + 1))
  [ \$n -gt 400 ] && { echo \"\$NAME: alone after 20 s\"; exit 1; }
  sleep 0.05
done
echo \"\$NAME stand-in: \${KVC_GPU_TEST_POLICIES:-every policy}\"
echo 'PASSED: 0 failure(s)'"
KVC_GPU_BIN=$scratch/together KVC_GPU_TEST_JOBS=5 "$run_test" "${suite[@]}" \
  > "$scratch/five.txt" 2>&1 || fail "five at once: exit $?: $(cat "$scratch/five.txt")"
grep -qx "gpu-test: 5 passed, 0 skipped, 0 failed" "$scratch/five.txt" ||
  fail "five at once: the tally: $(cat "$scratch/five.txt")"
# The same stand-ins one after another, past the barrier they now find full.
KVC_GPU_BIN=$scratch/together "$run_test" "${suite[@]}" > "$scratch/one.txt" 2>&1 ||
  fail "one at a time: exit $?: $(cat "$scratch/one.txt")"
diff <(seconds < "$scratch/one.txt") <(seconds < "$scratch/five.txt") > "$scratch/diff.txt" ||
  fail "five at once does not print the sequential run's output: $(cat "$scratch/diff.txt")"
grep -A1 -x "== kvc-gpu-tests-g3-grid (policies: streaming_llm,h2o,tova,h2o_merge,d2o,scissorhands,rpc_small,duo_small) ==" "$scratch/five.txt" |
  grep -qx "g3-grid stand-in: streaming_llm,h2o,tova,h2o_merge,d2o,scissorhands,rpc_small,duo_small" ||
  fail "five at once: the G = 3 grid suite's policies: $(cat "$scratch/five.txt")"
grep -A1 -x "== kvc-gpu-tests-g8 (policies: all) ==" "$scratch/five.txt" |
  grep -qx "g8 stand-in: every policy" ||
  fail "five at once: the G = 8 suite's policies: $(cat "$scratch/five.txt")"

# 2.
mkdir -p "$scratch/running" "$scratch/counts"
standins "$scratch/pairs" "touch $scratch/running/\$NAME
ls $scratch/running | wc -l > $scratch/counts/\$NAME
sleep 0.3
rm $scratch/running/\$NAME
echo 'PASSED: 0 failure(s)'"
KVC_GPU_BIN=$scratch/pairs KVC_GPU_TEST_JOBS=2 "$run_test" "${suite[@]}" \
  > "$scratch/two.txt" 2>&1 || fail "two at once: exit $?: $(cat "$scratch/two.txt")"
most=$(cat "$scratch/counts"/* | sort -n | tail -1)
[ "$(ls "$scratch/counts" | wc -l)" -eq 5 ] && [ "$most" -le 2 ] ||
  fail "two at once: $most ran together ($(ls "$scratch/counts" | wc -l) of 5 ran)"

# 3.
standins "$scratch/failing" 'if [ "$NAME" = g3 ]; then echo "g3: 2 failure(s)"; exit 1; fi
echo "PASSED: 0 failure(s)"'
KVC_GPU_BIN=$scratch/failing KVC_GPU_TEST_JOBS=5 "$run_test" "${suite[@]}" > "$scratch/failed.txt" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "one failing: exit $status (expected 1)"
grep -q "^-- kvc-gpu-tests-g3: FAILED (exit 1, [0-9]* s)$" "$scratch/failed.txt" &&
  grep -qx "gpu-test: 4 passed, 0 skipped, 1 failed" "$scratch/failed.txt" ||
  fail "one failing: $(cat "$scratch/failed.txt")"

# 4.
standins "$scratch/slow" "echo \"\$NAME started\"
sleep 4
touch $scratch/slow-\$NAME-finished
echo 'PASSED: 0 failure(s)'"
KVC_GPU_BIN=$scratch/slow KVC_GPU_TEST_JOBS=5 timeout 1 "$run_test" "${suite[@]}" > "$scratch/stopped.txt" 2>&1
status=$?
[ "$status" -eq 124 ] || fail "stopped: exit $status (expected 124, timeout's): $(cat "$scratch/stopped.txt")"
for g in "${suite[@]}"; do
  grep -A2 "^== kvc-gpu-tests-$g " "$scratch/stopped.txt" | sed -n 2,3p |
    tr '\n' '|' | grep -qx "$g started|-- kvc-gpu-tests-$g: stopped before it ended|" ||
    fail "stopped: $g's record: $(cat "$scratch/stopped.txt")"
done
sleep 5
ls "$scratch"/slow-*-finished > /dev/null 2>&1 &&
  fail "stopped: a stand-in outlived the run: $(ls "$scratch"/slow-*-finished)"

# 5.
KVC_GPU_BIN=$scratch/together KVC_GPU_TEST_JOBS=0 "$run_test" g1 > "$scratch/zero.txt" 2>&1
status=$?
[ "$status" -eq 2 ] &&
  grep -qx "gpu-test: KVC_GPU_TEST_JOBS='0' is not a whole number of executables (1 or more)" "$scratch/zero.txt" ||
  fail "KVC_GPU_TEST_JOBS=0: exit $status: $(cat "$scratch/zero.txt")"

echo "gpu-test jobs: 5 scenarios passed"
