// Recurrent PPO's rollout (agent/algo/ppo.cpp): what the B streams saw and
// did over T steps, the state every W steps, and the advantages. Sized when
// the trainer is made, so an iteration allocates nothing on the heap.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "segtape/agent/config.h"

namespace segtape::agent {

struct RolloutBuffer {
  RolloutBuffer(const TrainConfig& c, const EnvSpec& spec);
  // The host bytes a configuration's rollout takes (the memory check).
  static size_t bytes(const TrainConfig& c, const EnvSpec& spec);

  int64_t T = 0, B = 0, H = 0, obs_dim = 0;
  int64_t R = 1;  // the state's rows per stream (TrainConfig::state_rows: 2 with a separate critic)
  int64_t W = 0, S = 0;  // a state stored every W steps (History::stored_every: K, or exact's T), S of them
  // Row t * B + b: what stream b saw and did at step t.
  std::vector<int64_t> tokens, actions;  // tokens: token envs
  std::vector<float> vectors;            // vector envs [T, B, obs_dim]
  std::vector<float> logp, values, rewards, advantages, returns;
  std::vector<uint8_t> done;
  std::vector<float> start_state;        // [S, R B, H]: the state at each W-step window's start
  std::vector<float> bootstrap;          // [B]: the value after the rollout's last step

  // GAE(lambda) (Schulman et al. 2016) over the first n steps; a done step
  // does not bootstrap from the next one (the next episode's). returns =
  // advantages + values.
  void compute_advantages(int64_t n, double gamma, double lambda);
};

}  // namespace segtape::agent
