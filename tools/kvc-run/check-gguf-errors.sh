#!/usr/bin/env bash
# check-gguf-errors.sh - malformed GGUF files are rejected with a message
# that names the file, the offset and what was expected there.
# Usage: check-gguf-errors.sh KVC_RUN [MODEL]
#
# The cases built from scratch always run; the truncated-model case runs when
# the model file is present.
set -uo pipefail

kvc_run="$1"
model_dir="${KVC_MODEL_DIR:-$HOME/.cache/kvc/models}"
model="${2:-$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

status=0
# expect FILE PATTERN: kvc-run on FILE must fail with PATTERN on stderr.
expect() {
  local file="$1" pattern="$2" err
  err="$("$kvc_run" --model "$file" --prompt x 2>&1 >/dev/null)"
  local rc=$?
  if [[ $rc -ne 0 && "$err" == *"$file"* && "$err" == *"$pattern"* ]]; then
    echo "ok   $(basename "$file"): $err"
  else
    echo "FAIL $(basename "$file") (exit $rc): expected '$pattern' in: $err"
    status=1
  fi
}

printf 'not a model file' > "$tmp/bad-magic.gguf"
expect "$tmp/bad-magic.gguf" 'offset 0: expected the magic "GGUF"'

printf 'GGUF\001\000\000\000' > "$tmp/version1.gguf"
expect "$tmp/version1.gguf" "offset 4: expected format version 2 or 3, found 1"

printf 'GGUF\003\000\000\000\000\000' > "$tmp/short-header.gguf"
expect "$tmp/short-header.gguf" "offset 8: expected the tensor count"

# One metadata entry whose key claims 4096 bytes: magic, version 3, no
# tensors, one entry, key length 0x1000, then too few key bytes.
{
  printf 'GGUF\003\000\000\000'
  printf '\000\000\000\000\000\000\000\000'
  printf '\001\000\000\000\000\000\000\000'
  printf '\000\020\000\000\000\000\000\000'
  printf 'key-of-16-bytes'
} > "$tmp/long-key.gguf"
expect "$tmp/long-key.gguf" "offset 24: expected a metadata key of 4096 bytes"

if [[ -f "$model" ]]; then
  head -c 500000 "$model" > "$tmp/truncated-metadata.gguf"
  expect "$tmp/truncated-metadata.gguf" "'tokenizer.ggml."
  head -c 2000000 "$model" > "$tmp/truncated-data.gguf"
  expect "$tmp/truncated-data.gguf" "bytes of data for tensor"
fi
exit $status
