#!/usr/bin/env bash
# The README's main command: installs what is needed, builds kvc, and checks,
# specializes and prints a bundled policy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}
policy=${1:-$root/policies/snapkv.mlir}

"$root/scripts/setup.sh" >&2
"$root/scripts/build.sh" >&2
"$build/bin/kvc-opt" "$policy" --kvc-specialize=model=smollm2-135m --canonicalize
