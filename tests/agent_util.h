// Shared helpers for the agent's test suites.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "segtape/agent/trainer.h"

namespace segtape::test {

// A run small enough for a test: 4 streams, a GRU of 16 over embeddings of
// 8, recall's lag 2 and tmaze's corridor 3.
inline agent::TrainConfig small_config(const std::string& env, const std::string& history, int64_t steps) {
  agent::TrainConfig c;
  c.env = env;
  c.history = agent::History::parse(history);
  c.steps = steps;
  c.batch = 4;
  c.hidden = 16;
  c.embed = 8;
  c.env_options.lag = 2;
  c.env_options.corridor = 3;
  return c;
}

// The elements of a built policy's largest parameter (what
// Policy::largest_parameter_for says without building it).
inline int64_t largest_parameter(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n = std::max(n, p.numel());
  return n;
}

// One update's loss and PPO's figures, copied (an UpdateResult's metrics
// live in its trainer).
struct PpoIteration {
  double loss_sum, approx_kl, clip_fraction;
};
inline PpoIteration ppo_iteration(agent::Trainer& tr) {
  const agent::UpdateResult r = tr.run_segment();
  return {r.loss_sum, r.metric("approx_kl"), r.metric("clip_fraction")};
}

// PPO's minibatches replay their windows from the states stored at rollout
// time. With one epoch of one minibatch (make(history) must set that up)
// the first iteration's replay is its rollout again: every ratio is 1, and
// its loss is that of a run that stores no state but the first (tbptt:16),
// under tbptt:4 and exact:4/8, whose windows start from stored states.
inline void expect_first_ppo_iteration_replays_its_rollout(const std::function<agent::TrainConfig(const char*)>& make) {
  auto first = [&](const char* history) {
    agent::Trainer tr(make(history));
    return ppo_iteration(tr);
  };
  const PpoIteration whole = first("tbptt:16");
  EXPECT_GT(whole.loss_sum, 0);
  for (const char* history : {"tbptt:4", "exact:4/8"}) {
    SCOPED_TRACE(history);
    const PpoIteration r = first(history);
    EXPECT_LT(r.approx_kl, 1e-9);
    EXPECT_EQ(r.clip_fraction, 0.0);
    EXPECT_NEAR(r.loss_sum, whole.loss_sum, 1e-5 * whole.loss_sum);
  }
}

// Every parameter of the trainer's policy, in order, copied to the host (a
// device run's too): two runs agree bit for bit when these are equal.
inline std::vector<float> params_of(agent::Trainer& tr) {
  std::vector<float> all;
  for (const Tensor& p : tr.policy().parameters()) {
    const std::vector<float> v = p.to_host<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Runs c straight through, and again paused at step `pause` (checkpointed
// to `ck`, then a new trainer made from the checkpoint's configuration
// loads it and finishes): the parameters must agree bit for bit. Returns
// the configuration read back from the checkpoint.
inline agent::TrainConfig expect_resumes_bit_identically(const agent::TrainConfig& c, const std::filesystem::path& ck,
                                                         int64_t pause) {
  agent::Trainer straight(c);
  while (!straight.done()) straight.run_segment();
  agent::Trainer first(c);
  while (first.step() < pause) first.run_segment();
  first.save(ck);
  const agent::TrainConfig back = agent::Trainer::read_config(ck);
  agent::Trainer second(back);
  second.load(ck);
  while (!second.done()) second.run_segment();
  EXPECT_EQ(params_of(straight), params_of(second));
  return back;
}

}  // namespace segtape::test
