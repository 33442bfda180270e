"""`segtape train --log-dir` writes event files that TensorBoard's own reader
(the tensorboard package's EventAccumulator) reads: every scalar, with the
metrics.csv values. tests/run.sh passes the segtape program as SEGTAPE_CLI."""
import csv
import os
import subprocess

import pytest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_tensorboard_reads_the_training_scalars(tmp_path):
    exe = os.environ.get("SEGTAPE_CLI")
    if not exe:
        pytest.skip("SEGTAPE_CLI (the segtape program) not given; tests/run.sh gives it")
    out, logs = tmp_path / "run", tmp_path / "logs"
    subprocess.run([exe, "train", "--env", "recall", "--steps", "256", "--batch", "4", "--hidden", "16",
                    "--log-every", "64", "--checkpoint-every", "128", "--eval-steps", "64",
                    "--out", str(out), "--log-dir", str(logs)], check=True, capture_output=True)
    acc = event_accumulator.EventAccumulator(str(logs))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "memory/segment_peak_bytes", "memory/rss_bytes",
            "speed/steps_per_s", "eval/accuracy"} <= tags
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [int(r["step"]) for r in rows] == [64, 128, 192, 256]
    for e, r in zip(loss, rows):
        assert e.value == pytest.approx(float(r["loss"]), rel=1e-5)  # metrics.csv keeps 6 digits
    peaks = acc.Scalars("memory/segment_peak_bytes")
    assert all(e.value > 0 for e in peaks)
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [128, 256]
