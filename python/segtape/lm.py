"""segtape.lm: language models and time series on your own data, from Python.

The same tasks as `segtape train --task lm` and `--task series` (the C++
Trainer; docs/agent.md, "Your own text" and "Your own series"):

    import segtape.lm as lm
    run = lm.train("input.txt", epochs=1, out="runs/shakespeare")   # a character model
    print(run.valid_loss)                                           # nats per token, at each epoch's end
    print(lm.sample(run.checkpoint, prompt="ROMEO:", length=200, temperature=0.8, seed=1))

    vocab, train_ids, valid_ids, _ = lm.corpus("input.txt")        # the token ids segtape reads
    streams = lm.batchify(train_ids, 32)                             # word_language_model's layout [N / B, B]

train() blocks until the run ends; Ctrl-C stops it at its next chunk (the
KeyboardInterrupt propagates, the Trainer keeps the parameters so far).
"""
import os

import numpy as np

from . import _INT64, _UINT64, Error, _argument_names, _bytes, _set_ints
from . import _segtape

_A = _segtape.agent


def corpus(data, *, valid="", test="", tokens="chars", split=0.1):
    """A text's tokens as `segtape train --task lm` reads them: (vocabulary
    texts by id, train ids, valid ids, test ids), the ids int32 NumPy arrays.
    tokens: "chars" (UTF-8 code points), "bytes" or "words" (<eos> at each
    line's end); without `valid`, the last `split` of data's tokens."""
    return _A.corpus(os.fspath(data), os.fspath(valid), os.fspath(test), tokens, float(split))


def batchify(ids, batch):
    """word_language_model's batchify: the ids cut into `batch` contiguous
    streams (the tail that does not divide dropped), as [N / batch, batch]:
    column b is stream b, row i its i-th token."""
    ids = np.asarray(ids)
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise Error(f"segtape.lm.batchify: batch must be an int >= 1, got {batch!r}")
    n = len(ids) // int(batch)
    if n < 1:
        raise Error(f"segtape.lm.batchify: {len(ids)} tokens cannot fill {batch} streams")
    return ids[: n * int(batch)].reshape(int(batch), n).T


class Run:
    """A finished (or stopped) run: the trainer, each epoch's validation
    figures (lists, in order), the test figures when there was a test part,
    and the checkpoint written at the end (when `out` was given)."""

    def __init__(self, trainer, figures, checkpoint):
        self.trainer, self.figures, self.checkpoint = trainer, figures, checkpoint

    def __getattr__(self, name):  # run.valid_loss, run.valid_perplexity, run.train_tokens_per_s, run.valid_mse, ...
        figures = self.__dict__.get("figures", {})
        if name in figures:
            return figures[name]
        raise AttributeError(f"segtape.lm.Run has no figure {name!r} (it has {sorted(figures)})")

    def __repr__(self):
        last = {k: v[-1] for k, v in self.figures.items()}
        return f"<segtape.lm.Run {self.trainer.step} steps, last figures {last}>"


def _trainer(task, data, settings, ints):
    c = _A.TrainConfig()
    c.env = c.algo = task
    c.data = os.fspath(data)
    for key, value in settings.items():
        setattr(c, key, value)
    call = f"segtape.lm.{'train' if task == 'lm' else 'series'}"

    def named(e):  # the checks name the segtape program's flags: here, the function's arguments
        return type(e)(f"{call}: " + _argument_names(str(e)))
    _set_ints(c, ints, call, named)
    try:
        return _A.Trainer(c)
    except Error as e:
        raise named(e) from None


def _run(trainer, out, callback):
    figures = {}
    while not trainer.done():
        r = trainer.run_segment()
        for name, value in r["metrics"].items():
            figures.setdefault(name, []).append(value)
        if r["metrics"] and callback:
            callback(trainer.step, r["metrics"])
    checkpoint = None
    if out is not None:
        os.makedirs(out, exist_ok=True)
        checkpoint = os.path.join(out, "checkpoint.safetensors")
        trainer.save(checkpoint)
    return Run(trainer, figures, checkpoint)


def _steps(data, valid, test, tokens, split, batch, epochs, steps):
    if steps is not None:
        return steps
    per = len(corpus(data, valid=valid, test=test, tokens=tokens, split=split)[1]) // int(batch) - 1
    return max(1, per) * int(epochs)


def trainer(data, *, valid="", test="", tokens="chars", split=0.1, epochs=1, steps=None, batch=32, bptt=64, history=None,
            cell="gru", layers=2, hidden=256, embed=128, dropout=0.0, tied=False, optim="adam", lr=2e-3, clip=0.25, seed=1,
            budget="256MiB", size_check=True, precision="f32"):
    """train()'s Trainer, made and not run: run_segment() trains the next
    chunk and returns its figures (its "segment_peak", and at an epoch's end
    "metrics" with the validation loss), save(path) writes its checkpoint."""
    settings = {"history": history or f"tbptt:{bptt}", "tokens": tokens, "split": float(split), "valid": os.fspath(valid),
                "test": os.fspath(test), "cell": cell, "dropout": float(dropout), "tied": bool(tied), "optim": optim,
                "lr": float(lr), "clip": float(clip), "budget": _bytes(budget, "segtape.lm.train: budget"),
                "size_check": bool(size_check), "precision": str(precision)}
    total = _steps(data, valid, test, tokens, split, batch, epochs, steps)
    ints = [("steps", int(total), _INT64), ("batch", int(batch), _INT64), ("layers", int(layers), _INT64),
            ("hidden", int(hidden), _INT64), ("embed", int(embed), _INT64), ("seed", int(seed), _UINT64)]
    return _trainer("lm", data, settings, ints)


def train(data, *, out=None, callback=None, **settings):
    """A language model of a text, as `segtape train --task lm` (the same
    defaults: two GRU layers of 256 over embeddings of 128, chunks of bptt
    64, batch 32, Adam 2e-3, the gradient's norm clipped at 0.25, one epoch).
    history: any history that carries a state ("tbptt:K", "exact:K/T",
    "overlap:K/T/S"; default f"tbptt:{bptt}"). optim "sgd" divides lr by 4
    after an epoch whose validation loss did not improve. callback(step,
    figures) at each epoch's end. out: a folder for the final checkpoint
    (sample() reads it). Returns a Run: run.valid_loss, valid_perplexity,
    valid_bits_per_token, train_tokens_per_s (lists by epoch). The other
    arguments are trainer()'s: valid, test, tokens, split, epochs, steps,
    batch, bptt, history, cell, layers, hidden, embed, dropout, tied, optim,
    lr, clip, seed, budget, size_check (False: without the memory check made
    before anything is allocated; docs/hardening.md, "The size check"),
    precision ("f32", or "bf16": docs/precision.md)."""
    return _run(trainer(data, **settings), out, callback)


def series(data, *, target, features="", valid="", test="", split=0.1, steps=5000, batch=4, bptt=16, history=None,
           hidden=64, embed=16, lr=3e-3, clip=1.0, seed=1, out=None, callback=None, size_check=True, precision="f32"):
    """Next-value regression on a CSV's column, as `segtape train --task
    series` (the same defaults): the model's and the naive last-value
    forecast's error on the validation part, by epoch (run.valid_mse,
    run.naive_mse in normalised units; valid_rmse, naive_rmse in the
    column's). size_check, precision: as train()'s."""
    settings = {"history": history or f"tbptt:{bptt}", "target": target, "features": features, "split": float(split),
                "valid": os.fspath(valid), "test": os.fspath(test), "lr": float(lr), "clip": float(clip),
                "size_check": bool(size_check), "precision": str(precision)}
    ints = [("steps", int(steps), _INT64), ("batch", int(batch), _INT64), ("hidden", int(hidden), _INT64),
            ("embed", int(embed), _INT64), ("seed", int(seed), _UINT64)]
    return _run(_trainer("series", data, settings, ints), out, callback)


def sample(checkpoint, *, prompt="", length=500, temperature=1.0, seed=1):
    """The text a language-model checkpoint writes after `prompt` (segtape
    sample): the prompt, then `length` tokens drawn at `temperature`; the
    same seed, the same text."""
    return _A.sample(os.fspath(checkpoint), prompt, int(length), float(temperature), int(seed))
