#!/usr/bin/env python3
"""Summarises the compare runs kept in docs/figures/compare-runs/run-*.md
(each the printed tables of one `build-bench/bench/compare --rounds 5` run)
as markdown: segtape's time and its ratio to the per-step floor at one and at
two threads, run by run, and the two-thread / one-thread ratios of the runs
that alternated the thread counts within each round. A directory argument
reads its run-*.md instead (docs/figures/compare-runs/zen2: another machine).

    python3 docs/figures/compare-runs.py [DIR]
"""
import glob
import os
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare-runs")
runs = []
for path in sorted(glob.glob(os.path.join(here, "run-*.md"))):
    rows, threads = {}, None
    for line in open(path, encoding="utf-8"):
        if line.startswith("### "):
            threads = line.split()[1]
        elif line.startswith("Memory (") or line.startswith("Segment memory"):
            threads = None
        elif line.startswith("segtape's time per step on each thread count"):
            threads = "ratio"
        elif threads and line.startswith("| ") and not line.startswith("| B, H"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[(threads, cells[0])] = cells
    runs.append((os.path.basename(path)[:-3], rows))

sizes = ["1, 128", "32, 128", "32, 512", "64, 1024", "inference 1, 128"]
names = [n for n, _ in runs]
for threads in ("1", "2"):
    print(f"segtape µs/step, median (min–max) of the run's repetitions (15 at --rounds 5, 9 at --rounds 3), and segtape / per-step floor, {threads} thread{'s' if threads != '1' else ''}:")
    print()
    print("| B, H | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for z in sizes:
        cells = []
        for _, rows in runs:
            c = rows.get((threads, z))
            cells.append("–" if c is None else c[1] + ("" if c[6] == "–" else f", {c[6]}"))
        print(f"| {z} | " + " | ".join(cells) + " |")
    print()
alternating = [(n, rows) for n, rows in runs if any(k[0] == "ratio" for k in rows)]
if alternating:
    print("segtape on 2 threads / 1 thread, round by round, median (min–max), in the runs that alternate the thread counts:")
    print()
    print("| B, H | " + " | ".join(n for n, _ in alternating) + " |")
    print("|---" * (len(alternating) + 1) + "|")
    for z in sizes:
        print(f"| {z} | " + " | ".join(rows.get(("ratio", z), [z, "–"])[1] for _, rows in alternating) + " |")
