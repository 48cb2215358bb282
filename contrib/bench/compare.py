#!/usr/bin/env python3
"""Ratios of crius's figures to another runtime's, from the files `contrib/bench/run` wrote.

    compare.py OUT_DIR

Reads OUT_DIR/reads-{crius,other}.txt (the lifecycle bench's `--reads` table),
OUT_DIR/scale-{crius,other}.txt (its `--scale` table) and OUT_DIR/critest-{crius,other}/*.json
(critest's benchmark results), and prints, for each figure both have, crius / other. A ratio
under 1 is crius ahead. Figures only one side has are left out.
"""
import json
import os
import statistics
import sys


def table(path, first):
    """Rows of the table whose header line starts with `first`: {row name: [numbers]}."""
    rows, header, inside = {}, None, False
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        if line.startswith(first):
            header, inside = line.split(), True
            continue
        if inside:
            parts = line.split()
            numbers = []
            for p in parts[::-1]:
                try:
                    numbers.insert(0, float(p))
                except ValueError:
                    break
            if not parts or not numbers:
                inside = False
                continue
            name = " ".join(parts[: len(parts) - len(numbers)])
            if not name:  # a row of numbers only: the first is its name
                name, numbers = parts[0], numbers[1:]
            rows[name] = numbers
    return header, rows


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def reads(out):
    _, a = table(os.path.join(out, "reads-crius.txt"), "reads, idle")
    _, b = table(os.path.join(out, "reads-other.txt"), "reads, idle")
    if not a or not b:
        return
    print("reads under 10 writers (lifecycle --reads), crius / other")
    print(f"{'call':<22}{'idle p50':>10}{'idle p99':>10}{'load p50':>10}{'load p99':>10}")
    for name, x in a.items():
        y = b.get(name)
        if y:
            print(f"{name:<22}" + "".join(f"{ratio(x[i], y[i]):>10}" for i in range(4)))
    print()


def scale(out):
    header, a = table(os.path.join(out, "scale-crius.txt"), "pods ")
    _, b = table(os.path.join(out, "scale-other.txt"), "pods ")
    if not a or not b or not header:
        return
    # the header names two words ("rss MB"), the rows one number per column
    names = [" ".join(header[i : i + 2]) for i in range(1, len(header), 2)]
    print("scale curve (lifecycle --scale), crius / other")
    print(f"{'pods':<6}" + "".join(f"{n:>10}" for n in names))
    for pods, x in a.items():
        y = b.get(pods)
        if y:
            print(f"{pods:<6}" + "".join(f"{ratio(x[i], y[i]):>10}" for i in range(len(x))))
    print()


def critest(out):
    da, db = os.path.join(out, "critest-crius"), os.path.join(out, "critest-other")
    if not os.path.isdir(da) or not os.path.isdir(db):
        return
    print("critest -benchmark, medians and p99 in ms, crius / other")
    for name in sorted(os.listdir(da)):
        if not name.endswith(".json") or not os.path.exists(os.path.join(db, name)):
            continue
        sides = []
        for d in (da, db):
            data = json.load(open(os.path.join(d, name)))
            ops = data.get("operationsNames") or []
            per = {op: [] for op in ops}
            for point in data.get("datapoints") or []:
                for op, ns in zip(ops, point.get("operationsDurationsNs") or []):
                    per[op].append(ns / 1e6)
            sides.append((data.get("numParallel"), per))
        (par, a), (_, b) = sides
        print(f"{name} ({par} at a time)")
        for op, xs in a.items():
            ys = b.get(op)
            if not xs or not ys:
                continue
            xs, ys = sorted(xs), sorted(ys)
            p99 = lambda v: v[min(len(v) - 1, int(len(v) * 0.99))]
            print(
                f"  {op:<22}{statistics.median(xs):>9.2f}{statistics.median(ys):>9.2f}"
                f"{ratio(statistics.median(xs), statistics.median(ys)):>7}"
                f"{p99(xs):>9.2f}{p99(ys):>9.2f}{ratio(p99(xs), p99(ys)):>7}"
            )
    print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: compare.py OUT_DIR")
    reads(sys.argv[1])
    scale(sys.argv[1])
    critest(sys.argv[1])
