#!/usr/bin/env bash
# The README's test command: installs what the build needs, builds kvc, and
# runs every test: the lit suites (test/ and policies/) and the GoogleTest
# suites through ctest, then the runtime tests again under ASan and UBSan.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVC_BUILD_DIR:-$root/build}

"$root/scripts/setup.sh"
start=$(date +%s)
"$root/scripts/build.sh"

echo "== lit =="
/usr/lib/llvm-22/bin/lit -sv "$build/test" "$build/policies"

echo "== ctest =="
ctest --test-dir "$build" --output-on-failure -j2

echo "== runtime under ASan + UBSan =="
# At -O1 with line tables only (-g1: the reports' stack traces keep their
# files and lines), AddressSanitizer's usual level: RelWithDebInfo's
# -O2 -g took this build 193 s of a cold CI run, the longest compile
# (PoolTest.cpp) 62 s alone against 29 s (docs/performance.md).
san="$build-sanitize"
if [ ! -f "$san/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$san" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DKVC_BUILD_COMPILER=OFF -DKVC_ENABLE_SANITIZERS=ON \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ >/dev/null
fi
ninja -C "$san" kvc-runtime-tests
ctest --test-dir "$san" --output-on-failure -j2 -R '^runtime\.'


echo "test.sh: all suites passed in $(( $(date +%s) - start )) s"
