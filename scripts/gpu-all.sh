#!/usr/bin/env bash
# Every GPU check in one command under one time limit, most important
# first: the GPU suite (scripts/gpu-test.sh), the benchmark sweep with the
# SDPA baseline (scripts/gpu-bench.sh), compute-sanitizer memcheck on its
# default subset, then racecheck (scripts/gpu-sanitize.sh); or the phases
# of a plan file instead (scripts/gpu-plans/, below). Each phase gets at
# most its own cap and what is left of the whole limit, so a slow phase
# cuts the later ones short instead of the whole run; each phase's output
# is written to its own file as it runs, so a run stopped from outside
# still leaves what it measured.
#
# Usage: scripts/gpu-all.sh [SECONDS] [PLAN]   (the whole limit, default
#        570; PLAN: a plan file, default the four phases above)
# A plan file holds one phase a line, `NAME CAP COMMAND`: NAME (letters,
#        digits, '.', '_', '-'; unique) names the phase and its log
#        OUT/NAME.log, CAP is its limit in seconds (20 or more), and
#        COMMAND, the rest of the line, runs under bash in the repository
#        root with KVC_GPU_ALL_OUT exported (the output folder, absolute).
#        Blank lines and lines that start with '#' are skipped. A malformed
#        line stops the run before any phase, with its file and line.
# Environment: KVC_GPU_ALL_OUT (folder of the logs, default build/gpu-all),
#        KVC_GPU_ALL_BENCH_ARGS (kvc-bench-gpu options for the bench phase,
#        e.g. a few cells instead of the whole sweep; default none: the
#        sweep), KVC_GPU_ALL_PROFILE=1 (adds a profile phase after the
#        bench: scripts/gpu-profile.sh, Nsight Compute on the fused and
#        int2 decodes), KVC_GPU_ALL_ARCHIVE=FILE (after every phase, the
#        whole output folder as one gzip tar archive FILE, replaced
#        whole: one file to fetch from a machine that returns few, and
#        what a run stopped from outside had finished; when it would be
#        larger than KVC_GPU_ALL_ARCHIVE_MAX bytes, default 15 MiB, under
#        the 16 MiB a file that the device tool returns may have, its
#        largest files are left out, one at a time, until it is not, and
#        OUT/left-out.txt in it names them), KVC_GPU_BIN and the other
#        variables of the scripts it runs.
# Output: OUT/summary.txt (one line per phase: status and seconds); without
#        a plan OUT/test.log, OUT/gpu-bench.txt (+ .csv), OUT/profile.log
#        and OUT/ncu-*.txt (with KVC_GPU_ALL_PROFILE=1), OUT/memcheck.log,
#        OUT/racecheck.log; with one OUT/NAME.log per phase and what its
#        commands write under KVC_GPU_ALL_OUT.
# Exit status: 0 when every phase ran and passed (or skipped itself: no
#        compute-sanitizer), 1 when one failed, timed out or did not fit
#        in the limit (fewer than 20 s left), 2 for a malformed plan, 77
#        when no GPU is usable.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${1:-570}
plan=${2:-}
out=$(realpath -m "${KVC_GPU_ALL_OUT:-$root/build/gpu-all}")
archive=
[ -n "${KVC_GPU_ALL_ARCHIVE:-}" ] && archive=$(realpath -m "$KVC_GPU_ALL_ARCHIVE")
archive_max=${KVC_GPU_ALL_ARCHIVE_MAX:-15728640}
if ! [[ $archive_max =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu-all: KVC_GPU_ALL_ARCHIVE_MAX is '$archive_max', not a number of bytes" >&2
  exit 2
fi
case $archive in
  "$out"/*)
    echo "gpu-all: the archive $archive is inside the folder it archives ($out)" >&2
    exit 2 ;;
esac

# The plan's phases (plan_names, plan_caps, plan_commands), checked whole
# before anything runs.
plan_names=()
plan_caps=()
plan_commands=()
if [ -n "$plan" ]; then
  if [ ! -r "$plan" ]; then
    echo "gpu-all: cannot read the plan file $plan" >&2
    exit 2
  fi
  number=0
  while IFS= read -r line || [ -n "$line" ]; do
    number=$((number + 1))
    case $line in '' | '#'*) continue ;; esac
    read -r name cap command <<< "$line"
    where="gpu-all: $plan:$number"
    if ! [[ $name =~ ^[A-Za-z0-9._-]+$ ]]; then
      echo "$where: the phase name '$name' has characters other than letters, digits, '.', '_' and '-'" >&2
      exit 2
    fi
    if ! [[ $cap =~ ^[1-9][0-9]*$ ]]; then
      echo "$where: phase '$name': the cap '$cap' is not a whole number of seconds" >&2
      exit 2
    fi
    if [ "$cap" -lt 20 ]; then
      echo "$where: phase '$name': a cap of $cap s is under the 20 s that a phase needs to start" >&2
      exit 2
    fi
    if [ -z "$command" ]; then
      echo "$where: phase '$name' has no command" >&2
      exit 2
    fi
    for known in ${plan_names[@]+"${plan_names[@]}"}; do
      if [ "$known" = "$name" ]; then
        echo "$where: phase '$name' is named twice" >&2
        exit 2
      fi
    done
    plan_names+=("$name")
    plan_caps+=("$cap")
    plan_commands+=("$command")
  done < "$plan"
  if [ ${#plan_names[@]} -eq 0 ]; then
    echo "gpu-all: the plan file $plan has no phase" >&2
    exit 2
  fi
fi

mkdir -p "$out"
start=$(date +%s)
summary=$out/summary.txt
: > "$summary"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-all: SKIP: no CUDA device (nvidia-smi lists none)" | tee -a "$summary"
  exit 77
fi
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(hostname), kernel $(uname -r)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory,power.limit \
    --format=csv,noheader | sed 's/^/# /'
} >> "$summary"

# keep: the output folder as the archive KVC_GPU_ALL_ARCHIVE, written
# beside it and renamed, so that the archive is never half written; the
# largest files left out while it is over archive_max bytes, and named in
# OUT/left-out.txt.
keep() {
  [ -n "$archive" ] || return 0
  mkdir -p "$(dirname "$archive")"
  local excludes=() file size
  rm -f "$out/left-out.txt"
  while :; do
    tar -C "$out" -czf "$archive.partial" "${excludes[@]}" . || return 1
    size=$(stat -c %s "$archive.partial")
    [ "$size" -le "$archive_max" ] && break
    file=$(cd "$out" && find . -type f ! -name left-out.txt -printf '%s %p\n' |
             sort -rn | while read -r bytes path; do
               case " ${excludes[*]} " in
                 *" --exclude=$path "*) ;;
                 *) echo "$bytes $path"; break ;;
               esac
             done)
    if [ -z "$file" ]; then
      echo "gpu-all: the archive is $size bytes, over $archive_max, with" \
           "every file left out" >&2
      break
    fi
    excludes+=("--exclude=${file#* }")
    echo "${file#* } (${file%% *} bytes): left out of the archive, over" \
         "$archive_max bytes with it" >> "$out/left-out.txt"
  done
  mv -f "$archive.partial" "$archive"
}

failed=0
# phase NAME CAP LOG COMMAND...: runs COMMAND for at most CAP seconds and
# what is left of the limit, its output to LOG and the terminal.
phase() {
  local name=$1 cap=$2 log=$3
  shift 3
  local left=$((limit - ($(date +%s) - start)))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 20 ]; then
    echo "$name: not run ($left s left of $limit)" | tee -a "$summary"
    failed=1
    return
  fi
  local t0
  t0=$(date +%s)
  echo "== gpu-all: $name (at most $cap s) =="
  timeout "$cap" "$@" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  local took=$(($(date +%s) - t0))
  # The verdict is set here, not inside the pipeline to tee (a subshell,
  # whose `failed` the script would never see).
  local verdict
  case $status in
    0) verdict="passed ($took s)" ;;
    77) verdict="skipped ($took s)" ;;
    124) verdict="TIMEOUT after $took s (cap $cap s)"; failed=1 ;;
    *) verdict="FAILED, status $status ($took s)"; failed=1 ;;
  esac
  echo "$name: $verdict" | tee -a "$summary"
  keep
}

if [ -n "$plan" ]; then
  echo "# plan $plan: ${plan_names[*]}" >> "$summary"
  export KVC_GPU_ALL_OUT=$out
  for i in "${!plan_names[@]}"; do
    phase "${plan_names[$i]}" "${plan_caps[$i]}" "$out/${plan_names[$i]}.log" \
      bash -c "cd \"\$1\" && ${plan_commands[$i]}" phase "$root"
  done
  echo "gpu-all: $(($(date +%s) - start)) s; logs in $out" | tee -a "$summary"
  keep
  exit "$failed"
fi

phase test 200 "$out/test.log" "$root/scripts/gpu-test.sh"
read -r -a bench_args <<< "${KVC_GPU_ALL_BENCH_ARGS:-}"
KVC_GPU_BENCH_OUT=$out/gpu-bench.txt KVC_GPU_BENCH_NSYS=0 \
  phase bench 320 "$out/bench.log" "$root/scripts/gpu-bench.sh" "${bench_args[@]}"
if [ "${KVC_GPU_ALL_PROFILE:-0}" = 1 ]; then
  KVC_GPU_PROFILE_OUT=$out \
    phase profile 150 "$out/profile.log" "$root/scripts/gpu-profile.sh"
fi
KVC_SANITIZE_TOOLS=memcheck \
  phase memcheck 90 "$out/memcheck.log" "$root/scripts/gpu-sanitize.sh"
KVC_SANITIZE_TOOLS=racecheck \
  phase racecheck 600 "$out/racecheck.log" "$root/scripts/gpu-sanitize.sh"

echo "gpu-all: $(($(date +%s) - start)) s; logs in $out" | tee -a "$summary"
keep
exit "$failed"
