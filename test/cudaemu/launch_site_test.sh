#!/usr/bin/env bash
# The emulator's reports name the CUDA source and its lines, not the
# rewritten copy that the host compiler builds (RewriteLaunches.cmake's
# #line directive): the line an emulator failure names as the launch site
# holds that launch in the source, and the line UBSan names holds the
# operation it reports.
#  1. kvc-cudaemu-self deadlock: "launched at test/cudaemu/EmulatorTest.cu:N",
#     and line N of that file launches `deadlock`.
#  2. kvc-cudaemu-self-asan wide-shift: "test/cudaemu/EmulatorTest.cu:N:C:
#     runtime error: shift exponent", and line N shifts by `bits`.
# Usage: launch_site_test.sh SOURCE_DIR BIN_DIR
set -uo pipefail
src=$1
bin=$2
file=test/cudaemu/EmulatorTest.cu
fail() {
  echo "launch-site test: $*" >&2
  exit 1
}
# line_of REPORT PREFIX: the line number that follows "PREFIX$file:" in
# REPORT.
line_of() {
  sed -n "s|.*$2$file:\\([0-9][0-9]*\\).*|\\1|p" <<< "$1" | head -1
}

# 1.
report=$("$bin/kvc-cudaemu-self" deadlock 2>&1)
line=$(line_of "$report" "launched at ")
[ -n "$line" ] || fail "no 'launched at $file:N' in: $report"
sed -n "${line}p" "$src/$file" | grep -q 'deadlock<<<' ||
  fail "line $line of $file does not launch deadlock: $(sed -n "${line}p" "$src/$file")"

# 2.
report=$("$bin/kvc-cudaemu-self-asan" wide-shift 2>&1)
line=$(line_of "$report" "")
[ -n "$line" ] || fail "no '$file:N:C: runtime error' in: $report"
sed -n "${line}p" "$src/$file" | grep -q '>> bits' ||
  fail "line $line of $file does not shift by bits: $(sed -n "${line}p" "$src/$file")"

echo "launch-site: 2 reports name their source lines"
