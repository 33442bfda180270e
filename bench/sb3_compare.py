"""segtape's recurrent PPO against Stable-Baselines3's RecurrentPPO
(sb3-contrib) on masked-velocity CartPole at RL Zoo's tuned settings:
environment steps and training wall time to reach a target greedy return,
the greedy return over 100 episodes at the end, and the workers' peak and
growth of resident memory (docs/results/ppo.md, "Against Stable-Baselines3's RecurrentPPO").

    build/python/bin/python bench/sb3_compare.py [--seeds 1 2 3 4 5] [--max-steps 100000] [--out docs/results/ppo.md]

Each engine runs in a worker process of its own Python (segtape's: the tests'
venv build/python; SB3's: build-sb3, made by `bash bench/sb3_setup.sh`), one
thread each, seeds interleaved (segtape seed 1, SB3 seed 1, segtape seed 2,
...). Both use RL Zoo's tuned RecurrentPPO entry for CartPoleNoVel-v1
(hyperparams/ppo_lstm.yml at c94924e, marked "Tuned"; the entry RL Zoo's
published sb3/ppo_lstm-CartPoleNoVel-v1 agent lists, mean return 500): 8
envs, 32-step rollouts, one minibatch of all 256 steps, 20 epochs, gamma
0.98, GAE lambda 0.8, lr lin_0.001, clip lin_0.2 (segtape: clip_schedule
"linear"), no entropy bonus, observations and rewards normalised as
VecNormalize does (RL Zoo's "normalize: true", with the algorithm's gamma;
segtape: normalize_obs and normalize_reward), SB3's defaults for the rest
(gradient norm clipped at 0.5, vf_coef 0.5: segtape's value_coef 1.0, as its
value loss is value_coef / 2 x MSE; Adam's eps 1e-5: segtape's adam_eps). Models: SB3 as the entry's policy_kwargs (LSTM 64 for
the actor and one of its own for the critic, a 64-unit ReLU layer before
each head, no orthogonal initialisation); segtape Linear(4, 32) + tanh ->
GRUCell(32, 64) and a GRU of its own for the critic (critic="separate"),
linear heads. (An older file, 038ab16, had neither normalisation nor these
policy_kwargs; segtape at those is bench/ppo_ablation.py's.) Every
--eval-every steps each worker evaluates greedily over 10 episodes (not
counted in the training time), and with --stop stops at the first mean >=
--target; then 100 episodes.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPO = dict(batch=8, rollout=32, minibatches=1, epochs=20, gamma=0.98, gae_lambda=0.8, clip_range=0.2, entropy=0.0,
           lr=1e-3, hidden=64, clip=0.5, vf_coef=0.5)  # (lr and SB3's clip_range annealed linearly to 0)


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def zoo_policy_kwargs(hidden):
    """SB3's policy in RL Zoo's tuned CartPoleNoVel-v1 entry (ppo_lstm.yml at
    c94924e): an LSTM for the actor and one for the critic, a 64-unit ReLU
    layer before each head, no orthogonal initialisation."""
    import torch
    return dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=hidden, enable_critic_lstm=True,
                net_arch=dict(pi=[64], vf=[64]))


def evaluations(every, evaluate, record):
    """An SB3 callback: every `every` environment steps, evaluate(10) (a greedy
    evaluation of 10 episodes), timed; record(steps, mean return, seconds)
    is told, and training stops where it returns True."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Eval(BaseCallback):
        next_at = every

        def _on_step(self):
            if self.num_timesteps < self.next_at:
                return True
            self.next_at += every
            t0 = time.perf_counter()
            ret = evaluate(10)
            return not record(self.num_timesteps, ret, time.perf_counter() - t0)
    return Eval()


def worker_segtape(a):
    import segtape.gym as sg
    p = PPO
    first_rss = []
    res = sg.train(sg.masked_cartpole, steps=a.max_steps // p["batch"], batch=p["batch"], hidden=p["hidden"], embed=32,
                   lr=p["lr"], history="tbptt:32", gamma=p["gamma"], entropy=p["entropy"], clip=p["clip"], seed=a.seed,
                   value_coef=2 * p["vf_coef"], lr_schedule="linear", clip_schedule="linear", critic="separate",
                   normalize_obs=True, normalize_reward=True, adam_eps=1e-5,
                   # (segtape's value loss is value_coef / 2 x MSE, SB3's vf_coef x MSE)
                   algo="ppo", rollout=p["rollout"], epochs=p["epochs"], minibatches=p["minibatches"],
                   clip_range=p["clip_range"], gae_lambda=p["gae_lambda"], log_every=a.eval_every // p["batch"],
                   eval_every=a.eval_every // p["batch"], eval_episodes=10, stop_at=a.target if a.stop else None,
                   callback=lambda r: first_rss.append(rss()))
    return res.trainer.step * p["batch"], res.rows, lambda n: res.evaluate(episodes=n)["mean_return"], first_rss


def worker_sb3(a):
    import gymnasium as gym
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy  # noqa: F401
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    torch.set_num_threads(1)
    p = PPO

    class MaskVelocity(gym.ObservationWrapper):
        def observation(self, observation):
            return (observation * np.array([1, 0, 1, 0], dtype=np.float32)).astype(np.float32)

    def make():
        return MaskVelocity(gym.make("CartPole-v1", max_episode_steps=500))

    env = VecNormalize(DummyVecEnv([make] * p["batch"]), gamma=p["gamma"])  # (RL Zoo's normalize: true)
    env.seed(a.seed)
    eval_env = VecNormalize(DummyVecEnv([lambda: Monitor(make())]), training=False, norm_reward=False)
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=p["rollout"], batch_size=p["batch"] * p["rollout"] // p["minibatches"],
                         n_epochs=p["epochs"], gamma=p["gamma"], gae_lambda=p["gae_lambda"],
                         clip_range=lambda left: left * p["clip_range"], ent_coef=p["entropy"], vf_coef=p["vf_coef"],
                         learning_rate=lambda left: left * p["lr"], max_grad_norm=p["clip"], seed=a.seed, device="cpu",
                         policy_kwargs=zoo_policy_kwargs(p["hidden"]))
    rows, rss_at = [], []

    def evaluate(n):
        eval_env.obs_rms = env.obs_rms
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=n, deterministic=True)
        return float(mean)

    def record(steps, ret, seconds):
        rows.append({"step": steps // p["batch"], "eval_return": ret, "eval_seconds": seconds})
        rss_at.append(rss())
        return a.stop and ret >= a.target

    model.learn(total_timesteps=a.max_steps, callback=evaluations(a.eval_every, evaluate, record))
    return model.num_timesteps, rows, evaluate, rss_at


def worker(a):
    t0 = time.perf_counter()
    steps, rows, evaluate, rss_at = (worker_segtape if a.worker == "segtape" else worker_sb3)(a)
    wall = time.perf_counter() - t0 - sum(r.get("eval_seconds", 0) for r in rows)
    evals = [(r["step"] * PPO["batch"], r["eval_return"]) for r in rows if "eval_return" in r]
    reached = next((s for s, ret in evals if ret >= a.target), None)
    final = evaluate(100)
    print(json.dumps({"engine": a.worker, "seed": a.seed, "env_steps": steps, "train_seconds": wall,
                      "reached_at": reached, "final_return_100": final, "peak_rss": peak_rss(),
                      "rss_first": rss_at[0] if rss_at else None, "rss_last": rss_at[-1] if rss_at else None,
                      "evals": evals}))


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--max-steps", type=int, default=100_000, help="environment steps (all streams) at most")
    ap.add_argument("--eval-every", type=int, default=8192, help="environment steps (all streams)")
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--stop", action="store_true", help="stop each run at its first evaluation >= --target")
    ap.add_argument("--worker", choices=["segtape", "sb3"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--json")
    ap.add_argument("--out", help="a Markdown file whose sb3-compare section is replaced by the table")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    pythons = {"segtape": os.path.join(ROOT, "build/python/bin/python"), "sb3": os.path.join(ROOT, "build-sb3/bin/python")}
    for engine, py in pythons.items():
        if not os.path.exists(py):
            sys.exit(f"sb3_compare: {py} is missing (segtape: bash tests/run.sh makes it; sb3: bash bench/sb3_setup.sh)")
    results = []
    for seed in a.seeds:
        for engine in ("segtape", "sb3"):
            cmd = [pythons[engine], os.path.abspath(__file__), "--worker", engine, "--seed", str(seed),
                   "--max-steps", str(a.max_steps), "--eval-every", str(a.eval_every), "--target", str(a.target)]
            cmd += ["--stop"] if a.stop else []
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            r = results[-1]
            print(f"{engine:8s} seed {seed}: reached {a.target:.0f} at {r['reached_at']} steps, "
                  f"{r['train_seconds']:.1f} s training, final greedy return {r['final_return_100']:.1f}, "
                  f"peak RSS {r['peak_rss'] / 2**20:.1f} MiB", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    rows = []
    for engine, name in (("segtape", "segtape PPO (GRU 64, critic GRU 64)"), ("sb3", "SB3 RecurrentPPO (LSTM 64, critic LSTM 64)")):
        rs = [r for r in results if r["engine"] == engine]
        fmt_steps = ", ".join(f"{r['reached_at']:,}" if r["reached_at"] else f"not in {r['env_steps']:,}" for r in rs)
        fmt_secs = ", ".join(f"{r['train_seconds']:.0f}" for r in rs)
        fmt_ret = ", ".join(f"{r['final_return_100']:.1f}" for r in rs)
        fmt_rss = ", ".join(f"{r['peak_rss'] / 2**20:.0f}" for r in rs)
        growth = ", ".join(f"{(r['rss_last'] - r['rss_first']) / 2**20:+.1f}" if r["rss_first"] else "-" for r in rs)
        rows.append(f"| {name} | {fmt_steps} | {fmt_secs} | {fmt_ret} | {fmt_rss} | {growth} |")
    per_step = {e: [r["train_seconds"] / r["env_steps"] for r in results if r["engine"] == e] for e in ("segtape", "sb3")}
    ratio = median(per_step["sb3"]) / median(per_step["segtape"])
    import platform
    text = "\n".join([
        f"Generated by `build/python/bin/python bench/sb3_compare.py --seeds {' '.join(map(str, a.seeds))} "
        f"--max-steps {a.max_steps}{' --stop' if a.stop else ''}{' --out ' + a.out if a.out else ''}` on {platform.processor() or os.uname().machine} ({os.cpu_count()} CPUs), "
        f"one thread per worker, runs interleaved; one value per seed ({', '.join(map(str, a.seeds))}).",
        "",
        f"| engine | env steps to greedy return ≥ {a.target:.0f} (10 episodes) | training seconds (evaluations excluded) "
        f"| greedy return, 100 episodes at the end | peak RSS MiB | RSS growth first → last evaluation, MiB |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Training time per environment step, median over seeds: segtape {median(per_step['segtape']) * 1e6:.0f} µs, "
        f"SB3 {median(per_step['sb3']) * 1e6:.0f} µs: **{ratio:.1f}×**.",
    ])
    print(text)
    if a.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from markdown_section import replace_section
        replace_section(a.out, "sb3-compare", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
