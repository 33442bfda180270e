"""The README's training loop written in Python trains to the C++ loop's curve.

tests/run.sh passes SEGTAPE_README_CURVE: the README's C++ program
(tests/readme_example.cpp) built with one line added that prints every
segment's loss per step (readme_curve, tests/readme_test.cmake). Both use the
same seed and the same Rng draws in the same order."""
import contextlib
import io
import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

import segtape
from segtape import nn


class Model(nn.Module):  # token -> embedding -> GRU state -> logits
    def __init__(self, tape, rng):
        super().__init__(tape)
        self.embed = nn.Embedding(tape, 4, 16, rng=rng)
        self.gru = nn.GRUCell(tape, 16, 32, rng=rng)
        self.head = nn.Linear(tape, 32, 4, rng=rng)


def readme_loop_in_python(segments=200):
    """The README's loop, line for line; returns the loss per step of every segment."""
    tape = segtape.Tape("cpu", segment_budget=64 << 20)
    rng = nn.Rng(1)
    model = Model(tape, rng)
    opt = nn.Adam(model, lr=1e-2)
    B, K = 16, 8
    token = np.zeros(B, dtype=np.int64)
    previous = np.zeros(B, dtype=np.int64)
    h = None
    curve = []
    for _ in range(segments):
        with tape.segment() as seg:
            loss = tape.zeros([])
            for _ in range(K):
                for i in range(B):
                    token[i] = int(rng.uniform() * 4)
                h = model.gru(model.embed(tape.tensor(token)), h)
                loss = loss + segtape.cross_entropy(model.head(h), tape.tensor(previous))
                previous = token.copy()
                tape.next_step()
            seg.backward(loss)
            opt.step()
            opt.zero_grad()
            h = seg.carry(h)
            curve.append(loss.item() / K)
    return curve


def test_readme_loop_matches_the_cpp_loop():
    exe = os.environ.get("SEGTAPE_README_CURVE")
    if not exe:
        pytest.skip("SEGTAPE_README_CURVE (the readme_curve program) not given; tests/run.sh gives it")
    out = subprocess.run([exe], check=True, capture_output=True, text=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}).stdout.split("\n")
    cpp = [float(x) for x in out if x and not x.startswith("loss")]
    py = readme_loop_in_python(len(cpp))
    assert len(cpp) == 200
    diff = np.abs(np.array(py) - np.array(cpp))
    assert diff.max() <= 1e-6, f"largest difference {diff.max():.3g} at segment {int(diff.argmax()) + 1}"
    assert py[-1] < py[0] / 100  # it trained, as the README's program checks


def test_readme_loop_trains_without_the_cpp_program():
    curve = readme_loop_in_python(60)
    assert curve[-1] < curve[0] / 4


def test_the_readme_python_example_runs():
    """README.md's ```python block, executed as it is."""
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    block = re.search(r"```python\n(.*?)```", readme.read_text(), re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(readme), "exec"), {})
    assert "GruCell" in out.getvalue() and out.getvalue().rstrip().endswith("(4, 32)")
