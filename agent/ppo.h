// Recurrent PPO's host buffers (the Trainer's, agent/ppo.cpp): private to
// the agent library. Everything is sized when the Trainer is made, so an
// iteration allocates nothing on the heap.
#pragma once
#include <cstdint>
#include <vector>

#include "segtape/agent/trainer.h"

namespace segtape::agent {

struct Trainer::PpoBuffers {
  int64_t T = 0, B = 0, H = 0, K = 0, S = 0, obs_dim = 0, A = 0;
  // The rollout, row t * B + b: what stream b saw and did at step t.
  std::vector<int64_t> tokens, actions;  // tokens: token envs
  std::vector<float> vectors;            // vector envs [T, B, obs_dim]
  std::vector<float> logp, values, rewards, advantages, returns;
  std::vector<uint8_t> done;
  std::vector<float> start_state;        // [S, B, H]: the state each rollout segment started from
  std::vector<float> bootstrap;          // [B]: the value after the rollout's last step
  std::vector<int64_t> streams;          // the streams, shuffled each epoch
  // One minibatch's rows, gathered [Bm, ...]
  std::vector<int64_t> mb_tokens;
  std::vector<float> mb_vectors, mb_state, mb_returns, mb_weights, mb_rows, mb_values;
  std::vector<uint8_t> mb_done;
};

}  // namespace segtape::agent
