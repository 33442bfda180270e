#include <algorithm>

#include "task.h"

namespace segtape::agent {
namespace {

// Delayed recall: token x_t each step; the target at t is x_{t-lag}: a delay
// line, `lag` tokens to hold at once. Sparse: a token only at steps t that
// are multiples of lag, the blank token `vocab` between, and a target only at
// those steps (t >= lag): the token shown lag steps earlier, one token to hold.
class Recall final : public Env {
 public:
  Recall(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed), L_(o.lag), V_(o.vocab), sparse_(o.sparse) {
    if (L_ < 0 || V_ < 2) throw Error("recall: needs lag >= 0 and vocab >= 2");
    if (sparse_ && L_ < 1) throw Error("recall: sparse needs lag >= 1 (a token every lag steps)");
    spec_ = {"recall", sparse_ ? V_ + 1 : V_, 0, V_, true, "accuracy", true};
    s_.assign(size_t(B * (1 + L_ + 1)), 0);  // per stream: t, ring[L + 1]
    for (int64_t b = 0; b < B; ++b) ring(b)[0] = draw(V_);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tok[size_t(b)] = shown(t(b)) ? ring(b)[t(b) % (L_ + 1)] : V_;
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = asked(t(b)) ? ring(b)[(t(b) - L_) % (L_ + 1)] : kNoTarget;
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      if (asked(t(b))) {
        ++score_den_;
        score_num_ += a[size_t(b)] == ring(b)[(t(b) - L_) % (L_ + 1)];
      }
      int64_t& tb = s_[size_t(b * (L_ + 2))];
      ++tb;
      ring(b)[tb % (L_ + 1)] = draw(V_);
      reward[size_t(b)] = 0;
      done[size_t(b)] = 0;
    }
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {  // per stream: t >= 0, ring tokens in [0, V)
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || (i % size_t(L_ + 2) != 0 && v[i] >= V_)) return false;
    return true;
  }
  int64_t t(int64_t b) const { return s_[size_t(b * (L_ + 2))]; }
  bool shown(int64_t t) const { return !sparse_ || t % L_ == 0; }  // (sparse: every token is drawn, only these shown)
  bool asked(int64_t t) const { return t >= L_ && shown(t); }
  int64_t* ring(int64_t b) { return s_.data() + b * (L_ + 2) + 1; }
  const int64_t* ring(int64_t b) const { return s_.data() + b * (L_ + 2) + 1; }
  int64_t L_, V_;
  bool sparse_;
  EnvSpec spec_;
  std::vector<int64_t> s_;
};

}  // namespace

std::unique_ptr<Env> recall_task(int64_t batch, uint64_t seed, const EnvOptions& o) { return std::make_unique<Recall>(batch, seed, o); }

}  // namespace segtape::agent
