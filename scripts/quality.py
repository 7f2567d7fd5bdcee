#!/usr/bin/env python3
"""Quality and memory of the bundled kvc policies on SmolLM2-135M.

Writes docs/quality.md and docs/quality.png. One command, after the build
(`ninja -C build kvc-run`) and scripts/fetch-model.sh:

    python3 scripts/quality.py            # about 30 minutes on 2 cores

Every figure comes from build/bin/kvc-run --compare (tools/kvc-run/Compare.h),
which runs a prompt with the full f32 cache and then with each policy
library compiled by kvc and linked into kvc-run:

1. Next-token quality. The text is the GNU GPL version 3 as Debian's
   base-files ships it (/usr/share/common-licenses/GPL-3, 7639 tokens); its
   first --context tokens (2048) are the prompt, the next --eval-tokens (256)
   are fed one decode step at a time (teacher forcing) while the policy
   manages the cache. Reported: KV entries and bytes kept after the prompt
   and at the end, perplexity of the 256 tokens, mean KL divergence of the
   policy's next-token distribution from the full cache's, top-1 agreement,
   decode tokens/s at 2048-2304 entries of context.
2. Needle retrieval. "The secret code is 4729." is planted at 10/50/90% of
   the depth of a GPL-3 excerpt, the chat prompt (about --context tokens)
   ends with a question about it, and the greedy answer must contain 4729.

Budgets: tools/kvc-run/policies/CMakeLists.txt derives 10/25/50% variants
of every bundled policy from a prompt of KVC_RUN_EVAL_CONTEXT = 2048 tokens,
the --context used here. kivi2 evicts nothing and has no budget. full_f16
is the kvc runtime's f16 cache without eviction (StreamingLLM with a budget
of the whole model context): the denominator of the memory ratios, and the
error that f16 storage alone causes.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["streaming_llm", "h2o", "scissorhands", "snapkv", "pyramidkv",
            "snapkv_global", "snapkv_kivi2"]
PERCENTS = [10, 25, 50]
NEEDLE = "The secret code is 4729."
NEEDLE_ANSWER = "4729"
QUESTION = ("What is the secret code mentioned in the text above? "
            "Answer with the number only.")
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


def log(message):
    print("quality.py: " + message, file=sys.stderr, flush=True)


def run_kvc(args, opts, capture_stderr=False):
    cmd = [opts.kvc_run] + args
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE if capture_stderr else None,
                          text=True, errors="replace")
    if proc.returncode != 0:
        raise SystemExit("quality.py: %s failed with status %d" %
                         (" ".join(cmd[:4]), proc.returncode))
    return proc.stdout


def compare(prompt_args, policies, opts, extra):
    out = run_kvc(prompt_args + ["--compare", ",".join(policies),
                                 "--prefill-batch", "4096"] + extra, opts)
    return [json.loads(line) for line in out.splitlines()
            if line.startswith("{")]


def linked_policies(opts):
    names, context = set(), None
    for line in run_kvc(["--list-policies"], opts).splitlines():
        if line.startswith("(percent budgets are of a "):
            context = int(line.split()[5].split("-")[0])
        elif line and not line.startswith("("):
            names.add(line.split()[0])
    return names, context


def token_count(path, opts, chat):
    args = ["--prompt-file", path, "--print-tokens"]
    if chat:
        args.append("--chat")
    return len(run_kvc(args, opts).split())


def needle_prompt(text, depth, target_tokens, workdir, opts):
    """A chat prompt of about target_tokens tokens: a prefix of `text` with
    the needle planted at `depth` percent of it, then the question."""
    path = os.path.join(workdir, "needle_%d.txt" % depth)

    def build(chars):
        doc = text[:chars]
        doc = doc[:doc.rfind("\n") + 1] if "\n" in doc else doc
        at = int(len(doc) * depth / 100)
        # Plant it at the next paragraph break, as a paragraph of its own.
        br = doc.find("\n\n", at)
        at = br + 2 if br >= 0 else len(doc)
        doc = doc[:at] + NEEDLE + "\n\n" + doc[at:]
        with open(path, "w", encoding="utf-8") as f:
            f.write(doc.rstrip() + "\n\n" + QUESTION)
        return token_count(path, opts, chat=True)

    chars = target_tokens * 4
    for _ in range(6):
        n = build(chars)
        if abs(n - target_tokens) <= 8:
            break
        chars = int(chars * (target_tokens - 4) / n)
    return path, n


def mib(b):
    return b / (1 << 20)


def budget_of(policy):
    for pct in PERCENTS:
        if policy.endswith("_%dpct" % pct):
            return policy[:-len("_%dpct" % pct)], pct
    return policy, None


def write_plot(rows, full16, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    markers = {"streaming_llm": "o", "h2o": "s", "scissorhands": "x",
               "snapkv": "^", "pyramidkv": "v", "snapkv_global": "<",
               "snapkv_kivi2": "D", "kivi2": "*", "full_f16": "P"}
    groups = {}
    for r in rows:
        base, pct = budget_of(r["policy"])
        groups.setdefault(base, []).append(r)
    for base, runs in groups.items():
        runs.sort(key=lambda r: r["kv_bytes"])
        x = [100.0 * r["kv_bytes"] / full16["kv_bytes"] for r in runs]
        kw = dict(marker=markers.get(base, "x"), label=base)
        axes[0].plot(x, [max(r["kl"], 1e-6) for r in runs], **kw)
        axes[1].plot(x, [r["ppl"] for r in runs], **kw)
        axes[2].plot(x, [100.0 * r["top1"] for r in runs], **kw)
    ref_ppl = rows[0]["ref_ppl"]
    axes[1].axhline(ref_ppl, color="gray", ls="--", lw=1,
                    label="full cache (f32)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean KL(full || policy), nats")
    axes[1].set_ylabel("perplexity of the 256 scored tokens")
    axes[2].set_ylabel("top-1 agreement with the full cache, %")
    for ax in axes:
        ax.set_xlabel("KV bytes kept after the prompt, % of the f16 cache")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("kvc policies on SmolLM2-135M-Instruct (Q4_1), GPL-3 text: "
                 "2048-token prompt, 256 tokens decoded with teacher forcing")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kvc-run", default=os.path.join(ROOT, "build/bin/kvc-run"))
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--eval-tokens", type=int, default=256)
    ap.add_argument("--depths", default="10,50,90")
    ap.add_argument("--needle-percents", default="10,50",
                    help="budgets run in the needle test (all three take "
                    "about 5 more minutes)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out-md", default=os.path.join(ROOT, "docs/quality.md"))
    ap.add_argument("--out-png",
                    default=os.path.join(ROOT, "docs/quality.png"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build/quality"))
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the report and plot from the results of "
                    "the last run (WORKDIR/results.json)")
    opts = ap.parse_args()
    results_path = os.path.join(opts.workdir, "results.json")
    if opts.report_only:
        with open(results_path) as f:
            results = json.load(f)
    else:
        results = measure(opts)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
    report(results, opts)
    return 0


def measure(opts):
    """Runs every measurement; returns what the report needs."""
    started = time.time()
    if not os.path.exists(opts.kvc_run):
        raise SystemExit("quality.py: %s not found; build it with "
                         "ninja -C build kvc-run" % opts.kvc_run)
    names, built_context = linked_policies(opts)
    wanted = ["full_f16", "kivi2"] + ["%s_%dpct" % (p, pct)
                                      for pct in PERCENTS for p in POLICIES]
    missing = [n for n in wanted if n not in names]
    if missing:
        raise SystemExit("quality.py: kvc-run lacks the policy libraries %s "
                         "(built with KVC_BUILD_COMPILER=ON?)" %
                         ", ".join(missing))
    if built_context != opts.context:
        log("warning: the budget variants were derived from a %s-token "
            "prompt, this run uses %d" % (built_context, opts.context))
    os.makedirs(opts.workdir, exist_ok=True)
    with open(opts.text, encoding="utf-8") as f:
        text = f.read()

    # 1. Next-token quality.
    tokens = run_kvc(["--prompt-file", opts.text, "--print-tokens"],
                     opts).split()
    total = opts.context + opts.eval_tokens
    if len(tokens) < total:
        raise SystemExit("quality.py: %s has %d tokens, fewer than %d" %
                         (opts.text, len(tokens), total))
    log("%s: %d tokens; prompt %d + %d scored; %d policy runs" %
        (opts.text, len(tokens), opts.context, opts.eval_tokens,
         len(wanted)))
    runs = compare(["--prompt-tokens", " ".join(tokens[:total])], wanted,
                   opts, ["--eval-tokens", str(opts.eval_tokens)])
    quality_seconds = time.time() - started

    # 2. Needle retrieval.
    depths = [int(d) for d in opts.depths.split(",")]
    needle_percents = [int(p) for p in opts.needle_percents.split(",")]
    needle_policies = ["full_f16", "kivi2"] + [
        "%s_%dpct" % (p, pct) for pct in needle_percents for p in POLICIES]
    needle = {}
    needle_tokens = {}
    for depth in depths:
        path, n = needle_prompt(text, depth, opts.context, opts.workdir, opts)
        needle_tokens[depth] = n
        log("needle at %d%%: %d-token chat prompt" % (depth, n))
        for r in compare(["--prompt-file", path, "--chat"], needle_policies,
                         opts, ["--n-predict", "24"]):
            needle.setdefault(r["policy"], {})[str(depth)] = r["completion"]
    return {"runs": runs, "text_tokens": len(tokens), "needle": needle,
            "needle_tokens": needle_tokens, "depths": depths,
            "needle_policies": needle_policies,
            "quality_seconds": quality_seconds,
            "total_seconds": time.time() - started}


def answer_part(completion):
    """The part of a needle answer after "... is", for the table."""
    a = completion.strip().replace("\n", " ")
    at = a.find(" is ")
    return (a[at + 4:] if at >= 0 else a)[:24].replace("|", "\\|")


def report(results, opts):
    runs = results["runs"]
    by_name = {r["policy"]: r for r in runs}
    ref, full16 = by_name["none"], by_name["full_f16"]
    needle = results["needle"]
    depths = results["depths"]
    needle_tokens = {int(k): v for k, v in results["needle_tokens"].items()}
    needle_policies = results["needle_policies"]
    quality_seconds = results["quality_seconds"]
    total_seconds = results["total_seconds"]
    total = opts.context + opts.eval_tokens
    for r in runs:
        r["ref_ppl"] = ref["ppl"]
    full_entries = ref["entries"]
    lines = []
    w = lines.append
    w("# Policy quality on a real model")
    w("")
    w("Generated by `python3 scripts/quality.py` (%.0f minutes on this "
      "machine: %d cores shared with other work, kvc-run with %s threads). "
      "Do not edit; rerun the script." %
      (total_seconds / 60, os.cpu_count() or 0,
       opts.threads or "all"))
    w("")
    w("Model: SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, 9 query heads, "
      "3 kv heads of 64). Engine: `tools/kvc-run`, whose KV cache is either "
      "the full f32 cache (`none`, the reference) or the kvc runtime managed "
      "by a policy library that `kvc_add_policy_library` compiled from a "
      "policy file (`tools/kvc-run/policies/CMakeLists.txt`). Policy caches "
      "store keys and values in f16 (the geometry `model=smollm2-135m`), "
      "KIVI formats in 2 bits.")
    w("")
    w("## Next-token quality")
    w("")
    w("Text: `%s` (the GNU GPL 3 as Debian's base-files ships it, %d "
      "tokens). Prompt: its first %d tokens; the next %d tokens are decoded "
      "one at a time with teacher forcing while the policy manages the "
      "cache (context %d to %d). Budgets are %s%% of the %d-token prompt "
      "per layer and kv head (PyramidKV: the average over layers). After "
      "the prompt, SnapKV and PyramidKV (prefill-only policies) grow by one "
      "entry per decoded token; StreamingLLM and H2O evict at every step "
      "and stay at their budget." %
      (opts.text, results["text_tokens"], opts.context, opts.eval_tokens,
       opts.context, total, "/".join(str(p) for p in PERCENTS), opts.context))
    w("")
    w("Columns: entries kept after the prompt over all layers and heads "
      "(%% of the full cache); KV bytes of the live entries after the prompt "
      "and after the %d decoded tokens (from the runtime's page layout: "
      "rows plus quantization parameters; a KIVI entry still in its "
      "full-precision residual window counts at f16 size), and after the "
      "prompt as %% of the f16 cache without eviction (`full_f16`); "
      "perplexity of the scored tokens; mean KL divergence KL(full || "
      "policy) of the next-token distributions in nats; top-1 agreement "
      "with the full cache; decode tokens/s over the scored tokens." %
      opts.eval_tokens)
    w("")
    w("| policy | budget | entries kept | KV MiB after prompt | % of f16 "
      "cache | KV MiB at end | perplexity | KL (nats) | top-1 | decode "
      "tok/s |")
    w("|---|---|---|---|---|---|---|---|---|---|")

    def row(r, budget):
        w("| `%s` | %s | %d (%.1f%%) | %.2f | %.1f%% | %.2f | %.3f | %.3g | "
          "%.1f%% | %.1f |" %
          (r["policy"], budget, r["entries"],
           100.0 * r["entries"] / full_entries, mib(r["kv_bytes"]),
           100.0 * r["kv_bytes"] / full16["kv_bytes"], mib(r["kv_bytes_end"]),
           r["ppl"], r["kl"], 100.0 * r["top1"], r["decode_tok_s"]))

    row(ref, "full, f32")
    row(full16, "full, f16")
    row(by_name["kivi2"], "all, 2-bit")
    for pct in PERCENTS:
        for p in POLICIES:
            r = by_name["%s_%dpct" % (p, pct)]
            row(r, "%d%%" % pct)
    w("")
    w("![quality](quality.png)")
    w("")
    w("Decode tokens/s is the whole model step (30 layers of matrix "
      "products plus attention) at 2048-2304 tokens of context, measured "
      "while other work shared the 2 cores, so it is indicative only. The "
      "full cache's attention runs on both threads; a generated decode "
      "kernel runs on the calling thread, over fewer entries. "
      "Prompt time: %.1f s for the full cache; the first policy's prompt "
      "pass %.1f s; the later policies replay the recorded prompt pass "
      "(their prefill kernels still run, and their attention outputs are "
      "checked bit for bit against the recorded ones), %.1f-%.1f s." %
      (ref["prompt_s"], runs[1]["prompt_s"],
       min(r["prompt_s"] for r in runs[2:]),
       max(r["prompt_s"] for r in runs[2:])))
    w("")
    pyr = by_name["pyramidkv_10pct"]
    small = [by_name["%s_10pct" % p] for p in POLICIES]
    w("Notes. `full_f16` differs from `none` only by the f16 rounding of "
      "stored keys and values (KL %.2g nats). PyramidKV's budget rule (the "
      "integer rule of its code base) keeps %.0f entries per layer and head "
      "on average at a nominal 10%% budget of %d. The f16 caches decode "
      "slower than the f32 full cache at full length because the generated "
      "CPU decode kernel runs single-threaded and converts f16 rows in the "
      "loop; with 10%% of the entries they run at %.0f-%.0f tokens/s "
      "against %.0f." %
      (full16["kl"], pyr["entries"] / (LAYERS * KV_HEADS),
       round(opts.context * 0.10),
       min(r["decode_tok_s"] for r in small),
       max(r["decode_tok_s"] for r in small), ref["decode_tok_s"]))
    w("")
    w("## Needle retrieval")
    w("")
    w("The line \"%s\" is planted at %s%% of the depth of a GPL-3 excerpt; "
      "the chat prompt (system message of the model's template, the excerpt, "
      "then \"%s\") has %s tokens. Greedy answer of up to 24 tokens; retrieval "
      "is exact when it contains %s. Budgets are %% of %d tokens." %
      (NEEDLE, "/".join(str(d) for d in depths), QUESTION,
       "/".join(str(needle_tokens[d]) for d in depths), NEEDLE_ANSWER,
       opts.context))
    w("")
    w("| policy | " + " | ".join("depth %d%%" % d for d in depths) +
      " | retrieved |")
    w("|---|" + "---|" * len(depths) + "---|")
    for name in ["none"] + needle_policies:
        answers = needle.get(name, {})
        cells, hits = [], 0
        for d in depths:
            a = answers.get(str(d), "")
            hit = NEEDLE_ANSWER in a
            hits += hit
            cells.append("%s `%s`" % ("yes" if hit else "no", answer_part(a)))
        w("| `%s` | %s | %d/%d |" % (name, " | ".join(cells), hits,
                                      len(depths)))
    w("")
    w("## Reproducing")
    w("")
    w("```sh")
    w("scripts/fetch-model.sh")
    w("cmake -S . -B build && ninja -C build kvc-run")
    w("pip install -r scripts/requirements.txt   # matplotlib for the plot")
    w("python3 scripts/quality.py                # writes docs/quality.md, "
      "docs/quality.png")
    w("```")
    w("")
    w("Raw results of every run (the JSON objects of `kvc-run --compare` "
      "and the needle answers): `build/quality/results.json`; "
      "`--report-only` rewrites this page from them. The quality section "
      "took %.0f s, the needle section %.0f s." %
      (quality_seconds, total_seconds - quality_seconds))
    with open(opts.out_md, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    write_plot(runs[1:], full16, opts.out_png)
    log("wrote %s and %s" % (opts.out_md, opts.out_png))


if __name__ == "__main__":
    sys.exit(main())
