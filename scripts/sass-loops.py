#!/usr/bin/env python3
"""Static instruction counts of the decode and prefill kernels' loops, without a GPU.

Compiles explicit instantiations of the kernels of
runtime/kvc_cuda.cuh for sm_90a (nvcc -cubin), prints ptxas's registers and
spills per kernel, disassembles the cubin (cuobjdump -sass) and, for each
kernel, every loop of 30 or more instructions (a backward branch to an
earlier address of the same kernel): its length and its most frequent
opcodes. A loop's length counts every instruction of its body, the branches
not taken included; it is a static measure of the code a tile runs, not a
timing.

Usage: scripts/sass-loops.py [--arch=sm_90a] [--filter=REGEX] [--summary]
                             [--lines=N] [-DNAME=VALUE ...] [INST ...]
  INST: an instantiation, e.g. 'decodeAttentionSplit<4,128,Storage::F16,128>',
        'decodeAttentionKivi<4,128,2,32,KVC_DTYPE_F16,128>',
        'prefillAttention<8,128>' or 'prefillColumnStats<8,128>'; without
        any, the decode kernels docs/performance.md quotes.
  -D: a build-time override of runtime/kvc_cuda.cuh, e.g.
        -DKVC_CUDA_PREFILL_MMA=0 with --filter=prefill and the two prefill
        kernels for the CUDA-core prefill counts of docs/codegen-cuda.md
        (without it, the tensor-core ones, whose main loop includes both
        staging paths, float4 and float).
  --summary: one line per kernel instead of every loop: registers, bytes
        of spill stores, and its tile loop (the kernel's first loop of 300
        or more instructions that a predicated branch closes: what comes
        before it is the query's staging and the split's setup; the
        unconditional branches back from the out-of-line paths of shuffles
        in divergent code close no loop) with its length and its spill
        instructions (LDL, STL). The form docs/codegen-cuda.md's
        before/after tables use.
  --lines=N: after each kernel's summary line, where its tile loop's
        instructions come from: their count per function (a source
        line's innermost enclosing function, as scripts/ncu-source.py
        finds it) and the N source lines with the most (compiled with
        -lineinfo, which leaves the machine code as it is, and read back
        with nvdisasm --print-line-info). The static counterpart of
        ncu-source.py's samples per line.
Needs nvcc (/usr/local/cuda/bin or PATH) and cuobjdump (PATH or
$CUOBJDUMP), which runs nvdisasm (PATH or $NVDISASM_PATH; --lines runs
it itself). The CUDA
toolkit of the build machine has neither; the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them (both in
nvidia/cu13/bin: put that folder on PATH).
"""

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT = [
    "decodeAttentionSplit<1,128,Storage::F16,128>",
    "decodeAttentionSplit<4,128,Storage::F16,128>",
    "decodeAttentionSplit<8,128,Storage::BF16,128>",
    "decodeAttentionSplit<4,128,Storage::Int8,128>",
    "decodeAttentionKivi<1,128,2,32,KVC_DTYPE_F16,128>",
    "decodeAttentionKivi<4,128,2,32,KVC_DTYPE_F16,128>",
    "decodeAttentionKivi<8,128,2,32,KVC_DTYPE_F16,128>",
]


def tool(name, env):
    path = os.environ.get(env) or shutil.which(name)
    if not path and name == "nvcc" and os.path.exists("/usr/local/cuda/bin/nvcc"):
        path = "/usr/local/cuda/bin/nvcc"
    if not path:
        sys.exit(f"sass-loops: no {name} (PATH or ${env})")
    return path


def signature(inst):
    if inst.startswith("prefillAttention"):
        return ("(int32_t, const float *, const float *, const float *, "
                "float, float *, float *)")
    if inst.startswith("prefillColumnStats"):
        return ("(int32_t, int32_t, const float *, const float *, float, "
                "const float *, int32_t, float *, float *, float *, float, "
                "kvc::cuda::PersistenceBits)")
    return ("(kvc::cuda::DecodeSplitArgs, int32_t)" if "Kivi" in inst
            else "(kvc::cuda::DecodeSplitArgs)")


def demangle(name):
    """A kernel's short name: decodeAttentionKivi<4, 128, 2, 32, ...>."""
    filt = shutil.which("c++filt")
    if not filt:
        return name
    text = subprocess.run([filt, name], capture_output=True,
                          text=True).stdout.strip()
    text = re.sub(r"^void kvc::cuda::", "", text)
    text = re.sub(r"\(kvc::cuda::Storage\)1|\(kvc_dtype_t\)1", "f16", text)
    return re.sub(r"\(.*\)$", "", text)


def loops(sass, pattern):
    out = []
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        if not re.search(pattern, name):
            continue
        code = [(int(a, 16), t.strip()) for a, t in
                re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", block)]
        index = {a: i for i, (a, _) in enumerate(code)}
        found = []
        for i, (a, text) in enumerate(code):
            m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
            if not m:
                continue
            target = int(m.group(1), 16)
            if target >= a or target not in index:
                continue
            body = code[index[target]:i + 1]
            if len(body) < 30:
                continue
            ops = collections.Counter(
                re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                for _, t in body)
            found.append((target, a, len(body), ops,
                          text.startswith("@")))
        out.append((name, len(code), found))
    return out


def line_map(text):
    """{function: {address: (file, line)}} of `nvdisasm --print-line-info`
    output: each instruction's innermost source location."""
    out, function, where = {}, None, None
    for line in text.split("\n"):
        m = re.match(r"\.text\.(\S+):$", line.strip())
        if m:
            function, where = m.group(1), None
            out[function] = {}
            continue
        m = re.search(r'//## File "([^"]*)", line (\d+)', line)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+[^.\s]", line)
        if m and function is not None and where is not None:
            out[function][int(m.group(1), 16)] = where
    return out


def source_scan():
    """scripts/ncu-source.py as a module (its Sources)."""
    spec = importlib.util.spec_from_file_location(
        "ncu_source", os.path.join(ROOT, "scripts", "ncu-source.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attribute(start, end, lines, sources, top):
    """The lines of a summary: the instructions at addresses start..end by
    function and the `top` lines with the most."""
    by_line = collections.Counter(
        where for a, where in lines.items() if start <= a <= end)
    total = sum(by_line.values())
    by_function = collections.Counter()
    for (path, number), n in by_line.items():
        f = sources.function(path, number)
        by_function[(sources.shown(path), f[0], f[1]) if f
                     else (sources.shown(path), "?", 0)] += n
    out = [f"  {total} instructions with a source line, by function:"]
    for (path, name, first), n in sorted(by_function.items(),
                                         key=lambda kv: (-kv[1], kv[0])):
        out.append(f"    {n:5d}  {name} ({path}:{first})")
    out.append(f"  the {top} lines with the most:")
    for (path, number), n in sorted(by_line.items(),
                                    key=lambda kv: (-kv[1], kv[0]))[:top]:
        out.append(f"    {n:5d}  {sources.shown(path)}:{number}  "
                   f"{sources.text(path, number)[:70]}")
    return out


def main(argv):
    arch, pattern, insts, defines = "sm_90a", r"decode", [], []
    summary, top = False, 0
    for arg in argv:
        if arg == "--summary":
            summary = True
        elif arg.startswith("--lines="):
            top = int(arg.split("=", 1)[1])
            summary = True
        elif arg.startswith("-D"):
            defines.append(arg)
        elif arg.startswith("--arch="):
            arch = arg.split("=", 1)[1]
        elif arg.startswith("--filter="):
            pattern = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            insts.append(arg)
    insts = insts or DEFAULT
    nvcc, cuobjdump = tool("nvcc", "NVCC"), tool("cuobjdump", "CUOBJDUMP")
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "inst.cu")
        with open(source, "w") as f:
            f.write('#include "runtime/kvc_cuda.cuh"\n'
                    "using kvc::cuda::Storage;\n")
            for inst in insts:
                f.write(f"template __global__ void kvc::cuda::{inst}"
                        f"{signature(inst)};\n")
        cubin = os.path.join(tmp, "inst.cubin")
        ptxas = subprocess.run(
            [nvcc, "-std=c++17", f"-arch={arch}", "-I" + ROOT, *defines,
             *(["-lineinfo"] if top else []),
             "-cubin", "-o", cubin, source, "-Xptxas", "-v"],
            capture_output=True, text=True)
        if ptxas.returncode != 0:
            sys.stderr.write(ptxas.stderr)
            return ptxas.returncode
        kernel = None
        usage = {}
        for line in ptxas.stderr.splitlines():
            m = re.search(r"Compiling entry function '(\S+)'", line)
            if m:
                kernel = m.group(1)
            m = re.search(r"(\d+) bytes spill stores", line)
            if m and kernel and re.search(pattern, kernel):
                spills = m.group(1)
            m = re.search(r"Used (\d+) registers", line)
            if m and kernel and re.search(pattern, kernel):
                usage[kernel] = (m.group(1), spills)
                if not summary:
                    print(f"{kernel}: {m.group(1)} registers, "
                          f"{spills} bytes spilled")
        sass = subprocess.run([cuobjdump, "-sass", cubin], check=True,
                              capture_output=True, text=True).stdout
        lines = {}
        if top:
            lines = line_map(subprocess.run(
                [tool("nvdisasm", "NVDISASM"), "--print-line-info", cubin],
                check=True, capture_output=True, text=True).stdout)
    sources = source_scan().Sources(ROOT) if top else None
    if summary:
        for name, total, found in loops(sass, pattern):
            registers, spills = usage.get(name, ("?", "?"))
            tile = min((f for f in found if f[2] >= 300 and f[4]),
                       default=None, key=lambda f: f[0])
            line = (f"{demangle(name)}: {registers} registers, {spills} B "
                    f"spill stores, {total} instructions")
            if tile:
                start, end, length, ops, _ = tile
                line += (f"; tile loop {start:#x}-{end:#x}: {length} "
                         f"instructions, {ops['LDL'] + ops['STL']} spill")
            print(line)
            if tile and top:
                print("\n".join(attribute(tile[0], tile[1],
                                          lines.get(name, {}), sources, top)))
        return 0
    for name, total, found in loops(sass, pattern):
        print(f"{name}: {total} instructions")
        for start, end, length, ops, _ in found:
            top = " ".join(f"{op}:{n}" for op, n in ops.most_common(12))
            print(f"  loop {start:#x}-{end:#x}: {length} ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
