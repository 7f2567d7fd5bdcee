#!/usr/bin/env bash
# The GPU benchmark in one command: builds kvc-bench-gpu (every geometry of
# the sweep: head dim 64/128 x GQA group 1/4/8, 8 kv-heads), runs it, then
# the PyTorch SDPA baseline (bench/gpu/sdpa_baseline.py; skipped with a
# message where torch is missing), and writes everything to one file.
#
# Usage: scripts/gpu-bench.sh [kvc-bench-gpu options]   (e.g. --quick,
#        --batch=8 --context=4k,16k; see build/bin/kvc-bench-gpu --help)
# Output: ${KVC_GPU_BENCH_OUT:-build/gpu-bench.txt}, and the kvc rows as CSV
#         next to it (.csv).
# Environment: KVC_BUILD_DIR, KVC_GPU_BIN (a folder of prebuilt executables,
#         scripts/gpu-pack.sh: nothing is built), KVC_GPU_BENCH_NSYS=0 (no
#         Nsight Systems breakdown), KVC_GPU_BENCH_SDPA=0 (no SDPA
#         baseline: a slice of the sweep whose cells the baseline has
#         already timed).
# Exit status: that of kvc-bench-gpu; 77 when no CUDA device is usable
# (the table is then not produced).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
out=${KVC_GPU_BENCH_OUT:-$build/gpu-bench.txt}
csv=${out%.txt}.csv

# shellcheck source=gpu-lib.sh
. "$root/scripts/gpu-lib.sh"
# The sweep's 104 policy libraries: 36 (6 policies x 6 geometries), and 68
# kernel alternatives (17 at each of the 4 geometries with G >= 2).
gpu_executables kvc-bench-gpu || exit 1
bench=$bin/kvc-bench-gpu
if [ ! -x "$bench" ]; then
  echo "gpu-bench: $bench is missing (scripts/gpu-pack.sh gathers it)." >&2
  exit 1
fi

mkdir -p "$(dirname "$out")"
{
  echo "# kvc GPU benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
  echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
       "$(git -C "$root" diff --quiet 2>/dev/null || echo '(with local changes)')"
  echo "# command: $bench --csv=$csv $*"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.memory,power.limit \
      --format=csv,noheader 2>/dev/null | sed 's/^/# nvidia-smi: /' || true
  fi
} > "$out"

set +e
"$bench" --csv="$csv" "$@" | tee -a "$out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -eq 77 ]; then
  echo "gpu-bench: SKIP: no usable CUDA device; no figures were measured" \
       "(see $out)." | tee -a "$out"
  exit 77
elif [ "$status" -ne 0 ]; then
  echo "gpu-bench: kvc-bench-gpu failed with status $status (see $out)" >&2
  exit "$status"
fi

# Kernel time without the host side of the calls: where Nsight Systems is
# installed, one profiled cell per decode variant (batch 8, context 16k,
# head dim 128, group 4; int2 is KIVI's) and its per-kernel summary.
# KVC_GPU_BENCH_NSYS=0 skips it.
if [ "${KVC_GPU_BENCH_NSYS:-1}" != 0 ]; then
  echo | tee -a "$out"
  if nsys=$(command -v nsys); then
    prof=$(mktemp -d)
    for variant in plain fused unfused int2; do
      echo "== nsys: per-kernel GPU time, $variant decode, batch 8, context 16k," \
           "head dim 128, group 4 (kernels only; the table's times include the host side) ==" | tee -a "$out"
      if "$nsys" profile --trace=cuda --sample=none --cpuctxsw=none --force-overwrite=true \
           -o "$prof/$variant" "$bench" --batch=8 --context=16k \
           --dim=128 --group=4 --prefill-context=none --variants=$variant \
           --min-ms=50 >/dev/null 2>&1; then
        "$nsys" stats --report cuda_gpu_kern_sum --format table "$prof/$variant.nsys-rep" 2>/dev/null |
          tee -a "$out" ||
        "$nsys" stats --report gpukernsum --format table "$prof/$variant.nsys-rep" 2>/dev/null |
          tee -a "$out" || true
      else
        echo "nsys profile failed; no kernel breakdown for $variant" | tee -a "$out"
      fi
    done
    rm -rf "$prof"
  else
    echo "== nsys not installed: no per-kernel breakdown (the table's times include the host side of each call) ==" | tee -a "$out"
  fi
fi

if [ "${KVC_GPU_BENCH_SDPA:-1}" = 0 ]; then
  echo "gpu-bench: table written to $out (CSV: $csv; no SDPA baseline: KVC_GPU_BENCH_SDPA=0)" >&2
  exit 0
fi
echo | tee -a "$out"
echo "== Outside baseline: torch.nn.functional.scaled_dot_product_attention" \
     "(one batched call per step) ==" | tee -a "$out"
set +e
python3 "$root/bench/gpu/sdpa_baseline.py" "$@" 2>&1 | tee -a "$out"
py=${PIPESTATUS[0]}
set -e
if [ "$py" -ne 0 ] && [ "$py" -ne 77 ]; then
  echo "gpu-bench: the SDPA baseline failed with status $py" | tee -a "$out"
fi
echo "gpu-bench: table written to $out (CSV: $csv)" >&2
