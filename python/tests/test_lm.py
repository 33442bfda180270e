"""segtape.lm: language models and series from Python (the Trainer of
`segtape train --task lm / series`), on the shipped excerpt and series."""
from pathlib import Path

import numpy as np
import pytest

import segtape
import segtape.lm as lm

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
TEXT = DATA / "shakespeare-20k.txt"


def test_corpus_and_batchify_are_the_examples_layout():
    vocab, train, valid, test = lm.corpus(TEXT)
    raw = TEXT.read_text()
    assert vocab == sorted(set(raw))  # code points in their order
    assert len(train) + len(valid) == len(raw) and len(test) == 0
    assert len(valid) == int(len(raw) * 0.1) or abs(len(valid) - 0.1 * len(raw)) <= 1
    assert "".join(vocab[i] for i in train[:20]) == raw[:20]
    streams = lm.batchify(train, 8)
    n = len(train) // 8
    assert streams.shape == (n, 8)
    assert (streams[:, 3] == train[3 * n:4 * n]).all()  # column b is stream b, contiguous
    words = lm.corpus(TEXT, tokens="words")[0]
    assert "<eos>" in words
    with pytest.raises(segtape.Error, match="batch must be an int >= 1"):
        lm.batchify(train, 0)


def test_a_short_run_learns_resumes_its_checkpoint_and_samples(tmp_path):
    seen = []
    run = lm.train(TEXT, epochs=2, batch=8, bptt=16, layers=1, hidden=64, embed=32, lr=1e-2, out=tmp_path,
                   callback=lambda step, figures: seen.append((step, figures["valid_loss"])))
    assert len(run.valid_loss) == 2 and [v for _, v in seen] == run.valid_loss
    assert run.valid_loss[1] < run.valid_loss[0] < np.log(65)  # below the uniform guess, and falling
    assert run.valid_perplexity[1] == pytest.approx(np.exp(run.valid_loss[1]))
    assert run.train_tokens_per_s[0] > 0
    a = lm.sample(run.checkpoint, prompt="ROMEO:", length=50, temperature=0.8, seed=1)
    assert a == lm.sample(run.checkpoint, prompt="ROMEO:", length=50, temperature=0.8, seed=1)
    assert a.startswith("ROMEO:") and len(a) == 56
    with pytest.raises(segtape.Error, match="segtape.lm.train: cell 'rnn': choose gru or lstm"):
        lm.train(TEXT, cell="rnn")


def test_bf16_learns_as_float32_does_and_its_checkpoint_samples(tmp_path):
    """precision="bf16" (docs/precision.md): the validation loss of a short
    run within 1 % of float32's, not equal to it; its checkpoint samples (at
    bf16); a bad precision is refused naming the argument."""
    settings = dict(epochs=1, batch=8, bptt=16, layers=1, hidden=64, embed=32, lr=1e-2)
    f32 = lm.train(TEXT, **settings)
    bf16 = lm.train(TEXT, precision="bf16", out=tmp_path, **settings)
    assert bf16.valid_loss[0] == pytest.approx(f32.valid_loss[0], rel=0.01) and bf16.valid_loss != f32.valid_loss
    assert lm.sample(bf16.checkpoint, prompt="ROMEO:", length=20, seed=1).startswith("ROMEO:")
    with pytest.raises(segtape.Error, match="segtape.lm.train: precision 'fp16': choose f32 or bf16"):
        lm.train(TEXT, precision="fp16")


def test_a_series_run_beats_the_naive_forecast():
    run = lm.series(DATA / "sunspots.csv", target="sunactivity", steps=3000)
    assert run.valid_mse[-1] < 0.5 * run.naive_mse[-1]
