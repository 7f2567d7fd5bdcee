# Sourced by the script tests of this folder after they set `test_name` (what
# their messages start with): takes SOURCE_DIR and SCRATCH_DIR from the
# test's arguments into `src` and `scratch`, empties the scratch folder,
# and defines `fail MESSAGE` (prints "<test_name> test: MESSAGE" to stderr and
# exits 1).
set -uo pipefail
src=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
fail() {
  echo "$test_name test: $*" >&2
  exit 1
}
