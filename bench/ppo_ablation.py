"""segtape's recurrent PPO on masked-velocity CartPole at RL Zoo's tuned
RecurrentPPO settings for CartPoleNoVel-v1, changing one thing at a time:
the greedy mean return over 100 episodes after 100k environment steps, for
each of several seeds (docs/results/ppo.md, "Against Stable-Baselines3's RecurrentPPO").

RL Zoo's hyperparams/ppo_lstm.yml (DLR-RM/rl-baselines3-zoo at 038ab16),
CartPoleNoVel-v1: 8 envs, n_steps 32, batch_size 256 (one minibatch of all
8 x 32 steps), n_epochs 20, gamma 0.98, gae_lambda 0.8, ent_coef 0,
learning_rate lin_0.001, clip_range lin_0.2, 1e5 timesteps, no
normalisation; SB3's defaults for the rest (max_grad_norm 0.5, vf_coef 0.5).
Here: segtape.gym.train with those (value_coef 1.0: segtape's value loss is
value_coef / 2 x MSE, SB3's vf_coef x MSE; clip_range 0.2 constant, as
segtape had no schedule for it then), the agent's default policy (Linear(4, embed) + tanh
-> GRUCell(embed, hidden), policy and value heads on the GRU's state) at
hidden 64, embed 32, and history tbptt:32 (the whole rollout). Each row of
--configs is a JSON object of segtape.gym.train arguments laid over these.
With --base tuned, the base is the entry as RL Zoo's later file marks it
tuned (ppo_lstm.yml at c94924e, the settings of its published agent):
those with observations and rewards normalised as VecNormalize does (RL
Zoo's "normalize: true"; the table in docs/figures/rl/cartpole-novel-tuned
predates normalize_reward and normalised the observations only), the critic's
recurrent core of its own (critic="separate") and the clip range annealed
(clip_schedule="linear", lin_0.2); SB3's policy also puts a 64-unit ReLU
layer before each head, which segtape's has not.

    build/python/bin/python bench/ppo_ablation.py --seeds 1 2 3 4 5 --out docs/figures/rl/cartpole-novel-ablation
    build/python/bin/python bench/ppo_ablation.py --base tuned --configs '{}' '{"clip_schedule": "constant"}' ... \
        --out docs/figures/rl/cartpole-novel-tuned

One process, one thread, the configurations in turn, each over the seeds.
Writes ppo-ablation.json (every run) and ppo-ablation.md (the table).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ZOO = dict(steps=100_000 // 8, batch=8, hidden=64, embed=32, lr=1e-3, history="tbptt:32", gamma=0.98, entropy=0.0, clip=0.5,
           value_coef=1.0, lr_schedule="linear", algo="ppo", rollout=32, epochs=20, minibatches=1, clip_range=0.2,
           gae_lambda=0.8, normalize_obs=False)
# RL Zoo's entry as its later file marks it tuned (hyperparams/ppo_lstm.yml at
# c94924e, the settings of its published sb3/ppo_lstm-CartPoleNoVel-v1
# agent): observations normalised, the critic's LSTM of its own, clip range
# annealed (SB3's lin_0.2).
TUNED = dict(ZOO, normalize_obs=True, normalize_reward=True, critic="separate", clip_schedule="linear")
BASES = {"zoo038": ZOO, "tuned": TUNED}
CONFIGS = ['{}', '{"normalize_obs": true}', '{"hidden": 256}', '{"value_coef": 0.02}', '{"embed": 64, "hidden": 128}',
           '{"normalize_obs": true, "hidden": 256}', '{"critic": "separate"}', '{"critic": "separate", "hidden": 128}',
           '{"critic": "separate", "normalize_obs": true}']
TARGET = 475.0


def commit():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return head + ("+" if dirty else "")
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="JSON objects of segtape.gym.train arguments over RL Zoo's")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--base", choices=sorted(BASES), default="zoo038",
                    help="the settings the configurations change: RL Zoo's file at 038ab16, or its tuned entry at c94924e")
    ap.add_argument("--out", required=True, help="a folder for ppo-ablation.json and ppo-ablation.md")
    a = ap.parse_args()
    import segtape.gym as sg
    os.makedirs(a.out, exist_ok=True)
    runs = []
    for text in a.configs:
        extra = json.loads(text)
        for seed in a.seeds:
            t0 = time.perf_counter()
            res = sg.train(sg.masked_cartpole, seed=seed, **{**BASES[a.base], **extra})
            train_s = time.perf_counter() - t0
            ret = res.evaluate(episodes=a.episodes)["mean_return"]
            runs.append(dict(config=extra, seed=seed, greedy_return=ret, train_seconds=train_s))
            print(f"{json.dumps(extra)} seed {seed}: greedy {ret:.1f} over {a.episodes} episodes ({train_s:.1f} s)", flush=True)
    meta = dict(date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), machine=platform.processor() or platform.machine(),
                segtape=commit(), seeds=a.seeds, episodes=a.episodes, base=a.base, settings=BASES[a.base], target=TARGET)
    with open(os.path.join(a.out, "ppo-ablation.json"), "w") as f:
        json.dump(dict(meta=meta, runs=runs), f, indent=1)
    lines = [f"segtape at {meta['segtape']}, {meta['date']}; masked-velocity CartPole, 100k environment steps, greedy mean "
             f"return over {a.episodes} episodes per seed (seeds {', '.join(map(str, a.seeds))}). Generated by bench/ppo_ablation.py.",
             f"Base settings: {'RL Zoo at 038ab16' if a.base == 'zoo038' else 'RL Zoo tuned entry at c94924e'} "
             f"({', '.join(f'{k} {v}' for k, v in BASES[a.base].items())}).",
             "", "| change from the base settings | returns by seed | median | seeds >= 475 | train s per seed (median) |",
             "|---|---|---|---|---|"]
    for text in a.configs:
        extra = json.loads(text)
        rs = [r for r in runs if r["config"] == extra]
        rets = [r["greedy_return"] for r in rs]
        name = ", ".join(f"{k} {json.dumps(v)}" for k, v in extra.items()) or "none"
        lines.append(f"| {name} | {', '.join(f'{x:.0f}' for x in rets)} | {statistics.median(rets):.0f} | "
                     f"{sum(x >= TARGET for x in rets)} of {len(rets)} | {statistics.median(r['train_seconds'] for r in rs):.1f} |")
    with open(os.path.join(a.out, "ppo-ablation.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
