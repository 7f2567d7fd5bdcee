#!/usr/bin/env bash
# Host stubs of device functions in the GPU executables. nvcc compiles a
# call from host code to a __device__ function into a call to a host body
# that only exits with status 1, printing nothing, when the call sits in a
# template it instantiates (a plain host function is refused at compile
# time). Such a program builds, skips cleanly without a GPU and fails in
# silence on one. This check finds those bodies without a GPU: in the
# executables' host code (test/gpu builds it without optimization, so no
# body is inlined away), a function that calls exit and nothing that
# prints, named with its demangled signature.
# Usage: host_stubs_test.sh OBJDUMP EXECUTABLE...
set -uo pipefail
objdump=$1
shift
[ $# -gt 0 ] || { echo "host_stubs_test: no executables given" >&2; exit 2; }
found=0
for exe in "$@"; do
  if [ ! -f "$exe" ]; then
    echo "FAIL: $exe is missing"
    found=1
    continue
  fi
  stubs=$("$objdump" -d --no-show-raw-insn -C "$exe" | awk '
    function report() { if (name != "" && exits && !prints) print name }
    /^[0-9a-f]+ <.*>:$/ {
      report()
      name = substr($0, index($0, "<") + 1)
      name = substr(name, 1, length(name) - 2)
      if (name ~ /@plt$/) name = ""
      exits = 0; prints = 0
      next
    }
    /call.*<(exit|_exit)@plt>/ { exits = 1 }
    /call.*<(printf|fprintf|vfprintf|puts|fputs|fwrite|perror)@plt>/ {
      prints = 1
    }
    END { report() }')
  if [ -n "$stubs" ]; then
    echo "FAIL: $(basename "$exe") calls the host stub of a device" \
         "function (exits 1 without a message on a GPU):"
    sed 's/^/  /' <<< "$stubs"
    found=1
  else
    echo "$(basename "$exe"): no host stub of a device function"
  fi
done
exit "$found"
