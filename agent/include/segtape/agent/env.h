// Environments that need memory. Batched: B independent episode streams,
// seeded and deterministic; an episode that ends restarts by itself.
//
// Each step an env shows one observation per stream — a token (recall,
// tmaze) or a frozen embedding vector (dialogue) — and then takes one action
// per stream. Supervised envs also give a target class per stream (or
// kNoTarget); reinforcement-learning envs give rewards.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "segtape/nn/random.h"

namespace segtape::agent {

inline constexpr int64_t kNoTarget = -100;  // matches cross_entropy's ignore index

struct EnvSpec {
  std::string name;
  int64_t vocab = 0;        // token observations: number of distinct tokens (0 if vector obs)
  int64_t obs_dim = 0;      // vector observations: dimension (0 if token obs)
  int64_t num_actions = 0;  // classes (supervised) or actions (RL)
  bool supervised = true;
  std::string measure;      // what score() means, e.g. "accuracy" or "success"
};

struct EnvOptions {
  int64_t lag = 8;        // recall: target at t is the token shown at t - lag
  int64_t vocab = 4;      // recall: tokens
  int64_t corridor = 10;  // tmaze: corridor length N
  int64_t turns = 10;     // dialogue: turns per conversation
  int64_t cities = 4;     // dialogue: cities a user can name
  int64_t embed_dim = 32; // dialogue: message embedding size
};

class Env {
 public:
  Env(int64_t batch, uint64_t seed) : batch_(batch), rng_(seed) {}
  virtual ~Env() = default;
  virtual const EnvSpec& spec() const = 0;
  int64_t batch() const { return batch_; }

  // The current observation: tokens [B] (token envs) or vectors [B, obs_dim].
  virtual void observe(std::span<int64_t> tokens, std::span<float> vectors) const = 0;
  // Supervised: the target class of the current step per stream, or kNoTarget.
  virtual void targets(std::span<int64_t> y) const;
  // Applies one action per stream and moves to the next step. Fills the reward
  // and whether the stream's episode ended (it restarts by itself).
  virtual void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) = 0;

  // Score since the last reset_score(): accuracy on targets (supervised) or
  // the fraction of finished episodes that succeeded (RL).
  double score() const { return score_den_ ? double(score_num_) / double(score_den_) : 0.0; }
  int64_t score_count() const { return score_den_; }
  void reset_score() { score_num_ = score_den_ = 0; }

  // Everything needed to continue bit-identically (for checkpoints).
  virtual std::vector<int64_t> save_state() const;
  virtual void load_state(std::span<const int64_t> s);

 protected:
  int64_t draw(int64_t n) { return int64_t(rng_.next_u64() % uint64_t(n)); }
  // Per-stream integers that make up the env's state (besides the rng).
  virtual std::vector<int64_t>& state_ints() = 0;
  // Whether saved per-stream integers are a state this env can be in
  // (counters >= 0, indices in range): load_state refuses anything else, so a
  // damaged checkpoint never becomes an out-of-range index.
  virtual bool valid_state(std::span<const int64_t> ints) const = 0;

  int64_t batch_;
  nn::Rng rng_;
  int64_t score_num_ = 0, score_den_ = 0;
};

// names: "recall", "tmaze", "dialogue"
std::unique_ptr<Env> make_env(const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o);
const std::vector<std::string>& env_names();

}  // namespace segtape::agent
