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
echo "   (last 32 prompt tokens scored one at a time against the full cache; 24 tokens generated)"
"$build/bin/kvc-run" --compare "$policies" --prompt-file "$prompt" \
  --eval-tokens 32 --n-predict 24 2>/dev/null |
python3 -c '
import json, sys
runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
full = runs[0]["kv_bytes"]
print(f"{\"policy\":22} {\"KV MiB\":>8} {\"of full\":>8} {\"B/entry\":>8} {\"ppl\":>7} {\"KL\":>8} {\"top-1\":>6} {\"tok/s\":>6}")
for r in runs:
    print(f"{r[\"policy\"]:22} {r[\"kv_bytes\"]/2**20:8.2f} {100*r[\"kv_bytes\"]/full:7.1f}% "
          f"{r[\"bytes_per_entry\"]:8.0f} {r[\"ppl\"]:7.3f} {r[\"kl\"]:8.5f} {100*r[\"top1\"]:5.1f}% {r[\"decode_tok_s\"]:6.1f}")
print()
for r in runs:
    print(f"[{r[\"policy\"]}] ...{r[\"completion\"]!r}")
'
