#!/usr/bin/env python3
"""Where a kernel's warps stall, by source line and by function: the
per-instruction counters of an Nsight Compute report (the SourceCounters
section: warp-state samples per stall reason, instructions executed)
summed over the report's launches of each kernel and attributed to the
lines and functions of kvc's sources.

Usage: scripts/ncu-source.py [--kernel=REGEX] [--top=N] [--sass=N]
                             [--root=DIR] [--dump=FILE.json[.gz]]
                             INPUT [INPUT ...]
  INPUT: a report (.ncu-rep) of `ncu --section SourceCounters` (the
        kernels built with -lineinfo, as scripts/gpu-pack.sh builds them,
        so that each instruction has a file and line), or the records
        that --dump wrote (.json or .json.gz), which need no Nsight
        Compute: a GPU run's records are read back here.
  --kernel: only the kernels whose demangled name REGEX finds (default:
        every kernel of the inputs).
  --top: the N lines with the most samples per kernel (default 25).
  --sass: also the N instructions with the most samples per kernel
        (default 0: none).
  --root: where the sources are (default: this repository), for the
        paths printed (relative to it), the source text of a line and its
        enclosing function; a recorded path that does not exist is looked
        up under the root by its path from `runtime/`, `build-*/` or its
        name.
  --dump: writes the inputs' records (every instruction that has a
        nonzero counter: its address, SASS, file and line, and the
        counters) as JSON, gzip-compressed when FILE ends in .gz.

Per kernel it prints the launches, the samples and each stall reason's
share of them ("selected" is a warp issuing, not a stall), the
instructions executed where the report has them, then the functions (a
line's innermost enclosing function definition in its source file, by a
scan of the text: lambdas count as their enclosing function), and the
lines with the most samples, each with its three largest reasons and its
source text.

Reading a .ncu-rep takes Nsight Compute's Python module ncu_report: the
PyPI package `ncu-report` (pip install ncu-report), or the one in the
`extras/python` folder of an Nsight Compute installation (found next to
`ncu` on PATH, under /opt/nvidia/nsight-compute/*, or in KVC_NCU_PYTHON).
Exit status: 0; 1 when an input cannot be read; 2 on a usage error; 77
when a .ncu-rep is given and no ncu_report module is found (nothing read).
"""

import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = "kvc-ncu-source 1"
STALL = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+?)$")
# The per-instruction executed-instruction counter, by the names Nsight
# Compute versions give it.
EXECUTED = ("inst_executed", "sass__inst_executed", "smsp__sass_inst_executed")


# Metrics with correlation IDs that are not instruction addresses (block
# sizes, NUMA nodes, links, the function's start, opcodes).
_NOT_PER_INSTRUCTION = ("launch__", "numa__", "nvlink__", "device__",
                        "sass__inst_executed_per_opcode")


class InputError(Exception):
    pass


# ---------------------------------------------------------------------------
# Reading reports (Nsight Compute) into records.

def ncu_module():
    """The ncu_report module, or None."""
    try:
        import ncu_report  # noqa: F401
        return sys.modules["ncu_report"]
    except ImportError:
        pass
    folders = []
    if os.environ.get("KVC_NCU_PYTHON"):
        folders.append(os.environ["KVC_NCU_PYTHON"])
    ncu = shutil.which("ncu")
    if ncu:
        folders.append(os.path.join(os.path.dirname(os.path.realpath(ncu)),
                                    "extras", "python"))
    folders += sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"),
                      reverse=True)
    folders += sorted(glob.glob("/usr/local/cuda*/nsight-compute*/extras/python"),
                      reverse=True)
    for folder in folders:
        if os.path.exists(os.path.join(folder, "ncu_report.py")):
            sys.path.insert(0, folder)
            try:
                import ncu_report  # noqa: F401
                return sys.modules["ncu_report"]
            except ImportError:
                sys.path.pop(0)
    return None


def read_report(path, ncu):
    """The records of one .ncu-rep: one entry per profiled launch."""
    try:
        context = ncu.load_report(path)
    except Exception as e:  # the module raises plain exceptions
        raise InputError(f"{path}: not a readable Nsight Compute report ({e})")
    launches = []
    for r in range(context.num_ranges()):
        span = context.range_by_idx(r)
        for a in range(span.num_actions()):
            action = span.action_by_idx(a)
            counters = {}
            for name in action.metric_names():
                if name.startswith(_NOT_PER_INSTRUCTION):
                    continue
                metric = action.metric_by_name(name)
                if metric is None or not metric.has_correlation_ids() or \
                        not metric.num_instances():
                    continue
                ids = metric.correlation_ids()
                # Instanced by something else than the instructions.
                if not action.sass_by_pc(ids.as_uint64(0)):
                    continue
                values = {}
                for i in range(metric.num_instances()):
                    value = metric.as_double(i)
                    if value:
                        values[ids.as_uint64(i)] = value
                if values:
                    counters[name] = values
            pcs = {}
            for address in sorted({pc for v in counters.values() for pc in v}):
                info = action.source_info(address)
                pcs[f"{address:#x}"] = [
                    action.sass_by_pc(address) or "",
                    info.file_name() if info is not None else "",
                    info.line() if info is not None else 0]
            duration = action.metric_by_name("gpu__time_duration.sum")
            launches.append({
                "name": action.name(action.NameBase_DEMANGLED),
                "duration_ns": _nanoseconds(duration),
                "pcs": pcs,
                "counters": {name: {f"{pc:#x}": v for pc, v in values.items()}
                             for name, values in sorted(counters.items())},
            })
    return launches


def _nanoseconds(metric):
    if metric is None or not metric.has_value():
        return None
    scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
    return metric.as_double() * scale.get(metric.unit(), 1)


def read_records(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a records file of --dump ({e})")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a records file of --dump "
                         f"(no \"format\": \"{FORMAT}\")")
    launches = data.get("launches")
    if not isinstance(launches, list):
        raise InputError(f"{path}: no list of launches")
    for i, launch in enumerate(launches):
        if not (isinstance(launch, dict) and isinstance(launch.get("name"), str)
                and isinstance(launch.get("pcs"), dict)
                and isinstance(launch.get("counters"), dict)):
            raise InputError(f"{path}: launch {i} lacks its name, pcs or counters")
        for pc, entry in launch["pcs"].items():
            if not (isinstance(entry, list) and len(entry) == 3):
                raise InputError(f"{path}: launch {i}, instruction {pc}: "
                                 "not [sass, file, line]")
    return launches


# ---------------------------------------------------------------------------
# Source files: paths and the functions that enclose a line.

def _blank(match):
    return re.sub(r"[^\n]", " ", match.group(0))


def _code(text):
    """The text with comments, literals and preprocessor lines blanked
    (newlines kept, so that offsets keep their lines)."""
    text = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'
                  r"'(?:\\.|[^'\\\n])*'", _blank, text, flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", _blank, text, flags=re.M)


_NOT_FUNCTIONS = {"if", "constexpr", "for", "while", "switch", "catch",
                  "return", "sizeof", "decltype", "alignof", "static_assert",
                  "noexcept"}
_ATTRIBUTES = re.compile(r"\b(?:__launch_bounds__|__align__|alignas|"
                         r"__attribute__|__declspec)\s*\(")


_TEMPLATE = re.compile(r"\btemplate\s*<")


def _strip(head, opening, brackets):
    """head without each match of the regex `opening` (which ends with an
    open bracket) and all up to the bracket that closes it."""
    while True:
        m = opening.search(head)
        if not m:
            return head
        depth, i = 1, m.end()
        while i < len(head) and depth:
            depth += {brackets[0]: 1, brackets[1]: -1}.get(head[i], 0)
            i += 1
        head = head[:m.start()] + " " + head[i:]


def _function_name(head):
    """The name a definition's head declares, or None when the brace that
    follows it opens no function body (a control statement, a class, a
    lambda, an initializer)."""
    # Template headers (whose default arguments are no assignments) and
    # attribute calls such as __launch_bounds__(...) name nothing.
    head = _strip(_strip(head, _TEMPLATE, "<>"), _ATTRIBUTES, "()")
    depth = 0
    for i, c in enumerate(head):
        if c == "(":
            if depth == 0:
                before = head[:i].rstrip()
                # Template arguments of the name: f<G, D>(...).
                while before.endswith(">"):
                    level, j = 0, len(before) - 1
                    while j >= 0:
                        level += {">": 1, "<": -1}.get(before[j], 0)
                        if level == 0:
                            break
                        j -= 1
                    before = before[:j].rstrip()
                m = re.search(r"(~?[A-Za-z_]\w*)$", before)
                if not m or m.group(1) in _NOT_FUNCTIONS:
                    return None
                prefix = before[:m.start()]
                if re.search(r"=\s*$|\]\s*$|\breturn\s*$", prefix):
                    return None
                if "=" in re.sub(r"[=!<>]=|operator\s*\S+", "", prefix):
                    return None
                return ("operator" if prefix.rstrip().endswith("operator")
                        else m.group(1))
            depth += 1
        elif c == ")":
            depth -= 1
    return None


def functions(text):
    """[(first line, last line, name)] of the function bodies of C++ or
    CUDA text, in order of their opening braces."""
    code = _code(text)
    found, stack = [], []
    start = 0          # where the current statement's head begins
    paren = 0          # parentheses open since then
    for i, c in enumerate(code):
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c == ";" and paren == 0:
            start = i + 1
        elif c == "{":
            name = _function_name(code[start:i]) if paren == 0 else None
            line = code.count("\n", 0, i) + 1
            stack.append((name, line, paren))
            start, paren = i + 1, 0
        elif c == "}":
            if stack:
                name, line, outer = stack.pop()
                if name:
                    found.append((line, code.count("\n", 0, i) + 1, name))
                paren = outer
            start = i + 1
    found.sort()
    return found


class Sources:
    """Source files by the paths a report names, looked up under a root."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self._lines, self._functions, self._paths = {}, {}, {}

    def local(self, path):
        """The file for a recorded path, or None."""
        if path in self._paths:
            return self._paths[path]
        found = None
        if path and os.path.isfile(path):
            found = path
        elif path:
            parts = path.replace("\\", "/").split("/")
            tails = []
            for i, part in enumerate(parts):
                if part in ("runtime", "test", "bench", "codegen") or \
                        part.startswith("build"):
                    tails.append("/".join(parts[i:]))
            tails.append(parts[-1])
            for tail in tails:
                candidate = os.path.join(self.root, tail)
                if os.path.isfile(candidate):
                    found = candidate
                    break
        self._paths[path] = found
        return found

    def shown(self, path):
        local = self.local(path)
        shown = local or path or "?"
        if local and os.path.abspath(local).startswith(self.root + os.sep):
            shown = os.path.relpath(local, self.root)
        return shown

    def _load(self, local):
        if local not in self._lines:
            with open(local, encoding="utf-8", errors="replace") as f:
                text = f.read()
            self._lines[local] = text.split("\n")
            self._functions[local] = functions(text)
        return self._lines[local], self._functions[local]

    def text(self, path, line):
        local = self.local(path)
        if not local:
            return ""
        lines, _ = self._load(local)
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def function(self, path, line):
        """(name, first line) of the innermost function around the line."""
        local = self.local(path)
        if not local:
            return None
        _, spans = self._load(local)
        best = None
        for first, last, name in spans:
            if first <= line <= last and (best is None or first >= best[1]):
                best = (name, first)
        return best


# ---------------------------------------------------------------------------
# The tables.

class Kernel:
    def __init__(self, name):
        self.name = name
        self.launches = 0
        self.duration_ns = 0.0
        self.timed = 0
        self.pcs = {}
        self.counters = collections.defaultdict(collections.Counter)

    def add(self, launch):
        self.launches += 1
        if launch.get("duration_ns") is not None:
            self.duration_ns += launch["duration_ns"]
            self.timed += 1
        for pc, entry in launch["pcs"].items():
            self.pcs.setdefault(int(pc, 16), entry)
        for name, values in launch["counters"].items():
            for pc, value in values.items():
                self.counters[name][int(pc, 16)] += value

    def reasons(self):
        """{reason: Counter(pc: samples)} of the stall-reason counters."""
        out = {}
        for name, values in self.counters.items():
            m = STALL.match(name)
            if m and not m.group(1).endswith("_not_issued"):
                out[m.group(1)] = values
        return out

    def executed(self):
        for name in EXECUTED:
            if name in self.counters:
                return self.counters[name]
        return None


def share(part, whole):
    return f"{100.0 * part / whole:5.1f}%" if whole else "    -"


def top_reasons(by_reason, total, count=3):
    ranked = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{r} {100.0 * v / total:.0f}%"
                     for r, v in ranked[:count] if v) if total else ""


def report(launches, sources, pattern, top, sass, out):
    kernels = collections.OrderedDict()
    for launch in launches:
        if pattern and not re.search(pattern, launch["name"]):
            continue
        kernels.setdefault(launch["name"], Kernel(launch["name"])).add(launch)
    if not kernels:
        out.write("ncu-source: no kernel" +
                  (f" matches --kernel={pattern}" if pattern else "") + "\n")
        return 1
    for kernel in kernels.values():
        reasons = kernel.reasons()
        per_pc = collections.Counter()
        for values in reasons.values():
            per_pc.update(values)
        total = sum(per_pc.values())
        executed = kernel.executed()
        out.write(f"== {kernel.name}\n")
        line = f"{kernel.launches} launch{'es' if kernel.launches != 1 else ''}"
        if kernel.timed:
            line += f", {kernel.duration_ns / kernel.timed / 1e3:.1f} us each"
        line += f", {total:.0f} warp samples"
        if executed is not None:
            line += f", {sum(executed.values()):.0f} warp instructions executed"
        out.write(line + "\n")
        if not total:
            out.write("no stall samples (no SourceCounters section in the "
                      "report?)\n\n")
            continue
        sums = sorted(((sum(v.values()), r) for r, v in reasons.items()),
                      key=lambda x: (-x[0], x[1]))
        out.write("reasons: " + ", ".join(
            f"{r} {100.0 * s / total:.1f}%" for s, r in sums if s) + "\n")

        # Attribution of each instruction: (file, line) and function.
        def where(pc):
            entry = kernel.pcs.get(pc, ["", "", 0])
            return entry[1], int(entry[2] or 0)

        by_line = collections.defaultdict(collections.Counter)
        by_function = collections.defaultdict(collections.Counter)
        lines_executed = collections.Counter()
        for reason, values in reasons.items():
            for pc, v in values.items():
                path, number = where(pc)
                by_line[(path, number)][reason] += v
                f = sources.function(path, number) if number else None
                key = (sources.shown(path), f[0], f[1]) if f else \
                    (sources.shown(path) if path else "?", "?", 0)
                by_function[key][reason] += v
        if executed is not None:
            for pc, v in executed.items():
                lines_executed[where(pc)] += v

        out.write("functions (samples, share, largest reasons):\n")
        ranked = sorted(by_function.items(),
                        key=lambda kv: (-sum(kv[1].values()), kv[0]))
        for (path, name, first), counts in ranked:
            n = sum(counts.values())
            place = f"{path}:{first}" if first else path
            out.write(f"  {n:9.0f} {share(n, total)}  {name} ({place})  "
                      f"{top_reasons(counts, n)}\n")

        out.write(f"lines, the {top} with the most samples:\n")
        ranked = sorted(by_line.items(),
                        key=lambda kv: (-sum(kv[1].values()), kv[0]))
        for (path, number), counts in ranked[:top]:
            n = sum(counts.values())
            f = sources.function(path, number) if number else None
            place = f"{sources.shown(path)}:{number}" if path else "?"
            extra = f" [{f[0]}]" if f else ""
            if executed is not None:
                extra += f" executed {lines_executed[(path, number)]:.0f}"
            out.write(f"  {n:9.0f} {share(n, total)}  {place}{extra}  "
                      f"{top_reasons(counts, n)}\n")
            text = sources.text(path, number) if number else ""
            if text:
                out.write(f"             | {text[:100]}\n")
        if sass:
            out.write(f"instructions, the {sass} with the most samples:\n")
            for pc, n in sorted(per_pc.items(), key=lambda kv: (-kv[1], kv[0]))[:sass]:
                path, number = where(pc)
                counts = collections.Counter(
                    {r: v[pc] for r, v in reasons.items() if v.get(pc)})
                place = f"{sources.shown(path)}:{number}" if path else "?"
                out.write(f"  {n:9.0f} {share(n, total)}  {pc:#06x}  "
                          f"{kernel.pcs.get(pc, [''])[0]}  ({place})  "
                          f"{top_reasons(counts, n)}\n")
        out.write("\n")
    return 0


# ---------------------------------------------------------------------------

def main(argv):
    pattern, top, sass, root, dump, inputs = None, 25, 0, ROOT, None, []
    for arg in argv:
        key, _, value = arg.partition("=")
        try:
            if key == "--kernel" and value:
                re.compile(value)
                pattern = value
            elif key == "--top" and value:
                top = int(value)
            elif key == "--sass" and value:
                sass = int(value)
            elif key == "--root" and value:
                root = value
            elif key == "--dump" and value:
                dump = value
            elif arg in ("-h", "--help"):
                print(__doc__)
                return 0
            elif arg.startswith("-"):
                raise ValueError(f"unknown option '{arg}'")
            else:
                inputs.append(arg)
        except re.error as e:
            sys.stderr.write(f"ncu-source: --kernel: not a regular expression: {e}\n")
            return 2
        except ValueError as e:
            sys.stderr.write(f"ncu-source: {arg}: {e}\n")
            return 2
    if top < 1 or sass < 0:
        sys.stderr.write("ncu-source: --top must be at least 1 and --sass at least 0\n")
        return 2
    if not inputs:
        sys.stderr.write("ncu-source: no input (a .ncu-rep or a records "
                         "file of --dump); --help says more\n")
        return 2
    launches, ncu = [], None
    try:
        for path in inputs:
            if not os.path.isfile(path):
                raise InputError(f"{path}: no such file")
            if path.endswith(".ncu-rep"):
                ncu = ncu or ncu_module()
                if ncu is None:
                    sys.stderr.write(
                        "ncu-source: SKIP: reading a .ncu-rep needs Nsight "
                        "Compute's Python module ncu_report (pip install "
                        "ncu-report, or the extras/python folder of an Nsight "
                        "Compute installation in KVC_NCU_PYTHON)\n")
                    return 77
                launches += read_report(path, ncu)
            else:
                launches += read_records(path)
    except InputError as e:
        sys.stderr.write(f"ncu-source: {e}\n")
        return 1
    if dump:
        opener = gzip.open if dump.endswith(".gz") else open
        with opener(dump, "wt") as f:
            json.dump({"format": FORMAT, "launches": launches}, f,
                      sort_keys=True, separators=(",", ":"))
    return report(launches, Sources(root), pattern, top, sass, sys.stdout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
