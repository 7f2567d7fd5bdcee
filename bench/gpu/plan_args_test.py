#!/usr/bin/env python3
"""The benchmark commands of the GPU run plans, checked without a GPU.

A plan (scripts/gpu-plans/*.plan, run by scripts/gpu-all.sh) is a list of
phases `NAME CAP COMMAND`. Each kvc-bench-gpu invocation a phase makes goes
through kvc-bench-gpu's option parser here, with --list (which exits before
it looks for a device): the options given to scripts/gpu-bench.sh or to
kvc-bench-gpu itself, and for scripts/gpu-profile.sh its cell
(KVC_GPU_PROFILE_CELL, or the script's default) with the options the
script adds for each variant. The parser refuses a bad option and a sweep
that leaves a table it selects without rows (a batch list of none), so a
mistake there fails here rather than in the device time of a GPU run.

Usage: plan_args_test.py BENCH PLAN...   (BENCH: kvc-bench-gpu-smoke)
Exits 1 when any command is refused, 2 on bad usage or a plan with no
benchmark command.
"""

import shlex
import subprocess
import sys

# scripts/gpu-profile.sh: its default cell and what it adds to each run.
PROFILE_CELL = "--batch=8 --context=32k --dim=128 --group=4"
PROFILE_OPTIONS = ["--prefill-context=none", "--model-context=none",
                   "--alt-context=none", "--host-context=none", "--min-ms=1",
                   "--steps=8"]
SEPARATORS = {"&&", "||", ";", "|"}


def commands(tokens):
    """The simple commands of a phase's command line: [(env, words)]."""
    out, env, words = [], {}, []
    for token in tokens + ["&&"]:
        if token in SEPARATORS:
            if words:
                out.append((env, words))
            env, words = {}, []
        elif not words and "=" in token and token.split("=", 1)[0].isidentifier():
            name, value = token.split("=", 1)
            env[name] = value
        else:
            words.append(token)
    return out


def invocations(env, words):
    """The option lists of kvc-bench-gpu runs that one command makes."""
    program = words[0]
    if program.endswith("scripts/gpu-bench.sh") or program.endswith(
            "kvc-bench-gpu"):
        return [words[1:]]
    if program.endswith("scripts/gpu-profile.sh"):
        cell = shlex.split(env.get("KVC_GPU_PROFILE_CELL", PROFILE_CELL))
        return [cell + ["--variants=" + variant] + PROFILE_OPTIONS
                for variant in (words[1:] or ["fused"])]
    return []


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    bench, plans = argv[0], argv[1:]
    failed = checked = 0
    for plan in plans:
        found = 0
        with open(plan) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                fields = line.split(None, 2)
                if len(fields) < 3:
                    print(f"FAIL: {plan}:{number}: not NAME CAP COMMAND")
                    failed += 1
                    continue
                for env, words in commands(shlex.split(fields[2])):
                    for options in invocations(env, words):
                        found += 1
                        run = subprocess.run([bench, "--list", *options],
                                             capture_output=True, text=True)
                        if run.returncode != 0:
                            failed += 1
                            message = (run.stderr.strip().splitlines() or
                                       ["no message"])[0]
                            print(f"FAIL: {plan}:{number} (phase "
                                  f"{fields[0]}): kvc-bench-gpu "
                                  f"{' '.join(options)}: {message}")
        if found == 0:
            print(f"FAIL: {plan}: no kvc-bench-gpu command")
            return 2
        checked += found
    if failed:
        print(f"plan_args_test: {failed} of {checked} benchmark commands "
              "refused")
        return 1
    print(f"plan_args_test: {checked} benchmark commands of {len(plans)} "
          "plan(s) accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
