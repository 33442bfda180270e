// Recurrent PPO's host buffers (the Trainer's, agent/ppo.cpp): private to
// the agent library. Everything is sized when the Trainer is made, so an
// iteration allocates nothing on the heap.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "segtape/agent/trainer.h"
#include "segtape/ops.h"
#include "segtape/replay.h"

namespace segtape::agent {

// Steps between the states a rollout stores: K, or T under exact:K/T (a
// minibatch's gradient reaches back that far, computed in K-step segments).
inline int64_t ppo_window(const TrainConfig& c) {
  return c.history.kind == History::Kind::Exact ? c.history.horizon : c.history.k;
}

// Whether the recurrence of steps known before they run (a CUDA-graph
// segment's, a PPO update window's) is one gru_sequence with the episode ends
// in its keep: under tbptt:K with K > 1 (a window longer than one step),
// where the sequence runs fused (on a GPU whose plan fits B and hidden).
// Composed of cells, as on the CPU, it would only cost memory (keep expanded
// to [K B, hidden], the outputs stacked): the cells, as eagerly.
// SEGTAPE_GRU_SEQUENCE=1 takes the sequence anyway (a test seam: the emulated
// device never fuses).
inline bool recurrence_as_sequence(Tape& tape, const TrainConfig& c, int64_t B) {
  const char* force = std::getenv("SEGTAPE_GRU_SEQUENCE");
  return c.history.kind == History::Kind::Tbptt && c.history.k > 1 &&
         (gru_sequence_fused(tape, B, c.hidden, DType::F32) || (force && std::string_view(force) == "1"));
}

struct Trainer::PpoBuffers {
  int64_t T = 0, B = 0, H = 0, K = 0, obs_dim = 0, A = 0;
  int64_t W = 0, S = 0;  // a state stored every W steps (K; exact:K/T: T), S of them
  // The rollout, row t * B + b: what stream b saw and did at step t.
  std::vector<int64_t> tokens, actions;  // tokens: token envs
  std::vector<float> vectors;            // vector envs [T, B, obs_dim]
  std::vector<float> logp, values, rewards, advantages, returns;
  std::vector<uint8_t> done;
  std::vector<float> start_state;        // [S, B, H]: the state at each W-step window's start
  std::vector<float> bootstrap;          // [B]: the value after the rollout's last step
  std::vector<int64_t> streams;          // the streams, shuffled each epoch
  // One minibatch's rows, gathered [Bm, ...]
  std::vector<int64_t> mb_tokens;
  std::vector<float> mb_vectors, mb_state, mb_returns, mb_weights, mb_rows, mb_values;
  std::vector<uint8_t> mb_done;
  std::vector<double> step_stats;        // [T, 3]: each step's share of the reported loss, KL and clip fraction
  // tbptt:K where gru_sequence fuses (sequence): a window's recurrence as one
  // gru_sequence. Its steps' encodings on the tape; the host copies of its
  // log-probabilities [W, Bm, A] and values [W, Bm], the loss's weights
  // [W, Bm, A] and returns [W, Bm]; the state's factor entering each step
  // [W, Bm] (0 after an episode's end).
  bool sequence = false;
  std::vector<Tensor> seq_encoded;
  std::vector<float> seq_rows, seq_values, seq_weights, seq_returns, seq_keep;
  // exact:K/T: a minibatch window's start state (persistent) and the replay
  // driver of its windows (the shorter last ones of a rollout run on it too)
  Tensor mb_h0;
  std::unique_ptr<replay::Driver> driver;
};

}  // namespace segtape::agent
