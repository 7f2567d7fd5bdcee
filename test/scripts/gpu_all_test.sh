#!/usr/bin/env bash
# scripts/gpu-all.sh without a GPU: stand-ins for nvidia-smi,
# compute-sanitizer, python3 (the SDPA baseline) and the GPU executables (a folder given as
# KVC_GPU_BIN), so that the phases, their time caps and the summary are
# checked on any machine.
#  1. Every phase passes: exit 0 and one "passed" line per phase.
#  2. The benchmark outlasts the limit: it is stopped at what is left of
#     the limit ("TIMEOUT"), the phases after it are "not run", exit 1.
#  3. nvidia-smi lists no GPU: exit 77 and a SKIP line.
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
for g in g1 g3 g8; do
  printf '#!/bin/sh\necho "PASSED: 0 failure(s)"\n' > "$scratch/bin/kvc-gpu-tests-$g"
done
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

echo "gpu-all: 3 scenarios passed (slow sweep stopped after $took s)"
