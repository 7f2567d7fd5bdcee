#!/usr/bin/env python3
"""The performance issue's four targets, and the kernel alternatives'
ratios, from the CSV files of kvc-bench-gpu (--csv=FILE, or
scripts/gpu-bench.sh's KVC_GPU_BENCH_OUT: one file per phase of a GPU run).

Usage: scripts/gpu-verdicts.py [--predictions=FILE] [--before=FILE.csv,...]
                               FILE.csv [FILE.csv ...]

Reads every row of every file (a cell measured in two files counts once,
from the later file) and prints:
  - copy bandwidth: the reference of each file;
  - the targets over the decode and KIVI rows, each as "N of M cells met"
    with the range of the figure over the cells it applies to:
      bandwidth  fused GB/s / copy GB/s >= 85% at batch >= 8, context >= 4k
      overhead   fused / plain - 1 <= 5% (every cell with both)
      unfused    unfused / fused >= 1.5x (every cell with both)
      int2       16-bit / int2 >= 3x at context >= 16k
    then the cells that miss, closest first;
  - the kernel alternatives: for each alternative, its time over the
    shipped decode's in the same cell (plain_* over plain, int2_* over
    int2, fused_* over fused), the range per head dim and group;
  - the model step (model rows: every layer's fused decode per token): the
    overhead target on it (pipelined / plain - 1 <= 5%) as above, with the
    range of synchronized / pipelined and of pipelined / graph;
  - the prefill (prefill rows): SnapKV's and H2O's time over the plain
    prefill's, less one, per prompt length, and the CUDA-core prefill's
    time over the plain one's (alt_prefill_cc rows);
  - the host side (host rows): the CPU microseconds of a plain, fused and
    int2 decode call, their range per batch;
  - with --before (the CSV files of an earlier run), every decode, int2,
    model and prefill cell that both runs measured: the plain and fused
    times, % of copy and overhead, the int2 time and 16-bit / int2, the
    model step's pipelined time and overhead, the prefill's plain time and
    fractions, before -> after;
  - with --predictions (scripts/gpu-plans/next.predictions: expectations
    written before a run), each expectation against the cells it names:
    "inside", "below", "above" or "across" its range, or "not measured".
A figure kvc-bench-gpu printed as '-' (not measured) is empty in the CSV
and counts nowhere. Exits 2 on a file it cannot read or a row it cannot
parse, naming the file and line.
"""
import csv
import math
import sys

TARGETS = {
    "bandwidth": 0.85,
    "overhead": 0.05,
    "unfused": 1.5,
    "int2": 3.0,
}

# The columns of the rows whose figures are not decode times (kvc-bench-gpu's
# CSV header, "kind" comments): model rows hold microseconds per token of
# the fused policy pipelined, synchronized, the plain decode pipelined and
# the fused policy through CUDA graphs; prefill rows milliseconds per call
# of the plain prefill, SnapKV's and H2O's; host rows CPU microseconds per
# call of the plain, fused and int2 decode.
MODEL = ("pipelined", "synchronized", "plain", "graph")
PREFILL = ("plain", "snapkv", "h2o")
HOST = ("plain", "fused", "int2")


def figures_of(row, names):
    """A row's figures by name, from its four figure columns in order (the
    third under either of its names; None where not measured)."""
    values = (row["t_plain"], row["t_fused_or_snapkv"], third(row),
              row.get("fused_GBs"))
    return {name: number(value) for name, value in zip(names, values)}


def fail(message):
    """Stops the run on bad input (exit 2)."""
    print(f"gpu-verdicts: {message}", file=sys.stderr)
    sys.exit(2)


def number(text):
    """A CSV figure: None where it is empty or nan (not measured)."""
    if text is None or text == "":
        return None
    x = float(text)
    return None if math.isnan(x) else x


def third(row):
    """The third time of a row (unfused, h2o or int2: kvc-bench-gpu's CSV
    named it t_unfused_or_h2o until the int2 rows took it too)."""
    if "t_unfused_or_h2o_or_int2" in row:
        return row["t_unfused_or_h2o_or_int2"]
    return row["t_unfused_or_h2o"]


def read(paths):
    """Rows keyed by (kind, head_dim, group, batch, context), the later file
    winning; the copy bandwidth of each file."""
    rows, copies = {}, []
    for path in paths:
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                for line, row in enumerate(reader, start=2):
                    try:
                        kind = row["kind"]
                        if kind == "copy":
                            copies.append((path, number(row["copy_GBs"])))
                            continue
                        key = (kind, int(row["head_dim"]), int(row["group"]),
                               int(row["batch"]), int(row["context"]))
                        rows[key] = row
                    except (KeyError, TypeError, ValueError) as e:
                        fail(f"{path}:{line}: cannot read the row ({e}): "
                             f"{row}")
        except OSError as e:
            fail(f"cannot read {path}: {e.strerror}")
    return rows, copies


def span(xs, fmt):
    """The range of figures xs as "low-high (count)"."""
    return f"{fmt(min(xs))}-{fmt(max(xs))} ({len(xs)})"


def signed(x):
    return f"{100 * x:+.1f}%"


def times(x):
    return f"{x:.2f}x"


def cell_name(key):
    _, dim, group, batch, context = key
    return f"d{dim} G{group} B{batch} {context // 1024}k"


def verdict(name, cells, met, fmt, closest_first):
    """Prints one target: cells is [(key, figure)], met(figure) -> bool."""
    if not cells:
        print(f"{name}: no cells")
        return
    good = [c for c in cells if met(c[1])]
    figures = [c[1] for c in cells]
    print(f"{name}: {len(good)} of {len(cells)} cells met, "
          f"{fmt(min(figures))} to {fmt(max(figures))}")
    missed = sorted((c for c in cells if not met(c[1])),
                    key=lambda c: c[1], reverse=closest_first)
    if missed:
        print("  missed: " + ", ".join(
            f"{cell_name(k)} {fmt(x)}" for k, x in missed))


def targets(rows):
    bandwidth, overhead, unfused, int2 = [], [], [], []
    for key, row in sorted(rows.items()):
        kind, _, _, batch, context = key
        if kind == "decode":
            plain = number(row["t_plain"])
            fused = number(row["t_fused_or_snapkv"])
            unf = number(third(row))
            gbs, copy = number(row["fused_GBs"]), number(row["copy_GBs"])
            if gbs and copy and batch >= 8 and context >= 4096:
                bandwidth.append((key, gbs / copy))
            if plain and fused:
                overhead.append((key, fused / plain - 1))
            if fused and unf:
                unfused.append((key, unf / fused))
        elif kind == "int2":
            t16 = number(row["t_plain"])
            t2 = number(row["t_fused_or_snapkv"])
            if t16 and t2 and context >= 16384:
                int2.append((key, t16 / t2))
    percent = lambda x: f"{100 * x:.1f}%"
    verdict("bandwidth (>= 85% of copy, batch >= 8, context >= 4k)",
            bandwidth, lambda x: x >= TARGETS["bandwidth"], percent, True)
    verdict("overhead (fused / plain - 1 <= 5%)", overhead,
            lambda x: x <= TARGETS["overhead"], signed, False)
    verdict("unfused (unfused / fused >= 1.5x)", unfused,
            lambda x: x >= TARGETS["unfused"], times, True)
    verdict("int2 (16-bit / int2 >= 3x, context >= 16k)", int2,
            lambda x: x >= TARGETS["int2"], times, True)


def model_step(rows):
    """The model rows: the overhead target per token, synchronized /
    pipelined and pipelined / graph."""
    overhead, synced, graphed = [], [], []
    for key, row in sorted(rows.items()):
        if key[0] != "model":
            continue
        t = figures_of(row, MODEL)
        if t["pipelined"] and t["plain"]:
            overhead.append((key, t["pipelined"] / t["plain"] - 1))
        if t["pipelined"] and t["synchronized"]:
            synced.append(t["synchronized"] / t["pipelined"])
        if t["pipelined"] and t["graph"]:
            graphed.append(t["pipelined"] / t["graph"])
    if not overhead and not synced:
        return
    verdict("model step overhead (pipelined / plain - 1 <= 5%, per token)",
            overhead, lambda x: x <= TARGETS["overhead"], signed, False)
    if synced:
        print(f"  synchronized / pipelined: {span(synced, times)}")
    if graphed:
        print(f"  pipelined / graph: {span(graphed, times)}")


def prefill(rows):
    """The prefill rows: each policy's share on top of the plain prefill
    per prompt length; the CUDA-core prefill over the plain one."""
    shares, cores = {}, []
    for key, row in sorted(rows.items()):
        kind, dim, group, batch, context = key
        if kind == "prefill":
            t = figures_of(row, PREFILL)
            for policy in ("snapkv", "h2o"):
                if t["plain"] and t[policy]:
                    shares.setdefault(context, {}).setdefault(
                        policy, []).append(t[policy] / t["plain"] - 1)
        elif kind == "alt_prefill_cc":
            cc = number(row["t_plain"])
            plain = rows.get(("prefill", dim, group, batch, context))
            plain = plain and number(plain["t_plain"])
            if cc and plain:
                cores.append(cc / plain)
    if not shares and not cores:
        return
    print("prefill (policy / plain - 1, batch 1):")
    for context, by in sorted(shares.items()):
        print(f"  {context // 1024}k: " + ", ".join(
            f"{policy} {span(xs, signed)}" for policy, xs in by.items()))
    if cores:
        print(f"  CUDA-core plain / plain: {span(cores, times)}")


def host(rows):
    """The host rows: each decode call's CPU microseconds per batch."""
    by = {}
    for key, row in sorted(rows.items()):
        if key[0] != "host":
            continue
        for call, t in figures_of(row, HOST).items():
            if t:
                by.setdefault(key[3], {}).setdefault(call, []).append(t)
    if not by:
        return
    print("host side (CPU us per decode call):")
    for batch, calls in sorted(by.items()):
        print(f"  B{batch}: " + ", ".join(
            f"{call} {span(xs, lambda x: f'{x:.1f}')}"
            for call, xs in calls.items()))


def alternative_ratios(rows):
    """Each alternative's cells: name -> [(dim, group, batch, context,
    time / the shipped decode's in the same cell)] (plain_* over plain,
    int2_* over int2, fused_* over fused)."""
    shipped = {"plain", "int2", "fused"}
    ratios = {}
    for (kind, dim, group, batch, context), row in rows.items():
        if not kind.startswith("alt_") or kind == "alt_prefill_cc":
            continue
        name = kind[4:]
        if name in shipped:
            continue
        ref = rows.get(("alt_" + name.split("_")[0], dim, group, batch,
                        context))
        t, t0 = number(row["t_plain"]), ref and number(ref["t_plain"])
        if t and t0:
            ratios.setdefault(name, []).append(
                (dim, group, batch, context, t / t0))
    return ratios


def alternatives(ratios):
    """Each alternative's ratios, their range per head dim and group."""
    if not ratios:
        return
    print("alternatives (time / the shipped decode's; > 1: the shipped one "
          "is faster):")
    for name in sorted(ratios):
        by = {}
        for dim, group, _, _, x in ratios[name]:
            by.setdefault((dim, group), []).append(x)
        parts = []
        for (dim, group), xs in sorted(by.items()):
            parts.append(f"d{dim} G{group} {min(xs):.2f}-{max(xs):.2f} "
                         f"({len(xs)})")
        print(f"  {name}: " + "; ".join(parts))


def read_predictions(path):
    """The expectations of a predictions file: (step, column, alternative,
    dims, groups, batches, contexts, low, high) per line."""
    ints = lambda text: {int(x) for x in text.split(",")}
    found = []
    try:
        with open(path) as f:
            for number_, line in enumerate(f, start=1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                try:
                    if len(words) != 9:
                        raise ValueError(f"{len(words)} fields, not 9")
                    step, column, alt = words[:3]
                    found.append((step, column, alt, ints(words[3]),
                                  ints(words[4]), ints(words[5]),
                                  ints(words[6]), float(words[7]),
                                  float(words[8])))
                except ValueError as e:
                    fail(f"{path}:{number_}: expected STEP COLUMN ALTERNATIVE "
                         f"DIMS GROUPS BATCHES CONTEXTS LOW HIGH ({e})")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    return found


def predictions(ratios, expected):
    """Each expectation against the ratios of the cells it names."""
    print("predictions (alternative / shipped, expected range, measured):")
    for step, column, alt, dims, groups, batches, contexts, low, high in \
            expected:
        xs = [x for dim, group, batch, context, x in ratios.get(alt, [])
              if dim in dims and group in groups and batch in batches and
              context in contexts]
        where = (f"d{','.join(map(str, sorted(dims)))} "
                 f"G{','.join(map(str, sorted(groups)))} "
                 f"B{','.join(map(str, sorted(batches)))} "
                 + ",".join(f"{c // 1024}k" for c in sorted(contexts)))
        head = f"  step {step} {column} {where}: {low:.2f}-{high:.2f}"
        if not xs:
            print(f"{head}, not measured")
            continue
        lo, hi = min(xs), max(xs)
        if lo >= low and hi <= high:
            verdict_ = "inside"
        elif hi < low:
            verdict_ = "below"
        elif lo > high:
            verdict_ = "above"
        else:
            verdict_ = "across"
        print(f"{head}, measured {lo:.2f}-{hi:.2f} ({len(xs)}): {verdict_}")


def ratio(a, b, less=0.0):
    """a / b - less, None where either is not measured."""
    return a / b - less if a and b else None


def compared(kind, row):
    """The figures of a decode, int2, model or prefill row that --before
    compares: [(label, figure, format, unit)]; None for other kinds."""
    us = lambda x: f"{x:.1f}"
    if kind == "decode":
        plain = number(row["t_plain"])
        fused = number(row["t_fused_or_snapkv"])
        share = ratio(number(row["fused_GBs"]), number(row["copy_GBs"]))
        return [("plain", plain, us, " us"), ("fused", fused, us, " us"),
                ("copy", share, lambda x: f"{100 * x:.1f}%", ""),
                ("overhead", ratio(fused, plain, 1), signed, "")]
    if kind == "int2":
        t16 = number(row["t_plain"])
        t2 = number(row["t_fused_or_snapkv"])
        return [("", t2, us, " us"), ("x16b", ratio(t16, t2), times, "")]
    if kind == "model":
        t = figures_of(row, MODEL)
        return [("pipelined", t["pipelined"], us, " us/token"),
                ("overhead", ratio(t["pipelined"], t["plain"], 1), signed,
                 "")]
    if kind == "prefill":
        t = figures_of(row, PREFILL)
        return [("plain", t["plain"], lambda x: f"{x:.2f}", " ms"),
                ("snapkv", ratio(t["snapkv"], t["plain"], 1), signed, ""),
                ("h2o", ratio(t["h2o"], t["plain"], 1), signed, "")]
    return None


def compare(before, rows, copies_before, copies):
    """The decode, int2, model and prefill cells of both runs, before ->
    after. Runs whose copy bandwidths differ by more than a tenth ran on
    different devices (an H100's is about 3.0 TB/s, an H200's 4.26): a
    warning says so, since their times are not comparable."""
    print("against the run before (before -> after):")
    old_gbs = [g for _, g in copies_before if g]
    new_gbs = [g for _, g in copies if g]
    if old_gbs and new_gbs:
        a, b = sum(old_gbs) / len(old_gbs), sum(new_gbs) / len(new_gbs)
        if abs(b / a - 1) > 0.1:
            print(f"  warning: copy bandwidth {a:.0f} -> {b:.0f} GB/s: "
                  "another device; compare % of copy and ratios, not times")
    for key in sorted(k for k in rows if k in before):
        old, new = compared(key[0], before[key]), compared(key[0], rows[key])
        if old is None:
            continue
        parts = []
        for (label, a, fmt, unit), (_, b, _, _) in zip(old, new):
            change = (f"{fmt(a)} -> {fmt(b)}{unit}"
                      if a is not None and b is not None else "-")
            parts.append(f"{label} {change}" if label else change)
        print(f"  {key[0]} {cell_name(key)}: " + ", ".join(parts))


def main(argv):
    args = argv[1:]
    expected = before = None
    while args and args[0].startswith(("--predictions=", "--before=")):
        option, value = args[0].split("=", 1)
        if option == "--predictions":
            expected = read_predictions(value)
        else:
            before, copies_before = read(value.split(","))
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    rows, copies = read(args)
    for path, gbs in copies:
        print(f"copy bandwidth: {gbs:.0f} GB/s ({path})")
    targets(rows)
    ratios = alternative_ratios(rows)
    alternatives(ratios)
    model_step(rows)
    prefill(rows)
    host(rows)
    if before is not None:
        compare(before, rows, copies_before, copies)
    if expected is not None:
        predictions(ratios, expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
