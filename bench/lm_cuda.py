#!/usr/bin/env python3
"""Issue 47's GPU check: language-model training tokens/s of segtape
(`segtape train --task lm --device cuda`) against PyTorch's cuDNN GRU and
LSTM (torch.nn.GRU / nn.LSTM on the GPU) at the same recipe, in interleaved
rounds. The PyTorch side is examples/word_language_model's loop, written
here: the text batchified into B streams, bptt-token chunks, the hidden state
carried from chunk to chunk with repackage_hidden (detach), cross-entropy,
clip_grad_norm_, the optimizer's step.

Recipes (issue 47's): char-gru, char-lstm: the text as code points, 2 layers
of 256 over embeddings of 128, bptt 64, batch 32, Adam 2e-3, clip 0.25.
Each engine trains --epochs epochs of the text's first 90 %; its tokens/s is
the training loop alone (segtape: its train_tokens_per_s, each epoch's chunks
timed by the program; PyTorch: each epoch timed between two
torch.cuda.synchronize()), the median over the epochs after the first.
Each engine's validation loss (the text's last 10 %, nats per character)
after its last epoch goes beside it.

--precision bf16 (issue 51's bf16 at the same precision on both sides):
segtape's `--precision bf16` (bfloat16 matrix products, docs/precision.md)
against PyTorch under torch.autocast(dtype=torch.bfloat16), forward and
loss, training and validation.

  python3 bench/lm_cuda.py --segtape build/agent/segtape --data tests/data/shakespeare-20k.txt --out /tmp/lm-cuda
  python3 bench/lm_cuda.py ... --device cpu --epochs 2 --rounds 1   (a check of the script without a GPU)
  python3 bench/lm_cuda.py ... --precision bf16

Writes lm-cuda.md (the table) and lm-cuda.json (every run) under --out.
bench/device_check.sh runs it on a lent GPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

RECIPES = {
    "char-gru": {"cell": "gru", "layers": 2, "hidden": 256, "embed": 128, "bptt": 64, "batch": 32, "lr": 2e-3, "clip": 0.25},
    "char-lstm": {"cell": "lstm", "layers": 2, "hidden": 256, "embed": 128, "bptt": 64, "batch": 32, "lr": 2e-3, "clip": 0.25},
}


def segtape_run(a, name, r, work):
    out = os.path.join(work, f"segtape-{name}")
    cmd = [a.segtape, "train", "--task", "lm", "--data", a.data, "--split", "0.1", "--tokens", "chars", "--cell", r["cell"],
           "--layers", str(r["layers"]), "--hidden", str(r["hidden"]), "--embed", str(r["embed"]), "--history", f"tbptt:{r['bptt']}",
           "--batch", str(r["batch"]), "--optim", "adam", "--lr", str(r["lr"]), "--clip", str(r["clip"]), "--epochs", str(a.epochs),
           "--device", a.device, "--precision", a.precision, "--eval-steps", "1", "--out", out, "--force"]
    with open(out + ".log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    with open(os.path.join(out, "metrics.json")) as f:  # lm_series: [[step, value], ...] at each epoch's end
        series = json.load(f)["lm_series"]
    rates = [v for _, v in series["train_tokens_per_s"]]
    valid = [v for _, v in series["valid_loss"]]
    return {"engine": "segtape", "recipe": name, "tokens_per_s": rates, "valid_loss": valid, "command": " ".join(cmd)}


def torch_run(a, name, r):
    import torch

    torch.manual_seed(1)
    dev = torch.device(a.device)
    text = open(a.data, encoding="utf-8").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    split = int(len(text) * 0.9)
    ids = torch.tensor([index[c] for c in text[:split]], dtype=torch.long)
    held = torch.tensor([index[c] for c in text[split:]], dtype=torch.long)
    B, bptt, V = r["batch"], r["bptt"], len(vocab)
    data = ids[: (len(ids) // B) * B].view(B, -1).t().contiguous().to(dev)  # batchify: [L, B]
    valid_data = held[: (len(held) // B) * B].view(B, -1).t().contiguous().to(dev)
    cast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")
    emb = torch.nn.Embedding(V, r["embed"]).to(dev)
    rnn = (torch.nn.GRU if r["cell"] == "gru" else torch.nn.LSTM)(r["embed"], r["hidden"], r["layers"]).to(dev)
    dec = torch.nn.Linear(r["hidden"], V).to(dev)
    params = list(emb.parameters()) + list(rnn.parameters()) + list(dec.parameters())
    opt = torch.optim.Adam(params, lr=r["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    zeros = torch.zeros(r["layers"], B, r["hidden"], device=dev)
    rates, valid = [], []
    for _ in range(a.epochs):
        hidden = zeros if r["cell"] == "gru" else (zeros, zeros)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0, tokens = time.perf_counter(), 0
        for i in range(0, data.size(0) - 1, bptt):
            n = min(bptt, data.size(0) - 1 - i)
            x, y = data[i : i + n], data[i + 1 : i + 1 + n]
            hidden = hidden.detach() if r["cell"] == "gru" else tuple(h.detach() for h in hidden)  # repackage_hidden
            with cast:
                out, hidden = rnn(emb(x), hidden)
                loss = loss_fn(dec(out).view(-1, V).float(), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, r["clip"])
            opt.step()
            tokens += n * B
        if dev.type == "cuda":
            torch.cuda.synchronize()
        rates.append(tokens / (time.perf_counter() - t0))
        with torch.no_grad(), cast:  # the validation loss: the held-out text in chunks, the state carried
            hidden, total, count = zeros if r["cell"] == "gru" else (zeros, zeros), 0.0, 0
            for i in range(0, valid_data.size(0) - 1, bptt):
                n = min(bptt, valid_data.size(0) - 1 - i)
                out, hidden = rnn(emb(valid_data[i : i + n]), hidden)
                total += float(loss_fn(dec(out).view(-1, V).float(), valid_data[i + 1 : i + 1 + n].reshape(-1))) * n * B
                count += n * B
            valid.append(total / max(count, 1))
    return {"engine": "pytorch", "recipe": name, "tokens_per_s": rates, "valid_loss": valid, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None}


def median_after_first(rates):
    kept = rates[1:] or rates
    return statistics.median(kept)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segtape", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recipes", default="char-gru,char-lstm")
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = []
    for rnd in range(a.rounds):
        for name in a.recipes.split(","):
            r = RECIPES[name]
            pair = [lambda: segtape_run(a, name, r, a.out), lambda: torch_run(a, name, r)]
            for run in pair if rnd % 2 == 0 else reversed(pair):  # the first of the pair alternates
                res = run()
                res["round"] = rnd
                runs.append(res)
                print(f"round {rnd + 1}: {res['engine']} {name}: {median_after_first(res['tokens_per_s']):.0f} tokens/s", flush=True)
    json.dump({"device": a.device, "precision": a.precision, "data": a.data, "epochs": a.epochs, "runs": runs},
              open(os.path.join(a.out, "lm-cuda.json"), "w"), indent=1)
    lines = [f"Training tokens/s on {a.device}, precision {a.precision} ({a.data}, {a.epochs} epochs a run, the median over the "
             f"epochs after the first; {a.rounds} interleaved rounds: their median, min to max), and the validation loss after "
             f"the last epoch (the first round's):", "",
             "| recipe | segtape | PyTorch (cuDNN on a GPU) | segtape / PyTorch | valid loss: segtape, PyTorch |", "|---|---|---|---|---|"]
    for name in a.recipes.split(","):
        per = {e: [median_after_first(x["tokens_per_s"]) for x in runs if x["engine"] == e and x["recipe"] == name] for e in ("segtape", "pytorch")}
        s, p = statistics.median(per["segtape"]), statistics.median(per["pytorch"])
        last = {e: next(x["valid_loss"][-1] for x in runs if x["engine"] == e and x["recipe"] == name) for e in ("segtape", "pytorch")}
        lines.append(f"| {name} | {s:,.0f} ({min(per['segtape']):,.0f} to {max(per['segtape']):,.0f}) | "
                     f"{p:,.0f} ({min(per['pytorch']):,.0f} to {max(per['pytorch']):,.0f}) | {s / p:.2f}x | "
                     f"{last['segtape']:.4f}, {last['pytorch']:.4f} |")
    open(os.path.join(a.out, "lm-cuda.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
