#!/usr/bin/env python3
"""Prints the JSON lines of `kvc-run --compare` (stdin) as a table: KV memory
kept against the first (full-cache) run, bytes per entry, perplexity, KL
divergence and top-1 agreement against the full cache, decode speed, and the
greedy completions."""
import json
import sys

runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
if not runs:
    sys.exit("summarize_compare: no kvc-run results on stdin")
full = runs[0]["kv_bytes"]
print(f"{'policy':22} {'KV MiB':>8} {'of full':>8} {'B/entry':>8} "
      f"{'ppl':>8} {'KL':>8} {'top-1':>6} {'tok/s':>6}")
for r in runs:
    print(f"{r['policy']:22} {r['kv_bytes'] / 2**20:8.2f} "
          f"{100 * r['kv_bytes'] / full:7.1f}% {r['bytes_per_entry']:8.0f} "
          f"{r['ppl']:8.3f} {r['kl']:8.5f} {100 * r['top1']:5.1f}% "
          f"{r['decode_tok_s']:6.1f}")
print()
for r in runs:
    print(f"[{r['policy']}] ...{r['completion']!r}")
