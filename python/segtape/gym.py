"""segtape.gym: Gymnasium environments and segtape's recurrent agent.

train(env) trains the agent's GRU policy (the C++ Trainer of `segtape train`:
encoder, GRUCell, policy and value heads; advantage actor-critic with n-step
returns within a segment, or recurrent PPO; truncated BPTT with the state
carried across segments, each stream's state reset when its episode ends) on
any Gymnasium environment with a Discrete or MultiDiscrete action space and
a Discrete observation (a token) or one Gymnasium flattens to a vector (Box,
MultiDiscrete, Tuple...: POPGym's memory tasks among them). The B streams are a gymnasium.vector.SyncVectorEnv; the
Trainer steps them through the agent's Env contract, checked on every call (a
broken contract is a segtape.Error naming the env and the step).

The other way round, SegtapeEnv is one of segtape's built-in RL memory
tasks (tmaze, or an env of your own registered in C++) as a gymnasium.Env;
register_gymnasium_envs() registers "segtape/TMaze-v0".
"""
import itertools
import re
import time

import numpy as np

from . import _INT64, _UINT64, Error, _argument_names, _bytes, _set_ints
from . import _segtape

_A = _segtape.agent

# Python env factories by registered name; the C++ registry keeps only names.
_factories = {}
_serial = itertools.count()


def _gymnasium():
    try:
        import gymnasium
    except ImportError:
        raise ImportError("segtape.gym needs gymnasium (pip install gymnasium)") from None
    return gymnasium


class _RunningNorm:
    """Observation normalisation as Stable-Baselines3's VecNormalize does it:
    (obs - mean) / sqrt(var + 1e-8), clipped to [-10, 10], with the mean and
    variance of every observation seen so far (Chan et al.'s parallel update).
    One per training run, shared by its training and evaluation streams."""

    def __init__(self, dim):
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def __call__(self, obs):
        batch_mean, batch_var, n = obs.mean(0), obs.var(0), obs.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total
        return self.apply(obs)

    def apply(self, obs):
        """The normalisation as it stands, the statistics left as they are
        (a truncated episode's final observation, as VecNormalize does it)."""
        return np.clip((obs - self.mean) / np.sqrt(self.var + 1e-8), -10, 10)


class _RewardNorm:
    """Reward normalisation as Stable-Baselines3's VecNormalize does it
    (norm_reward): each stream keeps its discounted return (return x gamma +
    reward, zeroed when its episode ends); the variance of those returns over
    every step and stream so far (_RunningNorm's update) divides each reward,
    reward / sqrt(var + 1e-8), clipped to [-10, 10]. One per training run;
    evaluation streams read it without updating it."""

    def __init__(self, gamma):
        self.gamma, self.stats = gamma, _RunningNorm(1)

    def scale(self):
        return float(np.sqrt(self.stats.var[0] + 1e-8))


class _Streams:
    """B episode streams of a Gymnasium env under the agent's Env contract:
    an ended episode restarts by itself (autoreset in the same step), its
    return is recorded, and success(return, truncated) says whether it counts
    as a success in the trainer's score. An episode that Gymnasium says was
    truncated (and not terminated: a time limit's cut) is reported as such
    with the observation it was cut at (truncations()), which the trainer
    bootstraps from, as Stable-Baselines3 does."""

    def __init__(self, name, make, batch, seed, success, tokens, norm=None, obs_start=0, act_start=0, obs_dim=0,
                 reward_norm=None):
        gym = _gymnasium()
        self.name, self.norm, self.obs_start, self.act_start, self.obs_dim = name, norm, obs_start, act_start, obs_dim
        self.reward_norm, self.learning = reward_norm, True  # (evaluate() clears learning)
        self.discounted = np.zeros(batch)
        self.ended_sum, self.ended = 0.0, 0  # the episodes ended since the last read (ended_returns)
        self.steps = 0
        self.envs = gym.vector.SyncVectorEnv([make] * batch, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.batch, self.success, self.tokens = batch, success, tokens
        self.returns = np.zeros(batch)
        self.episode_returns = [[] for _ in range(batch)]  # per stream, in order
        self.truncated = np.zeros(batch, dtype=np.uint8)  # the last step's cuts, and the observations they were cut at
        self.final = np.zeros(batch, dtype=np.int64) if tokens else np.zeros((batch, obs_dim), dtype=np.float32)
        obs, _ = self._call("reset", lambda: self.envs.reset(seed=int(seed % (2**31 - 1))))
        self._set(obs)

    def _call(self, what, f):
        """f(), with an env's own exception named as the Env contract names it."""
        try:
            return f()
        except Error:
            raise
        except Exception as e:
            raise Error(f"env '{self.name}', step {self.steps}: {what}() raised {type(e).__name__}: {e}") from e

    def _set(self, obs):
        self.obs = self._converted(obs, self.batch, self.norm)

    def _converted(self, obs, rows, norm):
        """Gymnasium's observations of `rows` streams as segtape takes them:
        tokens from 0, or finite float32 vectors through `norm`."""
        obs = np.asarray(obs)
        want = (rows,) if self.tokens else (rows, self.obs_dim)
        if obs.shape != want or (self.tokens and obs.dtype.kind not in "iu"):
            raise Error(f"env '{self.name}', step {self.steps}: observations of shape {obs.shape} and dtype {obs.dtype}, "
                        f"expected {want} {'integers' if self.tokens else 'numbers'} (the env's observation space)")
        if self.tokens:
            return np.ascontiguousarray(obs - self.obs_start, dtype=np.int64)
        else:
            obs = obs.astype(np.float64)
            # Before the running normalisation, which a NaN, an inf or a value
            # float32 cannot hold (inf once cast; its square overflows the
            # variance) would spoil for the whole run.
            with np.errstate(invalid="ignore"):
                bad = np.argwhere(~(np.abs(obs) <= np.finfo(np.float32).max))
            if len(bad):
                b, i = (int(x) for x in bad[0])
                raise Error(f"env '{self.name}', step {self.steps}: observe() gave stream {b} the value {obs[b, i]} at {i}; "
                            "observations must be finite float32 values, |x| <= 3.4e38 (the Env contract: "
                            "segtape/agent/env.h, docs/agent.md)")
            return np.ascontiguousarray(norm(obs) if norm else obs, dtype=np.float32)

    def observe(self):
        return self.obs

    def truncations(self):
        """(truncated uint8 [B], the final observations: tokens [B] or
        vectors [B, obs_dim], rows of the truncated streams) of the last step."""
        return self.truncated, self.final

    def step(self, actions):
        self.steps += 1
        acts = np.array(actions, dtype=np.int64) + self.act_start
        obs, reward, terminated, truncated, info = self._call("step", lambda: self.envs.step(acts))
        done = np.logical_or(terminated, truncated)
        cut = np.logical_and(truncated, np.logical_not(terminated))  # (both: the task ended it, nothing to bootstrap)
        self.truncated = cut.astype(np.uint8)
        if cut.any():
            rows = np.flatnonzero(cut)
            final = [info["final_obs"][b] for b in rows]
            self.final[rows] = self._converted(np.stack([np.asarray(f) for f in final]), len(rows),
                                               self.norm.apply if self.norm else None)
        self.returns += reward
        success = np.zeros(self.batch, dtype=np.uint8)
        for b in np.flatnonzero(done):
            success[b] = bool(self.success(float(self.returns[b]), bool(truncated[b])))
            self.episode_returns[b].append(float(self.returns[b]))
            self.ended_sum, self.ended = self.ended_sum + float(self.returns[b]), self.ended + 1
            self.returns[b] = 0.0
        self._set(obs)
        if self.reward_norm is not None:
            rn = self.reward_norm
            reward = np.asarray(reward, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                bad = np.flatnonzero(~(np.abs(reward) <= np.finfo(np.float32).max))
            if len(bad):  # (refused as the Env contract refuses it, before the normalisation would hide it)
                raise Error(f"env '{self.name}', step {self.steps}: step() gave the reward {reward[bad[0]]} to stream "
                            f"{int(bad[0])}; rewards must be finite float32 values (the Env contract: segtape/agent/env.h, "
                            "docs/agent.md)")
            with np.errstate(over="ignore", invalid="ignore"):  # (a reward float32 cannot hold is refused as it is)
                self.discounted = self.discounted * rn.gamma + reward
                if self.learning and np.isfinite(self.discounted).all():
                    rn.stats(self.discounted[:, None])
                reward = np.clip(reward / rn.scale(), -10, 10)
            self.discounted[done] = 0.0
        return np.asarray(reward, dtype=np.float32), done.astype(np.uint8), success

    def ended_returns(self):
        """(sum, count) of the returns of the episodes ended since the last
        call: the env's own rewards, before any normalisation."""
        out = (self.ended_sum, self.ended)
        self.ended_sum, self.ended = 0.0, 0
        return out

    def close(self):
        self.envs.close()


def _maker(env):
    """(a function making one gymnasium.Env, a label) from an id or a callable.
    A POPGym id ("popgym-RepeatPreviousEasy-v0") imports popgym, which
    registers its envs, if nothing has yet."""
    gym = _gymnasium()
    if isinstance(env, str):
        if env.startswith("popgym-") and env not in gym.registry:
            try:
                import popgym  # noqa: F401  (registers the popgym-* ids)
            except ImportError:
                raise Error(f"env '{env}': POPGym's envs need popgym (pip install popgym)") from None
        return (lambda: gym.make(env)), env
    if callable(env):
        return env, getattr(env, "__name__", "env")
    raise Error(f"segtape.gym: env must be a Gymnasium id or a function returning a gymnasium.Env, got {type(env).__name__}")


_MAX_ACTIONS = 65536  # a MultiDiscrete action space's joint actions: the policy head's rows


def _flat_actions(gym, space):
    """A gymnasium.ActionWrapper class taking MultiDiscrete `space`'s joint
    actions as one Discrete index (C order over nvec, from its start)."""
    nvec, start = np.asarray(space.nvec, dtype=np.int64), np.asarray(getattr(space, "start", 0), dtype=np.int64)

    class FlatActions(gym.ActionWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.action_space = gym.spaces.Discrete(int(np.prod(nvec)))

        def action(self, action):
            return (np.array(np.unravel_index(int(action), tuple(nvec)), dtype=np.int64) + start).astype(space.dtype)
    return FlatActions


def _spaces(make, label):
    """(obs_dim, vocab, actions, first observation token, normalisable, make)
    for `make`'s env. A Discrete observation is a token (counted from its
    start); a Box of any shape, a MultiDiscrete, a MultiBinary, a Tuple or a
    Dict of them is one float vector, flattened by Gymnasium's
    FlattenObservation (discrete parts one-hot); only a Box is normalisable.
    A Discrete action space is taken as it is (counted from its start), a
    MultiDiscrete one as the one Discrete of its joint actions."""
    gym = _gymnasium()
    probe = make()
    try:
        obs, act = probe.observation_space, probe.action_space
    finally:
        probe.close()
    wrappers = []
    if isinstance(act, gym.spaces.Discrete):
        actions, act_start = int(act.n), int(act.start)
    elif isinstance(act, gym.spaces.MultiDiscrete):
        actions = int(np.prod(np.asarray(act.nvec, dtype=np.float64)))
        if act.nvec.ndim != 1 or not 1 <= actions <= _MAX_ACTIONS:
            raise Error(f"env '{label}': the action space {act} has {actions} joint actions; segtape.gym takes a 1-D "
                        f"MultiDiscrete of at most {_MAX_ACTIONS} (as one Discrete over them)")
        wrappers.append(_flat_actions(gym, act))
        act_start = 0
    else:
        raise Error(f"env '{label}': the action space must be Discrete or MultiDiscrete, got {act}")
    # (obs_dim, vocab, actions, first observation token, normalisable): Discrete
    # spaces may start elsewhere than 0; the agent counts from 0.
    if isinstance(obs, gym.spaces.Discrete):
        shape = (0, int(obs.n), actions, int(obs.start), False)
    else:
        try:
            flat = gym.spaces.flatten_space(obs) if obs.is_np_flattenable else None
        except (NotImplementedError, TypeError, ValueError):
            flat = None
        if not isinstance(flat, gym.spaces.Box) or len(flat.shape) != 1:
            raise Error(f"env '{label}': the observation space must be Discrete, or one Gymnasium flattens to a vector "
                        f"(Box, MultiDiscrete, MultiBinary, Tuple or Dict of them), got {obs}")
        if flat.shape[0] == 0:
            raise Error(f"env '{label}': the observation space {obs} has no dimensions")
        if not (isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1):
            wrappers.append(gym.wrappers.FlattenObservation)
        shape = (int(flat.shape[0]), 0, actions, 0, isinstance(obs, gym.spaces.Box))

    def wrapped():
        env = make()
        for w in wrappers:
            env = w(env)
        return env
    return shape + (act_start, wrapped if wrappers else make)


class TrainResult:
    """A finished (or stopped) training run: rows of metrics, and evaluate()."""

    def __init__(self, trainer, rows, name, label):
        self.trainer, self.rows, self.name, self.label = trainer, rows, name, label

    def evaluate(self, episodes=100, seed=12345, max_steps=1_000_000):
        """Greedy evaluation on fresh episodes (new streams seeded `seed`):
        {"episodes", "mean_return", "returns", "steps"}. Each of the B streams
        contributes its first ceil(episodes / B) episodes (taken in turn, up
        to `episodes`), so long episodes are not under-counted; the streams
        run until each has finished that many (at most max_steps steps: 256
        at first, doubled up to max_steps while a stream is short)."""
        for arg, value in (("episodes", episodes), ("max_steps", max_steps)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise Error(f"segtape.gym.TrainResult.evaluate: {arg} must be an int >= 1, got {value!r}")
        made = []
        factory = _factories[self.name]

        def recording(batch, s):
            streams = factory(batch, s)
            streams.learning = False
            made.append(streams)
            return streams

        _factories[self.name] = recording
        try:
            steps = min(256, int(max_steps))
            while True:
                made.clear()
                self.trainer.evaluate(steps, seed)
                per_stream = made[-1].episode_returns
                made[-1].close()
                quota = -(-episodes // len(per_stream))
                if min(len(r) for r in per_stream) >= quota or steps >= max_steps:
                    break
                steps = min(2 * steps, int(max_steps))
        finally:
            _factories[self.name] = factory
        got = [r[i] for i in range(quota) for r in per_stream if i < len(r)][:episodes]
        return {"episodes": len(got), "mean_return": float(np.mean(got)) if got else float("nan"),
                "returns": got, "steps": steps}

    def __repr__(self):
        last = self.rows[-1] if self.rows else {}
        return f"<segtape.gym.TrainResult {self.label}: {self.trainer.step} steps, last row {last}>"


def train(env, *, steps=50_000, batch=8, hidden=64, embed=32, update_bias=0.0, lr=3e-3, history="tbptt:32", gamma=0.99,
          entropy=0.01, value_coef=0.5, clip=1.0, seed=1, algo="a2c", rollout=128, epochs=10, minibatches=4,
          clip_range=0.2, gae_lambda=0.95, lr_schedule="linear", clip_schedule="constant", value_clip=0.0, critic="shared", head_hidden=0, ortho_init=False, cell="gru", encoder="linear", adam_eps=1e-8, nonfinite="stop", max_skips=10, success=None, normalize_obs=True, normalize_reward=False, log_every=None,
          callback=None,
          eval_every=None, eval_episodes=10, stop_at=None, budget=None, size_check=True, precision="f32"):
    """Trains segtape's recurrent agent on a Gymnasium env; returns a TrainResult.

    env: a Gymnasium id ("CartPole-v1") or a function returning a
    gymnasium.Env (e.g. masked_cartpole). steps: env steps (each over all B
    streams). success(episode_return, truncated) -> bool decides what the
    trainer's score counts (default: the episode ended by its time limit,
    truncated, rather than by failing). algo: "a2c" (an update per segment
    of the history's K steps) or "ppo" (recurrent PPO: rollouts of `rollout`
    steps, GAE(gae_lambda), the clipped surrogate with clip_range, `epochs`
    passes over `minibatches` minibatches of whole streams, each replayed from
    the states stored at rollout time; `minibatches` divides `batch`;
    lr_schedule "linear" anneals the learning rate to 0 over `steps`, or
    "constant"; clip_schedule "linear" anneals the clip range to 0 likewise,
    as SB3's lin_ schedules, or "constant", the default); value_clip > 0
    clips the value's move from its rollout value as PPO2 and CleanRL do
    (the larger of the clipped and unclipped value losses; 0, the default,
    is SB3's: off).
    critic: "shared" (the value head reads the policy's GRU or LSTM) or
    "separate" (a cell of its own of the same kind over the same
    embeddings, as sb3-contrib's RecurrentPPO gives its critic an LSTM of
    its own).
    cell: "gru" (the agent's GRUCell) or "lstm" (an LSTM cell of `hidden`
    units, its state h and c).
    encoder: "linear" (a vector observation goes through Linear(obs_dim,
    embed) + tanh) or "none" (into the recurrent cell as it is, as SB3's
    recurrent policies read it; embed is then unused); tokens are embedded.
    head_hidden: > 0 puts a layer of that many units with ReLU before the
    action head and one before the value head (SB3's net_arch
    dict(pi=[N], vf=[N])); 0, the heads read the GRU's state.
    ortho_init: SB3's ortho_init (the encoder and hidden layers drawn
    orthogonal with gain sqrt(2), the action head 0.01, the value head 1,
    biases 0; the recurrent cell as PyTorch's); off by default.
    nonfinite: an update whose gradient is not finite (inf or NaN, e.g.
    returns of rewards too large for float32): "stop" raises
    segtape.NonFiniteError naming it, that update not taken; "skip" leaves it out
    and counts it (result.trainer.skipped_updates), as PyTorch's GradScaler
    does, and raises after max_skips skipped in a row.
    adam_eps: Adam's eps (PyTorch's 1e-8, the default; SB3's and CleanRL's
    PPO use 1e-5).
    update_bias: added to the GRU's update-gate bias at initialisation (the
    cell keeps about sigmoid(update_bias) of its state per step from the
    start; 0 is PyTorch's initialisation; docs/agent.md, "Policy").
    normalize_reward: each reward the trainer learns from is divided by the
    running standard deviation of the discounted return (gamma), clipped to
    [-10, 10], as SB3's VecNormalize(norm_reward=True) does (RL Zoo's
    "normalize: true"); rows and evaluate() report the env's own returns.
    normalize_obs: Box observations are normalised by their running mean and
    variance (as SB3's VecNormalize; the statistics are the run's, shared by
    evaluate()); observations flattened from discrete spaces (MultiDiscrete,
    Tuple..., one-hot) are not.
    Spaces: a Discrete observation is a token (embedded); any other space
    Gymnasium flattens (gymnasium.wrappers.FlattenObservation: a Box of any
    shape, MultiDiscrete and Tuple one-hot) is a float vector. A MultiDiscrete
    action space is one Discrete over its joint actions (at most 65,536, in C
    order: index i is np.unravel_index(i, nvec) + start), where SB3 samples
    each part from a factorised distribution.
    budget: each segment's arena (bytes or a size such as "64MiB"; as
    `segtape train --budget`, default 64 MiB, for history "full" its growth
    limit, default 1 GiB): a run that needs more is refused when made.
    size_check: False skips the check, made before anything is allocated,
    that the run's estimated memory fits what the machine has free (its
    cgroup's, ulimit -v / -d; docs/hardening.md, "The size check").
    precision: "f32", or "bf16" (matrix products in bfloat16; docs/precision.md).
    log_every (default steps // 20) rows: step, loss, mean return of the
    episodes that ended in the interval, success rate, segment peak bytes;
    callback(row) is called with each.
    eval_every: every so many steps (at the first row after them), a greedy
    evaluation over eval_episodes fresh episodes adds "eval_return" and
    "eval_seconds" (its own time) to the row; with stop_at, training stops at
    the first evaluation whose mean return is >= stop_at.
    """
    make, label = _maker(env)
    obs_dim, vocab, actions, obs_start, normalisable, act_start, make = _spaces(make, label)
    tokens = vocab > 0
    succeed = success or (lambda ret, truncated: truncated)
    name = "gym." + re.sub(r"[^A-Za-z0-9_.-]", "_", label) + "." + str(next(_serial))
    norm = _RunningNorm(obs_dim) if normalize_obs and normalisable else None
    reward_norm = _RewardNorm(float(gamma)) if normalize_reward else None
    training = []  # the training streams (the first made: the Trainer's), whose ended episodes the rows report

    def streams(b, s):
        made = _Streams(name, make, b, s, succeed, tokens, norm, obs_start, act_start, obs_dim, reward_norm)
        if not training:
            training.append(made)
        return made
    _factories[name] = streams
    _A.register_python_env(name, obs_dim, vocab, actions, "success")
    c = _A.TrainConfig()
    c.env, c.history = name, history
    if eval_every and c.history == "full":
        raise Error("segtape.gym.train: eval_every needs a history other than 'full': history 'full' keeps its whole run in "
                    "one open segment, so it evaluates only once the run has ended (result.evaluate() after train())")
    c.lr, c.gamma, c.entropy, c.value_coef, c.clip = lr, gamma, entropy, value_coef, clip
    c.clip_range, c.gae_lambda, c.lr_schedule, c.critic = clip_range, gae_lambda, lr_schedule, critic
    c.clip_schedule, c.cell, c.adam_eps, c.nonfinite, c.encoder = clip_schedule, cell, float(adam_eps), nonfinite, encoder
    c.update_bias, c.size_check, c.value_clip = float(update_bias), bool(size_check), float(value_clip)
    c.precision = str(precision)
    c.ortho_init = bool(ortho_init)
    if budget is not None:  # (None: the Trainer's default, 64 MiB, or 1 GiB of growth for history "full")
        c.budget = _bytes(budget, "segtape.gym.train: budget")

    def named(e):  # the checks name the segtape program's flags: here, train()'s arguments (the error's class kept)
        text = _argument_names(str(e)).replace("TrainConfig::budget", "budget")
        return type(e)("segtape.gym.train: " + text)
    ints = (("steps", steps, _INT64), ("batch", batch, _INT64), ("hidden", hidden, _INT64), ("embed", embed, _INT64),
            ("head_hidden", head_hidden, _INT64), ("max_skips", max_skips, _INT64),
            ("seed", seed, _UINT64), ("rollout", rollout, _INT64), ("epochs", epochs, _INT64),
            ("minibatches", minibatches, _INT64))
    _set_ints(c, [(k, int(v), kind) for k, v, kind in ints], "segtape.gym.train", named)
    try:
        c.algo = algo
        trainer = _A.Trainer(c)
    except Error as e:
        raise named(e) from None
    every = log_every or max(1, int(steps) // 20)
    rows, acc = [], {"steps": 0, "loss_sum": 0.0, "loss_steps": 0, "return_sum": 0.0, "episodes": 0, "peak": 0}
    next_row = every
    next_eval = eval_every
    result = TrainResult(trainer, rows, name, label)
    while not trainer.done():
        try:
            r = trainer.run_segment()
        except Error as e:  # (a budget a run outgrows, e.g. history "full", named as train() takes it)
            raise named(e) from None
        for k in ("steps", "loss_sum", "loss_steps"):
            acc[k] += r[k]
        # (with normalize_reward the trainer's returns are of the normalised rewards: the env's own instead)
        ended_sum, ended = training[0].ended_returns() if reward_norm is not None else (r["return_sum"], r["episodes"])
        acc["return_sum"] += ended_sum
        acc["episodes"] += ended
        acc["peak"] = max(acc["peak"], r["segment_peak"])
        if trainer.step >= next_row or trainer.done():
            row = {"step": trainer.step,
                   "loss": acc["loss_sum"] / acc["loss_steps"] if acc["loss_steps"] else float("nan"),
                   "episode_return": acc["return_sum"] / acc["episodes"] if acc["episodes"] else float("nan"),
                   "success": trainer.score(), "segment_peak_bytes": acc["peak"]}
            stop = False
            if eval_every and trainer.step >= next_eval:
                t0 = time.perf_counter()
                row["eval_return"] = result.evaluate(episodes=eval_episodes)["mean_return"]
                row["eval_seconds"] = time.perf_counter() - t0
                stop = stop_at is not None and row["eval_return"] >= stop_at
                next_eval += eval_every
            rows.append(row)
            if callback:
                callback(row)
            trainer.reset_score()
            acc = dict.fromkeys(acc, 0)
            acc["loss_sum"] = acc["return_sum"] = 0.0
            next_row += every
            if stop:
                break
    return result


def masked_cartpole(max_episode_steps=500):
    """CartPole-v1 with the two velocities hidden (observation [x, 0, theta, 0]):
    a POMDP that only a policy with memory can balance."""
    gym = _gymnasium()

    class MaskVelocity(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.mask = np.array([1, 0, 1, 0], dtype=np.float32)

        def observation(self, observation):
            return (observation * self.mask).astype(np.float32)

    return MaskVelocity(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))


def _make_segtape_env_class():
    gym = _gymnasium()

    class SegtapeEnv(gym.Env):
        """One of segtape's built-in envs (recall, tmaze, dialogue, or a
        registered one) as a single-stream gymnasium.Env. Episodes restart by
        themselves inside segtape; here `terminated` is segtape's done, and
        the next reset() continues with the restarted episode."""

        metadata = {"render_modes": []}

        def __init__(self, name="tmaze", lag=8, vocab=4, corridor=10, seed=0):
            self._args = dict(name=name, lag=lag, vocab=vocab, corridor=corridor)
            self._env = _A.make_env(batch=1, seed=seed, **self._args)
            if self._env.supervised:
                raise Error(f"SegtapeEnv: env '{name}' is supervised (targets, no rewards); use an RL env such as tmaze")
            self.action_space = gym.spaces.Discrete(self._env.num_actions)
            if self._env.vocab > 0:
                self.observation_space = gym.spaces.Discrete(self._env.vocab)
            else:
                self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self._env.obs_dim,), np.float32)

        def _obs(self):
            tokens, vectors = self._env.observe()
            return int(tokens[0]) if self._env.vocab > 0 else np.asarray(vectors, dtype=np.float32)

        def reset(self, *, seed=None, options=None):
            """(observation, {}): the stream's present observation; a seed
            makes the env afresh from that seed."""
            super().reset(seed=seed)
            if seed is not None:
                self._env = _A.make_env(batch=1, seed=int(seed), **self._args)
            return self._obs(), {}

        def step(self, action):
            """(observation, reward, terminated, False, {}) after the action;
            an episode is never truncated here."""
            reward, done = self._env.step([int(action)])
            return self._obs(), float(reward[0]), bool(done[0]), False, {}

    return SegtapeEnv


def __getattr__(name):  # SegtapeEnv is made on first use: Gymnasium is optional
    if name == "SegtapeEnv":
        cls = _make_segtape_env_class()
        globals()["SegtapeEnv"] = cls
        return cls
    raise AttributeError(f"module 'segtape.gym' has no attribute '{name}'")


def register_gymnasium_envs():
    """Registers segtape/TMaze-v0 with Gymnasium (idempotent)."""
    gym = _gymnasium()
    for env_id, kwargs in (("segtape/TMaze-v0", {"name": "tmaze"}),):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="segtape.gym:SegtapeEnv", kwargs=kwargs)
