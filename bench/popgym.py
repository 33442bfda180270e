"""segtape's recurrent PPO against sb3-contrib's RecurrentPPO on POPGym's
memory tasks (Morad et al., ICLR 2023; popgym 1.0.7): the greedy return
every --eval-every environment steps (10 episodes), the greedy return over
100 episodes at the end, the training time per environment step, and the
workers' peak and growth of resident memory (docs/results/ppo.md, "POPGym").

    build/python/bin/python bench/popgym.py [--envs RepeatPreviousEasy ...] [--seeds 1 2 3 4 5] [--steps 50000]
                                            [--out docs/figures/rl/popgym] [--doc docs/results/ppo.md]

Each run is a worker process of its own Python (segtape's: the tests' venv
build/python; SB3's: build-sb3, made by `bash bench/sb3_setup.sh`), one
thread, one run at a time, interleaved: env 1 seed 1 segtape, SB3, seed 2
segtape, SB3, ... Both engines run the same PPO settings, RL Zoo's tuned
RecurrentPPO entry for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml at
c94924e; RL Zoo has no POPGym entry, and this is its tuned recurrent-PPO
setting of a small memory task): 8 envs, 32-step rollouts, one minibatch of
all 256 steps, 20 epochs, gamma 0.98, GAE lambda 0.8, clip lin_0.2
(segtape: clip_schedule "linear"), lr lin_0.001, no entropy bonus, gradient
norm clipped at 0.5, vf_coef 0.5 (segtape's value_coef 1.0: its value loss
is value_coef / 2 x MSE), Adam's eps 1e-5 (SB3's; segtape's adam_eps),
rewards normalised as VecNormalize does (RL Zoo's "normalize: true", with
the algorithm's gamma; segtape's normalize_reward) and observations too where
the space is a Box (POPGym's other spaces are discrete: one-hot).
Models: SB3 as the Zoo entry's policy_kwargs (LSTM 64 for the actor and one
of its own for the critic, a 64-unit ReLU layer before each head, no
orthogonal initialisation); segtape its default policy, Linear(obs, 32) +
tanh (an embedding for a Discrete observation) -> GRUCell(32, 64) with a
GRU of its own for the critic (critic="separate"), linear heads, history
tbptt:32 (the rollout). A Tuple observation is flattened one-hot by
gymnasium.wrappers.FlattenObservation for both (SB3 takes no Tuple space);
a MultiDiscrete action is SB3's factorised distribution and segtape's one
Discrete over the joint actions (segtape.gym). Writes popgym.json (every
run, with its curve), popgym.md (the table) and popgym.png (the curves) to
--out, and the table into --doc's popgym section.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This file is popgym.py: `import popgym` must find the package, not this
# script, so its folder leaves the path and its neighbours load by file.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]


def _neighbour(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_sb3_compare = _neighbour("sb3_compare")
rss, peak_rss = _sb3_compare.rss, _sb3_compare.peak_rss

ENVS = ["RepeatPreviousEasy", "RepeatFirstEasy", "PositionOnlyCartPoleEasy", "NoisyPositionOnlyCartPoleEasy",
        "CountRecallEasy"]
ZOO = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, clip_range=0.2, ent_coef=0.0,
           learning_rate=1e-3, max_grad_norm=0.5, vf_coef=0.5, hidden=64)


def env_id(name):
    return f"popgym-{name}-v0"


def worker_segtape(a):
    import segtape.gym as sg
    z, rss_at = ZOO, []
    settings = dict(steps=a.steps // z["n_envs"], batch=z["n_envs"], hidden=z["hidden"], embed=32, lr=z["learning_rate"],
                    lr_schedule="linear", history=f"tbptt:{z['n_steps']}", gamma=z["gamma"], entropy=z["ent_coef"],
                    clip=z["max_grad_norm"], value_coef=2 * z["vf_coef"], seed=a.seed, algo="ppo", rollout=z["n_steps"],
                    epochs=z["n_epochs"], minibatches=z["n_envs"] * z["n_steps"] // z["batch_size"],
                    clip_range=z["clip_range"], gae_lambda=z["gae_lambda"], critic="separate", normalize_obs=True,
                    normalize_reward=True, adam_eps=1e-5, clip_schedule="linear")
    res = sg.train(env_id(a.env), **{**settings, **json.loads(a.segtape_args)}, log_every=a.eval_every // z["n_envs"],
                   eval_every=a.eval_every // z["n_envs"], eval_episodes=10, callback=lambda r: rss_at.append(rss()))
    evals = [(r["step"] * z["n_envs"], r["eval_return"], r["eval_seconds"]) for r in res.rows if "eval_return" in r]
    return res.trainer.step * z["n_envs"], evals, lambda n: res.evaluate(episodes=n)["mean_return"], rss_at


def worker_sb3(a):
    import gymnasium as gym
    import popgym  # noqa: F401  (registers popgym-*)
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    torch.set_num_threads(1)
    z = ZOO

    def make():
        env = gym.make(env_id(a.env))
        return gym.wrappers.FlattenObservation(env) if isinstance(env.observation_space, gym.spaces.Tuple) else env

    box = isinstance(make().observation_space, gym.spaces.Box)
    env = DummyVecEnv([make] * z["n_envs"])
    eval_env = DummyVecEnv([lambda: Monitor(make())])
    env = VecNormalize(env, norm_obs=box, gamma=z["gamma"])  # (RL Zoo's normalize: true; a discrete space stays one-hot)
    eval_env = VecNormalize(eval_env, norm_obs=box, training=False, norm_reward=False)
    env.seed(a.seed)
    eval_env.seed(12345)
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=z["n_steps"], batch_size=z["batch_size"], n_epochs=z["n_epochs"],
                         gamma=z["gamma"], gae_lambda=z["gae_lambda"], clip_range=lambda p: p * z["clip_range"],
                         ent_coef=z["ent_coef"], vf_coef=z["vf_coef"], learning_rate=lambda p: p * z["learning_rate"],
                         max_grad_norm=z["max_grad_norm"], seed=a.seed, device="cpu",
                         policy_kwargs=_sb3_compare.zoo_policy_kwargs(z["hidden"]))
    evals, rss_at = [], []

    def evaluate(n):
        if box:
            eval_env.obs_rms = env.obs_rms
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=n, deterministic=True)
        return float(mean)

    def record(steps, ret, seconds):
        evals.append((steps, ret, seconds))
        rss_at.append(rss())
        return False  # (the whole budget)

    model.learn(total_timesteps=a.steps, callback=_sb3_compare.evaluations(a.eval_every, evaluate, record))
    return model.num_timesteps, evals, evaluate, rss_at


def worker(a):
    t0 = time.perf_counter()
    steps, evals, evaluate, rss_at = (worker_segtape if a.worker == "segtape" else worker_sb3)(a)
    wall = time.perf_counter() - t0 - sum(e[2] for e in evals)
    print(json.dumps({"engine": a.worker, "env": a.env, "seed": a.seed, "env_steps": steps, "train_seconds": wall,
                      "final_return_100": evaluate(100), "peak_rss": peak_rss(),
                      "rss_first": rss_at[0] if rss_at else None, "rss_last": rss_at[-1] if rss_at else None,
                      "evals": [(s, r) for s, r, _ in evals]}))


def commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return head.strip() + ("+" if dirty else "")
    except OSError:
        return "?"


def segtape_name(a):
    """segtape's row name: its cell and critic as --segtape-args leave them."""
    args = json.loads(a.segtape_args)
    cell, critic = args.get("cell", "gru").upper(), args.get("critic", "separate")
    extras = [f"{k} {v}" for k, v in args.items() if k not in ("cell", "critic")]
    return (f"segtape PPO ({cell} 64" + (f", critic {cell} 64" if critic == "separate" else ", shared core") +
            "".join(", " + e for e in extras) + ")")


def table(results, a, at=None):
    lines = ["| env | engine | greedy return, 100 episodes, per seed | mean | µs per env step (median) | peak RSS MiB "
             "| RSS growth MiB (first → last evaluation) |", "|---|---|---|---|---|---|---|"]
    short = []
    for env in a.envs:
        means = {}
        for engine, name in (("segtape", segtape_name(a)), ("sb3", "SB3 RecurrentPPO (LSTM 64, critic LSTM 64)")):
            rs = [r for r in results if r["env"] == env and r["engine"] == engine]
            if not rs:
                continue
            means[engine] = statistics.mean(r["final_return_100"] for r in rs)
            per_step = statistics.median(r["train_seconds"] / r["env_steps"] for r in rs)
            growth = [(r["rss_last"] - r["rss_first"]) / 2**20 for r in rs if r["rss_first"]]
            returns = ", ".join(f"{r['final_return_100']:.3f}" for r in rs)
            grew = f"{min(growth):+.1f} to {max(growth):+.1f}" if growth else "-"
            lines.append(f"| {env} | {name} | {returns} | **{means[engine]:.3f}** | {per_step * 1e6:.0f} "
                         f"| {max(r['peak_rss'] for r in rs) / 2**20:.0f} | {grew} |")
        if len(means) == 2 and means["segtape"] < means["sb3"]:
            short.append(env)
    speed = []
    for env in a.envs:
        ps = {e: statistics.median(r["train_seconds"] / r["env_steps"] for r in results if r["env"] == env and r["engine"] == e)
              for e in ("segtape", "sb3") if any(r["env"] == env and r["engine"] == e for r in results)}
        if len(ps) == 2:
            speed.append(f"{env} {ps['sb3'] / ps['segtape']:.1f}×")
    extra = f" --segtape-args '{a.segtape_args}'" if a.segtape_args != "{}" else ""
    if a.envs != ENVS:
        extra += " --envs " + " ".join(a.envs)
    if a.engines != ["segtape", "sb3"]:
        extra += " --engines " + " ".join(a.engines)
    if a.segtape_python != "build/python/bin/python":
        extra += " --segtape-python " + a.segtape_python
    head = (f"Generated by `build/python/bin/python bench/popgym.py --steps {a.steps} --seeds {' '.join(map(str, a.seeds))}{extra}"
            f"{' --out ' + a.out if a.out else ''}{' --doc ' + a.doc if a.doc else ''}` at {at or commit()} on "
            f"{platform.processor() or os.uname().machine} ({os.cpu_count()} CPUs), one thread per worker, one run at a "
            f"time, interleaved; {a.steps:,} environment steps per run, the final greedy return over 100 episodes.")
    both = ["", "SB3's training time per environment step over segtape's (medians): " + ", ".join(speed) + ".",
            "segtape's mean below SB3's: " + (", ".join(short) if short else "none") + "."] if speed else []
    return "\n".join([head, "", *lines, *both])


def plot(results, a, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(a.envs), figsize=(4 * len(a.envs), 3.2), squeeze=False)
    for ax, env in zip(axes[0], a.envs):
        for engine, color in (("segtape", "tab:blue"), ("sb3", "tab:orange")):
            for i, r in enumerate(r for r in results if r["env"] == env and r["engine"] == engine):
                xs, ys = zip(*r["evals"]) if r["evals"] else ((), ())
                ax.plot(xs, ys, color=color, alpha=0.6, label=engine if i == 0 else None)
        ax.set_title(env, fontsize=9)
        ax.set_xlabel("environment steps")
    axes[0][0].set_ylabel("greedy return (10 episodes)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=ENVS, help="POPGym names (popgym-NAME-v0)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=50_000, help="environment steps (all streams) per run")
    ap.add_argument("--eval-every", type=int, default=5120, help="environment steps (all streams)")
    ap.add_argument("--engines", nargs="+", default=["segtape", "sb3"], choices=["segtape", "sb3"])
    ap.add_argument("--segtape-args", default="{}", help="a JSON object of segtape.gym.train arguments laid over segtape's "
                    "settings (to measure what a change does)")
    ap.add_argument("--out", help="a folder for popgym.json, popgym.md and popgym.png")
    ap.add_argument("--doc", help="a Markdown file whose popgym section is replaced by the table")
    ap.add_argument("--segtape-python", default="build/python/bin/python",
                    help="the Python with segtape's package (another venv: a package built from another commit)")
    ap.add_argument("--render", action="store_true", help="run nothing: write the table and plot again from --out's popgym.json "
                    "(the other flags as the run had them)")
    ap.add_argument("--worker", choices=["segtape", "sb3"], help=argparse.SUPPRESS)
    ap.add_argument("--env", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    pythons = {"segtape": os.path.join(ROOT, a.segtape_python), "sb3": os.path.join(ROOT, "build-sb3/bin/python")}
    for engine in a.engines:
        if not os.path.exists(pythons[engine]):
            sys.exit(f"popgym: {pythons[engine]} is missing (segtape: bash tests/run.sh makes it; sb3: bash bench/sb3_setup.sh)")
    results = []
    if a.render:
        with open(os.path.join(a.out, "popgym.json")) as f:
            results = json.load(f)
    for env in [] if a.render else a.envs:
        for seed in a.seeds:
            for engine in a.engines:
                cmd = [pythons[engine], os.path.abspath(__file__), "--worker", engine, "--env", env, "--seed", str(seed),
                       "--steps", str(a.steps), "--eval-every", str(a.eval_every), "--segtape-args", a.segtape_args]
                run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if run.returncode:
                    sys.exit(f"popgym: {engine} on {env} seed {seed} failed:\n{run.stderr[-3000:]}")
                results.append(json.loads(run.stdout.strip().splitlines()[-1]))
                r = results[-1]
                print(f"{env:32s} {engine:8s} seed {seed}: final greedy return {r['final_return_100']:.3f}, "
                      f"{r['train_seconds']:.1f} s training, peak RSS {r['peak_rss'] / 2**20:.0f} MiB", flush=True)
                if a.out:  # (kept as it goes: a stopped run keeps what it measured)
                    os.makedirs(a.out, exist_ok=True)
                    with open(os.path.join(a.out, "popgym.json"), "w") as f:
                        json.dump(results, f, indent=1)
    at = None
    if a.render and os.path.exists(os.path.join(a.out, "popgym.md")):  # the commit the run was made at, as its table says
        import re
        with open(os.path.join(a.out, "popgym.md")) as f:
            m = re.search(r"` at (\S+) on ", f.readline())
        at = m.group(1) if m else None
    text = table(results, a, at)
    print(text)
    if a.out:
        with open(os.path.join(a.out, "popgym.md"), "w") as f:
            f.write(text + "\n")
        plot(results, a, os.path.join(a.out, "popgym.png"))
    if a.doc:
        replace_section = _neighbour("markdown_section").replace_section
        figure = os.path.relpath(os.path.join(a.out, "popgym.png"), os.path.dirname(a.doc)) if a.out else None
        replace_section(a.doc, "popgym", text + (f"\n\n![POPGym: greedy return during training]({figure})" if figure else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
