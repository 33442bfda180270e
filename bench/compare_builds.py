#!/usr/bin/env python3
"""Two builds of segtape, timed side by side: bench/compare's workers (segtape's
training step at every size, and its inference step) of a build before a
change and one after it, interleaved: in each round the two workers run in
random order, one process each, one OpenBLAS thread. Prints, per benchmark,
each build's median over all rounds and repetitions (min-max) and after /
before. The timed processes are compare's own workers: no hook, no counting.

  python3 bench/compare_builds.py BEFORE/bench/compare AFTER/bench/compare [--rounds 5] [--repetitions 3] [--min-time 0.3]
"""
import argparse
import os
import random
import statistics
import subprocess
import sys


def worker(binary, reps, min_time):
    cmd = [binary, "--worker", "--threads", "1", "--repetitions", str(reps), "--min-time", str(min_time),
           "--filter", "segtape_"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "time":
            times.setdefault(parts[1], []).append(float(parts[2]))
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3)
    a = ap.parse_args()
    runs = {"before": {}, "after": {}}
    for r in range(a.rounds):
        order = ["before", "after"]
        random.shuffle(order)
        for which in order:
            for name, ts in worker(getattr(a, which), a.repetitions, a.min_time).items():
                runs[which].setdefault(name, []).extend(ts)
        print(f"round {r + 1} of {a.rounds}: {order[0]} then {order[1]}", file=sys.stderr)
    names = sorted(set(runs["before"]) & set(runs["after"]), key=lambda n: (n.split("/")[0], [int(x) for x in n.split("/")[1:]]))
    print(f"| benchmark (us per step) | before | after | after / before |")
    print("|---|---|---|---|")
    for n in names:
        b, f = runs["before"][n], runs["after"][n]
        mb, mf = statistics.median(b), statistics.median(f)
        print(f"| {n} | {mb:.2f} ({min(b):.2f}-{max(b):.2f}) | {mf:.2f} ({min(f):.2f}-{max(f):.2f}) | {mf / mb:.3f} |")
    print(f"\n{a.rounds} rounds x {a.repetitions} repetitions per build, interleaved; medians (min-max).")


if __name__ == "__main__":
    main()
