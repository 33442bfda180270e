#!/usr/bin/env python3
"""Is bench/lm_torch PyTorch's word_language_model? Each case trains the same
small model twice: once with this file's Python version of the example's
main.py and model.py (in Python's torch), once with lm_torch (LibTorch), from
the same seed, and compares every epoch's learning rate, training loss and
validation loss. The two make the same RNG draws in the same order (the
initialisation, the dropout masks) and the same operations in the same order
(parameters() too: clip_grad_norm_ sums over it), so on one LibTorch they
agree to the bit (Debian's python3-torch and libtorch-dev are one build); a
difference above --tol is a port that does something else.

Needs a Python with torch (Debian's python3-torch: /usr/bin/python3). Cases are
small (a few seconds each, one thread):

  /usr/bin/python3 bench/lm_torch_check.py --lm-torch build/bench/lm_torch \\
      --data tests/data/shakespeare-20k.txt
"""
import argparse
import json
import subprocess
import sys

# name: lm_torch's flags (the Python version reads the same)
CASES = {
    "gru adam": "--cell gru --layers 2 --embed 16 --hidden 32 --bptt 16 --batch 8 --optim adam --lr 2e-3 --epochs 2",
    "lstm adam dropout": "--cell lstm --layers 2 --embed 16 --hidden 32 --bptt 16 --batch 8 --optim adam --lr 2e-3 --dropout 0.2 --epochs 2",
    "lstm sgd words tied (lr/4)": "--tokens words --cell lstm --layers 2 --embed 24 --hidden 24 --bptt 35 --batch 20 --optim sgd --lr 20 "
                                  "--dropout 0.2 --tied --epochs 6 --seed 7",
    "gru sgd words": "--tokens words --cell gru --layers 2 --embed 16 --hidden 32 --bptt 35 --batch 20 --optim sgd --lr 20 --dropout 0.5 --epochs 3",
}


def parse_flags(flags):
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="chars")
    p.add_argument("--cell", default="gru")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embed", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--bptt", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--optim", default="adam")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--split", type=float, default=0.1)
    return p.parse_args(flags.split())


def tokenize(text, kind):
    """segtape's tokens (agent/task/corpus.cpp) for an ASCII or UTF-8 text."""
    if kind == "chars":
        vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(vocab)}
        return [index[c] for c in text], len(vocab)
    assert kind == "words"
    index = {}
    ids = []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # (no line after the last '\n')
    for line in lines:
        for w in _split(line) + ["<eos>"]:
            ids.append(index.setdefault(w, len(index)))
    return ids, len(index)


def _split(line):
    # whitespace as segtape's: ' ', \t, \n, \r, \v, \f (not Unicode's)
    out, word = [], ""
    for ch in line:
        if ch in " \t\n\r\v\f":
            if word:
                out.append(word)
            word = ""
        else:
            word += ch
    if word:
        out.append(word)
    return out


def reference(text, a):
    """main.py's training and evaluation loop, model.py's RNNModel."""
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    ids, V = tokenize(text, a.tokens)
    nv = int(len(ids) * a.split)
    train_ids, valid_ids = torch.tensor(ids[: len(ids) - nv]), torch.tensor(ids[len(ids) - nv :])
    torch.manual_seed(a.seed)

    def batchify(d, bsz):
        n = d.size(0) // bsz
        return d.narrow(0, 0, n * bsz).view(bsz, -1).t().contiguous()

    train_data, val_data = batchify(train_ids, a.batch), batchify(valid_ids, 10)
    cell = a.cell.upper()

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(a.dropout)
            self.encoder = nn.Embedding(V, a.embed)
            self.rnn = getattr(nn, cell)(a.embed, a.hidden, a.layers, dropout=a.dropout)
            self.decoder = nn.Linear(a.hidden, V)
            if a.tied:
                self.decoder.weight = self.encoder.weight
            nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def forward(self, x, h):
            out, h = self.rnn(self.drop(self.encoder(x)), h)
            return self.decoder(self.drop(out)).view(-1, V), h

        def init_hidden(self, bsz):
            w = next(self.parameters())
            z = lambda: w.new_zeros(a.layers, bsz, a.hidden)  # noqa: E731
            return (z(), z()) if cell == "LSTM" else z()

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (dropout with one layer)
        model = RNNModel()
    criterion = nn.CrossEntropyLoss()
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[a.optim](model.parameters(), lr=a.lr) if a.optim != "sgd" else None

    def repackage(h):
        return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage(v) for v in h)

    def get_batch(source, i):
        n = min(a.bptt, len(source) - 1 - i)
        return source[i : i + n], source[i + 1 : i + 1 + n].view(-1)

    def evaluate(source):
        model.eval()
        total, h = 0.0, model.init_hidden(10)
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, a.bptt):
                x, y = get_batch(source, i)
                out, h = model(x, h)
                h = repackage(h)
                total += len(x) * criterion(out, y).item()
        return total / (len(source) - 1)

    lr, best, epochs = a.lr, None, []
    for epoch in range(1, a.epochs + 1):
        model.train()
        h, total = model.init_hidden(a.batch), 0.0
        for i in range(0, train_data.size(0) - 1, a.bptt):
            x, y = get_batch(train_data, i)
            model.zero_grad()
            h = repackage(h)
            out, h = model(x, h)
            loss = criterion(out, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            if opt:
                opt.step()
            else:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
            total += len(x) * loss.item()
        val = evaluate(val_data)
        epochs.append({"epoch": epoch, "lr": lr, "train_loss": total / (train_data.size(0) - 1), "valid_loss": val})
        if not best or val < best:
            best = val
        elif opt is None:
            lr /= 4.0
    return {"vocab_size": V, "parameters": sum(p.numel() for p in model.parameters()), "epochs": epochs}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lm-torch", default="build/bench/lm_torch")
    p.add_argument("--data", default="tests/data/shakespeare-20k.txt")
    p.add_argument("--tol", type=float, default=1e-6, help="largest difference in a loss (nats)")
    args = p.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("lm_torch_check: this Python has no torch (Debian: /usr/bin/python3 with python3-torch); nothing checked")
        return 77
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    failed = 0
    for name, flags in CASES.items():
        a = parse_flags(flags)
        ref = reference(text, a)
        out = subprocess.run([args.lm_torch, "--data", args.data, "--threads", "1"] + flags.split(), check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        worst = 0.0
        ok = got["layout"]["vocab_size"] == ref["vocab_size"] and got["parameters"] == ref["parameters"] and len(got["epochs"]) == len(ref["epochs"])
        for r, g in zip(ref["epochs"], got["epochs"]):
            ok = ok and r["lr"] == g["lr"]
            worst = max(worst, abs(r["train_loss"] - g["train_loss"]), abs(r["valid_loss"] - g["valid_loss"]))
        ok = ok and worst <= args.tol
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(ref['epochs'])} epochs, lr {[e['lr'] for e in got['epochs']]}, "
              f"valid {[round(e['valid_loss'], 4) for e in got['epochs']]}, largest difference {worst:.2e} nats")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
