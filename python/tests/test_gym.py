"""segtape.gym: the agent's Trainer on Gymnasium envs, and segtape's tmaze as
a Gymnasium env. Small runs; the figures of longer ones are in docs/python.md."""
import json

import numpy as np
import pytest

import segtape

gymnasium = pytest.importorskip("gymnasium")
import segtape.gym as sg  # noqa: E402

sg.register_gymnasium_envs()


def test_segtape_tmaze_is_a_valid_gymnasium_env():
    from gymnasium.utils.env_checker import check_env
    env = gymnasium.make("segtape/TMaze-v0", corridor=4)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert obs in (0, 1)  # the cue


def test_tmaze_through_gymnasium_is_learned():
    """segtape's own tmaze (corridor 10), stepped through gymnasium.vector and
    the Env contract, learned by the Trainer's actor-critic."""
    res = sg.train("segtape/TMaze-v0", steps=6000, batch=16, hidden=32, gamma=0.9, lr=3e-3, seed=1,
                   success=lambda ret, truncated: ret > 0)
    assert res.rows[0]["episode_return"] < 0.5  # chance is 0
    ev = res.evaluate(episodes=100)
    assert ev["episodes"] == 100 and ev["mean_return"] >= 0.9
    assert len({r["segment_peak_bytes"] for r in res.rows}) == 1  # every segment's peak to the byte


def test_tmaze_through_gymnasium_is_learned_by_ppo():
    """The same through recurrent PPO (rollouts of 64 steps, minibatches of
    whole streams replayed from their stored states)."""
    res = sg.train("segtape/TMaze-v0", steps=4096, batch=16, hidden=32, gamma=0.9, lr=3e-3, seed=1, algo="ppo",
                   rollout=64, history="tbptt:16", success=lambda ret, truncated: ret > 0)
    assert res.rows[0]["episode_return"] < 0.5
    ev = res.evaluate(episodes=100)
    assert ev["episodes"] == 100 and ev["mean_return"] >= 0.9, ev


def test_periodic_evaluations_and_stopping_at_a_target():
    """eval_every adds a timed greedy evaluation to the rows it falls on;
    stop_at ends training at the first one that reaches the target."""
    res = sg.train("segtape/TMaze-v0", steps=512, batch=4, hidden=8, log_every=64, eval_every=128, eval_episodes=4,
                   success=lambda ret, truncated: ret > 0)
    assert res.trainer.done()
    evaluated = [r for r in res.rows if "eval_return" in r]
    assert [r["step"] for r in evaluated] == [128, 256, 384, 512]
    assert all(-1 <= r["eval_return"] <= 1 and r["eval_seconds"] > 0 for r in evaluated)
    res = sg.train("segtape/TMaze-v0", steps=512, batch=4, hidden=8, log_every=64, eval_every=128, eval_episodes=4,
                   stop_at=-1.0)  # every return is >= -1: the first evaluation stops it
    assert res.trainer.step == 128 and not res.trainer.done()
    assert "eval_return" in res.rows[-1] and len(res.rows) == 2


def test_cartpole_is_learned():
    # A2C on CartPole is unstable from seed to seed: at lr 3e-3 the greedy mean
    # after 40,000 steps ranged 85-304 over seeds 1-6 (>= 195, "solved", for two
    # of them; seed 1 passed only until the engine's rounding changed). At lr
    # 1e-3 it ranged 115-500, so the bar is "learned": over 4x a random policy (~22).
    res = sg.train("CartPole-v1", steps=40000, batch=8, hidden=64, gamma=0.99, lr=1e-3, seed=1)
    ev = res.evaluate(episodes=20)
    assert ev["mean_return"] >= 100, ev


def box_env(name, broken_at, obs=0.0, reward=1.0, dtype=np.float32):
    """A 3-float Box env, its observation `obs` and reward `reward` at step broken_at (0 and 1 otherwise)."""
    def step(self, action):
        self.t += 1
        now = self.t == broken_at
        return np.full(3, obs if now else 0.0, dtype), (reward if now else 1.0), False, False, {}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}
    return type(name, (gymnasium.Env,), {"observation_space": gymnasium.spaces.Box(-1, 1, (3,), dtype),
                                         "action_space": gymnasium.spaces.Discrete(2), "t": 0, "reset": reset, "step": step})


def test_a_broken_env_is_refused_naming_the_env_and_the_step():
    with pytest.raises(segtape.Error, match=r"env 'gym\.Broken\.\d+', step 5: .*reward"):
        sg.train(box_env("Broken", 5, reward=float("nan")), steps=64, batch=2, hidden=8)


def test_non_finite_observations_are_named_before_normalising():
    # An inf observation was normalised first and reported as -nan (and
    # spoiled the running statistics).
    with pytest.raises(segtape.Error, match=r"step 3: observe\(\) gave stream 0 the value inf at 0; observations must be finite"):
        sg.train(box_env("Inf", 3, obs=float("inf")), steps=64, batch=2, hidden=8)
    # A finite float64 value float32 cannot hold: named as the env gave it (it
    # was reported as inf, or, normalised, overflowed the variance silently).
    for norm in (True, False):
        with pytest.raises(segtape.Error, match=r"step 3: observe\(\) gave stream 0 the value 1e\+300 at 0; .*\|x\| <= 3\.4e38"):
            sg.train(box_env("Huge", 3, obs=1e300, dtype=np.float64), steps=64, batch=2, hidden=8, normalize_obs=norm)

    class Empty(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1, 1, (0,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)
    with pytest.raises(segtape.Error, match=r"observation space .* has no dimensions"):
        sg.train(Empty, steps=32)


def test_unsupported_spaces_and_algorithms_are_errors():
    with pytest.raises(segtape.Error, match="action space must be Discrete"):
        sg.train("Pendulum-v1", steps=32)
    with pytest.raises(segtape.Error, match="segtape.gym.train: algo 'sac': choose a2c, ppo, lm or series"):
        sg.train("CartPole-v1", steps=32, algo="sac")
    with pytest.raises(segtape.Error, match="minibatches 3: must divide batch 8"):
        sg.train("CartPole-v1", steps=32, algo="ppo", minibatches=3)
    with pytest.raises(segtape.Error, match="update_bias sets the GRU's update gate; history window:N has no GRU"):
        sg.train("CartPole-v1", steps=32, history="window:3", update_bias=1.0)
    with pytest.raises(segtape.Error, match="update_bias must be"):
        sg.train("CartPole-v1", steps=32, update_bias=float("inf"))
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: batch must be in \[1, 65536\]"):  # train()'s names, not the CLI's
        sg.train("CartPole-v1", steps=32, batch=0)
    res = sg.train("CartPole-v1", steps=64, batch=2, hidden=8, update_bias=3.0)  # taken, and trains
    assert res.trainer.step == 64


def test_discrete_spaces_that_do_not_start_at_zero():
    """Actions and tokens are offset by the spaces' start (the agent counts from 0)."""
    class Shifted(gymnasium.Env):
        observation_space = gymnasium.spaces.Discrete(2, start=5)
        action_space = gymnasium.spaces.Discrete(2, start=1)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.cue = int(self.np_random.integers(2))
            return 5 + self.cue, {}

        def step(self, action):
            assert action in (1, 2), action
            return 5 + self.cue, float(action - 1 == self.cue), True, False, {}

    res = sg.train(Shifted, steps=3000, batch=8, hidden=16, gamma=0.0, lr=1e-2, seed=2)
    assert res.evaluate(episodes=64)["mean_return"] >= 0.95


def test_an_env_that_raises_is_named_and_the_trainer_stays_usable():
    class Flaky(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)
        fail = False

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            if Flaky.fail:
                raise ValueError("the simulator fell over")
            return np.zeros(2, np.float32), 1.0, False, True, {}

    res = sg.train(Flaky, steps=64, batch=2, hidden=8)
    Flaky.fail = True
    with pytest.raises(segtape.Error, match=r"env 'gym\.Flaky\.\d+', step 1: step\(\) raised ValueError: the simulator fell over"):
        res.evaluate(episodes=2)
    Flaky.fail = False
    assert res.evaluate(episodes=2)["episodes"] == 2


def test_evaluate_runs_at_most_max_steps():
    """evaluate's step count starts at 256 and doubles while a stream is short of
    its episodes, never past max_steps; counts below 1 are refused by name."""
    res = sg.train("segtape/TMaze-v0", steps=64, batch=2, hidden=8)
    assert res.evaluate(episodes=1000, max_steps=10)["steps"] == 10
    assert res.evaluate(episodes=1000, max_steps=300)["steps"] == 300
    for bad in ({"max_steps": 0}, {"episodes": 0}, {"max_steps": 2.5}, {"episodes": True}):
        with pytest.raises(segtape.Error, match=r"TrainResult\.evaluate: (max_steps|episodes) must be an int >= 1"):
            res.evaluate(**bad)


def test_a_segment_whose_env_raises_leaves_the_trainer_where_it_began():
    """run_segment that throws: step, state and parameters as before it; the trainer runs and evaluates again."""
    A = segtape._segtape.agent

    class Env:
        fail = False

        def __init__(self, batch, seed):
            self.batch, self.steps = batch, 0

        def observe(self):
            return np.zeros((self.batch, 3), np.float32)

        def step(self, actions):
            self.steps += 1
            if Env.fail and self.steps % 4 == 2:  # the segment's second step: its first has counted
                raise ValueError("the simulator fell over")
            return np.ones(self.batch, np.float32), np.zeros(self.batch, np.uint8), np.zeros(self.batch, np.uint8)

    name = "test.raises_in_a_segment"
    sg._factories[name] = Env
    A.register_python_env(name, 3, 0, 2)
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps, c.history = name, 2, 4, 4, 64, "tbptt:4"
    t = A.Trainer(c)
    t.run_segment()
    before = [p.copy() for p in t.parameters()]
    Env.fail = True
    for _ in range(2):  # the second failure finds the trainer as the first left it
        with pytest.raises(Exception, match="the simulator fell over"):
            t.run_segment()
        assert t.step == 4  # (one step of the segment had counted when the env raised)
    assert all(np.array_equal(a, b) for a, b in zip(before, t.parameters()))
    Env.fail = False
    assert t.run_segment()["steps"] == 4  # (the expired carried state of before failed here)
    assert t.step == 8
    t.evaluate(8, 1)
    while not t.done():
        t.run_segment()
    assert t.step == 64

    # A callback returning the wrong type is named, with what was expected (it was a bare std::bad_cast).
    Env.observe = lambda self: None
    with pytest.raises(segtape.Error, match=r"env 'test\.raises_in_a_segment': observe\(\) returned NoneType, expected a float32 array"):
        t.evaluate(8, 1)


def test_non_finite_coefficients_are_refused():
    with pytest.raises(segtape.Error, match="entropy"):
        sg.train("CartPole-v1", steps=32, entropy=float("inf"))


class _Counting(gymnasium.Env):
    """An env that shows token 0 at its reset and counts its steps in t."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}


class _Pay(_Counting):
    """Token 0 and reward 1 at every step; each episode cut after 3 steps by
    a time limit (truncated), or with `terminates` ended by the task
    (terminated; with `both`, both flags set)."""
    observation_space = gymnasium.spaces.Discrete(2)
    action_space = gymnasium.spaces.Discrete(2)
    terminates, both = False, False

    def step(self, action):
        self.t += 1
        end = self.t == 3
        # the observation the episode is cut at: 1 (the reset shows 0)
        return int(end), 1.0, end and (self.terminates or self.both), end and not self.terminates, {}


def test_truncated_episodes_reach_the_trainer_with_their_final_observation():
    """A Gymnasium episode cut by its time limit (truncated, not terminated)
    is reported through segtape.gym's env to the trainer's Env as truncated,
    with the observation it was cut at (the trainer bootstraps from its
    value: tests/truncation_test.cpp); one the task ended (terminated, or
    both flags) is not."""
    for kind, want in (("truncated", [1, 1]), ("terminated", [0, 0]), ("both", [0, 0])):
        cls = type("Pay_" + kind, (_Pay,), {"terminates": kind == "terminated", "both": kind == "both"})
        res = sg.train(cls, steps=8, batch=2, hidden=8, gamma=0.5)  # (trains: the bootstrap runs through the contract checks)
        assert res.trainer.step == 8
        env = sg._A.make_env(res.name, 2, 1)
        for t in range(1, 7):
            env.observe()
            _, done = env.step([0, 1])
            truncated, tokens, _ = env.truncations()
            end = t % 3 == 0
            assert done == [int(end)] * 2, (kind, t)
            assert truncated == (want if end else [0, 0]), (kind, t)
            assert list(tokens) == ([1, 1] if end and want[0] else [0, 0]), (kind, t)


def test_a_critic_of_its_own():
    """critic="separate": the value head reads a GRU of its own (its
    parameters beside the policy's GRU's), under A2C and PPO; another word is
    refused naming the argument."""
    shared = sg.train("CartPole-v1", steps=64, batch=2, hidden=8, embed=4)
    for algo in ("a2c", "ppo"):
        res = sg.train("CartPole-v1", steps=64, batch=2, hidden=8, embed=4, critic="separate", algo=algo, rollout=16,
                       minibatches=1)
        assert res.trainer.step == 64
        # the critic's GRU: weight_ih [24, 4], weight_hh [24, 8] and two biases of 24 more than the shared core's
        assert sum(p.size for p in res.trainer.parameters()) == sum(p.size for p in shared.trainer.parameters()) + 24 * 12 + 48
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: critic 'own': choose shared or separate"):
        sg.train("CartPole-v1", steps=32, critic="own")


def test_multidiscrete_actions_and_flattened_observations():
    """A Tuple observation is one-hot through Gymnasium's flattening, and a
    MultiDiscrete action one Discrete over its joint actions (starts
    honoured): a contextual bandit whose reward needs both parts of the
    action right for a cue shown in both parts of the observation is learned."""
    class Pairs(gymnasium.Env):
        observation_space = gymnasium.spaces.Tuple((gymnasium.spaces.Discrete(2), gymnasium.spaces.Discrete(3, start=4)))
        action_space = gymnasium.spaces.MultiDiscrete([2, 3], start=[1, -1])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.cue = (int(self.np_random.integers(2)), int(self.np_random.integers(3)))
            return (self.cue[0], 4 + self.cue[1]), {}

        def step(self, action):
            assert action.shape == (2,) and action[0] in (1, 2) and action[1] in (-1, 0, 1), action
            right = action[0] - 1 == self.cue[0] and action[1] + 1 == self.cue[1]
            return (self.cue[0], 4 + self.cue[1]), float(right), True, False, {}

    res = sg.train(Pairs, steps=3000, batch=8, hidden=16, gamma=0.0, lr=1e-2, seed=3)
    env = sg._A.make_env(res.name, 1, 1)
    assert (env.num_actions, env.obs_dim) == (6, 5)
    wrapped = sg._spaces(Pairs, "Pairs")[-1]()  # joint action i: np.unravel_index(i, nvec) + start, in C order
    while not isinstance(wrapped, gymnasium.ActionWrapper):
        wrapped = wrapped.env
    assert [list(wrapped.action(i)) for i in range(6)] == [[1, -1], [1, 0], [1, 1], [2, -1], [2, 0], [2, 1]]
    assert res.evaluate(episodes=64)["mean_return"] >= 0.95


def test_spaces_that_cannot_be_taken_are_named():
    class Huge(gymnasium.Env):
        observation_space = gymnasium.spaces.Discrete(2)
        action_space = gymnasium.spaces.MultiDiscrete([300, 300])
    with pytest.raises(segtape.Error, match=r"env 'Huge': the action space MultiDiscrete\(\[300 300\]\) has 90000 joint "
                                            r"actions; segtape.gym takes a 1-D MultiDiscrete of at most 65536"):
        sg.train(Huge, steps=8)

    class Lists(gymnasium.Env):
        observation_space = gymnasium.spaces.Sequence(gymnasium.spaces.Discrete(2))
        action_space = gymnasium.spaces.Discrete(2)
    with pytest.raises(segtape.Error, match=r"env 'Lists': the observation space must be Discrete, or one Gymnasium "
                                            r"flattens to a vector .*, got Sequence\("):
        sg.train(Lists, steps=8)


popgym = pytest.importorskip("popgym")  # (installed by tests/setup.sh beside gymnasium)


def test_every_popgym_family_runs_or_is_refused_naming_its_space():
    """POPGym 1.0.7's envs (Easy of each family) through segtape.gym: each
    trains a few hundred transitions of PPO and evaluates greedily, or (the
    pendulums' continuous actions) is refused naming the space."""
    from popgym.envs import ALL
    ran = []
    for cls, info in ALL.items():
        if not cls.__name__.endswith("Easy"):
            continue
        if "Pendulum" in cls.__name__:
            with pytest.raises(segtape.Error, match=rf"env '{info['id']}': the action space must be Discrete or "
                                                    r"MultiDiscrete, got Box\(-2.0, 2.0, \(1,\), float32\)"):
                sg.train(info["id"], steps=8)
            continue
        res = sg.train(info["id"], steps=64, batch=4, hidden=16, algo="ppo", rollout=16, minibatches=2, epochs=2)
        assert res.trainer.step == 64, info["id"]
        ev = res.evaluate(episodes=4)
        assert ev["episodes"] == 4 and np.isfinite(ev["mean_return"]), (info["id"], ev)
        ran.append(cls.__name__)
    assert len(ran) == 12, ran  # 14 families, two of them pendulums


def test_the_clip_schedule_and_hidden_layers_before_the_heads():
    """clip_schedule and head_hidden reach the Trainer (RL Zoo's tuned
    entry's lin_ clip range and net_arch pi=[N], vf=[N]); bad values are
    refused naming train()'s arguments."""
    plain = sg.train("CartPole-v1", steps=64, batch=2, hidden=8, embed=4, algo="ppo", rollout=16, minibatches=1)
    res = sg.train("CartPole-v1", steps=64, batch=2, hidden=8, embed=4, algo="ppo", rollout=16, minibatches=1,
                   clip_schedule="linear", head_hidden=5)
    assert res.trainer.step == 64
    # pi [5, 8] + 5 and vf [5, 8] + 5 added; the heads read 5 units where they read 8: 2 actions and 1 value, weights only
    assert (sum(p.size for p in res.trainer.parameters()) - sum(p.size for p in plain.trainer.parameters())
            == 2 * (5 * 8 + 5) - 3 * (8 - 5))
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: clip_schedule 'cosine': choose linear or constant"):
        sg.train("CartPole-v1", steps=32, algo="ppo", clip_schedule="cosine")
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: head_hidden must be in \[0, 16384\]"):
        sg.train("CartPole-v1", steps=32, head_hidden=-1)


def test_adam_eps_reaches_the_trainer(tmp_path):
    """adam_eps is Adam's eps (SB3's PPO uses 1e-5): kept in the run's
    checkpoint, and it changes the run; a bad value is refused naming
    train()'s argument."""
    kw = dict(steps=64, batch=2, hidden=8, embed=4, algo="ppo", rollout=16, minibatches=1)
    plain, eps = sg.train("CartPole-v1", **kw), sg.train("CartPole-v1", adam_eps=0.1, **kw)
    assert [p.tolist() for p in plain.trainer.parameters()] != [p.tolist() for p in eps.trainer.parameters()]
    eps.trainer.save(str(tmp_path / "ck.safetensors"))
    raw = (tmp_path / "ck.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert float(header["__metadata__"]["adam_eps"]) == 0.1
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: adam_eps must be in \(0, 1\]"):
        sg.train("CartPole-v1", steps=32, adam_eps=-1)


class _Huge(_Counting):
    """Token 0; reward 1 at every step, or 3e38 (finite in float32: the env
    boundary takes it, and two of them overflow a return) at the steps of
    each stream in [lo, hi) while `on`."""
    observation_space = gymnasium.spaces.Discrete(2)
    action_space = gymnasium.spaces.Discrete(2)
    on, lo, hi = True, 0, 10**9

    def step(self, action):
        self.t += 1
        huge = self.on and self.lo <= self.t < self.hi
        return 0, 3e38 if huge else 1.0, False, False, {}


def test_returns_that_overflow_stop_the_run_and_keep_its_checkpoint(tmp_path):
    """A Python env paying 3e38: the update over it raises NonFiniteError
    naming the update, its steps and the first parameter whose gradient is
    not finite; nothing is updated, and the checkpoint written before it is
    as it was and loads."""
    env = type("Huge_stop", (_Huge,), {"on": False})
    res = sg.train(env, steps=16, batch=2, hidden=8, embed=4, history="tbptt:8")
    c = sg._A.TrainConfig()
    c.env, c.history, c.steps, c.batch, c.hidden, c.embed, c.gamma = res.name, "tbptt:8", 64, 2, 8, 4, 0.99
    t = sg._A.Trainer(c)
    t.run_segment()
    ck = tmp_path / "ck.safetensors"
    t.save(str(ck))
    saved = ck.read_bytes()
    before = [p.copy() for p in t.parameters()]
    env.on = True
    with pytest.raises(segtape.NonFiniteError, match=r"^update 2, in the segment of steps 8 to 16: the gradient's norm is "
                       r"(NaN|inf) \(the first parameter whose gradient is not finite is [a-z_.]+ \[[0-9,]+\]\)"):
        t.run_segment()
    assert all(np.array_equal(a, b) for a, b in zip(before, t.parameters()))
    assert ck.read_bytes() == saved
    with pytest.raises(segtape.NonFiniteError, match=r"^run_segment: this trainer stopped at the non-finite update 2 "
                       r"\(steps 8 to 16\), part-way through its segment .*load a checkpoint first$"):
        t.run_segment()  # (its env moved on: it goes on from a checkpoint only)
    env.on = False
    t.load(str(ck))
    assert t.step == 8
    back = sg._A.Trainer(c)
    back.load(str(ck))
    assert all(np.array_equal(a, b) for a, b in zip(before, back.parameters()))
    # through segtape.gym.train: the same error, its arguments' names
    with pytest.raises(segtape.NonFiniteError, match=r"nonfinite skip skips such updates"):
        sg.train(type("Huge_all", (_Huge,), {}), steps=64, batch=2, hidden=8, embed=4)


def test_the_skip_policy_completes_the_run_and_counts_its_skipped_updates():
    """nonfinite="skip": the updates over the steps paid 3e38 are left out and
    counted, as PyTorch's GradScaler skips a step; the run completes with
    finite parameters. After max_skips in a row it raises."""
    env = type("Huge_window", (_Huge,), {"lo": 40, "hi": 48})
    res = sg.train(env, steps=128, batch=2, hidden=8, embed=4, history="tbptt:32", nonfinite="skip")
    assert res.trainer.step == 128
    assert res.trainer.skipped_updates == 1  # (the segment of steps 32 to 64)
    assert all(np.isfinite(p).all() for p in res.trainer.parameters())
    with pytest.raises(segtape.NonFiniteError, match=r"2 updates in a row had a gradient that is not finite \(max_skips 2\)"):
        sg.train(type("Huge_all2", (_Huge,), {}), steps=128, batch=2, hidden=8, embed=4, nonfinite="skip", max_skips=2)
    with pytest.raises(segtape.Error, match=r"segtape.gym.train: nonfinite 'ignore': choose stop or skip"):
        sg.train("CartPole-v1", steps=32, nonfinite="ignore")


class _Ramp(_Counting):
    """Token 0; reward t at the t-th step of an episode, which ends (by the
    task) after 3 steps."""
    observation_space = gymnasium.spaces.Discrete(1)
    action_space = gymnasium.spaces.Discrete(2)

    def step(self, action):
        self.t += 1
        return 0, float(self.t), self.t == 3, False, {}


def test_reward_normalisation_is_vecnormalizes():
    """normalize_reward: the rewards the trainer learns from are VecNormalize's
    (norm_reward=True) computed by hand: the discounted return of each stream
    updates a running variance (starting at 1 with count 1e-4), the reward is
    divided by sqrt(var + 1e-8) and clipped to [-10, 10], and the return is
    zeroed where an episode ends. The rows report the env's own returns
    (1 + 2 + 3 = 6); an evaluation's streams leave the statistics alone; a
    reward float32 cannot hold is refused before the normalisation."""
    gamma, B = 0.9, 2
    rn = sg._RewardNorm(gamma)
    streams = sg._Streams("ramp", _Ramp, B, 1, lambda r, t: t, True, reward_norm=rn)
    mean, var, count, ret = 0.0, 1.0, 1e-4, np.zeros(B)
    for t in range(1, 10):
        reward = np.full(B, float((t - 1) % 3 + 1))
        ret = ret * gamma + reward
        m, v, n = ret.mean(), ret.var(), B
        delta, total = m - mean, count + n
        mean, var = mean + delta * n / total, (var * count + v * n + delta**2 * count * n / total) / total
        count = total
        want = np.clip(reward / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)
        got, done, _ = streams.step([0, 1])
        np.testing.assert_allclose(got, want, rtol=1e-6)
        ret[done.astype(bool)] = 0.0
    res = sg.train(_Ramp, steps=48, batch=2, hidden=8, embed=4, normalize_reward=True, log_every=48)
    assert res.rows[-1]["episode_return"] == 6.0
    reader = sg._Streams("ramp", _Ramp, B, 2, lambda r, t: t, True, reward_norm=rn)
    reader.learning = False  # (as evaluate() makes its streams)
    seen = (rn.stats.count, rn.stats.var.copy())
    got, _, _ = reader.step([0, 0])
    assert (rn.stats.count, rn.stats.var.tolist()) == (seen[0], seen[1].tolist())
    np.testing.assert_allclose(got, np.float32(1 / np.sqrt(seen[1][0] + 1e-8)), rtol=1e-6)
    with pytest.raises(segtape.Error, match=r"step\(\) gave the reward inf to stream 0; rewards must be finite float32"):
        class Inf(_Ramp):
            def step(self, action):
                return 0, float("inf"), False, False, {}
        sg.train(Inf, steps=8, batch=2, hidden=8, embed=4, normalize_reward=True)
