# Functions of the GPU scripts (gpu-test.sh, gpu-sanitize.sh, gpu-bench.sh,
# gpu-pack.sh), sourced after they set `root` and `build`.

# gpu_executables TARGET...: sets `bin` to the folder of the GPU
# executables: KVC_GPU_BIN when it is set (prebuilt, scripts/gpu-pack.sh;
# nothing is built), else $build/bin after building TARGETs (configuring
# and building kvc first on a fresh checkout). Returns 1 when a target is
# missing (no CUDA compiler at configuration) or a build fails.
gpu_executables() {
  if [ -n "${KVC_GPU_BIN:-}" ]; then
    bin=$KVC_GPU_BIN
    return 0
  fi
  if [ ! -f "$build/build.ninja" ]; then
    "$root/scripts/setup.sh" >&2 || return 1
    "$root/scripts/build.sh" >&2 || return 1
  fi
  local target
  for target in "$@"; do
    if ! ninja -C "$build" -t query "$target" >/dev/null 2>&1; then
      echo "$(basename "$0"): the build in $build has no $target target:" \
           "CMake found no CUDA compiler (nvcc in /usr/local/cuda/bin or on PATH)." >&2
      return 1
    fi
  done
  echo "$(basename "$0"): building $*" >&2
  ninja -C "$build" "$@" >&2 || return 1
  bin=$build/bin
}

# gpu_finish SCRIPT WORD RAN SKIPPED FAILED: prints the tally ("RAN WORD,
# SKIPPED skipped, FAILED failed") and exits 1 when something failed, 77
# when nothing ran (no usable GPU), 0 otherwise.
gpu_finish() {
  echo "$1: $3 $2, $4 skipped, $5 failed"
  if [ "$5" -gt 0 ]; then
    exit 1
  fi
  if [ "$3" -eq 0 ]; then
    exit 77
  fi
  exit 0
}
