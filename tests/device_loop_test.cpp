// The agent loop on the device (agent/device/device_loop.h) against the host
// loop, on a tape of Device::cuda(): the host-emulated device in every build
// (device_loop_test, label `emulated`), a GPU where there is one
// (cuda_device_loop_test, label `cuda`; it skips without one).
//
//  - each device env's streams equal its host twin's (make_env("device-" +
//    name)) step for step: observations, rewards, done flags, the state rows
//    and the score, under random actions;
//  - a device rollout (observe, the policy's step, sampled actions, env
//    steps, resets, the values, the look-ahead value, GAE) equals the host
//    loop's by the host pieces (the twin env, the policy on a CPU tape, the
//    sampler and GAE's rules): bit for bit on the emulated device, whose
//    ops are the CPU's; on a GPU the integers exactly and the reals to 1e-5;
//  - the rollout issues the same calls every iteration and reads nothing
//    on the host: under graph replay its segments are captured and replayed
//    (a changed call or a host read in a graph segment would throw), with
//    the same results as without.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <cmath>
#include <string>
#include <vector>

#include "../agent/device/device_loop.h"
#include "../agent/device/rules.h"
#include "../agent/algo/rollout_buffer.h"
#include "gpu.h"
#include "agent_util.h"
#include "alloc_hook.h"
#include "segtape/agent/env.h"
#include "segtape/device_call.h"
#include "segtape/agent/trainer.h"
#include "segtape/agent/policy.h"
#include "segtape/nn/random.h"
#include "segtape/ops.h"
#include "util.h"

using namespace segtape;
using namespace segtape::agent;

namespace {

using test::small_device_pools;

struct Case {
  std::string name;
  EnvOptions o;
};
std::vector<Case> cases() {
  EnvOptions dense, sparse, maze, talk;
  dense.lag = 3, dense.vocab = 4;
  sparse.lag = 4, sparse.vocab = 3, sparse.sparse = true;
  maze.corridor = 3;
  talk.turns = 4, talk.cities = 3, talk.embed_dim = 5;
  return {{"recall", dense}, {"recall", sparse}, {"tmaze", maze}, {"dialogue", talk}};
}

// Reals equal bit for bit on the emulated device (the CPU's ops), within tol on a GPU.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (test::kEmulated) ASSERT_EQ(a[i], b[i]) << what << " [" << i << "]";
    else ASSERT_NEAR(a[i], b[i], 1e-5 * std::max(1.0f, std::abs(b[i]))) << what << " [" << i << "]";
  }
}

TEST(DeviceLoop, DeviceEnvsEqualTheirHostTwinsStepForStep) {
  REQUIRE_GPU();
  constexpr int64_t B = 5, kSteps = 60;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name + (c.o.sparse ? " sparse" : ""));
    Tape tape(Device::cuda(), small_device_pools());
    device::DeviceEnv denv(tape, c.name, B, 17, c.o);
    const std::unique_ptr<Env> twin = make_env("device-" + c.name, B, 17, c.o);
    ASSERT_EQ(denv.spec().vocab, twin->spec().vocab);
    const int64_t D = twin->spec().obs_dim;  // (a vector env's; 0: tokens)
    const Tensor tokens = D ? tape.persistent({1, B, D}) : tape.persistent({1, B}, DType::I64);
    const Tensor cursor = tape.persistent({1}, DType::I64);
    const Tensor rewards = tape.persistent({1, B}), done = tape.persistent({1, B}), keep = tape.persistent({B});
    const Tensor stats = tape.persistent({B, 3}, DType::F64);
    nn::Rng pick(5);
    std::vector<int64_t> tok(B), want_tok(B), y(B), a(B);
    std::vector<float> r(B);
    std::vector<uint8_t> d(B);
    int64_t rewarded = 0, ended = 0;
    for (int64_t t = 0; t < kSteps; ++t) {
      Segment seg = tape.segment();
      const Tensor obs = D ? tape.empty({B, D}) : tape.empty({B}, DType::I64);
      denv.observe(obs, tokens, cursor);
      if (D) {
        std::vector<float> want(size_t(B * D));
        twin->observe({}, want);
        expect_close(obs.to_host<float>(), want, "observation at step " + std::to_string(t));
        expect_close(tokens.to_host<float>(), want, "stored observation at step " + std::to_string(t));
      } else {
        obs.to_host(std::span<int64_t>(tok));
        twin->observe(want_tok, {});
        ASSERT_EQ(tok, want_tok) << "step " << t;
        ASSERT_EQ(tokens.to_host<int64_t>(), want_tok) << "step " << t;
      }
      twin->targets(y);
      for (int64_t b = 0; b < B; ++b) a[size_t(b)] = int64_t(pick.next_u64() % uint64_t(twin->spec().num_actions));
      denv.step(tape.from(a, {B}), cursor, rewards, done, keep, stats);
      twin->step(a, r, d);
      const std::vector<float> got_r = rewards.to_host<float>(), got_d = done.to_host<float>(), got_k = keep.to_host<float>();
      for (int64_t b = 0; b < B; ++b) {
        const auto i = size_t(b);
        // the device env's reward is PPO's for a supervised env: 1 for the target
        const float want = twin->spec().supervised ? (y[i] != kNoTarget && a[i] == y[i] ? 1.0f : 0.0f) : r[i];
        ASSERT_EQ(got_r[i], want) << "step " << t << " stream " << b;
        ASSERT_EQ(got_d[i], float(d[i])) << "step " << t << " stream " << b;
        ASSERT_EQ(got_k[i], d[i] ? 0.0f : 1.0f);
        rewarded += want != 0, ended += d[i];
      }
      const std::vector<int64_t> saved = twin->save_state();
      ASSERT_EQ(denv.state().to_host<int64_t>(), std::vector<int64_t>(saved.end() - B * denv.state().dim(1), saved.end())) << "step " << t;
    }
    EXPECT_EQ(denv.score_counts(), twin->score_counts());
    EXPECT_GT(rewarded, 0);  // (the comparisons above saw rewards, and tmaze's episodes end)
    if (c.name != "recall") {
      EXPECT_GT(ended, 0);
    }
  }
}

// The env's start with its streams out of step (tmaze: stream b at
// position b mod (corridor + 1); dialogue: at turn b mod turns), so that episodes end at different steps
// and each stream's reset is its own.
std::vector<int64_t> staggered(const Env& env) {
  std::vector<int64_t> s = env.save_state();
  if (env.spec().name == "device-tmaze")
    for (size_t b = 0; 4 + 5 * b < s.size(); ++b) s[4 + 5 * b + 1] = int64_t(b) % 4;  // (the cases' corridor: 3)
  if (env.spec().name == "device-dialogue")
    for (size_t b = 0; 4 + 7 * b < s.size(); ++b) s[4 + 7 * b] = int64_t(b) % 4;  // the turn (the cases' turns: 4)
  return s;
}

// The twins keep their envs' rules (the device env equals its twin, so
// this is what checks the device's rules too): recall's targets are the
// tokens shown lag steps before (sparse: a token only every lag steps);
// tmaze's episodes are the cue, the corridor and the junction, +1 for the
// cued arm; dialogue's episodes last `turns` turns, each message near its
// table row, a request's target its tool for the last city named.
TEST(DeviceLoop, TwinsKeepTheirEnvsRules) {
  constexpr int64_t B = 6, kSteps = 400;
  nn::Rng pick(9);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name + (c.o.sparse ? " sparse" : ""));
    const std::unique_ptr<Env> env = make_env("device-" + c.name, B, 23, c.o);
    const int64_t D = env->spec().obs_dim, A = env->spec().num_actions;
    std::vector<int64_t> tok(B), y(B), a(B);
    std::vector<float> vec(size_t(B * D)), r(B);
    std::vector<uint8_t> d(B);
    std::vector<std::vector<int64_t>> seen;                    // recall: tokens by step
    std::vector<int64_t> pos(B, 0), cue(B, -1), city(B, -1);  // tmaze: steps into the episode, its cue; dialogue: turn, city
    const std::vector<float> table = device::dialogue_table(c.o.cities, c.o.embed_dim);
    int64_t requests = 0, episodes = 0;
    for (int64_t t = 0; t < kSteps; ++t) {
      env->observe(tok, vec);
      env->targets(y);
      seen.push_back(tok);
      for (int64_t b = 0; b < B; ++b) a[size_t(b)] = int64_t(pick.next_u64() % uint64_t(A));
      env->step(a, r, d);
      for (int64_t b = 0; b < B; ++b) {
        const auto i = size_t(b);
        if (c.name == "recall") {
          const int64_t L = c.o.lag, V = c.o.vocab;
          const bool shown = !c.o.sparse || t % L == 0;
          ASSERT_EQ(tok[i] == V, !shown) << "step " << t;  // (the blank token between shown ones)
          ASSERT_EQ(y[i], t >= L && shown ? seen[size_t(t - L)][i] : kNoTarget) << "step " << t;
        } else if (c.name == "tmaze") {
          const int64_t N = c.o.corridor;
          if (pos[i] == 0) {
            ASSERT_TRUE(tok[i] == 0 || tok[i] == 1);
            cue[i] = tok[i];
          } else {
            ASSERT_EQ(tok[i], pos[i] < N ? 2 : 3);
          }
          ASSERT_EQ(d[i], pos[i] == N);
          ASSERT_EQ(r[i], pos[i] == N ? (a[i] == cue[i] ? 1.0f : -1.0f) : 0.0f);
          pos[i] = d[i] ? 0 : pos[i] + 1, episodes += d[i];
        } else {  // dialogue: the message is the table row nearest the observation
          const int64_t C = c.o.cities, M = int64_t(table.size()) / D;
          int64_t m = -1;
          for (int64_t k = 0; k < M && m < 0; ++k) {
            bool near = true;
            for (int64_t j = 0; j < D; ++j)
              near = near && std::abs(vec[size_t(b * D + j)] - table[size_t(k * D + j)]) <= 0.025 / std::sqrt(double(D)) + 1e-6;
            if (near) m = k;
          }
          ASSERT_GE(m, 0) << "step " << t << ": the observation is no message of the table";
          if (pos[i] == 0) {
            ASSERT_LT(m, C) << "a conversation starts by naming a city";
          }
          if (m < C) city[i] = m;
          const int64_t request = m - (C + 6);
          ASSERT_EQ(y[i], request >= 0 ? 1 + request * C + city[i] : 0) << "step " << t;
          requests += request >= 0;
          ASSERT_EQ(d[i], pos[i] == c.o.turns - 1);
          pos[i] = d[i] ? 0 : pos[i] + 1, episodes += d[i];
        }
      }
    }
    if (c.name != "recall") {
      EXPECT_GT(episodes, 0);
    }
    if (c.name == "dialogue") {  // about 35 % of the turns after the first are requests
      const double share = double(requests) / double(B * kSteps);
      EXPECT_GT(share, 0.15);
      EXPECT_LT(share, 0.45);
    }
  }
}

// The host loop by the host pieces, as agent/algo/ppo.cpp's rollout runs it
// (its sampler's draws from the device's counters): T steps over the twin env
// on a CPU tape, the buffers [T, B], GAE by PPO's host rollout buffer.
struct HostRollout {
  std::vector<int64_t> tokens, actions;
  std::vector<float> vectors;
  std::vector<float> logp, values, rewards, done, advantages, returns, bootstrap, h;
  std::vector<double> stats;
};
HostRollout host_rollout(const Case& c, int64_t B, int64_t T, const PolicyShape& shape, uint64_t sample_seed, double gamma, double lambda) {
  Tape tape;
  const std::unique_ptr<Env> env = make_env("device-" + c.name, B, 17, c.o);
  env->load_state(staggered(*env));
  nn::Rng init(3);
  const Policy policy(tape, init, env->spec(), shape);
  const int64_t A = env->spec().num_actions, H = shape.hidden, D = env->spec().obs_dim;
  HostRollout out;
  const auto TB = size_t(T * B);
  out.tokens.assign(D ? 0 : TB, 0), out.actions.assign(TB, 0), out.vectors.assign(TB * size_t(D), 0.0f);
  for (auto* v : {&out.logp, &out.values, &out.rewards, &out.done, &out.advantages, &out.returns}) v->assign(TB, 0.0f);
  out.bootstrap.assign(size_t(B), 0.0f), out.stats.assign(size_t(B * 3), 0.0);
  const auto nB = static_cast<size_t>(B);
  std::vector<float> h(nB * size_t(H), 0.0f), lp(nB * size_t(A)), v(nB), r(nB);
  std::vector<int64_t> tok(nB), y(nB), a(nB), counter(nB, 0);
  std::vector<uint8_t> d(nB);
  std::vector<float> vec(size_t(B * D));
  const auto observation = [&] {  // the twin's observation now, on the tape
    env->observe(tok, vec);
    return D ? tape.from(vec, {B, D}) : tape.from(tok, {B});
  };
  for (int64_t t = 0; t < T; ++t) {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    const Tensor x = observation();
    env->targets(y);
    std::copy(vec.begin(), vec.end(), out.vectors.begin() + t * B * D);
    const Tensor state = policy.recur(policy.encode(x), tape.from(h, {B, H}));
    const Tensor f = policy.output(state);
    log_softmax(policy.logits(f)).to_host(std::span<float>(lp));
    policy.value(f).to_host(std::span<float>(v));
    for (int64_t b = 0; b < B; ++b) {
      const auto i = size_t(b), k = size_t(t * B + b);
      a[i] = rules::sample_row(lp.data() + b * A, A, rules::draw(sample_seed, b, counter[i]++));
      if (!D) out.tokens[k] = tok[i];
      out.actions[k] = a[i], out.logp[k] = lp[size_t(b * A + a[i])], out.values[k] = v[i];
    }
    env->step(a, r, d);
    std::vector<float> s = state.to_host<float>();
    for (int64_t b = 0; b < B; ++b) {
      const auto i = size_t(b), k = size_t(t * B + b);
      if (env->spec().supervised) r[i] += y[i] != kNoTarget && a[i] == y[i] ? 1.0f : 0.0f;
      out.rewards[k] = r[i], out.done[k] = d[i] ? 1.0f : 0.0f;
      const float g = float(out.stats[3 * i]) + r[i];
      if (d[i]) out.stats[3 * i + 1] += double(g), out.stats[3 * i + 2] += 1, out.stats[3 * i] = 0;
      else out.stats[3 * i] = double(g);
      for (int64_t j = 0; j < H; ++j) s[size_t(b * H + j)] = s[size_t(b * H + j)] * (d[i] ? 0.0f : 1.0f);
    }
    h = s;
    tape.next_step();
  }
  {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    policy.value(policy.output(policy.recur(policy.encode(observation()), tape.from(h, {B, H})))).to_host(std::span<float>(out.bootstrap));
  }
  // GAE by the host PPO's own buffer (agent/algo/rollout_buffer.h)
  TrainConfig config;
  config.rollout = T, config.batch = B, config.hidden = H;
  RolloutBuffer buf(config, env->spec());
  buf.rewards = out.rewards, buf.values = out.values, buf.bootstrap = out.bootstrap;
  std::transform(out.done.begin(), out.done.end(), buf.done.begin(), [](float x) { return uint8_t(x != 0); });
  buf.compute_advantages(T, gamma, lambda);
  out.advantages = buf.advantages, out.returns = buf.returns;
  out.h = h;
  return out;
}

void expect_rollout(device::DeviceRollout& dr, const Tensor& h_home, const HostRollout& want) {
  if (dr.D) expect_close(dr.vectors.to_host<float>(), want.vectors, "vectors");
  else EXPECT_EQ(dr.tokens.to_host<int64_t>(), want.tokens);
  EXPECT_EQ(dr.actions.to_host<int64_t>(), want.actions);
  expect_close(dr.logp.to_host<float>(), want.logp, "logp");
  expect_close(dr.values.to_host<float>(), want.values, "values");
  expect_close(dr.rewards.to_host<float>(), want.rewards, "rewards");
  expect_close(dr.done.to_host<float>(), want.done, "done");
  expect_close(dr.bootstrap.to_host<float>(), want.bootstrap, "bootstrap");
  expect_close(dr.advantages_.to_host<float>(), want.advantages, "advantages");
  expect_close(dr.returns.to_host<float>(), want.returns, "returns");
  expect_close(h_home.to_host<float>(), want.h, "state after the rollout");
  const std::vector<double> stats = dr.stats.to_host<double>();
  for (size_t i = 0; i < stats.size(); ++i) EXPECT_NEAR(stats[i], want.stats[i], test::kEmulated ? 0.0 : 1e-4) << "stats " << i;
}

TEST(DeviceLoop, RolloutEqualsTheHostLoop) {
  REQUIRE_GPU();
  constexpr int64_t B = 6, T = 12, K = 4;
  const PolicyShape shape{6, 10, 0, true};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name + (c.o.sparse ? " sparse" : ""));
    const HostRollout want = host_rollout(c, B, T, shape, 99, 0.9, 0.8);
    Tape tape(Device::cuda(), small_device_pools());
    device::DeviceEnv denv(tape, c.name, B, 17, c.o);
    const std::vector<int64_t> start = staggered(*make_env("device-" + c.name, B, 17, c.o));
    denv.load_rows(std::span<const int64_t>(start).subspan(4));
    nn::Rng init(3);
    const Policy policy(tape, init, denv.spec(), shape);
    device::DeviceRollout dr(tape, policy, denv, T, K, 99);
    const Tensor h_home = tape.persistent({B, shape.hidden});
    dr.run(h_home);
    dr.advantages(0.9, 0.8);
    expect_rollout(dr, h_home, want);
    // the rollout is not vacuous: actions of both kinds, rewards, and (tmaze) ended episodes
    const std::vector<int64_t> acts = dr.actions.to_host<int64_t>();
    EXPECT_NE(std::count(acts.begin(), acts.end(), acts[0]), int64_t(acts.size()));
    const std::vector<float> rw = dr.rewards.to_host<float>(), dn = dr.done.to_host<float>();
    EXPECT_GT(std::count_if(rw.begin(), rw.end(), [](float x) { return x != 0; }), 0);
    if (c.name != "recall") {
      EXPECT_GT(std::count(dn.begin(), dn.end(), 1.0f), 0);
    }
  }
}

TEST(DeviceLoop, RolloutReplaysAsCudaGraphsWithTheSameResults) {
  REQUIRE_GPU();
  constexpr int64_t B = 4, T = 8, K = 4, kIterations = 3;
  const PolicyShape shape{6, 10, 0, true};
  const Case c = cases()[2];
  std::vector<std::vector<float>> runs[2];
  for (const bool graph : {false, true}) {
    TapeOptions o = small_device_pools();
    o.graph_replay = graph;
    Tape tape(Device::cuda(), o);
    device::DeviceEnv denv(tape, c.name, B, 17, c.o);
    nn::Rng init(3);
    const Policy policy(tape, init, denv.spec(), shape);
    device::DeviceRollout dr(tape, policy, denv, T, K, 99);
    const Tensor h_home = tape.persistent({B, shape.hidden});
    for (int64_t i = 0; i < kIterations; ++i) {
      dr.run(h_home);
      dr.advantages(0.9, 0.8);
      runs[graph].push_back(dr.advantages_.to_host<float>());
      runs[graph].push_back(dr.logp.to_host<float>());
    }
    if (graph) {  // 6 segments: one warm-up, two captured, three replayed
      EXPECT_EQ(tape.stats().graph_captures, 2u);
      EXPECT_EQ(tape.stats().graph_replays, 3u);
    }
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) expect_close(runs[1][i], runs[0][i], "iteration " + std::to_string(i / 2));
  EXPECT_NE(runs[0][0], runs[0][2]);  // (the iterations differ: the env and the state move on)
}

// A PPO run with --device-loop on is the host loop's run: the same
// iterations' figures and the same parameters after each; its last
// rollout, shorter than --rollout, takes the host loop. On Device::cuda()
// the rollouts' segments are CUDA graphs, the rest of the run eager. On a CPU tape and
// on Device::cuda() (the emulated device: bit for bit; a GPU: the first
// iteration's loss within 1e-3, its device sampler's exp and GAE being nvcc's).
// The update's terms run on the device as the host's (agent/device/rules.h):
// also with the window's recurrence as one gru_sequence (the update's
// window at once), a value clip, and a learning rate at which the
// surrogate's clip bounds some rows (a clip fraction above 0).
TEST(DeviceLoop, PpoWithTheDeviceLoopIsTheHostLoopsRun) {
  REQUIRE_GPU();
  const bool exact = test::kEmulated;
  for (const char* env : {"device-tmaze", "device-recall", "device-dialogue"})
    for (const char* dev : {"cpu", "cuda"})
      for (const bool clipping : {false, true}) {
        SCOPED_TRACE(std::string(env) + " on " + dev + (clipping ? ", as one sequence, clipping" : ""));
        TrainConfig c = test::small_config(env, "tbptt:4", 72);  // (4 iterations of 16 steps, then 8 by the host loop)
        c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2, c.device = dev;
        if (clipping) c.force_sequence = true, c.value_clip = 0.1, c.lr = 0.03, c.epochs = 4, c.entropy = 0.05;
        std::vector<std::vector<double>> figures[2];
        std::vector<std::vector<float>> params[2];
        for (const bool on : {false, true}) {
          c.device_loop = on;
          Trainer t(c);
          while (!t.done()) {
            const UpdateResult r = t.run_segment();
            figures[on].push_back({r.loss_sum, r.return_sum, double(r.episodes), r.metric("approx_kl"), r.metric("clip_fraction"),
                                   t.env().score()});
            params[on].push_back(test::params_of(t));
          }
          if (on && std::string(dev) == "cuda") {
            // the rollouts' 16 segments: a warm-up, two captured, 13 replayed; the
            // update's windows (4 iterations x epochs x 2 minibatches x 4 windows),
            // graphs of a slot of their own: two captured, the rest replayed
            const uint64_t windows = uint64_t(4 * c.epochs * 2 * 4);
            EXPECT_EQ(t.tape().stats().graph_captures, 4u);
            EXPECT_EQ(t.tape().stats().graph_replays, 13u + windows - 2);
          }
        }
        ASSERT_EQ(figures[0].size(), 5u);
        ASSERT_EQ(figures[1].size(), 5u);
        for (size_t i = 0; i < 5; ++i) {
          SCOPED_TRACE("iteration " + std::to_string(i));
          if (exact || std::string(dev) == "cpu") {
            EXPECT_EQ(figures[1][i], figures[0][i]);
            EXPECT_EQ(params[1][i], params[0][i]);
          } else if (i == 0) {  // (later iterations may part where a draw lands on a boundary the two round differently)
            EXPECT_NEAR(figures[1][i][0], figures[0][i][0], 1e-3);
          }
        }
        if (std::string(env) == "device-tmaze") {
          EXPECT_GT(figures[1][0][2], 0);  // (episodes ended in the device loop's first rollout)
        }
        if (clipping) {
          double clip_fraction = 0;
          for (size_t i = 0; i < 4; ++i) clip_fraction += figures[1][i][4];
          EXPECT_GT(clip_fraction, 0);
        }
      }
}

// With the device loop an iteration reads back to the host the same number
// of times whatever its length and however many updates it makes: nothing
// per step, in the rollout or in the update's minibatches (the host loop
// reads every step, and each update's gradient norm); per iteration the
// figures with the updates' norms, the streams' returns and the env's
// state, and under exact and overlap the replays' checks (the replay
// driver checks each boundary state on the device and reads no loss:
// replay::Options::verify_on_device, read_loss). (TapeStats::host_reads
// counts the tape's tensors read and the gradient norms' sums of squares.)
TEST(DeviceLoop, PpoReadsNothingBackPerStep) {
  REQUIRE_GPU();
  for (const char* history : {"tbptt:4", "tbptt:8", "exact:4/16", "overlap:4/8"})
    for (const char* dev : {"cpu", "cuda"})
      for (const bool sequence : {false, true}) {
        SCOPED_TRACE(std::string(history) + " on " + dev + (sequence ? ", as one sequence" : ""));
        const auto reads = [&](int64_t rollout, bool on, int64_t epochs = 2) {
          TrainConfig c = test::small_config("device-tmaze", history, 2 * rollout);
          c.algo = Algo::Ppo, c.rollout = rollout, c.epochs = epochs, c.minibatches = 2, c.device = dev, c.device_loop = on;
          c.force_sequence = sequence;
          Trainer t(c);
          t.run_segment();  // (the first iteration)
          const uint64_t before = t.tape().stats().host_reads;
          t.run_segment();
          return t.tape().stats().host_reads - before;
        };
        EXPECT_EQ(reads(16, true), reads(32, true));
        EXPECT_EQ(reads(16, true, 2), reads(16, true, 4));
        EXPECT_GT(reads(32, false), reads(16, false));
        EXPECT_GT(reads(16, false, 4), reads(16, false, 2));
      }
}

// The device loop's updates keep their gradient norms on the device and
// read them once, after the iteration: a norm that is not finite (from a
// value head of NaNs) stops the run there, naming the update the host loop
// names (which stops before that update's step), with the clip and
// without it; the trainer then refuses to train until a checkpoint is
// loaded. Under --nonfinite skip the device loop reads each norm before its
// step as the host loop does, and the two runs skip alike, and stop alike
// after --max-skips, the env moved on by the rollout in both.
TEST(DeviceLoop, PpoChecksItsUpdatesNormsAfterTheIteration) {
  REQUIRE_GPU();
  const auto poison = [](Trainer& t) {
    for (const auto& [name, p] : t.policy().named_parameters())
      if (name.rfind("value.", 0) == 0) p.from_host(std::span<const float>(std::vector<float>(size_t(p.numel()), std::nanf(""))));
  };
  for (const char* dev : {"cpu", "cuda"})
    for (const double clip : {0.0, 0.5}) {
      SCOPED_TRACE(std::string(dev) + (clip > 0 ? ", clip 0.5" : ", no clip"));
      TrainConfig c = test::small_config("device-tmaze", "tbptt:4", 64);
      c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2, c.device = dev, c.clip = clip;
      std::string stop[2], stop_skip[2];
      std::vector<float> skipped[2];
      std::vector<int64_t> env_after[2];
      for (const bool on : {false, true}) {
        c.device_loop = on, c.nonfinite = "stop";
        Trainer t(c);
        t.run_segment();  // (updates 1 to 4, finite)
        poison(t);
        stop[on] = test::message_of<NonFiniteError>([&] { t.run_segment(); });
        EXPECT_EQ(t.step(), 16);
        EXPECT_NE(test::message_of<NonFiniteError>([&] { t.run_segment(); }).find("this trainer stopped at the non-finite update 5 (steps 16 to 32)"),
                  std::string::npos);
        c.nonfinite = "skip";
        Trainer s(c);
        s.run_segment();
        poison(s);
        s.run_segment();
        EXPECT_EQ(s.skipped_updates(), 4);
        skipped[on] = test::params_of(s);
        // ... and after --max-skips in a row (an error inside the update): the env moved on by the rollout, as the host loop's
        c.max_skips = 2;
        Trainer k(c);
        k.run_segment();
        poison(k);
        stop_skip[on] = test::message_of<NonFiniteError>([&] { k.run_segment(); });
        env_after[on] = k.env().save_state();
        c.max_skips = 10;
      }
      EXPECT_EQ(stop_skip[1], stop_skip[0]);
      EXPECT_NE(stop_skip[0].find("update 6"), std::string::npos) << stop_skip[0];
      EXPECT_EQ(env_after[1], env_after[0]);
      EXPECT_EQ(stop[0].rfind("update 5, in the segment of steps 16 to 32: the gradient's norm is NaN (", 0), 0u) << stop[0];
      EXPECT_EQ(stop[1].rfind("update 5, in the segment of steps 16 to 32: the gradient's norm is NaN, found after the iteration "
                              "(--device-loop on reads the update's norms once an iteration), so this update and the "
                              "iteration's later ones were taken.", 0),
                0u)
          << stop[1];
      ASSERT_EQ(skipped[1].size(), skipped[0].size());
      EXPECT_TRUE(std::any_of(skipped[0].begin(), skipped[0].end(), [](float x) { return std::isnan(x); }));
      for (size_t i = 0; i < skipped[0].size(); ++i)  // (the value head's NaNs in both)
        ASSERT_TRUE(skipped[1][i] == skipped[0][i] || (std::isnan(skipped[1][i]) && std::isnan(skipped[0][i]))) << i;
    }
}

// The same with an LSTM and a critic of its own (a state of 4 B rows, each
// block reset), under exact:4/16 (one stored state a rollout) and overlap.
TEST(DeviceLoop, PpoWithTheDeviceLoopIsTheHostLoopsRunForOtherCoresAndHistories) {
  REQUIRE_GPU();
  for (const char* history : {"exact:4/16", "overlap:4/8"})
    for (const char* dev : {"cpu", "cuda"}) {
      SCOPED_TRACE(std::string(history) + " on " + dev);
      TrainConfig c = test::small_config("device-dialogue", history, 48);
      c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2, c.device = dev, c.cell = "lstm", c.critic = "separate";
      c.env_options.turns = 3;
      std::vector<float> params[2];
      for (const bool on : {false, true}) {
        c.device_loop = on;
        Trainer t(c);
        while (!t.done()) t.run_segment();
        params[on] = test::params_of(t);
      }
      if (test::kEmulated || std::string(dev) == "cpu") {
        EXPECT_EQ(params[1], params[0]);
      }
    }
}

// A device-loop run's checkpoint resumes bit for bit; the resumed run
// takes the host loop (--device-loop is not in the checkpoint), the same run.
TEST(DeviceLoop, PpoResumesFromADeviceLoopCheckpointBitForBit) {
  TrainConfig c = test::small_config("device-tmaze", "tbptt:4", 64);
  c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2, c.device_loop = true;
  const std::filesystem::path ck = std::filesystem::temp_directory_path() / ("segtape-device-loop-" + std::to_string(::getpid())) / "ck";
  std::filesystem::create_directories(ck.parent_path());
  const TrainConfig back = test::expect_resumes_bit_identically(c, ck, 32);
  EXPECT_FALSE(back.device_loop);
  std::filesystem::remove_all(ck.parent_path());
}

// segtape/device_call.h: a call runs its host form on the tensors, in
// place, and every refusal names the function.
void add_one(const CallArgs& a) {
  for (int64_t i = 0; i < a.numel[1]; ++i) a.at<float>(1)[i] = a.at<const float>(0)[i] + float(a.i[0]);
}
TEST(DeviceCall, RunsTheHostFormAndRefusesByName) {
  const DeviceFunction fn{"test: add", add_one, nullptr};
  Tape tape, other;
  const Tensor x = tape.persistent({3}), y = tape.persistent({3});
  x.from_host(std::span<const float>(std::vector<float>{1, 2, 3}));
  device_call(fn, {x}, {y}, {10});
  EXPECT_EQ(y.to_host<float>(), (std::vector<float>{11, 12, 13}));
  const Tensor p = tape.parameter({3}), z = other.persistent({3});
  const auto refused = [&](const std::function<void()>& call, const std::string& says, const std::string& also = "") {
    try {
      call();
      ADD_FAILURE() << "not refused: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test: add: " + says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(also), std::string::npos) << e.what();
    }
  };
  refused([&] { device_call(fn, {p}, {y}, {10}); }, "tensor 0 ", "requires a gradient");
  refused([&] { device_call(fn, {x}, {z}, {10}); }, "tensor 1 belongs to another tape");
  refused([&] { device_call(fn, {x}, {Tensor{}}, {10}); }, "tensor 1 is undefined");
  refused([&] { device_call(fn, {}, {}); }, "no tensors");
  refused([&] { device_call(fn, {x}, {y}, {1, 2, 3, 4, 5, 6, 7, 8, 9}); }, "at most 16 tensors, 8 integers and 4 reals");
  EXPECT_EQ(y.to_host<float>(), (std::vector<float>{11, 12, 13}));  // (nothing ran)
}

// After the first rollout a rollout and its GAE take nothing from the heap,
// on a CPU tape and on the device (the device calls' checks build no string
// unless they refuse).
TEST(DeviceLoop, RolloutAllocatesNothingAfterTheFirst) {
  REQUIRE_GPU();
  const PolicyShape shape{6, 10, 0, true};
  for (const Device& dev : {Device::cpu(), Device::cuda()}) {
    SCOPED_TRACE(dev.str());
    Tape tape(dev, small_device_pools());
    device::DeviceEnv denv(tape, "dialogue", 4, 17, cases()[3].o);
    nn::Rng init(3);
    const Policy policy(tape, init, denv.spec(), shape);
    device::DeviceRollout dr(tape, policy, denv, 8, 4, 99, 4);
    const Tensor h_home = tape.persistent({4, shape.hidden});
    dr.run(h_home);
    dr.advantages(0.9, 0.8);
    const uint64_t heap = alloc_hook::count();
    alloc_hook::enable(true);
    dr.run(h_home);
    dr.advantages(0.9, 0.8);
    alloc_hook::enable(false);
    EXPECT_EQ(alloc_hook::count() - heap, 0u) << "heap allocations in a rollout after the first";
  }
}

TEST(DeviceLoop, RefusesWhatItDoesNotBuild) {
  REQUIRE_GPU();
  Tape tape(Device::cuda(), small_device_pools());
  EnvOptions o;
  try {
    device::DeviceEnv e(tape, "lm", 4, 1, o);
    FAIL() << "lm has no device form";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built for the device"), std::string::npos) << e.what();
  }
  o.corridor = 3;
  device::DeviceEnv maze(tape, "tmaze", 2, 1, o);
  const std::vector<int64_t> before = maze.state().to_host<int64_t>();
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0, 4, 0, 0, 0, 1, 0, 0, 0, 0},  // position past the junction
                                          std::vector<int64_t>{2, 0, 0, 0, 0, 1, 0, 0, 0, 0},  // no such cue
                                          std::vector<int64_t>{0, 0, 0, 0, 0}}) {            // one stream of two
    EXPECT_THROW(maze.load_rows(bad), Error);
    EXPECT_EQ(maze.state().to_host<int64_t>(), before);
  }
  o.vocab = 1;
  EXPECT_THROW(device::DeviceEnv(tape, "recall", 4, 1, o), Error);  // the twin's checks: vocab >= 2
  // --device-loop: PPO on a twin env, one env's streams
  for (const auto& [set, says] : std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>>{
           {[](TrainConfig& t) { t.env = "tmaze"; }, "--env tmaze has no device form"},
           {[](TrainConfig& t) { t.algo = Algo::A2c; }, "--device-loop on runs PPO's rollouts on the device: --algo ppo (not a2c)"},
           {[](TrainConfig& t) { t.env_shards = 2; }, "not --env-shards 2"}}) {
    TrainConfig t = test::small_config("device-tmaze", "tbptt:4", 64);
    t.algo = Algo::Ppo, t.rollout = 16, t.device_loop = true;
    set(t);
    try {
      t.validate();
      FAIL() << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

}  // namespace
