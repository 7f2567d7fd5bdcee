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
#     the caches as the kernel before left them (--cache-control none),
#     then each variant's source pass (SourceCounters, scripts/ncu-source.py).
#  6. A plan file: its phases run in order from the repository root, each
#     to its own log; a failing phase does not stop the next; when the run
#     is stopped from outside, KVC_GPU_ALL_ARCHIVE holds every log of the
#     phases that had ended.
#  7. Malformed plans stop the run before any phase, naming the file and
#     line (exit 2).
#  8. The bundled plan of the next GPU run (scripts/gpu-plans/next.plan):
#     every phase's command runs against the stand-ins.
#  9. An archive that would be over KVC_GPU_ALL_ARCHIVE_MAX leaves its
#     largest file out and names it; a maximum that is no number is
#     refused (exit 2).
# Usage: gpu_all_test.sh SOURCE_DIR SCRATCH_DIR
test_name="gpu-all"
. "$(dirname "$0")/script_test.sh"
mkdir -p "$scratch/path" "$scratch/bin"

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
# The grid suites print the policies they were given.
for g in g3-grid g8-grid; do
  printf '#!/bin/sh\necho "%s stand-in: $KVC_GPU_TEST_POLICIES"\necho "PASSED: 0 failure(s)"\n' \
    "$g" > "$scratch/bin/kvc-gpu-tests-$g"
done
# The kernel tests, which scripts/gpu-test.sh runs before the policies.
for t in mma-fragments kivi-decode decode-kernel prefill-kernel fold-slots; do
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
for t in mma-fragments kivi-decode decode-kernel prefill-kernel fold-slots; do
  grep -q "^kernel test stand-in $t: ok" "$scratch/all/test.log" ||
    fail "test.log lacks the kernel test $t"
done
grep -q "^g3-grid stand-in: streaming_llm,h2o,tova,h2o_merge,d2o,scissorhands,rpc_small,duo_small$" \
  "$scratch/all/test.log" || fail "the G = 3 grid suite's policies: $(grep 'grid stand-in' "$scratch/all/test.log")"
grep -q "^g8-grid stand-in: streaming_llm,h2o,tova,h2o_merge,d2o,scissorhands,rpc_small$" \
  "$scratch/all/test.log" || fail "the G = 8 grid suite's policies: $(grep 'grid stand-in' "$scratch/all/test.log")"
grep -q "^gpu-test: 10 passed, 0 skipped, 0 failed" "$scratch/all/test.log" ||
  fail "the suite's tally is not 10 passed: $(grep '^gpu-test:' "$scratch/all/test.log")"
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
# The source pass of each variant: the decode kernels' per-instruction
# samples into a report that scripts/ncu-source.py reads (here the
# stand-in python3, which finds no module: exit 77, not a failure).
for v in fused int2; do
  grep -q "^ncu stand-in .*--kernel-name regex:^decode --launch-skip 8 --launch-count 4 --section SourceCounters .*--export $scratch/profile/ncu-$v-source .*--variants=$v " \
    "$scratch/profile/ncu-$v-source.log" || fail "profile: no source pass of $v"
  grep -q "sdpa_baseline: SKIP: stand-in" "$scratch/profile/ncu-$v-source.txt" ||
    fail "profile: ncu-source.py did not run on the $v report"
done

# 6. A plan of four phases, the last longer than the whole run may take:
# gpu-all.sh is stopped from outside during it, and the archive holds what
# the phases before it wrote.
plan=$scratch/four.plan
cat > "$plan" <<'PLAN'
# A comment, then a blank line.

first 30 pwd > "$KVC_GPU_ALL_OUT/first.pwd"; echo first ran
failing 30 echo failing ran; exit 3
last 30 echo "last ran with $KVC_GPU_BIN"
stopped 60 sleep 40
PLAN
KVC_GPU_ALL_OUT=$scratch/plan KVC_GPU_ALL_ARCHIVE=$scratch/plan.tgz \
  timeout 15 "$src/scripts/gpu-all.sh" 120 "$plan" > "$scratch/plan.log" 2>&1
status=$?
summary=$scratch/plan/summary.txt
[ "$status" -eq 124 ] || fail "plan: exit $status (expected 124, stopped from outside); $(cat "$scratch/plan.log")"
grep -q "^first: passed (" "$summary" || fail "plan: no 'first: passed' in $(cat "$summary")"
grep -q "^failing: FAILED, status 3 (" "$summary" || fail "plan: no 'failing: FAILED, status 3' in $(cat "$summary")"
grep -q "^last: passed (" "$summary" || fail "plan: no 'last: passed' in $(cat "$summary")"
[ "$(cat "$scratch/plan/first.pwd")" = "$(cd "$src" && pwd)" ] ||
  fail "plan: the phase ran in $(cat "$scratch/plan/first.pwd"), not the repository root"
grep -q "^last ran with $scratch/bin\$" "$scratch/plan/last.log" || fail "plan: last.log lacks its output"
grep -q "^failing ran" "$scratch/plan/failing.log" || fail "plan: failing.log lacks its output"
members=$(tar -tzf "$scratch/plan.tgz" | sort | tr '\n' ' ')
for f in ./summary.txt ./first.log ./failing.log ./last.log ./first.pwd; do
  case " $members" in *" $f "*) ;; *) fail "plan: the archive lacks $f: $members" ;; esac
done
tar -xzOf "$scratch/plan.tgz" ./summary.txt | grep -q "^last: passed (" ||
  fail "plan: the archive was not written after the phase 'last'"
[ ! -e "$scratch/plan.tgz.partial" ] || fail "plan: the archive's partial file was left"

# 7. Malformed plans: nothing runs, the file and line are named.
bad() { # bad NAME LINE MESSAGE: a plan whose third line is LINE
  printf 'ok 30 touch "$KVC_GPU_ALL_OUT/ran"\n# comment\n%s\n' "$2" > "$scratch/$1.plan"
  KVC_GPU_ALL_OUT=$scratch/$1 "$src/scripts/gpu-all.sh" 60 "$scratch/$1.plan" \
    > "$scratch/$1.log" 2>&1
  local status=$?
  [ "$status" -eq 2 ] || fail "$1: exit $status (expected 2); $(cat "$scratch/$1.log")"
  grep -qF "gpu-all: $scratch/$1.plan:3: $3" "$scratch/$1.log" ||
    fail "$1: no '$3' at line 3 in $(cat "$scratch/$1.log")"
  [ ! -e "$scratch/$1/ran" ] || fail "$1: a phase ran before the plan was checked"
}
bad badcap 'two 1x echo' "phase 'two': the cap '1x' is not a whole number of seconds"
bad badname 'a/b 30 echo' "the phase name 'a/b' has characters other than letters, digits"
bad nocommand 'two 30' "phase 'two' has no command"
bad short 'two 19 echo' "phase 'two': a cap of 19 s is under the 20 s that a phase needs to start"
bad twice 'ok 30 echo again' "phase 'ok' is named twice"
KVC_GPU_ALL_OUT=$scratch/inside KVC_GPU_ALL_ARCHIVE=$scratch/inside/a.tgz \
  "$src/scripts/gpu-all.sh" 60 "$plan" > "$scratch/inside.log" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "archive inside its folder: exit $status (expected 2)"
grep -q "is inside the folder it archives" "$scratch/inside.log" ||
  fail "archive inside its folder: $(cat "$scratch/inside.log")"

# 8. The next GPU run's plan against the stand-ins.
KVC_GPU_ALL_OUT=$scratch/next KVC_GPU_ALL_ARCHIVE=$scratch/next.tgz \
  "$src/scripts/gpu-all.sh" 300 "$src/scripts/gpu-plans/next.plan" > "$scratch/next.log" 2>&1
status=$?
summary=$scratch/next/summary.txt
[ "$status" -eq 0 ] || fail "next.plan: exit $status (expected 0); $(cat "$summary")"
phases=$(grep -c '^[a-z0-9-]*: \(passed\|skipped\) (' "$summary")
expected=$(grep -c '^[a-z]' "$src/scripts/gpu-plans/next.plan")
[ "$phases" -eq "$expected" ] || fail "next.plan: $phases of $expected phases passed: $(cat "$summary")"
grep -q "^sdpa: skipped (" "$summary" || fail "next.plan: the SDPA stand-in did not skip: $(cat "$summary")"
# The suite's five executables at once, their records in the plan's order.
[ "$(grep '^-- kvc-gpu-tests-' "$scratch/next/suite.log" | sed 's/: .*//' | tr '\n' ' ')" = \
  "-- kvc-gpu-tests-g1 -- kvc-gpu-tests-g3 -- kvc-gpu-tests-g8 -- kvc-gpu-tests-g3-grid -- kvc-gpu-tests-g8-grid " ] ||
  fail "next.plan: the suite's records: $(cat "$scratch/next/suite.log")"
grep -q "sweep stand-in --csv=$scratch/next/alternatives.csv --dim=128 --group=4,8 --context=none .*--alt-context=4k,32k" \
  "$scratch/next/alternatives.txt" || fail "next.plan: the alternatives table's command"
grep -q "sweep stand-in --csv=$scratch/next/g1-alternatives.csv --group=1 --context=none .*--alt-context=4k,32k" \
  "$scratch/next/g1-alternatives.txt" || fail "next.plan: the G = 1 alternatives table's command"
if grep -q "Outside baseline" "$scratch/next/decode.txt"; then
  fail "next.plan: the decode slice ran the SDPA baseline (KVC_GPU_BENCH_SDPA=0)"
fi
grep -q "^ncu stand-in .*--batch=32 --context=32k --dim=128 --group=8 --variants=fused " \
  "$scratch/next/ncu-g8/ncu-fused.txt" || fail "next.plan: no G = 8 fold profile"
grep -q "^-- memcheck kvc-gpu-kernel-kivi-decode: clean" "$scratch/next/kivi-sanitize.log" ||
  fail "next.plan: the KIVI kernel's memcheck: $(cat "$scratch/next/kivi-sanitize.log")"
if grep -q "kvc-gpu-tests-g1" "$scratch/next/kivi-sanitize.log"; then
  fail "next.plan: KVC_SANITIZE_SUBSET=kernel ran the policy tests"
fi

# 9. An archive over KVC_GPU_ALL_ARCHIVE_MAX: its largest file is left
# out (and named in left-out.txt), the rest kept; a bad maximum is refused.
cat > "$scratch/big.plan" <<'PLAN'
files 30 mkdir -p "$KVC_GPU_ALL_OUT/sub" && head -c 400000 /dev/urandom > "$KVC_GPU_ALL_OUT/sub/big.bin" && head -c 200000 /dev/urandom > "$KVC_GPU_ALL_OUT/mid.bin" && echo small > "$KVC_GPU_ALL_OUT/small.txt"
PLAN
KVC_GPU_ALL_OUT=$scratch/big KVC_GPU_ALL_ARCHIVE=$scratch/big.tgz KVC_GPU_ALL_ARCHIVE_MAX=350000 \
  "$src/scripts/gpu-all.sh" 60 "$scratch/big.plan" > "$scratch/big.log" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "large archive: exit $status; $(cat "$scratch/big.log")"
members=$(tar -tzf "$scratch/big.tgz" | sort | tr '\n' ' ')
for f in ./summary.txt ./files.log ./small.txt ./mid.bin ./left-out.txt; do
  case " $members" in *" $f "*) ;; *) fail "large archive: no $f in $members" ;; esac
done
case " $members" in *" ./sub/big.bin "*) fail "large archive: big.bin kept: $members" ;; esac
[ "$(stat -c %s "$scratch/big.tgz")" -le 350000 ] || fail "large archive: over its maximum"
[ "$(tar -xzOf "$scratch/big.tgz" ./left-out.txt)" = \
  "./sub/big.bin (400000 bytes): left out of the archive, over 350000 bytes with it" ] ||
  fail "large archive: left-out.txt: $(tar -xzOf "$scratch/big.tgz" ./left-out.txt)"
KVC_GPU_ALL_OUT=$scratch/bigbad KVC_GPU_ALL_ARCHIVE=$scratch/bigbad.tgz KVC_GPU_ALL_ARCHIVE_MAX=15M \
  "$src/scripts/gpu-all.sh" 60 "$scratch/big.plan" > "$scratch/bigbad.log" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "bad archive maximum: exit $status (expected 2)"
grep -q "KVC_GPU_ALL_ARCHIVE_MAX is '15M', not a number of bytes" "$scratch/bigbad.log" ||
  fail "bad archive maximum: $(cat "$scratch/bigbad.log")"

echo "gpu-all: 9 scenarios passed (slow sweep stopped after $took s)"
