#!/usr/bin/env python3
"""Checks kvc-run with policy libraries compiled by kvc on the real model.

Usage: check_policies.py KVC_RUN [--model PATH]

1. completions: greedy answers with each bundled policy managing the cache
   name the right answer (the prompts fit every budget: nothing is evicted).
2. full-match: on an 89-token prompt, below every budget, policies must
   reproduce the full f32 cache while decoding 16 tokens (teacher forcing):
   snapkv_f32 (an f32 cache) within max |logit diff| <= 1e-4 * max |logit|;
   the f16 caches within KL <= 1e-3 and max |logit diff| <= 0.1, the
   rounding of keys and values to f16, with the same top-1 token throughout.
   Every policy keeps every entry. Run without replay: every prompt goes
   through the model and the policy's prefill.
3. eviction: on a 319-token prompt the 10% variants (budget 205) keep at
   most 205 entries per layer and head after the prompt and hold fewer
   bytes than the f16 cache without eviction; kivi2 keeps every entry, in
   48 bytes once quantized (2-bit rows plus f16 parameters) instead
   of 256;
   next-token agreement with the full cache stays sensible (top-1 >= 0.6,
   perplexity within 1.5x). Replaying the recorded prompt pass gives
   exactly the figures of running every prompt through the model.

Exits 77 (skipped) when the model file is absent.
"""

import json
import os
import subprocess
import sys

LAYERS, KV_HEADS = 30, 3

failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message)
    if not condition:
        failures.append(message)


def kvc_run(args):
    cmd = [KVC_RUN] + MODEL_ARGS + args
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          errors="replace")
    if proc.returncode != 0:
        print(proc.stderr)
        raise SystemExit("FAIL kvc-run exited with %d: %s" %
                         (proc.returncode, " ".join(cmd[:6])))
    return proc.stdout


def compare(prompt_file, policies, eval_tokens, replay=True):
    args = ["--prompt-file", prompt_file, "--compare", ",".join(policies),
            "--eval-tokens", str(eval_tokens)]
    if not replay:
        args.append("--no-replay")
    runs = [json.loads(line) for line in kvc_run(args).splitlines()
            if line.startswith("{")]
    return {r["policy"]: r for r in runs}


def text_prefix(chars):
    path = "/usr/share/common-licenses/GPL-3"
    with open(path, encoding="utf-8") as f:
        return f.read()[:chars]


def write_prompt(name, text):
    path = os.path.join(WORK, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def completions():
    policies = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "kivi2",
                "snapkv_kivi2"]
    for policy in policies:
        for mode, prompt, answer in [
                ("text", "The capital of France is", "Paris"),
                ("chat", "What is the capital of Japan?", "Tokyo")]:
            args = ["--policy", policy, "--prompt", prompt, "--n-predict",
                    "24"]
            if mode == "chat":
                args.append("--chat")
            out = kvc_run(args)
            check(answer in out, "completion [%s, %s] %r -> %r" %
                  (policy, mode, prompt, out.strip().split("\n")[0]))


def full_match():
    prompt = write_prompt("short.txt", text_prefix(480))
    policies = ["snapkv_f32", "full_f16", "streaming_llm", "h2o", "snapkv",
                "pyramidkv", "snapkv_kivi2"]
    runs = compare(prompt, policies, 16, replay=False)
    ref = runs["none"]
    check(80 <= ref["prompt_tokens"] <= 110,
          "full-match prompt has %d tokens" % ref["prompt_tokens"])
    exact = runs["snapkv_f32"]
    check(exact["max_abs_logit_diff"] <= 1e-4 * exact["max_abs_ref_logit"]
          and exact["top1"] == 1.0,
          "snapkv_f32 matches the full cache: max |logit diff| %.3g <= 1e-4"
          " * %.3g" % (exact["max_abs_logit_diff"],
                       exact["max_abs_ref_logit"]))
    for policy in policies:
        r = runs[policy]
        check(r["entries"] == ref["entries"],
              "%s keeps all %d entries (%d)" % (policy, ref["entries"],
                                                r["entries"]))
        if policy in ("snapkv_f32", "snapkv_kivi2"):
            continue
        check(r["kl"] <= 1e-3 and r["max_abs_logit_diff"] <= 0.1 and
              r["top1"] == 1.0,
              "%s (f16 cache) matches the full cache: KL %.3g <= 1e-3, max "
              "|logit diff| %.3g <= 0.1, top-1 %.3f" %
              (policy, r["kl"], r["max_abs_logit_diff"], r["top1"]))
        check(r["prompt_max_abs_logit_diff"] <= 1e-4 * r["max_abs_ref_logit"],
              "%s prompt logits (prefill reads f32 inputs) within 1e-4: %.3g"
              % (policy, r["prompt_max_abs_logit_diff"]))


def eviction():
    prompt = write_prompt("long.txt", text_prefix(1560))
    small = ["streaming_llm_10pct", "h2o_10pct", "snapkv_10pct",
             "pyramidkv_10pct", "snapkv_kivi2_10pct"]
    policies = ["full_f16"] + small + ["kivi2", "int8", "mixed_precision"]
    runs = compare(prompt, policies, 24)
    ref, full16 = runs["none"], runs["full_f16"]
    check(ref["prompt_tokens"] > 300,
          "eviction prompt has %d tokens" % ref["prompt_tokens"])
    for policy in small:
        r = runs[policy]
        check(r["max_layer_entries"] <= 205 and
              r["entries"] <= 205 * LAYERS * KV_HEADS,
              "%s keeps at most 205 entries per layer and head after the "
              "prompt (%d, %d in all)" % (policy, r["max_layer_entries"],
                                          r["entries"]))
        check(r["kv_bytes"] < full16["kv_bytes"],
              "%s holds fewer bytes than the f16 cache: %d < %d" %
              (policy, r["kv_bytes"], full16["kv_bytes"]))
        check(r["top1"] >= 0.6 and r["ppl"] <= 1.5 * ref["ppl"],
              "%s stays sensible: top-1 %.3f >= 0.6, ppl %.2f <= 1.5 x %.2f"
              % (policy, r["top1"], r["ppl"], ref["ppl"]))
    kivi = runs["kivi2"]
    check(kivi["entries"] == ref["entries"] and
          kivi["bytes_per_entry"] == 48 and
          kivi["kv_bytes"] < full16["kv_bytes"],
          "kivi2 keeps every entry, %g bytes each once quantized, %d bytes "
          "in all (the 128 most recent at f16) vs %d" %
          (kivi["bytes_per_entry"], kivi["kv_bytes"], full16["kv_bytes"]))
    # Mixed precision keeps every entry: per head the ceil(0.2 n) best in
    # int8 (64 + 64 code bytes + two float scales = 136 bytes), the rest
    # in int2 (16 + 16 code bytes + two groups of {scale, min}, two
    # f16 each, for the key and the value = 48 bytes).
    n = ref["prompt_tokens"]
    high = -(-n // 5)
    mixed, int8 = runs["mixed_precision"], runs["int8"]
    want = LAYERS * KV_HEADS * (136 * high + 48 * (n - high))
    check(mixed["entries"] == ref["entries"] and mixed["kv_bytes"] == want and
          int8["kv_bytes"] == LAYERS * KV_HEADS * 136 * n,
          "mixed_precision keeps every entry in %d bytes (want %d; int8 %d)"
          % (mixed["kv_bytes"], want, int8["kv_bytes"]))
    check(all(runs[p]["replayed"] for p in policies[1:]),
          "the later policies replayed the recorded prompt pass")
    direct = compare(prompt, policies, 24, replay=False)
    volatile = {"replayed", "prompt_s", "decode_tok_s"}
    for policy in policies:
        a = {k: v for k, v in runs[policy].items() if k not in volatile}
        b = {k: v for k, v in direct[policy].items() if k not in volatile}
        check(a == b, "%s: replayed and direct runs give identical figures"
              % policy)


def main():
    global KVC_RUN, MODEL_ARGS, WORK
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    KVC_RUN = sys.argv[1]
    model = os.path.join(
        os.environ.get("KVC_MODEL_DIR",
                       os.path.expanduser("~/.cache/kvc/models")),
        "SmolLM2-135M-Instruct.Q4_1.gguf")
    if len(sys.argv) > 3 and sys.argv[2] == "--model":
        model = sys.argv[3]
    if not os.path.exists(model):
        print("SKIP: model file %s not found; run scripts/fetch-model.sh" %
              model)
        return 77
    if not os.path.exists("/usr/share/common-licenses/GPL-3"):
        print("SKIP: /usr/share/common-licenses/GPL-3 (base-files) not found")
        return 77
    MODEL_ARGS = ["--model", model]
    import tempfile
    with tempfile.TemporaryDirectory() as work:
        WORK = work
        completions()
        full_match()
        eviction()
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
