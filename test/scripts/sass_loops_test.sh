#!/usr/bin/env bash
# scripts/sass-loops.py's reading of disassembly, without nvcc: a
# cuobjdump -sass listing and an nvdisasm --print-line-info one of the
# same made-up kernel (the figures docs/codegen-cuda.md quotes come from
# these readers).
#  1. The loops: a backward branch closes one (its length counts every
#     instruction from its target to the branch, 32 here), a predicated
#     one is the tile loop's kind, a short one (under 30) is no loop, a
#     forward branch neither; the opcodes are counted without their
#     predicates and modifiers.
#  2. The line map: each instruction's innermost file and line, per
#     function; a function's instructions before its first line have none,
#     and a label leaves the line as it was.
#  3. The attribution of a loop's addresses: per enclosing function of the
#     source (scripts/ncu-source.py's scan) and per line, most first.
# Usage: sass_loops_test.sh SOURCE_DIR SCRATCH_DIR
test_name="sass-loops"
. "$(dirname "$0")/script_test.sh"
mkdir -p "$scratch/root/runtime"

cat > "$scratch/root/runtime/tile.cuh" <<'CUH'
__device__ float load(const float *p, int i) {
  return p[i];
}
__global__ void tileKernel(const float *p, float *out, int n) {
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    sum += load(p, i) * 2;
  }
  out[0] = sum;
}
CUH

# cuobjdump -sass: 0x0000-0x0030 set-up, a loop 0x0040-0x0230 (32
# instructions, a predicated branch back), a short loop 0x0240-0x0270 (4,
# under 30), a forward branch, the end.
{
  echo "	code for sm_90a"
  echo "		Function : _Z10tileKernelPKfPfi"
  printf '        /*%04x*/                   MOV R1, c[0x0][0x28] ;\n' 0 16 32 48
  for ((a = 64; a < 560; a += 16)); do
    case $a in
      64) text="LDG.E R2, desc[UR4][R4.64]" ;;
      80 | 96) text="@P0 FFMA R3, R2, 2, R3" ;;
      112) text="IMAD.WIDE R4, R0, 0x4, R4" ;;
      *) text="IADD3 R0, R0, 0x1, RZ" ;;
    esac
    [ "$a" -eq 560 ] || printf '        /*%04x*/                   %s ;\n' "$a" "$text"
  done
  printf '        /*%04x*/              @P1 BRA 0x40 ;\n' 560
  printf '        /*%04x*/                   NOP ;\n' 576 592 608
  printf '        /*%04x*/                   BRA 0x240 ;\n' 624
  printf '        /*%04x*/                   BRA 0x2a0 ;\n' 640
  printf '        /*%04x*/                   STG.E desc[UR4][R6.64], R3 ;\n' 656
  printf '        /*%04x*/                   EXIT ;\n' 672
} > "$scratch/kernel.sass"

# nvdisasm --print-line-info of the same: set-up without a line, the
# loop's first 4 instructions in load (line 2), the next 12 at line 7,
# the rest at line 6, and so is the EXIT after a label (a label does not
# end a line's instructions): 33 with a line.
{
  echo "	.section	.text._Z10tileKernelPKfPfi,\"ax\",@progbits"
  echo ".text._Z10tileKernelPKfPfi:"
  printf '        /*%04x*/                   MOV R1, c[0x0][0x28] ;\n' 0 16 32 48
  for ((a = 64; a <= 560; a += 16)); do
    case $a in
      64) echo '	//## File "/elsewhere/runtime/tile.cuh", line 2' ;;
      128) echo '	//## File "/elsewhere/runtime/tile.cuh", line 7' ;;
      320) echo '	//## File "/elsewhere/runtime/tile.cuh", line 6' ;;
    esac
    printf '        /*%04x*/                   IADD3 R0, R0, 0x1, RZ ;\n' "$a"
  done
  echo ".L_x_1:"
  printf '        /*%04x*/                   EXIT ;\n' 672
  # A second function, whose instructions come before any line of its own.
  echo ".text._Z5otherv:"
  printf '        /*%04x*/                   EXIT ;\n' 0 16
} > "$scratch/kernel.lines"

cd "$scratch" || fail "no scratch folder"
python3 - "$src/scripts/sass-loops.py" "$scratch/root" > "$scratch/out.txt" 2>&1 <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sass_loops", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
for name, total, found in m.loops(open("kernel.sass").read(), "tile"):
    print(f"{name}: {total} instructions")
    for start, end, length, ops, predicated in found:
        print(f"loop {start:#x}-{end:#x}: {length}, predicated {predicated}, "
              + " ".join(f"{op}:{n}" for op, n in sorted(ops.items())))
lines = m.line_map(open("kernel.lines").read())
for name, where in lines.items():
    print(f"{name}: {len(where)} with a line")
where = lines["_Z10tileKernelPKfPfi"]
print(f"first {min(where):#x}, {where[0x40]}, {where[0x80]}, {where[0x230]}")
sources = m.source_scan().Sources(sys.argv[2])
print("\n".join(m.attribute(0x40, 0x230, lines["_Z10tileKernelPKfPfi"],
                            sources, 2)))
PY
[ "$?" -eq 0 ] || fail "the readers failed: $(cat "$scratch/out.txt")"
cat > "$scratch/expected.txt" <<'TXT'
_Z10tileKernelPKfPfi: 43 instructions
loop 0x40-0x230: 32, predicated True, BRA:1 FFMA:2 IADD3:27 IMAD:1 LDG:1
_Z10tileKernelPKfPfi: 33 with a line
_Z5otherv: 0 with a line
first 0x40, ('/elsewhere/runtime/tile.cuh', 2), ('/elsewhere/runtime/tile.cuh', 7), ('/elsewhere/runtime/tile.cuh', 6)
  32 instructions with a source line, by function:
       28  tileKernel (runtime/tile.cuh:4)
        4  load (runtime/tile.cuh:1)
  the 2 lines with the most:
       16  runtime/tile.cuh:6  for (int i = 0; i < n; ++i) {
       12  runtime/tile.cuh:7  sum += load(p, i) * 2;
TXT
diff "$scratch/expected.txt" "$scratch/out.txt" > "$scratch/out.diff" ||
  fail "the readers' output differs: $(cat "$scratch/out.diff")"

echo "sass-loops: 3 scenarios passed"
