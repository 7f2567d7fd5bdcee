#!/usr/bin/env bash
# check-completions.sh - greedy completions of factual prompts must name the
# right answer. Usage: check-completions.sh KVC_RUN [MODEL]
#
# Exits 77 (skipped) when the model file is absent.
set -uo pipefail

kvc_run="$1"
model_dir="${KVC_MODEL_DIR:-$HOME/.cache/kvc/models}"
model="${2:-$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$model" ]]; then
  echo "SKIP: model file $model not found; run scripts/fetch-model.sh"
  exit 77
fi

status=0
# expect MODE PROMPT ANSWER: greedy completion (MODE "text" or "chat") must
# contain ANSWER.
expect() {
  local mode="$1" prompt="$2" answer="$3" out
  local args=(--model "$model" --prompt "$prompt" --n-predict 24 --temp 0)
  [[ "$mode" == chat ]] && args+=(--chat)
  if ! out="$("$kvc_run" "${args[@]}" 2>/dev/null)"; then
    echo "FAIL [$mode] $prompt: kvc-run exited with an error"
    status=1
    return
  fi
  if [[ "$out" == *"$answer"* ]]; then
    echo "ok   [$mode] $prompt ->${out%%$'\n'*}"
  else
    echo "FAIL [$mode] $prompt: expected '$answer' in: $out"
    status=1
  fi
}

expect text "The capital of France is" "Paris"
expect text "The largest planet in the solar system is" "Jupiter"
expect chat "What is the capital of Japan?" "Tokyo"
expect chat "Which planet is known as the Red Planet?" "Mars"
exit $status
