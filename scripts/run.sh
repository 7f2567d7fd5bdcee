#!/usr/bin/env bash
# The README's main command. Installs what is needed (Debian packages, the
# model), builds kvc (which compiles the bundled policies into libraries that
# kvc-run links), shows one policy through the compiler, and runs
# SmolLM2-135M on a real text with the full cache and with compiled
# policies, printing memory kept, quality against the full cache, decode
# speed and the greedy completions.
#
# Usage: scripts/run.sh [POLICY,POLICY,...]   (names: kvc-run --list-policies)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
policies=${1:-snapkv_25pct,h2o_25pct,streaming_llm_25pct,kivi2}

"$root/scripts/setup.sh" >&2
"$root/scripts/build.sh" >&2

echo "== policies/snapkv.mlir, specialized to SmolLM2-135M, formed into kernels =="
"$build/bin/kvc-opt" "$root/policies/snapkv.mlir" \
  --kvc-specialize=model=smollm2-135m --kvc-form-kernels

text=/usr/share/common-licenses/GPL-3
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
head -c 3000 "$text" > "$prompt"
echo
echo "== kvc-run: SmolLM2-135M on the first 3000 characters of $text =="
echo "   (memory against the full f32 cache of kvc-run; the last 32 prompt tokens scored one"
echo "    at a time against it; 24 tokens generated; policies are compiled for a 2048-token budget basis)"
"$build/bin/kvc-run" --compare "$policies" --prompt-file "$prompt" \
  --eval-tokens 32 --n-predict 24 2>/dev/null |
python3 "$root/scripts/summarize_compare.py"
