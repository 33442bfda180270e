#include <algorithm>
#include <cmath>

#include "task.h"

namespace segtape::agent {
namespace {

// Multi-turn tool-use dialogue. Each turn's message arrives as a frozen
// embedding (a fixed table plus a small paraphrase jitter, as a frozen LLM's
// output would: no graph behind it). Turn 0 names a city; later turns are
// small talk, a new city, or a request (weather or time). The correct tool
// for a request depends on the most recently named city:
//   tool 0 = reply (no tool), tool 1 + r * cities + c = request r for city c.
class Dialogue final : public Env {
 public:
  static constexpr int64_t kFillers = 6, kRequests = 2;
  Dialogue(int64_t B, uint64_t seed, const EnvOptions& o)
      : Env(B, seed), T_(o.turns), C_(o.cities), D_(o.embed_dim) {
    if (T_ < 2 || C_ < 1 || D_ < 1) throw Error("dialogue: needs turns >= 2, cities >= 1, embed_dim >= 1");
    if (o.sparse) throw Error("dialogue: sparse is recall's option (a token every lag steps); dialogue has no sparse form");
    spec_ = {"dialogue", 0, D_, 1 + kRequests * C_, true, "accuracy", true};
    // The frozen message table: fixed, independent of the env's seed.
    nn::Rng table_rng(0x5e97a9e);
    table_.resize(size_t(messages() * D_));
    for (float& v : table_) v = float(table_rng.normal(0, 1.0 / std::sqrt(double(D_))));
    s_.assign(size_t(B * 4), 0);  // per stream: turn, city, message, jitter id
    for (int64_t b = 0; b < B; ++b) start(b);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t>, std::span<float> vec) const override {
    for (int64_t b = 0; b < batch_; ++b) {
      const float* e = table_.data() + msg(b) * D_;
      nn::Rng jitter{uint64_t(s_[size_t(4 * b + 3)])};
      for (int64_t d = 0; d < D_; ++d)
        vec[size_t(b * D_ + d)] = e[d] + float(0.05 * (jitter.uniform() - 0.5) / std::sqrt(double(D_)));
    }
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = target(b);
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t y = target(b);
      if (y != 0) {  // the measure is tool choice on requests
        ++score_den_;
        score_num_ += a[size_t(b)] == y;
      }
      reward[size_t(b)] = a[size_t(b)] == y ? 1.0f : 0.0f;
      int64_t& turn = s_[size_t(4 * b)];
      done[size_t(b)] = turn + 1 >= T_;
      if (done[size_t(b)]) {
        start(b);
        continue;
      }
      ++turn;
      const int64_t u = draw(100);
      if (u < 15) set_city(b, draw(C_));                        // "actually, I'm in <city> now"
      else if (u < 50) set_msg(b, C_ + kFillers + draw(kRequests));  // a request
      else set_msg(b, C_ + draw(kFillers));                     // small talk
    }
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  // per stream: turn in [0, T), city in [0, C), message in [0, messages); the jitter id is any value
  bool valid_state(std::span<const int64_t> v) const override {
    for (size_t i = 0; i + 3 < v.size(); i += 4)
      if (v[i] < 0 || v[i] >= T_ || v[i + 1] < 0 || v[i + 1] >= C_ || v[i + 2] < 0 || v[i + 2] >= messages()) return false;
    return true;
  }
  int64_t messages() const { return C_ + kFillers + kRequests; }
  int64_t msg(int64_t b) const { return s_[size_t(4 * b + 2)]; }
  int64_t target(int64_t b) const {
    const int64_t m = msg(b), r = m - (C_ + kFillers);
    return r >= 0 ? 1 + r * C_ + s_[size_t(4 * b + 1)] : 0;
  }
  void set_msg(int64_t b, int64_t m) {
    s_[size_t(4 * b + 2)] = m;
    s_[size_t(4 * b + 3)] = int64_t(rng_.next_u64() >> 1);
  }
  void set_city(int64_t b, int64_t c) {
    s_[size_t(4 * b + 1)] = c;
    set_msg(b, c);
  }
  void start(int64_t b) {
    s_[size_t(4 * b)] = 0;
    set_city(b, draw(C_));
  }
  int64_t T_, C_, D_;
  EnvSpec spec_;
  std::vector<float> table_;  // [messages, D]
  std::vector<int64_t> s_;
};

}  // namespace

std::unique_ptr<Env> dialogue_task(int64_t batch, uint64_t seed, const EnvOptions& o) { return std::make_unique<Dialogue>(batch, seed, o); }

}  // namespace segtape::agent
