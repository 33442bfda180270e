#!/usr/bin/env python3
"""The language-model benchmark (issue 47): the same recipe trained by LibTorch
(bench/lm_torch, PyTorch's examples/word_language_model loop) and by segtape
(`segtape train --task lm`), side by side in one run, interleaved.

Configurations (--configs):
  char-gru        tinyshakespeare as UTF-8 code points, 2-layer GRU 256 over
                  embeddings of 128, bptt 64, batch 32, Adam 2e-3, clip 0.25
  char-lstm       the same with an LSTM
  word-lstm       the example's word-level defaults: 2-layer LSTM 200,
                  embeddings 200, dropout 0.2, SGD lr 20 (lr / 4 after an
                  epoch whose validation loss did not improve), bptt 35,
                  batch 20, clip 0.25
  word-lstm-tied  the same, the decoder's weight tied to the embeddings'
                  (not run unless named)

The word corpus is tinyshakespeare itself read as words (--tokens words:
whitespace-separated, case and punctuation kept, "<eos>" at each line's end;
242,652 tokens, 25,671 distinct), the last 10 % of its tokens the validation
part, as the char runs split the characters. Nothing is downloaded: the file
is the one the char runs read (--word-data gives another).

Each configuration runs at each thread count (--threads, OPENBLAS_NUM_THREADS
and OMP_NUM_THREADS set to it for both engines, lm_torch's --threads too) and
each seed (--seeds), the two engines one after the other, the first of the
pair alternating. Per run: the validation loss (nats per token) after each
epoch; training tokens per second, the training loop alone (chunks: forward,
backward, clip, optimizer step; no evaluation, checkpoint or logging), from
each engine's own clock; peak RSS of the process, from the driver
(os.wait4's ru_maxrss), and the process's wall time. After each segtape
run the driver checks that the two engines read the same tokens and built the
same model: lm_torch --print-layout's vocabulary against the one in segtape's
checkpoint, the steps per epoch against segtape's steps, the parameter counts
against each other (lm-bench.md lists any that differ).

Output under --out: lm-bench.json (every run, its command and series) and
lm-bench.md (medians over seeds with min-max: tokens/s, validation loss after
epoch 1 and after the last, segtape - LibTorch in nats, segtape / LibTorch in
tokens/s, peak RSS). The runs' own folders go under --work (default
runs/lm-bench; checkpoints deleted once read).

  # the full benchmark (3 configs x 1 and 2 threads x 3 seeds x 2 engines, 5 epochs)
  python3 bench/lm_bench.py --lm-torch build/bench/lm_torch --segtape build/agent/segtape \\
      --data /work/shared/data/tinyshakespeare.txt --out docs/figures/lm
  # a reduced one: one config, one thread, one seed, one epoch of the first 100 kB
  python3 bench/lm_bench.py --configs char-gru --threads 1 --seeds 1 --epochs 1 --data-bytes 100000 --out /tmp/lm-bench
  # the tables again from a JSON
  python3 bench/lm_bench.py --from-json docs/figures/lm/lm-bench.json --out docs/figures/lm
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time

CONFIGS = {
    "char-gru": dict(tokens="chars", cell="gru", layers=2, hidden=256, embed=128, dropout=0.0, tied=False, bptt=64, batch=32,
                     optim="adam", lr=2e-3, clip=0.25),
    "char-lstm": dict(tokens="chars", cell="lstm", layers=2, hidden=256, embed=128, dropout=0.0, tied=False, bptt=64, batch=32,
                      optim="adam", lr=2e-3, clip=0.25),
    "word-lstm": dict(tokens="words", cell="lstm", layers=2, hidden=200, embed=200, dropout=0.2, tied=False, bptt=35, batch=20,
                      optim="sgd", lr=20.0, clip=0.25),
    "word-lstm-tied": dict(tokens="words", cell="lstm", layers=2, hidden=200, embed=200, dropout=0.2, tied=True, bptt=35, batch=20,
                           optim="sgd", lr=20.0, clip=0.25),
}
DEFAULT_CONFIGS = "char-gru,char-lstm,word-lstm"
# segtape's segment budget (its limit on one chunk's memory): the char LSTM's
# chunk holds about 76 MiB and the word LSTM's 165 MiB (35 steps of
# [20, 25671] logits and their gradients), above the 64 MiB default. Only a
# limit: the arena holds what a chunk uses (peak RSS measured the same at
# 64 MiB and 1 GiB).
SEGTAPE_BUDGET = "1GiB"
SPEED_TARGET = 2.0  # segtape's tokens/s at least twice LibTorch's
LOSS_TARGET = 0.02  # |validation loss difference| in nats per token


def fmt_g(x):
    return f"{x:g}"


# ---- the two engines' commands ----

def torch_cmd(a, cfg, data, threads, seed, out_json):
    c = [a.lm_torch, "--data", data, "--split", fmt_g(a.split), "--tokens", cfg["tokens"], "--cell", cfg["cell"],
         "--layers", str(cfg["layers"]), "--hidden", str(cfg["hidden"]), "--embed", str(cfg["embed"]),
         "--dropout", fmt_g(cfg["dropout"]), "--bptt", str(cfg["bptt"]), "--batch", str(cfg["batch"]),
         "--optim", cfg["optim"], "--lr", fmt_g(cfg["lr"]), "--clip", fmt_g(cfg["clip"]), "--epochs", str(a.epochs),
         "--seed", str(seed), "--threads", str(threads), "--out", out_json]
    return c + (["--tied"] if cfg["tied"] else [])


def segtape_cmd(a, cfg, data, seed, out_dir, steps_per_epoch):
    total = a.epochs * steps_per_epoch
    c = [a.segtape, "train", "--task", "lm", "--data", data, "--split", fmt_g(a.split), "--tokens", cfg["tokens"],
         "--cell", cfg["cell"], "--layers", str(cfg["layers"]), "--hidden", str(cfg["hidden"]), "--embed", str(cfg["embed"]),
         "--dropout", fmt_g(cfg["dropout"]), "--history", f"tbptt:{cfg['bptt']}", "--batch", str(cfg["batch"]),
         "--optim", cfg["optim"], "--lr", fmt_g(cfg["lr"]), "--clip", fmt_g(cfg["clip"]), "--seed", str(seed),
         "--out", out_dir, "--force",
         # one checkpoint (at the end: the layout check reads its vocabulary), the final greedy evaluation as short as allowed
         "--checkpoint-every", str(total), "--eval-steps", "1"]
    c += ["--steps", str(total)] if a.segtape_steps else ["--epochs", str(a.epochs)]
    if cfg["tied"]:
        c.append("--tied")
    c += ["--budget", SEGTAPE_BUDGET]
    return c + shlex.split(a.segtape_extra)


def run_measured(cmd, env, log_path):
    """Runs cmd with its output in log_path; returns (exit code, wall seconds, peak RSS bytes) of that process alone."""
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, wall, ru.ru_maxrss * 1024  # (Linux: KiB)


def tail(path, n=15):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def safetensors_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def series_by_epoch(points, steps_per_epoch):
    """segtape's [[step, value], ...] as {epoch: value} (reports at epochs' ends only)."""
    return {step // steps_per_epoch: v for step, v in points if step % steps_per_epoch == 0}


def read_segtape(out_dir, layout, epochs):
    """The run's per-epoch figures from metrics.json, and its layout checks."""
    with open(os.path.join(out_dir, "metrics.json")) as f:
        m = json.load(f)
    spe = layout["steps_per_epoch"]
    r = {"parameters": m.get("parameters"), "steps": m.get("steps"), "wall_seconds": m.get("wall_seconds"),
         "rss_bytes_reported": m.get("rss_bytes"), "segment_peak_bytes": m.get("segment_peak_bytes"), "complete": m.get("complete")}
    series = m.get("lm_series")
    if series and "valid_loss" in series:
        valid = series_by_epoch(series["valid_loss"], spe)
        tps = series_by_epoch(series.get("train_tokens_per_s", []), spe)
        lr_after = series_by_epoch(series.get("lr", []), spe)
        r["epochs"] = [{"epoch": e, "valid_loss": valid.get(e), "tokens_per_s": tps.get(e),
                        "train_tokens": spe * m["config"]["batch"],
                        "train_seconds": spe * m["config"]["batch"] / tps[e] if tps.get(e) else None,
                        "lr_after": lr_after.get(e)} for e in range(1, epochs + 1)]
        r["source"] = "metrics.json lm_series (valid_loss, train_tokens_per_s by epoch)"
    else:  # a segtape without per-epoch figures: the last validation loss only, no training-only time
        r["epochs"] = [{"epoch": e, "valid_loss": m.get("lm", {}).get("valid_loss") if e == epochs else None, "tokens_per_s": None}
                       for e in range(1, epochs + 1)]
        r["source"] = "metrics.json lm (the last validation loss only; no per-epoch series, no training-only time)"
    ck = os.path.join(out_dir, "checkpoint.safetensors")
    checks = {"steps": m.get("steps") == epochs * spe}
    if os.path.exists(ck):
        vocab = json.loads(safetensors_metadata(ck).get("lm.vocab", "[]"))
        checks["vocab"] = vocab == layout["vocab"]
    else:
        checks["vocab"] = None
    r["checks"] = checks
    return r


def read_torch(out_json):
    with open(out_json) as f:
        t = json.load(f)
    return {"parameters": t["parameters"], "peak_rss_bytes_reported": t["peak_rss_bytes"], "torch_version": t["torch_version"],
            "torch_threads": t["torch_threads"],
            "epochs": [{"epoch": e["epoch"], "valid_loss": e["valid_loss"], "tokens_per_s": e["tokens_per_s"], "train_tokens": e["train_tokens"],
                        "train_seconds": e["train_seconds"], "valid_seconds": e["valid_seconds"], "train_loss": e["train_loss"], "lr": e["lr"]}
                       for e in t["epochs"]],
            "source": "lm_torch's JSON (steady_clock around each epoch's training loop)"}


def run_tokens_per_s(run):
    """The whole run's training tokens / training seconds (None where an epoch lacks its time)."""
    eps = run.get("epochs") or []
    if not eps or any(e.get("train_seconds") is None for e in eps):
        return None
    return sum(e["train_tokens"] for e in eps) / sum(e["train_seconds"] for e in eps)


# ---- the data ----

def prepared_data(a, path, work):
    """path, or its first --data-bytes bytes (cut after the last whole line) in --work."""
    if not a.data_bytes:
        return path
    with open(path, "rb") as f:
        b = f.read(a.data_bytes)
    if len(b) == a.data_bytes and b"\n" in b:
        b = b[: b.rindex(b"\n") + 1]
    name = os.path.join(work, f"{os.path.splitext(os.path.basename(path))[0]}-{len(b)}.txt")
    with open(name, "wb") as f:
        f.write(b)
    return name


def describe_file(path):
    with open(path, "rb") as f:
        b = f.read()
    return {"path": path, "bytes": len(b), "md5": hashlib.md5(b).hexdigest()}


def commit_of(path):
    """The commit of the git checkout holding path (a binary in its build folder), '+' where its tree has changes."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        head = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", d, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+" if dirty else "")


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "python": platform.python_version()}


# ---- the tables ----

def stats(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs), len(xs)) if xs else None


def cell(s, f):
    if s is None:
        return "n/a"
    med, lo, hi, n = s
    return f"{f(med)} ({f(lo)}-{f(hi)})" if n > 1 else f(med)


def ktok(x):
    return f"{x / 1000:.1f}k"


def mib(x):
    return f"{x / 2**20:.0f}"


def nats(x):
    return f"{x:.4f}"


def report(res):
    runs = [r for r in res["runs"] if r.get("returncode") == 0]
    epochs = res["settings"]["epochs"]
    keys = []
    for r in res["runs"]:
        if (r["config"], r["threads"]) not in keys:
            keys.append((r["config"], r["threads"]))

    def pick(config, threads, engine):
        return [r for r in runs if r["config"] == config and r["threads"] == threads and r["engine"] == engine]

    def valid_at(r, e):
        eps = r.get("epochs") or []
        return eps[e - 1]["valid_loss"] if len(eps) >= e else None

    md = ["# Language-model benchmark: segtape against LibTorch", ""]
    md.append(f"{res['settings']['when']}, {res['machine']['cpu']} ({res['machine']['affinity']} CPUs usable), "
              f"LibTorch {res['settings'].get('torch_version', '?')}, segtape at {res['machine'].get('segtape_commit') or '?'} "
              f"('+': with uncommitted changes); {epochs} epoch{'s' if epochs > 1 else ''}, seeds {', '.join(map(str, res['settings']['seeds']))}, medians over seeds (min-max). "
              f"Generated by bench/lm_bench.py.")
    md.append("")
    for name, d in res["data"].items():
        lay = d["layout"]
        md.append(f"- {name}: {os.path.basename(d['file']['path'])} ({d['file']['bytes']} bytes, md5 {d['file']['md5']}) as {lay['tokens']}: "
                  f"{lay['vocab_size']} tokens in the vocabulary, {lay['train_tokens']} training and {lay['valid_tokens']} validation tokens "
                  f"(the last {res['settings']['split']:g})")
    md += ["", "## Speed and memory", "",
           "Training tokens per second: the training loop alone (forward, backward, clip, optimizer step; no evaluation), "
           "by each engine's own clock, over all epochs. Peak RSS: the process's, from the driver.", "",
           "| config | threads | LibTorch tokens/s | segtape tokens/s | segtape / LibTorch | LibTorch peak RSS (MiB) | segtape peak RSS (MiB) |",
           "|---|---|---|---|---|---|---|"]
    for config, threads in keys:
        t, s = pick(config, threads, "libtorch"), pick(config, threads, "segtape")
        ts, ss = stats([run_tokens_per_s(r) for r in t]), stats([run_tokens_per_s(r) for r in s])
        ratio = f"{ss[0] / ts[0]:.2f}x {'(meets 2x)' if ss[0] / ts[0] >= SPEED_TARGET else '(below 2x)'}" if ts and ss else "n/a"
        md.append(f"| {config} | {threads} | {cell(ts, ktok)} | {cell(ss, ktok)} | {ratio} | "
                  f"{cell(stats([r['peak_rss_bytes'] for r in t]), mib)} | {cell(stats([r['peak_rss_bytes'] for r in s]), mib)} |")
    md += ["", "## Validation loss", "",
           f"Nats per token (per character for char-*, per word for word-*) on the validation part, the state carried over it "
           f"(10 streams); segtape - LibTorch as the difference of the medians, the target within {LOSS_TARGET}.", "",
           "| config | threads | after epoch | LibTorch | segtape | segtape - LibTorch |", "|---|---|---|---|---|---|"]
    shown = sorted({1, epochs})
    for config, threads in keys:
        t, s = pick(config, threads, "libtorch"), pick(config, threads, "segtape")
        for e in shown:
            tv, sv = stats([valid_at(r, e) for r in t]), stats([valid_at(r, e) for r in s])
            diff = f"{sv[0] - tv[0]:+.4f} {'(within)' if abs(sv[0] - tv[0]) <= LOSS_TARGET else '(outside)'}" if tv and sv else "n/a"
            md.append(f"| {config} | {threads} | {e} | {cell(tv, nats)} | {cell(sv, nats)} | {diff} |")
    notes = []
    loads = [r["load_before"] for r in res["runs"] if "load_before" in r]
    if loads:  # (the average decays over minutes: it still counts the run before, about 1 for a one-thread run)
        busy = max(loads) > max(res["settings"]["threads"]) + 0.5
        notes.append(f"the 1-minute load average before a run, the run before it included, reached {max(loads):.1f} (median "
                     f"{statistics.median(loads):.1f}) on {res['machine']['affinity']} CPUs" +
                     (": more than the runs' own threads, other work shared the machine" if busy else ""))
    envs = sorted({json.dumps(r.get("env", {}), sort_keys=True) for r in res["runs"]})
    if any("OMP_WAIT_POLICY" in e for e in envs):
        notes.append("OMP_WAIT_POLICY=passive was set for both engines (--omp-passive)")
    failed = [r for r in res["runs"] if r.get("returncode") != 0]
    if failed:
        notes.append(f"{len(failed)} run(s) failed and are left out: " +
                     "; ".join(f"{r['engine']} {r['config']} t{r['threads']} s{r['seed']} (exit {r.get('returncode')})" for r in failed))
    bad = [r for r in runs if r["engine"] == "segtape" and not all(v is not False for v in r.get("checks", {}).values())]
    if bad:
        notes.append("layout checks failed (the engines did not read the same tokens or model): " +
                     "; ".join(f"{r['config']} t{r['threads']} s{r['seed']} {r['checks']}" for r in bad))
    sources = sorted({r.get("source", "") for r in runs if r["engine"] == "segtape"})
    if any("no per-epoch" in s for s in sources):
        notes.append("this segtape wrote no per-epoch figures (metrics.json lm_series): its tokens/s and epoch-1 loss are n/a")
    if notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(md) + "\n"


def write_outputs(res, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "lm-bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "lm-bench.md"), "w") as f:
        f.write(report(res))


# ---- main ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lm-torch", default="build/bench/lm_torch", help="bench/lm_torch's binary")
    ap.add_argument("--segtape", default="build/agent/segtape", help="segtape's binary")
    ap.add_argument("--data", default="/work/shared/data/tinyshakespeare.txt", help="the text of the char configs")
    ap.add_argument("--word-data", help="the text of the word configs (default: --data, read as words)")
    ap.add_argument("--data-bytes", type=int, default=0, help="use only the first N bytes of each text (cut at a line's end), for both engines")
    ap.add_argument("--split", type=float, default=0.1, help="the last fraction of the tokens kept for validation")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--seeds", default="3", help="a count N (seeds 1..N) or a comma-separated list")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--out", default="docs/figures/lm", help="where lm-bench.json and lm-bench.md go")
    ap.add_argument("--work", default="runs/lm-bench", help="the runs' own folders and logs")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep segtape's checkpoints under --work")
    ap.add_argument("--omp-passive", action="store_true",
                    help="OMP_WAIT_POLICY=passive for both engines (LibTorch's OpenMP threads sleep instead of spinning between "
                         "parallel regions; on a loaded machine its spinning slows 2 threads by 10x)")
    ap.add_argument("--segtape-steps", action="store_true", help="give segtape --steps (epochs x steps per epoch) instead of --epochs")
    ap.add_argument("--segtape-extra", default="", help="more flags for segtape train, appended (one string)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--from-json", action="append",
                    help="write the tables from this lm-bench.json and exit; given again, the runs of several (the first's "
                         "settings, every file's runs, the seeds and threads of all); with --threads or --seeds, only those runs")
    a = ap.parse_args()

    if a.from_json:
        res = None
        for path in a.from_json:
            with open(path) as f:
                one = json.load(f)
            if res is None:
                res = one
                continue
            res["runs"] += one["runs"]
            for key in ("seeds", "threads"):
                res["settings"][key] = sorted(set(res["settings"][key]) | set(one["settings"][key]))
        # --threads / --seeds given with --from-json: only those runs
        given = {arg.split("=")[0] for arg in sys.argv[1:]}
        if "--threads" in given:
            keep = {int(t) for t in a.threads.split(",")}
            res["runs"] = [r for r in res["runs"] if r["threads"] in keep]
            res["settings"]["threads"] = sorted(keep)
        if "--seeds" in given:
            keep = set(range(1, int(a.seeds) + 1)) if "," not in a.seeds else {int(x) for x in a.seeds.split(",")}
            res["runs"] = [r for r in res["runs"] if r["seed"] in keep]
            res["settings"]["seeds"] = sorted(keep)
        write_outputs(res, a.out)
        print(report(res))
        return 0

    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: unknown '{c}' (choose from {', '.join(CONFIGS)})")
    threads = [int(t) for t in a.threads.split(",")]
    seeds = list(range(1, int(a.seeds) + 1)) if "," not in a.seeds else [int(s) for s in a.seeds.split(",")]
    for exe in (a.lm_torch, a.segtape):
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            ap.error(f"{exe}: no such program (build it: cmake --build build --target lm_torch segtape)")
    os.makedirs(a.work, exist_ok=True)

    # The text each config reads, and its layout from lm_torch (checked against segtape's after each run).
    data, data_of = {}, {}
    for c in configs:
        tokens = CONFIGS[c]["tokens"]
        src = (a.word_data or a.data) if tokens == "words" else a.data
        key = data_of[c] = f"{os.path.basename(src)} {tokens}"
        if key in data:
            continue
        path = prepared_data(a, src, a.work)
        out = subprocess.run([a.lm_torch, "--data", path, "--tokens", tokens, "--split", fmt_g(a.split), "--print-layout"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"lm_torch --print-layout failed on {path}: {out.stderr.strip()}")
        data[key] = {"file": describe_file(path), "layout": json.loads(out.stdout)}

    res = {"machine": dict(machine(), segtape_commit=commit_of(a.segtape), lm_torch_commit=commit_of(a.lm_torch)),
           "settings": {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "epochs": a.epochs, "seeds": seeds, "threads": threads,
                        "configs": {c: CONFIGS[c] for c in configs}, "split": a.split, "data_bytes": a.data_bytes,
                        "lm_torch": a.lm_torch, "segtape": a.segtape, "segtape_extra": a.segtape_extra, "segtape_steps": a.segtape_steps},
           "data": {k: {"file": v["file"], "layout": {x: y for x, y in v["layout"].items() if x != "vocab"}} for k, v in data.items()},
           "runs": []}

    plan = [(seed, c, t) for seed in seeds for c in configs for t in threads]
    n_runs = 2 * len(plan)
    done = 0
    for k, (seed, c, t) in enumerate(plan):
        cfg = CONFIGS[c]
        d = data[data_of[c]]
        lay = dict(d["layout"], steps_per_epoch=d["layout"]["train_tokens"] // cfg["batch"] - 1)  # (main.py's rows - 1)
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
        if a.omp_passive:
            env["OMP_WAIT_POLICY"] = "passive"
        order = ["libtorch", "segtape"] if k % 2 == 0 else ["segtape", "libtorch"]
        for engine in order:
            name = f"{c}-t{t}-s{seed}-{engine}"
            folder = os.path.join(a.work, name)
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            if engine == "libtorch":
                cmd = torch_cmd(a, cfg, d["file"]["path"], t, seed, os.path.join(folder, "lm_torch.json"))
            else:
                cmd = segtape_cmd(a, cfg, d["file"]["path"], seed, os.path.join(folder, "run"), lay["steps_per_epoch"])
            done += 1
            print(f"[{done}/{n_runs}] {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            if a.dry_run:
                continue
            load = os.getloadavg()[0]
            rc, wall, rss = run_measured(cmd, env, os.path.join(folder, "log.txt"))
            run = {"config": c, "engine": engine, "threads": t, "seed": seed, "command": cmd, "returncode": rc,
                   "process_seconds": wall, "peak_rss_bytes": rss, "load_before": load,
                   "env": {k: env[k] for k in sorted(env) if k.startswith(("OMP_", "OPENBLAS_", "MKL_", "GOMP_"))}}
            if rc != 0:
                print(f"  failed (exit {rc}); the end of {folder}/log.txt:\n{tail(os.path.join(folder, 'log.txt'))}", file=sys.stderr)
            else:
                try:
                    if engine == "libtorch":
                        run.update(read_torch(os.path.join(folder, "lm_torch.json")))
                        res["settings"]["torch_version"] = run["torch_version"]
                    else:
                        run.update(read_segtape(os.path.join(folder, "run"), lay, a.epochs))
                        if not a.keep_checkpoints:
                            ck = os.path.join(folder, "run", "checkpoint.safetensors")
                            if os.path.exists(ck):
                                os.remove(ck)
                except (OSError, KeyError, ValueError) as e:
                    run["returncode"], run["error"] = -1, f"reading its results: {e}"
                    print(f"  {run['error']}", file=sys.stderr)
                tps = run_tokens_per_s(run)
                last = (run.get("epochs") or [{}])[-1].get("valid_loss")
                print(f"  {wall:.1f} s, peak RSS {rss / 2**20:.0f} MiB, "
                      f"{'%.0f tokens/s' % tps if tps else 'tokens/s n/a'}, valid loss {'%.4f' % last if last is not None else 'n/a'}"
                      + (f", checks {run['checks']}" if "checks" in run else ""), file=sys.stderr, flush=True)
            res["runs"].append(run)
            write_outputs(res, a.out)  # (after every run: an interrupted benchmark keeps what it measured)

    # The parameter counts of the two engines' models, per config (the same model?)
    for c in configs:
        counts = {e: {r["parameters"] for r in res["runs"] if r["config"] == c and r["engine"] == e and r.get("parameters")}
                  for e in ("libtorch", "segtape")}
        for r in res["runs"]:
            if r["config"] == c and r["engine"] == "segtape" and "checks" in r and counts["libtorch"]:
                r["checks"]["parameters"] = counts["libtorch"] == {r["parameters"]}
    if not a.dry_run:
        write_outputs(res, a.out)
        print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
