#include <algorithm>

#include "task.h"

namespace segtape::agent {
namespace {

// T-maze: a cue (token 0 = left, 1 = right) at the corridor's start, N - 1
// corridor steps (token 2), then the junction (token 3) where the action
// (0 = left, 1 = right) ends the episode: reward +1 for the cued arm, -1 else.
class TMaze final : public Env {
 public:
  TMaze(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed), N_(o.corridor) {
    if (N_ < 1) throw Error("tmaze: corridor length must be >= 1");
    if (o.sparse) throw Error("tmaze: sparse is recall's option (a token every lag steps); tmaze has no sparse form");
    spec_ = {"tmaze", 4, 0, 2, false, "success"};
    s_.assign(size_t(B * 2), 0);  // per stream: cue, position
    for (int64_t b = 0; b < B; ++b) s_[size_t(2 * b)] = draw(2);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t pos = s_[size_t(2 * b + 1)];
      tok[size_t(b)] = pos == 0 ? s_[size_t(2 * b)] : pos < N_ ? 2 : 3;
    }
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t& cue = s_[size_t(2 * b)];
      int64_t& pos = s_[size_t(2 * b + 1)];
      reward[size_t(b)] = 0;
      done[size_t(b)] = 0;
      if (pos < N_) {
        ++pos;  // the corridor only goes forward
        continue;
      }
      const bool ok = a[size_t(b)] == cue;
      reward[size_t(b)] = ok ? 1.0f : -1.0f;
      done[size_t(b)] = 1;
      ++score_den_;
      score_num_ += ok;
      cue = draw(2);
      pos = 0;
    }
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {  // per stream: cue in {0, 1}, position in [0, N]
    for (size_t i = 0; i + 1 < v.size(); i += 2)
      if (v[i] < 0 || v[i] > 1 || v[i + 1] < 0 || v[i + 1] > N_) return false;
    return true;
  }
  int64_t N_;
  EnvSpec spec_;
  std::vector<int64_t> s_;
};

}  // namespace

std::unique_ptr<Env> tmaze_task(int64_t batch, uint64_t seed, const EnvOptions& o) { return std::make_unique<TMaze>(batch, seed, o); }

}  // namespace segtape::agent
