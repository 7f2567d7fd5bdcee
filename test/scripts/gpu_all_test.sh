#!/usr/bin/env bash
# scripts/gpu-all.sh without a GPU: stand-ins for nvidia-smi,
# compute-sanitizer, python3 (the SDPA baseline) and the GPU executables (a folder given as
# KVC_GPU_BIN), so that the phases, their time caps and the summary are
# checked on any machine.
#  1. Every phase passes: exit 0 and one "passed" line per phase.
#  2. The benchmark outlasts the limit: it is stopped at what is left of
#     the limit ("TIMEOUT"), the phases after it are "not run", exit 1.
#  3. nvidia-smi lists no GPU: exit 77 and a SKIP line.
#  4. A phase fails (the suite, at G = 3): exit 1, although the phases
#     after it pass.
#  5. KVC_GPU_ALL_BENCH_ARGS reaches the sweep and KVC_GPU_ALL_PROFILE=1
#     adds the profile phase (scripts/gpu-profile.sh, a stand-in ncu): one
#     report per variant, the KIVI one with the stall sections, each with
#     the caches as the kernel before left them (--cache-control none).
# Usage: gpu_all_test.sh SOURCE_DIR SCRATCH_DIR
set -uo pipefail
src=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch/path" "$scratch/bin"
fail() {
  echo "FAIL: $*"
  exit 1
}

cat > "$scratch/path/nvidia-smi" <<'SH'
#!/bin/sh
[ -n "${FAKE_NO_GPU:-}" ] && exit 0
case "$1" in
  -L) echo "GPU 0: Stand-in (UUID: GPU-0)" ;;
  *) echo "Stand-in, 0.0, 1 MHz, 1 MHz, 1 W" ;;
esac
SH
# compute-sanitizer --tool T [--leak-check full] --error-exitcode 99 EXE ARGS
cat > "$scratch/path/compute-sanitizer" <<'SH'
#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    --tool | --leak-check | --error-exitcode) shift 2 ;;
    *) break ;;
  esac
done
exec "$@"
SH
# The SDPA baseline that scripts/gpu-bench.sh runs after the sweep.
printf '#!/bin/sh\necho "sdpa_baseline: SKIP: stand-in"\nexit 77\n' > "$scratch/path/python3"
for g in g1 g8; do
  printf '#!/bin/sh\necho "PASSED: 0 failure(s)"\n' > "$scratch/bin/kvc-gpu-tests-$g"
done
# The kernel tests, which scripts/gpu-test.sh runs before the policies.
for t in kivi-decode decode-kernel prefill-kernel fold-slots; do
  printf '#!/bin/sh\necho "kernel test stand-in %s: ok"\n' "$t" \
    > "$scratch/bin/kvc-gpu-kernel-$t"
done
# G = 3, which the sanitizers do not run, fails when FAKE_SUITE_FAILS is set.
printf '#!/bin/sh\n[ -n "${FAKE_SUITE_FAILS:-}" ] && { echo "FAILED: 1 failure(s)"; exit 1; }\necho "PASSED: 0 failure(s)"\n' \
  > "$scratch/bin/kvc-gpu-tests-g3"
# Nsight Compute: prints its arguments.
printf '#!/bin/sh\necho "ncu stand-in $*"\n' > "$scratch/path/ncu"
printf '#!/bin/sh\necho "kvc-bench-gpu-smoke stand-in"\n' > "$scratch/bin/kvc-bench-gpu-smoke"
# The sweep: quick, or longer than any limit below when FAKE_SLOW_BENCH is set.
printf '#!/bin/sh\n[ -n "${FAKE_SLOW_BENCH:-}" ] && sleep 300\necho "sweep stand-in $*"\n' \
  > "$scratch/bin/kvc-bench-gpu"
chmod +x "$scratch"/path/* "$scratch"/bin/*

export PATH=$scratch/path:$PATH KVC_GPU_BIN=$scratch/bin
run() { # run NAME LIMIT: scripts/gpu-all.sh into $scratch/NAME
  KVC_GPU_ALL_OUT=$scratch/$1 "$src/scripts/gpu-all.sh" "$2" > "$scratch/$1.log" 2>&1
}

# 1. Every phase passes.
run all 120
status=$?
summary=$scratch/all/summary.txt
[ "$status" -eq 0 ] || fail "every phase passing: exit $status (expected 0); $(cat "$scratch/all.log")"
for p in test bench memcheck racecheck; do
  grep -q "^$p: passed (" "$summary" || fail "no '$p: passed' line in $(cat "$summary")"
done
grep -q "sweep stand-in --csv=$scratch/all/gpu-bench.csv" "$scratch/all/gpu-bench.txt" ||
  fail "the sweep's output is not in gpu-bench.txt"
grep -q "PASSED: 0 failure(s)" "$scratch/all/test.log" || fail "test.log lacks the suite's output"
for t in kivi-decode decode-kernel prefill-kernel fold-slots; do
  grep -q "^kernel test stand-in $t: ok" "$scratch/all/test.log" ||
    fail "test.log lacks the kernel test $t"
done
grep -q "^gpu-test: 7 passed, 0 skipped, 0 failed" "$scratch/all/test.log" ||
  fail "the suite's tally is not 7 passed: $(grep '^gpu-test:' "$scratch/all/test.log")"
grep -q "sdpa_baseline: SKIP: stand-in" "$scratch/all/gpu-bench.txt" ||
  fail "gpu-bench.txt lacks the SDPA baseline's output"

# 2. The sweep outlasts a limit of 30 s: it is stopped when the limit is
# reached, and the sanitizers are not started (a phase needs 20 s).
start=$(date +%s)
FAKE_SLOW_BENCH=1 run slow 30
status=$?
took=$(($(date +%s) - start))
summary=$scratch/slow/summary.txt
[ "$status" -eq 1 ] || fail "slow sweep: exit $status (expected 1)"
grep -q "^test: passed (" "$summary" || fail "slow sweep: no 'test: passed' in $(cat "$summary")"
grep -q "^bench: TIMEOUT after " "$summary" || fail "slow sweep: no bench TIMEOUT in $(cat "$summary")"
grep -q "^memcheck: not run (" "$summary" || fail "slow sweep: memcheck ran: $(cat "$summary")"
grep -q "^racecheck: not run (" "$summary" || fail "slow sweep: racecheck ran: $(cat "$summary")"
[ "$took" -lt 60 ] || fail "slow sweep: the run took $took s with a limit of 30 s"

# 3. No GPU.
FAKE_NO_GPU=1 run none 60
status=$?
[ "$status" -eq 77 ] || fail "no GPU: exit $status (expected 77)"
grep -q "gpu-all: SKIP: no CUDA device" "$scratch/none/summary.txt" || fail "no GPU: no SKIP line"

# 4. The suite fails; the sweep and the sanitizers still run and pass.
FAKE_SUITE_FAILS=1 run failing 120
status=$?
summary=$scratch/failing/summary.txt
[ "$status" -eq 1 ] || fail "failing suite: exit $status (expected 1); $(cat "$summary")"
grep -q "^test: FAILED, status 1 (" "$summary" || fail "failing suite: no 'test: FAILED' in $(cat "$summary")"
for p in bench memcheck racecheck; do
  grep -q "^$p: passed (" "$summary" || fail "failing suite: no '$p: passed' line in $(cat "$summary")"
done

# 5. A slice of the sweep, and the profile phase.
KVC_GPU_ALL_BENCH_ARGS="--batch=8 --context=32k" KVC_GPU_ALL_PROFILE=1 run profile 120
status=$?
summary=$scratch/profile/summary.txt
[ "$status" -eq 0 ] || fail "profile: exit $status (expected 0); $(cat "$scratch/profile.log")"
grep -q "^profile: passed (" "$summary" || fail "profile: no 'profile: passed' in $(cat "$summary")"
grep -q "sweep stand-in --csv=$scratch/profile/gpu-bench.csv --batch=8 --context=32k\$" \
  "$scratch/profile/gpu-bench.txt" || fail "profile: the sweep did not get KVC_GPU_ALL_BENCH_ARGS"
grep -q "^ncu stand-in .*--metrics gpu__time_duration.sum,.* --variants=fused " \
  "$scratch/profile/ncu-fused.txt" || fail "profile: no fused report"
# The caches as the kernel before left them, not emptied per kernel.
grep -q "^ncu stand-in --clock-control none --cache-control none " \
  "$scratch/profile/ncu-fused.txt" || fail "profile: caches emptied per kernel"
grep -q "^ncu stand-in .*--section WarpStateStats --section SchedulerStats .* --variants=int2 " \
  "$scratch/profile/ncu-int2.txt" || fail "profile: the int2 report lacks the stall sections"
if grep -q "WarpStateStats" "$scratch/profile/ncu-fused.txt"; then
  fail "profile: the fused report has the KIVI sections"
fi

echo "gpu-all: 5 scenarios passed (slow sweep stopped after $took s)"
