"""Per-op overhead from Python, segtape beside PyTorch, and the agent loop
driven from Python beside the same loop in C++ (docs/python.md, Benchmarks).

    build/python/bin/python bench/python_bench.py [--rounds 7] [--cxx build/bench/loop_bench] [--json FILE] [--out docs/python.md]

1. Per-op overhead: a chain of N ops recorded in one graph, then one
   backward; the time of the whole iteration divided by N is one op's cost,
   forward and backward, as a user pays it from Python. Two ops: a small
   elementwise op (tanh of a [1, 16] tensor) and a GRU step at B = 1, H = 128
   (GRUCell(32, 128)). segtape: one segment per iteration (its opening, the
   inputs, the backward and the end are in the time); PyTorch: the same chain
   with requires_grad and .backward().
2. The agent loop: bench/workload.h's training loop (GRUCell(32, H) ->
   Linear(H, 16) -> cross-entropy, Adam, K = 32 steps per segment) at B = 1,
   H = 128, written in Python on segtape, against build/bench/loop_bench (the
   same loop in C++): microseconds per training step.

Every measurement is repeated in rounds that interleave the engines; the
report gives the median and the min-max over the rounds. One thread
(OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)). No instrumentation in
the timed regions."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from markdown_section import replace_section  # noqa: E402  (bench/, beside this script)

import segtape  # noqa: E402
from segtape import nn  # noqa: E402

CHAIN = 64  # ops per iteration


def timed(fn, iterations):
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - t0) / iterations


def segtape_elementwise():
    tape = segtape.Tape(segment_budget="16MiB")
    w = tape.parameter([1, 16])
    x0 = np.full((1, 16), 0.5, dtype=np.float32)

    def it():
        with tape.segment() as seg:
            y = tape.tensor(x0) * w
            for _ in range(CHAIN):
                y = y.tanh()
            seg.backward(y.sum())
    return it


def torch_elementwise(torch):
    w = torch.zeros(1, 16, requires_grad=True)
    x0 = torch.full((1, 16), 0.5)

    def it():
        y = x0 * w
        for _ in range(CHAIN):
            y = y.tanh()
        y.sum().backward()
    return it


def segtape_gru():
    tape = segtape.Tape(segment_budget="64MiB")
    cell = nn.GRUCell(tape, 32, 128, rng=nn.Rng(1))
    x0 = np.full((1, 32), 0.25, dtype=np.float32)

    def it():
        with tape.segment() as seg:
            x = tape.tensor(x0)
            h = None
            for _ in range(CHAIN):
                h = cell(x, h)
            seg.backward(h.sum())
    return it


def torch_gru(torch):
    cell = torch.nn.GRUCell(32, 128)
    x = torch.full((1, 32), 0.25)

    def it():
        h = None
        for _ in range(CHAIN):
            h = cell(x, h)
        h.sum().backward()
    return it


def python_loop(B=1, H=128, segments=200):
    """bench/workload.h's loop in Python: microseconds per training step."""
    K, I, C = 32, 32, 16
    tape = segtape.Tape(segment_budget="256MiB")
    rng = nn.Rng(1)

    class Model(nn.Module):
        def __init__(self, t):
            super().__init__(t)
            self.cell = nn.GRUCell(t, I, H, rng=rng)
            self.head = nn.Linear(t, H, C, rng=rng)

    model = Model(tape)
    opt = nn.Adam(model, lr=1e-3)
    g = np.random.default_rng(11)
    xs = g.uniform(-1, 1, (K, B, I)).astype(np.float32)
    ys = g.integers(0, C, (K, B))
    state = [None]

    def segment():
        with tape.segment() as seg:
            h = state[0]
            loss = None
            for t in range(K):
                h = model.cell(tape.tensor(xs[t]), h)
                step_loss = segtape.cross_entropy(model.head(h), tape.tensor(ys[t]))
                loss = step_loss if loss is None else loss + step_loss
            seg.backward(loss)
            opt.step()
            opt.zero_grad()
            state[0] = seg.carry(h)

    for _ in range(10):
        segment()
    t0 = time.perf_counter()
    for _ in range(segments):
        segment()
    return (time.perf_counter() - t0) / (segments * K) * 1e6


def cxx_loop(exe, segments=200):
    out = subprocess.run([exe, "--batch", "1", "--hidden", "128", "--segments", str(segments)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=200, help="iterations per timing of an op chain")
    ap.add_argument("--cxx", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench", "loop_bench"))
    ap.add_argument("--json")
    ap.add_argument("--out", help="a Markdown file whose python-bench section is replaced by the table")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    runs = {k: [] for k in ("segtape_elementwise", "torch_elementwise", "segtape_gru", "torch_gru",
                            "python_loop", "cxx_loop")}
    makers = {"segtape_elementwise": segtape_elementwise, "torch_elementwise": lambda: torch_elementwise(torch),
              "segtape_gru": segtape_gru, "torch_gru": lambda: torch_gru(torch)}
    fns = {k: f() for k, f in makers.items()}
    for r in range(a.rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for k in order:
            runs[k].append(timed(fns[k], a.iterations) / CHAIN * 1e6)
        loops = [("python_loop", python_loop), ("cxx_loop", lambda: cxx_loop(a.cxx))]
        for k, f in (loops if r % 2 == 0 else loops[::-1]):
            runs[k].append(f())
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), file=sys.stderr)
    s = {k: summary(v) for k, v in runs.items()}
    ratios = {
        "elementwise_segtape_over_torch": s["segtape_elementwise"]["median"] / s["torch_elementwise"]["median"],
        "gru_segtape_over_torch": s["segtape_gru"]["median"] / s["torch_gru"]["median"],
        "loop_python_over_cxx": s["python_loop"]["median"] / s["cxx_loop"]["median"],
    }
    report = {"unit": "microseconds (per op, forward + backward; per training step for the loops)",
              "machine": os.uname().machine, "cpus": os.cpu_count(), "torch": torch.__version__,
              "rounds": a.rounds, "chain": CHAIN, "results": s, "ratios": ratios}
    labels = {"segtape_elementwise": "tanh [1,16], segtape", "torch_elementwise": "tanh [1,16], PyTorch",
              "segtape_gru": "GRU step 1x128, segtape", "torch_gru": "GRU step 1x128, PyTorch",
              "python_loop": "agent loop B=1 H=128, Python", "cxx_loop": "agent loop B=1 H=128, C++"}
    lines = ["| measurement | median µs | min–max |", "|---|---:|---|"]
    lines += [f"| {labels[k]} | {v['median']:.2f} | {v['min']:.2f}–{v['max']:.2f} |" for k, v in s.items()]
    lines += ["", "| ratio (medians) | value | target |", "|---|---:|---|",
              f"| tanh: segtape / PyTorch | {ratios['elementwise_segtape_over_torch']:.2f} | ≤ 0.5 |",
              f"| GRU step: segtape / PyTorch | {ratios['gru_segtape_over_torch']:.2f} | ≤ 0.5 |",
              f"| agent loop: Python / C++ | {ratios['loop_python_over_cxx']:.2f} | ≤ 1.5 |"]
    table = "\n".join(lines)
    print(table)
    if a.out:
        import platform
        head = (f"Generated by `bench/python_bench.py --rounds {a.rounds} --out {a.out}` on {platform.processor() or os.uname().machine} "
                f"({os.cpu_count()} CPUs), Python {platform.python_version()}, torch {torch.__version__}, one thread. "
                f"Per op: a chain of {CHAIN} ops, forward and backward, per op; loops: per training step. Median and "
                f"min–max over {a.rounds} rounds that interleave the engines.")
        replace_section(a.out, "python-bench", head + "\n\n" + table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
