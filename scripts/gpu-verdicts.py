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
    int2, fused_* over fused), the range per head dim and group.
  - with --before (the CSV files of an earlier run), every decode and int2
    cell that both runs measured: the plain and fused times, % of copy and
    overhead, the int2 time and 16-bit / int2, before -> after;
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
            lambda x: x <= TARGETS["overhead"],
            lambda x: f"{100 * x:+.1f}%", False)
    verdict("unfused (unfused / fused >= 1.5x)", unfused,
            lambda x: x >= TARGETS["unfused"], lambda x: f"{x:.2f}x", True)
    verdict("int2 (16-bit / int2 >= 3x, context >= 16k)", int2,
            lambda x: x >= TARGETS["int2"], lambda x: f"{x:.2f}x", True)


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


def compare(before, rows):
    """The decode and int2 cells of both runs, before -> after."""
    print("against the run before (before -> after):")
    arrow = lambda a, b, fmt: (f"{fmt(a)} -> {fmt(b)}" if a is not None and
                               b is not None else "-")
    us = lambda x: f"{x:.1f}"
    for key in sorted(k for k in rows if k in before):
        kind = key[0]
        old, new = before[key], rows[key]
        if kind == "decode":
            def figures(row):
                plain = number(row["t_plain"])
                fused = number(row["t_fused_or_snapkv"])
                gbs, copy = number(row["fused_GBs"]), number(row["copy_GBs"])
                share = gbs / copy if gbs and copy else None
                ovh = fused / plain - 1 if plain and fused else None
                return plain, fused, share, ovh
            p0, f0, c0, o0 = figures(old)
            p1, f1, c1, o1 = figures(new)
            print(f"  decode {cell_name(key)}: plain {arrow(p0, p1, us)} us, "
                  f"fused {arrow(f0, f1, us)} us, copy "
                  f"{arrow(c0, c1, lambda x: f'{100 * x:.1f}%')}, overhead "
                  f"{arrow(o0, o1, lambda x: f'{100 * x:+.1f}%')}")
        elif kind == "int2":
            def figures(row):
                t16 = number(row["t_plain"])
                t2 = number(row["t_fused_or_snapkv"])
                return t2, (t16 / t2 if t16 and t2 else None)
            t0, x0 = figures(old)
            t1, x1 = figures(new)
            print(f"  int2 {cell_name(key)}: {arrow(t0, t1, us)} us, x16b "
                  f"{arrow(x0, x1, lambda x: f'{x:.2f}x')}")


def main(argv):
    args = argv[1:]
    expected = before = None
    while args and args[0].startswith(("--predictions=", "--before=")):
        option, value = args[0].split("=", 1)
        if option == "--predictions":
            expected = read_predictions(value)
        else:
            before, _ = read(value.split(","))
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
    if before is not None:
        compare(before, rows)
    if expected is not None:
        predictions(ratios, expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
