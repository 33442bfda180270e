#include "segtape/agent/env.h"

#include <algorithm>
#include <cmath>

#include "segtape/error.h"

namespace segtape::agent {

void Env::targets(std::span<int64_t> y) const { std::fill(y.begin(), y.end(), kNoTarget); }

std::vector<int64_t> Env::save_state() const {
  auto& ints = const_cast<Env*>(this)->state_ints();
  const auto rs = rng_.state();
  std::vector<int64_t> s = {int64_t(rs.seed), int64_t(rs.counter), score_num_, score_den_};
  s.insert(s.end(), ints.begin(), ints.end());
  return s;
}

void Env::load_state(std::span<const int64_t> s) {
  auto& ints = state_ints();
  if (s.size() != ints.size() + 4)
    throw Error("env '" + spec().name + "': saved state has " + std::to_string(s.size()) + " integers, expected " +
                std::to_string(ints.size() + 4) + " (a checkpoint of another configuration?)");
  if (s[2] < 0 || s[3] < s[2] || !valid_state(s.subspan(4)))
    throw Error("env '" + spec().name + "': saved state is out of range for this configuration (a damaged checkpoint?)");
  rng_.set_state({uint64_t(s[0]), uint64_t(s[1])});
  score_num_ = s[2], score_den_ = s[3];
  std::copy(s.begin() + 4, s.end(), ints.begin());
}

namespace {

// Delayed recall: token x_t each step; the target at t is x_{t-lag}.
class Recall final : public Env {
 public:
  Recall(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed), L_(o.lag), V_(o.vocab) {
    if (L_ < 0 || V_ < 2) throw Error("recall: needs lag >= 0 and vocab >= 2");
    spec_ = {"recall", V_, 0, V_, true, "accuracy"};
    s_.assign(size_t(B * (1 + L_ + 1)), 0);  // per stream: t, ring[L + 1]
    for (int64_t b = 0; b < B; ++b) ring(b)[0] = draw(V_);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tok[size_t(b)] = ring(b)[t(b) % (L_ + 1)];
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = t(b) >= L_ ? ring(b)[(t(b) - L_) % (L_ + 1)] : kNoTarget;
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      if (t(b) >= L_) {
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
  int64_t* ring(int64_t b) { return s_.data() + b * (L_ + 2) + 1; }
  const int64_t* ring(int64_t b) const { return s_.data() + b * (L_ + 2) + 1; }
  int64_t L_, V_;
  EnvSpec spec_;
  std::vector<int64_t> s_;
};

// T-maze: a cue (token 0 = left, 1 = right) at the corridor's start, N - 1
// corridor steps (token 2), then the junction (token 3) where the action
// (0 = left, 1 = right) ends the episode: reward +1 for the cued arm, -1 else.
class TMaze final : public Env {
 public:
  TMaze(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed), N_(o.corridor) {
    if (N_ < 1) throw Error("tmaze: corridor length must be >= 1");
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
    spec_ = {"dialogue", 0, D_, 1 + kRequests * C_, true, "accuracy"};
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

const std::vector<std::string>& env_names() {
  static const std::vector<std::string> n = {"recall", "tmaze", "dialogue"};
  return n;
}

std::unique_ptr<Env> make_env(const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (batch < 1) throw Error("env: batch must be >= 1, got " + std::to_string(batch));
  if (name == "recall") return std::make_unique<Recall>(batch, seed, o);
  if (name == "tmaze") return std::make_unique<TMaze>(batch, seed, o);
  if (name == "dialogue") return std::make_unique<Dialogue>(batch, seed, o);
  throw Error("unknown env '" + name + "' (choose recall, tmaze or dialogue)");
}

}  // namespace segtape::agent
