#include "segtape/agent/env.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>

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

// ---- Contract checks

// f(), where an exception that is not a std::exception (which passes
// unchanged: a Python env's KeyboardInterrupt among them) becomes an
// EnvContractError saying `who` (the env, the step, the call) threw it:
// nothing in segtape could catch it by type, and the program would end in
// std::terminate. A cancelled thread's unwinding goes on.
template <class Who, class F>
std::invoke_result_t<F&> guard_foreign(const Who& who, F&& f) {
  try {
    return f();
  } catch (const std::exception&) {
    throw;
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    throw EnvContractError(who() + " threw an exception that is not a std::exception (the Env contract: segtape/agent/env.h, docs/agent.md)");
  }
}

// make_env's wrapper: forwards every call to the env it owns and checks what
// comes back against the Env contract (env.h). Each check is one pass over
// the B values a call filled (B x obs_dim for vector observations), next to
// the env's own pass that filled them. The buffers are first filled with
// values no env writes (a NaN of its own payload, an impossible token), so a
// value the env left unwritten is told from one it wrote wrong.
class CheckedEnv final : public Env {
 public:
  CheckedEnv(std::unique_ptr<Env> env, std::string name, int64_t batch)
      : Env(batch, 0), env_(std::move(env)), name_(std::move(name)) {
    if (!env_) throw EnvContractError("env '" + name_ + "': its factory returned no env");
    const int64_t made = guarded("batch", [&] { return env_->batch(); });
    if (made != batch) fail_at_make("batch() is " + std::to_string(made) + ", but it was made for " + std::to_string(batch) + " streams");
    spec_ = guarded("spec", [&] { return env_->spec(); });
    const EnvSpec& s = spec_;
    vocab_ = s.vocab, obs_dim_ = s.obs_dim, actions_ = s.num_actions;
    if ((vocab_ > 0) == (obs_dim_ > 0) || vocab_ < 0 || obs_dim_ < 0)
      fail_at_make("spec() has vocab " + std::to_string(vocab_) + " and obs_dim " + std::to_string(obs_dim_) +
                   "; exactly one must be > 0 (vocab: token observations, obs_dim: vector observations)");
    if (actions_ < 1) fail_at_make("spec().num_actions is " + std::to_string(actions_) + "; must be >= 1");
    if (s.measure.empty()) fail_at_make("spec().measure is empty; name what score() measures, e.g. \"accuracy\"");
    // (a column name of metrics.csv and a TensorBoard tag: a comma split the header)
    if (s.measure.find_first_of(",\n\r\"") != std::string::npos)
      fail_at_make("spec().measure '" + s.measure + "' holds a comma, quote or line break; name it with a word, e.g. \"success_rate\"");
  }

  // The spec as it was at make_env: the env's own is compared with it before
  // each call (a spec that changed would have the env write past the
  // buffers sized by the old one).
  const EnvSpec& spec() const override { return spec_; }

  void observe(std::span<int64_t> tokens, std::span<float> vectors) const override {
    const size_t B = size_t(batch_);
    if (vocab_ > 0) {
      need("observe", "token", tokens.size(), B);
      std::fill_n(tokens.begin(), B, kUnwritten);
      check_spec("observe");
      guarded("observe", [&] { env_->observe(tokens, vectors); });
      if (!all_below(tokens.first(B), vocab_)) [[unlikely]]
        for (size_t b = 0; b < B; ++b)
          if (tokens[b] < 0 || tokens[b] >= vocab_)
            fail(tokens[b] == kUnwritten ? "observe() left the token of stream " + std::to_string(b) + " unwritten"
                                         : "observe() gave stream " + std::to_string(b) + " the token " + std::to_string(tokens[b]) +
                                               ", outside [0, " + std::to_string(vocab_) + ") (spec().vocab)");
    } else {
      const size_t n = B * size_t(obs_dim_);
      need("observe", "vector", vectors.size(), n);
      std::fill_n(vectors.begin(), n, kUnwrittenFloat);
      check_spec("observe");
      guarded("observe", [&] { env_->observe(tokens, vectors); });
      if (!all_finite(vectors.first(n))) [[unlikely]]
        for (size_t i = 0; i < n; ++i)
          if (!std::isfinite(vectors[i]))
            fail("observe() " + (std::bit_cast<uint32_t>(vectors[i]) == kUnwrittenBits
                                     ? std::string("left value ") + std::to_string(i % size_t(obs_dim_)) + " of stream " +
                                           std::to_string(i / size_t(obs_dim_)) + " unwritten (obs_dim is " + std::to_string(obs_dim_) + ")"
                                     : "gave stream " + std::to_string(i / size_t(obs_dim_)) + " the value " + std::to_string(vectors[i]) +
                                           " at " + std::to_string(i % size_t(obs_dim_)) + "; observations must be finite"));
    }
  }

  void targets(std::span<int64_t> y) const override {
    const size_t B = size_t(batch_);
    need("targets", "target", y.size(), B);
    std::fill_n(y.begin(), B, kUnwritten);
    check_spec("targets");
    guarded("targets", [&] { env_->targets(y); });
    uint64_t bad = 0;  // no early exit (vectorized): a class in [0, num_actions) or kNoTarget
    for (size_t b = 0; b < B; ++b) bad |= uint64_t(uint64_t(y[b]) >= uint64_t(actions_)) & uint64_t(y[b] != kNoTarget);
    if (bad) [[unlikely]]
      for (size_t b = 0; b < B; ++b)
        if ((y[b] < 0 || y[b] >= actions_) && y[b] != kNoTarget)
          fail(y[b] == kUnwritten ? "targets() left the target of stream " + std::to_string(b) + " unwritten"
                                  : "targets() gave stream " + std::to_string(b) + " the target " + std::to_string(y[b]) + ", outside [0, " +
                                        std::to_string(actions_) + ") (spec().num_actions) and not kNoTarget");
  }

  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    const size_t B = size_t(batch_);
    need("step", "action", actions.size(), B);
    need("step", "reward", reward.size(), B);
    need("step", "done", done.size(), B);
    if (!all_below(actions.first(B), actions_)) [[unlikely]]
      for (size_t b = 0; b < B; ++b)
        if (actions[b] < 0 || actions[b] >= actions_)
          throw Error("env '" + name_ + "', step " + std::to_string(steps_ + 1) + ": the caller's action " +
                      std::to_string(actions[b]) + " for stream " + std::to_string(b) + " is outside [0, " + std::to_string(actions_) + ")");
    std::fill_n(reward.begin(), B, kUnwrittenFloat);
    std::fill_n(done.begin(), B, uint8_t(0xff));
    check_spec("step");
    guarded("step", [&] { env_->step(actions, reward, done); });
    uint8_t done_or = 0;
    for (size_t b = 0; b < B; ++b) done_or |= done[b];
    if (!all_finite(reward.first(B)) || done_or > 1) [[unlikely]]
      for (size_t b = 0; b < B; ++b) {
        const std::string s = " of stream " + std::to_string(b);
        if (std::bit_cast<uint32_t>(reward[b]) == kUnwrittenBits) fail("step() left the reward" + s + " unwritten");
        if (!std::isfinite(reward[b])) fail("step() gave the reward " + std::to_string(reward[b]) + " to stream " + std::to_string(b) + "; rewards must be finite");
        if (done[b] == 0xff) fail("step() left done" + s + " unwritten (or set it to 255, the mark of an unwritten one); done is 0 or 1");
        if (done[b] > 1) fail("step() set done" + s + " to " + std::to_string(done[b]) + "; done is 0 or 1");
      }
    ++steps_;
  }

  double score() const override { return guarded("score", [&] { return env_->score(); }); }
  void reset_score() override { guarded("reset_score", [&] { env_->reset_score(); }); }
  std::pair<int64_t, int64_t> score_counts() const override { return guarded("score_counts", [&] { return env_->score_counts(); }); }
  std::vector<int64_t> save_state() const override { return guarded("save_state", [&] { return env_->save_state(); }); }
  void load_state(std::span<const int64_t> s) override { guarded("load_state", [&] { env_->load_state(s); }); }

 private:
  // Never called: save_state and load_state go to the wrapped env.
  std::vector<int64_t>& state_ints() override { return no_ints_; }
  bool valid_state(std::span<const int64_t>) const override { return false; }

  static constexpr int64_t kUnwritten = std::numeric_limits<int64_t>::min();
  static constexpr uint32_t kUnwrittenBits = 0x7fc5e97au;  // a quiet NaN with segtape's payload
  static inline const float kUnwrittenFloat = std::bit_cast<float>(kUnwrittenBits);

  // No NaN or infinity in v: exponent bits not all ones. Integer compares
  // and no early exit, a loop the compiler vectorizes (std::isfinite's is not).
  // Every value in [0, n) (a negative one is a large unsigned one).
  static bool all_below(std::span<const int64_t> v, int64_t n) {
    uint64_t out = 0;
    for (const int64_t x : v) out |= uint64_t(uint64_t(x) >= uint64_t(n));
    return out == 0;
  }
  static bool all_finite(std::span<const float> v) {
    uint32_t inf_or_nan = 0;
    for (const float x : v) inf_or_nan |= uint32_t((std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u);
    return inf_or_nan == 0;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw EnvContractError("env '" + name_ + "', step " + std::to_string(steps_ + 1) + ": " + what +
                           " (the Env contract: segtape/agent/env.h, docs/agent.md)");
  }
  // The env's call `call` (guard_foreign): named with the env and the step.
  template <class F>
  std::invoke_result_t<F&> guarded(const char* call, F&& f) const {
    return guard_foreign([&] { return "env '" + name_ + "', step " + std::to_string(steps_ + 1) + ": " + call + "()"; },
                         std::forward<F>(f));
  }
  // spec() must stay what it was at make_env (env.h).
  void check_spec(const char* call) const {
    const EnvSpec& now = guarded("spec", [&]() -> const EnvSpec& { return env_->spec(); });
    if (now.vocab == spec_.vocab && now.obs_dim == spec_.obs_dim && now.num_actions == spec_.num_actions &&
        now.supervised == spec_.supervised && now.measure == spec_.measure && now.open_loop == spec_.open_loop) [[likely]]
      return;
    std::string changed;
    auto field = [&](const char* name, const std::string& was, const std::string& is) {
      if (was != is) changed += (changed.empty() ? "" : ", ") + std::string(name) + " " + was + " -> " + is;
    };
    field("vocab", std::to_string(spec_.vocab), std::to_string(now.vocab));
    field("obs_dim", std::to_string(spec_.obs_dim), std::to_string(now.obs_dim));
    field("num_actions", std::to_string(spec_.num_actions), std::to_string(now.num_actions));
    field("supervised", spec_.supervised ? "true" : "false", now.supervised ? "true" : "false");
    field("measure", "'" + spec_.measure + "'", "'" + now.measure + "'");
    field("open_loop", spec_.open_loop ? "true" : "false", now.open_loop ? "true" : "false");
    fail("spec() changed before " + std::string(call) + "(): " + changed + "; the spec must stay the same for the env's whole life");
  }
  [[noreturn]] void fail_at_make(const std::string& what) const {
    throw EnvContractError("env '" + name_ + "': " + what + " (the Env contract: segtape/agent/env.h, docs/agent.md)");
  }
  // A caller's buffer too small for B streams: the caller's error, refused
  // before the env could write past it.
  void need(const char* call, const char* buffer, size_t have, size_t want) const {
    if (have < want) [[unlikely]]
      throw Error("env '" + name_ + "', " + call + "(): the caller's " + buffer + " buffer holds " + std::to_string(have) +
                  " values; this env's " + std::to_string(batch_) + " streams need " + std::to_string(want));
  }

  std::unique_ptr<Env> env_;
  std::string name_;
  EnvSpec spec_;
  int64_t vocab_ = 0, obs_dim_ = 0, actions_ = 0;
  int64_t steps_ = 0;  // step() calls so far: messages name step steps_ + 1
  std::vector<int64_t> no_ints_;
};

// ---- The registry

// Read and written under `lock`: Python registers envs at any time (each
// segtape.gym.train does), also while a thread that released the GIL makes
// one (segtape.retention.run): a push_back then moved the vectors under it.
struct Registry {
  std::vector<std::string> names;  // in registration order
  std::vector<EnvFactory> factories;
  std::mutex lock;
};

void add(Registry& r, const std::string& name, EnvFactory f) {
  if (name.empty()) throw Error("register_env: the env name is empty");
  for (const char ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.')
      throw Error("register_env: env name '" + name + "' has a character other than letters, digits, '-', '_' and '.'");
  if (std::find(r.names.begin(), r.names.end(), name) != r.names.end())
    throw Error("register_env: an env named '" + name + "' is already registered; choose another name");
  if (!f) throw Error("register_env: the factory of env '" + name + "' is empty");
  r.names.push_back(name);
  r.factories.push_back(std::move(f));
}

template <class E>
EnvFactory builtin() {
  return [](int64_t batch, uint64_t seed, const EnvOptions& o) -> std::unique_ptr<Env> { return std::make_unique<E>(batch, seed, o); };
}

Registry& registry() {
  static Registry r;
  static const bool builtins = [] {  // (once, thread-safe: a static's initialisation)
    add(r, "recall", builtin<Recall>());
    add(r, "tmaze", builtin<TMaze>());
    add(r, "dialogue", builtin<Dialogue>());
    return true;
  }();
  (void)builtins;
  return r;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

void register_env(const std::string& name, EnvFactory factory) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  add(r, name, std::move(factory));
}

std::vector<std::string> env_names() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  return r.names;
}

bool env_registered(const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  return std::find(r.names.begin(), r.names.end(), name) != r.names.end();
}

std::unique_ptr<Env> make_env(const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (batch < 1) throw Error("env: batch must be >= 1, got " + std::to_string(batch));
  EnvFactory make;  // a copy, called with the registry unlocked (a factory may register envs)
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> hold(r.lock);
    const auto it = std::find(r.names.begin(), r.names.end(), name);
    if (it == r.names.end())
      throw Error("unknown env '" + name + "' (registered: " + joined(r.names) +
                  "; an env of your own: register_env, or `segtape train --env-plugin FILE`)");
    make = r.factories[size_t(it - r.names.begin())];
  }
  std::unique_ptr<Env> env = guard_foreign([&] { return "env '" + name + "': its factory"; }, [&] { return make(batch, seed, o); });
  return std::make_unique<CheckedEnv>(std::move(env), name, batch);
}

namespace {

// make_env_shards' env: the shards side by side, stream ranges in order.
class ShardedEnv final : public Env {
 public:
  ShardedEnv(std::vector<std::unique_ptr<Env>> shards, int64_t batch) : Env(batch, 0), shards_(std::move(shards)) {
    per_ = batch / int64_t(shards_.size());
    dim_ = shards_[0]->spec().obs_dim;
  }
  const EnvSpec& spec() const override { return shards_[0]->spec(); }
  void observe(std::span<int64_t> tokens, std::span<float> vectors) const override {
    for (size_t i = 0; i < shards_.size(); ++i)
      shards_[i]->observe(part(tokens, i, 1), dim_ > 0 ? part(vectors, i, dim_) : std::span<float>());
  }
  void targets(std::span<int64_t> y) const override {
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i]->targets(part(y, i, 1));
  }
  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i]->step(part(actions, i, 1), part(reward, i, 1), part(done, i, 1));
  }
  std::pair<int64_t, int64_t> score_counts() const override {
    std::pair<int64_t, int64_t> n{0, 0};
    for (const auto& e : shards_) {
      const auto [a, b] = e->score_counts();
      n.first += a, n.second += b;
    }
    return n;
  }
  double score() const override {
    const auto [a, b] = score_counts();
    return b ? double(a) / double(b) : 0.0;
  }
  void reset_score() override {
    for (const auto& e : shards_) e->reset_score();
  }
  std::vector<int64_t> save_state() const override {
    std::vector<int64_t> s;
    for (const auto& e : shards_) {
      const std::vector<int64_t> one = e->save_state();
      s.insert(s.end(), one.begin(), one.end());
    }
    return s;
  }
  void load_state(std::span<const int64_t> s) override {
    std::vector<size_t> sizes;
    size_t total = 0;
    for (const auto& e : shards_) sizes.push_back(e->save_state().size()), total += sizes.back();
    if (s.size() != total)
      throw Error("env '" + spec().name + "' (" + std::to_string(shards_.size()) + " shards): saved state has " +
                  std::to_string(s.size()) + " integers, expected " + std::to_string(total) + " (a checkpoint of another configuration?)");
    // All or nothing: a shard that refuses its state puts the ones before it back.
    std::vector<std::vector<int64_t>> before;
    for (const auto& e : shards_) before.push_back(e->save_state());
    size_t i = 0;
    try {
      for (size_t at = 0; i < shards_.size(); at += sizes[i], ++i) shards_[i]->load_state(s.subspan(at, sizes[i]));
    } catch (...) {
      for (size_t j = 0; j < i; ++j) shards_[j]->load_state(before[j]);
      throw;
    }
  }

 private:
  template <class T>
  std::span<T> part(std::span<T> v, size_t i, int64_t width) const {
    const size_t n = size_t(per_ * width);
    return v.size() >= (i + 1) * n ? v.subspan(i * n, n) : std::span<T>();
  }
  std::vector<int64_t>& state_ints() override { return no_ints_; }
  bool valid_state(std::span<const int64_t>) const override { return false; }

  std::vector<std::unique_ptr<Env>> shards_;
  std::vector<int64_t> no_ints_;
  int64_t per_ = 0, dim_ = 0;
};

}  // namespace

std::unique_ptr<Env> make_env_shards(const std::string& name, int64_t batch, std::span<const uint64_t> seeds, const EnvOptions& o) {
  if (seeds.empty()) throw Error("env: make_env_shards needs at least one seed");
  if (seeds.size() == 1) return make_env(name, batch, seeds[0], o);
  const int64_t n = int64_t(seeds.size());
  if (batch < n || batch % n != 0)
    throw Error("env: " + std::to_string(batch) + " streams cannot be split into " + std::to_string(n) +
                " shards of equal size (--batch must be a multiple of --env-shards)");
  std::vector<std::unique_ptr<Env>> shards;
  for (const uint64_t seed : seeds) shards.push_back(make_env(name, batch / n, seed, o));
  return std::make_unique<ShardedEnv>(std::move(shards), batch);
}

std::vector<std::string> load_env_plugin(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  static std::map<fs::path, std::vector<std::string>> loaded;  // by absolute path: what each plug-in registered
  std::error_code ec;
  if (!fs::exists(file, ec)) throw Error(file.string() + (ec ? ": cannot look at it (" + ec.message() + ")" : ": no such file"));
  if (fs::is_directory(file, ec)) throw Error(file.string() + ": is a directory, not a shared library");
  // dlopen of a FIFO waits for a writer forever; a device is no library either.
  if (!fs::is_regular_file(file, ec)) throw Error(file.string() + ": not a regular file, not a shared library");
  // An absolute path: dlopen searches the library path for a bare name.
  const fs::path path = fs::weakly_canonical(fs::absolute(file, ec), ec);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  dlerror();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    throw Error(file.string() + ": cannot load it as a shared library (" + (why ? why : "dlopen failed") + ")");
  }
  // Reading a function pointer out of dlsym's void*: the POSIX way.
  void* sym = dlsym(lib, "segtape_register_envs");
  if (!sym) {
    dlclose(lib);
    throw Error(file.string() + ": not a segtape env plug-in (it defines no extern \"C\" void segtape_register_envs())");
  }
  auto* register_envs = reinterpret_cast<void (*)()>(sym);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  // The library stays loaded from here on: its factories may be in the
  // registry (and an env it made may outlive any handle we would close).
  // (the registry is locked around each step, not across register_envs,
  // whose register_env calls lock it themselves)
  Registry& r = registry();
  const size_t before = [&] {
    const std::lock_guard<std::mutex> hold(r.lock);
    return r.names.size();
  }();
  auto roll_back = [&] {
    const std::lock_guard<std::mutex> hold(r.lock);
    r.names.resize(before);
    r.factories.resize(before);
  };
  try {
    register_envs();
  } catch (const std::exception& e) {
    roll_back();
    throw Error(file.string() + ": segtape_register_envs() failed: " + e.what());
  } catch (...) {
    roll_back();
    throw Error(file.string() + ": segtape_register_envs() failed with an exception that is not a std::exception");
  }
  std::vector<std::string> added;
  {
    const std::lock_guard<std::mutex> hold(r.lock);
    added.assign(r.names.begin() + std::ptrdiff_t(before), r.names.end());
  }
  if (added.empty()) throw Error(file.string() + ": segtape_register_envs() registered no env (call register_env in it)");
  loaded[path] = added;
  return added;
}

}  // namespace segtape::agent
