#!/usr/bin/env python3
"""Issue 14's before/after check of bench/compare, from the raw outputs.

Reads every run-NN-before.txt / run-NN-after.txt in a directory (default
/tmp/bench-i14), each the console output of one
`compare --threads 1 --filter segtape ...` run preceded by '# ' header lines
(binary, commit, command, load average), and prints as markdown:

  * per benchmark, the median µs per step over all repetitions of all runs of
    each binary, the min–max spread, after / before, and whether after's
    median lies above before's max ("slower beyond the spread") or below
    before's min ("faster beyond the spread");
  * the runs in order with their commit, 1-minute load average and, per
    benchmark, that run's median (the run-to-run drift);
  * per round (a before run and the after run made right after it), the ratio
    of their medians, and in how many rounds after was the slower.

A repetition's time is Google Benchmark's real time per iteration (one
segment of K = 32 steps), divided by 32.

  python3 docs/figures/i14-compare.py [DIR]
"""
import re
import statistics
import sys
from pathlib import Path

K = 32  # steps per segment (bench/workload_data.h: kK)
UNIT = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A repetition line: "segtape_train/32/128/real_time   4960123 ns   4950000 ns   ..."
# (aggregates end in _mean, _median, _stddev, _cv and do not match).
REP = re.compile(r"^(segtape_\w+?/\d+/\d+)/real_time\s+([0-9.]+) (ns|us|ms|s)\s")
NAME = re.compile(r"run-(\d+)-(before|after)\.txt$")
ORDER = ["segtape_train/1/128", "segtape_train/32/128", "segtape_train/32/512", "segtape_train/64/1024",
         "segtape_infer/1/128"]


def label(bench):
    kind, b, h = bench.split("/")
    return ("inference " if kind == "segtape_infer" else "train ") + f"{b}, {h}"


def read_run(path):
    run = {"file": path.name, "times": {}, "commit": "?", "load": "?", "command": "?"}
    for raw in path.read_text(errors="replace").splitlines():
        line = ANSI.sub("", raw).strip()
        if line.startswith("# binary:"):
            m = re.search(r"commit ([0-9a-f]+)", line)
            run["commit"] = m.group(1) if m else "?"
        elif line.startswith("# command:"):
            run["command"] = line.split(":", 1)[1].strip()
        elif line.startswith("# start:"):
            m = re.search(r"loadavg: (\S+) (\S+) (\S+)", line)
            run["load"] = m.group(1) if m else "?"
        m = REP.match(line)
        if m:
            us = float(m.group(2)) * UNIT[m.group(3)] / K
            run["times"].setdefault(m.group(1), []).append(us)
    return run


def fmt(v):
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def main():
    d = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench-i14")
    runs = {"before": [], "after": []}
    order = []
    for p in sorted(d.glob("run-*.txt")):
        m = NAME.search(p.name)
        if not m:
            continue
        r = read_run(p)
        r["side"] = m.group(2)
        runs[m.group(2)].append(r)
        order.append(r)
    if not runs["before"] or not runs["after"]:
        sys.exit(f"i14-compare: no before/after runs in {d}")
    pooled = {side: {} for side in runs}
    for side, rs in runs.items():
        for r in rs:
            for b, v in r["times"].items():
                pooled[side].setdefault(b, []).extend(v)
    benches = [b for b in ORDER if b in pooled["before"] and b in pooled["after"]]
    benches += sorted(set(pooled["before"]) & set(pooled["after"]) - set(ORDER))

    commits = {side: sorted({r["commit"] for r in rs}) for side, rs in runs.items()}
    print(f"before: {', '.join(commits['before'])} ({len(runs['before'])} runs); "
          f"after: {', '.join(commits['after'])} ({len(runs['after'])} runs)\n")
    print("| benchmark (B, H) | before µs/step, median (min–max) | after µs/step, median (min–max) | after / before | verdict |")
    print("|---|---|---|---|---|")
    for b in benches:
        s = {}
        for side in ("before", "after"):
            v = pooled[side][b]
            s[side] = (statistics.median(v), min(v), max(v), len(v))
        (mb, lb, hb, nb), (ma, la, ha, na) = s["before"], s["after"]
        if ma > hb:
            verdict = "**slower beyond the spread** (after's median > before's max)"
        elif ma < lb:
            verdict = "faster beyond the spread (after's median < before's min)"
        else:
            verdict = "within the spread"
        print(f"| {label(b)} | {fmt(mb)} ({fmt(lb)}–{fmt(hb)}), n = {nb} | {fmt(ma)} ({fmt(la)}–{fmt(ha)}), n = {na} | "
              f"{ma / mb:.3f} | {verdict} |")

    print("\nEach run's median µs/step, in the order the runs were made:\n")
    print("| run | binary | 1-min load before | " + " | ".join(label(b) for b in benches) + " |")
    print("|---|---|---|" + "---|" * len(benches))
    for r in order:
        cells = [fmt(statistics.median(r["times"][b])) if b in r["times"] else "–" for b in benches]
        print(f"| {r['file'][4:6]} | {r['side']} | {r['load']} | " + " | ".join(cells) + " |")

    pairs = [(a, b) for a, b in zip(order, order[1:]) if a["side"] == "before" and b["side"] == "after"]
    print("\nPer round, after / before of the two runs' medians:\n")
    print("| round (runs) | " + " | ".join(label(b) for b in benches) + " |")
    print("|---|" + "---|" * len(benches))
    slower = {b: 0 for b in benches}
    ratios = {b: [] for b in benches}
    for i, (rb, ra) in enumerate(pairs, 1):
        cells = []
        for b in benches:
            if b in rb["times"] and b in ra["times"]:
                q = statistics.median(ra["times"][b]) / statistics.median(rb["times"][b])
                ratios[b].append(q)
                slower[b] += q > 1
                cells.append(f"{q:.3f}")
            else:
                cells.append("–")
        print(f"| {i} ({rb['file'][4:6]}, {ra['file'][4:6]}) | " + " | ".join(cells) + " |")
    print("| median of the rounds | " + " | ".join(f"{statistics.median(ratios[b]):.3f}" if ratios[b] else "–" for b in benches) + " |")
    print("| rounds with after slower | " + " | ".join(f"{slower[b]} of {len(ratios[b])}" for b in benches) + " |")


if __name__ == "__main__":
    main()
