#!/usr/bin/env python3
"""Two builds of the segtape program, their training loops timed side by side:
`segtape train` runs of a build before a change and one after it,
interleaved (each round both builds in random order, one process each, one
OpenBLAS thread); the time is metrics.json's wall_seconds (training, the
final evaluation not counted). Prints per run each build's median (min-max)
and after / before.

  python3 bench/train_builds.py BEFORE/agent/segtape AFTER/agent/segtape [--rounds 5]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

RUNS = {
    "recall, tbptt:32 (the README's run)": [],
    "recall, exact:32/256": ["--history", "exact:32/256"],
    "tmaze, a2c, tbptt:32": ["--env", "tmaze", "--steps", "12000"],
    "tmaze, ppo": ["--env", "tmaze", "--algo", "ppo", "--steps", "8192"],
    "recall, B 1, tbptt:32": ["--batch", "1", "--steps", "12000"],
}


def timed(binary, args, out):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run([binary, "train", "--force", "--out", out, "--eval-steps", "64"] + args, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)["wall_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    t = {(w, r): [] for w in ("before", "after") for r in RUNS}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            for run, args in RUNS.items():
                order = ["before", "after"]
                random.shuffle(order)
                for w in order:
                    t[(w, run)].append(timed(getattr(a, w), args, os.path.join(d, w)))
            print(f"round {i + 1} of {a.rounds}", file=sys.stderr)
    print("| run (segtape train) | before, s | after, s | after / before |")
    print("|---|---|---|---|")
    for run in RUNS:
        b, f = t[("before", run)], t[("after", run)]
        mb, mf = statistics.median(b), statistics.median(f)
        print(f"| {run} | {mb:.3f} ({min(b):.3f}-{max(b):.3f}) | {mf:.3f} ({min(f):.3f}-{max(f):.3f}) | {mf / mb:.3f} |")
    print(f"\n{a.rounds} rounds, the two builds in random order in each; medians (min-max) of metrics.json's wall_seconds.")


if __name__ == "__main__":
    main()
