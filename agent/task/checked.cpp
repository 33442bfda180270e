// make_env's contract checks (env.h, "The Env contract").
#include <cxxabi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "task.h"

namespace segtape::agent {
namespace {

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
    state_size_ = env_->state_size();
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

  void target_values(std::span<float> y) const override {
    const size_t B = size_t(batch_);
    need("target_values", "target", y.size(), B);
    std::fill_n(y.begin(), B, kUnwrittenFloat);
    check_spec("target_values");
    guarded("target_values", [&] { env_->target_values(y); });
    if (!all_finite(y.first(B))) [[unlikely]]
      for (size_t b = 0; b < B; ++b)
        if (!std::isfinite(y[b]))
          fail(std::bit_cast<uint32_t>(y[b]) == kUnwrittenBits ? "target_values() left the target of stream " + std::to_string(b) + " unwritten"
                                                                : "target_values() gave stream " + std::to_string(b) + " the target " +
                                                                      std::to_string(y[b]) + "; targets must be finite");
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
    std::copy_n(done.begin(), B, last_done_.begin());
    if (const size_t now = env_->state_size(); now != state_size_) [[unlikely]]
      fail("step() changed the number of state_ints() from " + std::to_string(state_size_) + " to " + std::to_string(now) +
           "; an env's state keeps its size for its whole life (a checkpoint saves it, and a fresh env of the same "
           "configuration reads it back)");
    ++steps_;
  }

  // The rows of the streams not truncated come back 0 (a token and a vector
  // any caller can run), whatever the env left there.
  bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float> vectors) const override {
    const size_t B = size_t(batch_), D = size_t(std::max<int64_t>(obs_dim_, 1));
    need("truncations", "truncated", truncated.size(), B);
    if (vocab_ > 0) need("truncations", "token", tokens.size(), B);
    else need("truncations", "vector", vectors.size(), B * D);
    std::fill_n(truncated.begin(), B, uint8_t(0xff));
    if (vocab_ > 0) std::fill_n(tokens.begin(), B, kUnwritten);
    else std::fill_n(vectors.begin(), B * D, kUnwrittenFloat);
    check_spec("truncations");
    const bool any = guarded("truncations", [&] { return env_->truncations(truncated, tokens, vectors); });
    // (in the step the message names: the one whose episodes these are)
    const auto at = [&](const std::string& what) {
      throw EnvContractError("env '" + name_ + "', step " + std::to_string(steps_) + ": " + what +
                             " (the Env contract: segtape/agent/env.h, docs/agent.md)");
    };
    bool seen = false;
    for (size_t b = 0; b < B; ++b) {
      const std::string s = " of stream " + std::to_string(b);
      if (truncated[b] == 0xff) at("truncations() left truncated" + s + " unwritten; it is 0 or 1");
      if (truncated[b] > 1) at("truncations() set truncated" + s + " to " + std::to_string(truncated[b]) + "; it is 0 or 1");
      if (truncated[b] && !last_done_[b]) at("truncations() says the episode" + s + " was truncated, but step() did not end it (done 0)");
      seen |= truncated[b] != 0;
      if (vocab_ > 0) {
        if (!truncated[b]) tokens[b] = 0;
        else if (tokens[b] < 0 || tokens[b] >= vocab_)
          at(tokens[b] == kUnwritten ? "truncations() left the final token" + s + " unwritten"
                                     : "truncations() gave stream " + std::to_string(b) + " the final token " + std::to_string(tokens[b]) +
                                           ", outside [0, " + std::to_string(vocab_) + ") (spec().vocab)");
      } else {
        float* row = vectors.data() + b * D;
        if (!truncated[b]) std::fill_n(row, D, 0.0f);
        else if (!all_finite(std::span<const float>(row, D)))
          at("truncations() left or gave a final observation" + s + " that is not finite (obs_dim is " + std::to_string(obs_dim_) + ")");
      }
    }
    if (seen != any) at(std::string("truncations() returned ") + (any ? "true" : "false") + " but truncated " + (seen ? "some" : "no") + " stream");
    return any;
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
  size_t state_size_ = 0;  // the env's state_ints() when made (Env::state_size)
  std::vector<int64_t> no_ints_;
  std::vector<uint8_t> last_done_ = std::vector<uint8_t>(size_t(batch_), 0);  // the last step()'s done flags (truncations)
};

}  // namespace

std::unique_ptr<Env> checked_env(const std::string& name, int64_t batch, const std::function<std::unique_ptr<Env>()>& make) {
  std::unique_ptr<Env> env = guard_foreign([&] { return "env '" + name + "': its factory"; }, make);
  return std::make_unique<CheckedEnv>(std::move(env), name, batch);
}

}  // namespace segtape::agent
