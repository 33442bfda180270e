// count-ones: an environment of one's own, in one file. Each step shows a
// bit (token 0 or 1); the target is how many ones this episode has shown so
// far, this step's included. An episode is `--lag` steps long (EnvOptions::lag,
// default 8), so the answer is a count from 0 to lag that only a memory of
// the episode can give. A supervised env: no rewards, targets every step.
//
// Built two ways (CMakeLists.txt): as a plug-in, `segtape train --env-plugin
// libcount_env.so --env count-ones`, and into train_count (main.cpp), a
// program of its own that trains it through segtape::agent::Trainer.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "segtape/agent/env.h"

namespace {

using segtape::agent::Env;
using segtape::agent::EnvOptions;
using segtape::agent::EnvSpec;

class CountOnes final : public Env {
 public:
  CountOnes(int64_t batch, uint64_t seed, const EnvOptions& o) : Env(batch, seed), n_(o.lag) {
    if (n_ < 1) throw segtape::Error("count-ones: --lag (the episode length) must be >= 1");
    // Tokens 0 and 1; the answer is one of n + 1 counts; score() is accuracy.
    spec_ = {"count-ones", 2, 0, n_ + 1, true, "accuracy"};
    s_.assign(size_t(batch * 3), 0);  // per stream: t (step in the episode), ones before it, this step's bit
    for (int64_t b = 0; b < batch; ++b) bit(b) = draw(2);
  }
  const EnvSpec& spec() const override { return spec_; }

  void observe(std::span<int64_t> tokens, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tokens[size_t(b)] = bit(b);
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = ones(b) + bit(b);
  }
  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      ++score_den_;  // accuracy: one target per stream per step
      score_num_ += actions[size_t(b)] == ones(b) + bit(b);
      ones(b) += bit(b);
      reward[size_t(b)] = 0;
      done[size_t(b)] = ++t(b) == n_;  // the episode ends: the next one starts from zero
      if (done[size_t(b)]) t(b) = ones(b) = 0;
      bit(b) = draw(2);
    }
  }

 private:
  // Everything besides the rng that decides what comes next: save_state and
  // load_state (checkpoints, --resume) read and write these.
  std::vector<int64_t>& state_ints() override { return s_; }
  // A checkpoint's integers are refused unless this env could be in them.
  bool valid_state(std::span<const int64_t> v) const override {
    for (size_t i = 0; i + 2 < v.size(); i += 3)
      if (v[i] < 0 || v[i] >= n_ || v[i + 1] < 0 || v[i + 1] > v[i] || v[i + 2] < 0 || v[i + 2] > 1) return false;
    return true;
  }
  int64_t& t(int64_t b) { return s_[size_t(3 * b)]; }
  int64_t& ones(int64_t b) { return s_[size_t(3 * b + 1)]; }
  int64_t& bit(int64_t b) { return s_[size_t(3 * b + 2)]; }
  int64_t ones(int64_t b) const { return s_[size_t(3 * b + 1)]; }
  int64_t bit(int64_t b) const { return s_[size_t(3 * b + 2)]; }

  int64_t n_;
  EnvSpec spec_;
  std::vector<int64_t> s_;
};

}  // namespace

// The plug-in's entry point: `segtape --env-plugin` calls it once after
// loading the library; train_count calls it before training.
extern "C" void segtape_register_envs() {
  segtape::agent::register_env("count-ones", [](int64_t batch, uint64_t seed, const EnvOptions& o) -> std::unique_ptr<Env> {
    return std::make_unique<CountOnes>(batch, seed, o);
  });
}
