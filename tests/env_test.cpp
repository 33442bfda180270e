// Envs of one's own: the registry (register_env, make_env, env_names), the
// contract checks make_env wraps every env in, and env plug-ins
// (load_env_plugin). Compiled twice more as plug-ins (tests/agent_test.cmake):
// with SEGTAPE_ENV_TEST_PLUGIN set, only the plug-in part below is built.
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "segtape/agent/env.h"

namespace segtape::agent::test_envs {

// A small token env that keeps the contract: each step shows t mod 3, the
// target is the token shown one step earlier, an episode lasts 4 steps.
// With `truncates`, the odd streams' episodes are cut there by a time limit
// (truncations(): the observation they were cut at, token 4 mod 3 = 1).
class Echo : public Env {
 public:
  Echo(int64_t batch, uint64_t seed, std::string name, bool truncates = false) : Env(batch, seed), truncates_(truncates) {
    spec_ = {std::move(name), 3, 0, 3, true, "accuracy"};
    s_.assign(size_t(batch * 2), 0);  // per stream: t, the previous token
    ended_.assign(size_t(batch), 0);
  }
  bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float>) const override {
    bool any = false;
    for (size_t b = 0; b < size_t(batch_); ++b) {
      truncated[b] = uint8_t(truncates_ && ended_[b] && b % 2 == 1);
      if (truncated[b]) tokens[b] = 1, any = true;
    }
    return any;
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tokens[size_t(b)] = s_[size_t(2 * b)] % 3;
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = s_[size_t(2 * b)] == 0 ? kNoTarget : s_[size_t(2 * b + 1)];
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t& t = s_[size_t(2 * b)];
      if (t > 0) ++score_den_, score_num_ += a[size_t(b)] == s_[size_t(2 * b + 1)];
      s_[size_t(2 * b + 1)] = t % 3;
      reward[size_t(b)] = 0;
      done[size_t(b)] = ended_[size_t(b)] = ++t == 4;
      if (done[size_t(b)]) t = 0;
    }
  }

 protected:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {
    for (size_t i = 0; i + 1 < v.size(); i += 2)
      if (v[i] < 0 || v[i] >= 4 || v[i + 1] < 0 || v[i + 1] >= 3) return false;
    return true;
  }
  EnvSpec spec_;
  std::vector<int64_t> s_;
  bool truncates_;
  std::vector<uint8_t> ended_;  // the last step's ends
};

}  // namespace segtape::agent::test_envs

#ifdef SEGTAPE_ENV_TEST_PLUGIN
// ---- The plug-ins env_test loads: 1 registers two envs, 2 defines no entry
// point, 3 registers nothing, 4 registers a name that is taken.
#if SEGTAPE_ENV_TEST_PLUGIN == 1
extern "C" void segtape_register_envs() {
  using namespace segtape::agent;
  for (const char* name : {"plugin-echo", "plugin-echo-2"})  // (the second's odd streams truncated: Echo)
    register_env(name, [name](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
      return std::make_unique<test_envs::Echo>(batch, seed, name, name == std::string("plugin-echo-2"));
    });
}
#elif SEGTAPE_ENV_TEST_PLUGIN == 2
extern "C" int not_a_segtape_plugin() { return 1; }
#elif SEGTAPE_ENV_TEST_PLUGIN == 3
extern "C" void segtape_register_envs() {}
#elif SEGTAPE_ENV_TEST_PLUGIN == 4
extern "C" void segtape_register_envs() {
  using namespace segtape::agent;
  register_env("plugin-before-the-clash", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<test_envs::Echo>(batch, seed, "plugin-before-the-clash");
  });
  register_env("recall", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<test_envs::Echo>(batch, seed, "recall");
  });
}
#endif

#else  // the test program

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <sys/stat.h>
#include <unistd.h>

#include "segtape/agent/trainer.h"
#include "util.h"

using namespace segtape;
using namespace segtape::agent;
using test_envs::Echo;

namespace {

// test::message_of (util.h), with the library's Error as the default.
template <class E = Error, class F>
std::string message_of(F f) {
  return test::message_of<E>(f);
}

TrainConfig config(const std::string& env, const std::string& history, int64_t steps, int64_t batch, int64_t hidden,
                   int64_t embed) {
  TrainConfig c;
  c.env = env;
  c.history = History::parse(history);
  c.steps = steps;
  c.batch = batch;
  c.hidden = hidden;
  c.embed = embed;
  return c;
}

// Registers once per process (each test may run in a process of its own).
void ensure(const std::string& name, const EnvFactory& f) {
  if (!env_registered(name)) register_env(name, f);
}

// Echo, broken in one way from a given step on.
enum class Fault { TokenOutOfRange, TokenNegative, TokenUnwritten, RewardNaN, RewardInf, RewardUnwritten, DoneTwo, DoneUnwritten,
                   TargetOutOfRange, TargetNegative, ThrowsInt, SpecChanges, StateGrows };

class Broken final : public Echo {
 public:
  Broken(int64_t batch, uint64_t seed, std::string name, Fault f, int64_t from_step)
      : Echo(batch, seed, std::move(name)), fault_(f), from_(from_step) {}
  const EnvSpec& spec() const override {
    if (fault_ != Fault::SpecChanges || !now()) return Echo::spec();
    changed_ = Echo::spec();
    changed_.vocab = 5;  // an env whose observations grew
    return changed_;
  }
  void observe(std::span<int64_t> tokens, std::span<float> v) const override {
    if (now() && fault_ == Fault::TokenUnwritten) {  // an observe that forgets stream 1
      std::vector<int64_t> all(tokens.size());
      Echo::observe(all, v);
      tokens[0] = all[0];
      return;
    }
    Echo::observe(tokens, v);
    if (!now()) return;
    if (fault_ == Fault::TokenOutOfRange) tokens[1] = 3;  // vocab is 3
    if (fault_ == Fault::TokenNegative) tokens[1] = -1;
  }
  void targets(std::span<int64_t> y) const override {
    Echo::targets(y);
    if (!now()) return;
    if (fault_ == Fault::TargetOutOfRange) y[1] = 7;
    if (fault_ == Fault::TargetNegative) y[1] = -1;  // neither a class nor kNoTarget (-100)
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    const bool broken = now();
    ++steps_;
    if (broken && fault_ == Fault::ThrowsInt) throw 7;  // not a std::exception
    if (broken && (fault_ == Fault::RewardUnwritten || fault_ == Fault::DoneUnwritten)) {  // a step that forgets stream 1
      std::vector<float> r(reward.size());
      std::vector<uint8_t> d(done.size());
      Echo::step(a, r, d);
      for (size_t b = 0; b < r.size(); ++b) {
        if (b != 1 || fault_ != Fault::RewardUnwritten) reward[b] = r[b];
        if (b != 1 || fault_ != Fault::DoneUnwritten) done[b] = d[b];
      }
      return;
    }
    Echo::step(a, reward, done);
    if (!broken) return;
    if (fault_ == Fault::StateGrows && s_.size() == size_t(2 * batch_)) s_.push_back(0);  // (its checkpoints: unreadable)
    if (fault_ == Fault::RewardNaN) reward[1] = std::nanf("");
    if (fault_ == Fault::RewardInf) reward[1] = -std::numeric_limits<float>::infinity();
    if (fault_ == Fault::DoneTwo) done[1] = 2;
  }

 private:
  bool now() const { return steps_ + 1 >= from_; }  // the step being observed / taken, counted from 1
  Fault fault_;
  int64_t from_;
  int64_t steps_ = 0;
  mutable EnvSpec changed_;
};

// The broken env `name` (registered once), made for 2 streams.
std::unique_ptr<Env> broken(const std::string& name, Fault f, int64_t from_step) {
  ensure(name, [=](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Broken>(batch, seed, name, f, from_step);
  });
  return make_env(name, 2, 1, {});
}

// Steps env with action 0 until something throws; the message (or "" when nothing did).
std::string run_until_refused(Env& env, int steps) {
  const size_t B = size_t(env.batch()), D = size_t(std::max<int64_t>(env.spec().obs_dim, 1));
  std::vector<int64_t> tok(B), y(B), a(B, 0);
  std::vector<float> vec(B * D), r(B);
  std::vector<uint8_t> done(B);
  try {
    for (int s = 0; s < steps; ++s) {
      env.observe(tok, vec);
      env.targets(y);
      env.step(a, r, done);
    }
  } catch (const EnvContractError& e) {
    return e.what();
  }
  return "";
}

// The message names the env, the step and the wrong value; the contract is
// never refused before the step it breaks.
void expect_refused(const std::string& name, Fault f, const std::string& what) {
  SCOPED_TRACE(name);
  auto env = broken(name, f, 3);
  const std::string m = run_until_refused(*env, 10);
  EXPECT_NE(m.find("env '" + name + "', step 3: "), std::string::npos) << m;
  EXPECT_NE(m.find(what), std::string::npos) << m;
  EXPECT_NE(m.find("stream 1"), std::string::npos) << m;
  EXPECT_NE(m.find("docs/agent.md"), std::string::npos) << m;
}

// ---------------------------------------------------------------- registry

// Python registers an env with every segtape.gym.train, also while a thread
// that released the GIL makes one (segtape.retention.run): the registry is
// locked (a push_back moved the vectors under a reader: ASan's
// heap-use-after-free in CI's sanitizer build). In a child process, so that
// its thousands of names stay out of this process's registry.
TEST(EnvRegistry, RegisteringWhileOtherThreadsMakeEnvsIsSafe) {
  EXPECT_EXIT(
      {
        std::thread maker([] {
          for (int i = 0; i < 3000; ++i) {
            auto env = make_env("recall", 1, uint64_t(i), {});
            if (env->spec().name != "recall" || env_names().size() < 3) std::exit(3);
          }
        });
        EnvFactory f = [](int64_t b, uint64_t seed, const EnvOptions& o) { return make_env("recall", b, seed, o); };
        for (int i = 0; i < 3000; ++i) register_env("stress-" + std::to_string(i), f);
        maker.join();
        std::exit(make_env("stress-2999", 2, 1, {})->spec().name == "recall" && env_names().size() >= 3003 ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(EnvRegistry, TheBuiltInsComeFirst) {
  ASSERT_GE(env_names().size(), 3u);
  const std::vector<std::string> known = env_names();
  EXPECT_EQ(std::vector<std::string>(known.begin(), known.begin() + 3),
            (std::vector<std::string>{"recall", "tmaze", "dialogue"}));
}

TEST(EnvRegistry, ARegisteredEnvIsMadeByName) {
  ensure("echo", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "echo");
  });
  EXPECT_TRUE(env_registered("echo"));
  auto env = make_env("echo", 3, 1, {});
  EXPECT_EQ(env->batch(), 3);
  EXPECT_EQ(env->spec().vocab, 3);
  EXPECT_EQ(run_until_refused(*env, 20), "");
  EXPECT_GT(env->score(), 0.0) << "score() goes through to the env";  // Echo: action 0 is right 1 step in 3
  env->reset_score();
  EXPECT_EQ(env->score(), 0.0) << "reset_score() goes through to the env";
}

TEST(EnvRegistry, ANameTakenTwiceIsRefused) {
  const auto echo = [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "twice");
  };
  ensure("twice", echo);
  EXPECT_NE(message_of([&] { register_env("twice", echo); }).find("an env named 'twice' is already registered"), std::string::npos);
  EXPECT_NE(message_of([&] { register_env("recall", echo); }).find("'recall' is already registered"), std::string::npos);
}

TEST(EnvRegistry, AnEmptyOrOddNameOrAnEmptyFactoryIsRefused) {
  const auto echo = [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "x");
  };
  EXPECT_NE(message_of([&] { register_env("", echo); }).find("the env name is empty"), std::string::npos);
  for (const char* odd : {"two words", "a/b", "a,b"})
    EXPECT_NE(message_of([&] { register_env(odd, echo); }).find("has a character other than"), std::string::npos) << odd;
  EXPECT_NE(message_of([&] { register_env("no-factory", EnvFactory{}); }).find("factory of env 'no-factory' is empty"),
            std::string::npos);
  EXPECT_FALSE(env_registered("no-factory"));
}

TEST(EnvRegistry, AnUnknownNameListsTheRegisteredOnes) {
  ensure("echo", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "echo");
  });
  const std::string m = message_of([] { (void)make_env("chess", 2, 1, {}); });
  EXPECT_NE(m.find("unknown env 'chess' (registered: recall, tmaze, dialogue, "), std::string::npos) << m;
  EXPECT_NE(m.find("echo"), std::string::npos) << m;
}

// A class defined outside the library implements the protected state hooks,
// and the checking wrapper hands save_state / load_state through: a resumed
// env continues exactly, and a damaged state is refused by its valid_state.
TEST(EnvRegistry, AnEnvOfOnesOwnSavesAndLoadsItsState) {
  ensure("echo", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "echo");
  });
  auto a = make_env("echo", 2, 1, {}), b = make_env("echo", 2, 1, {});
  (void)run_until_refused(*a, 3);
  const std::vector<int64_t> s = a->save_state();
  b->load_state(s);
  EXPECT_EQ(b->save_state(), s);
  std::vector<int64_t> bad = s;
  bad.back() = 9;  // a previous token outside [0, 3)
  EXPECT_NE(message_of([&] { b->load_state(bad); }).find("env 'echo': saved state is out of range"), std::string::npos);
}

// ---------------------------------------------------------------- contract

TEST(EnvContract, ATokenOutOfRangeIsRefused) {
  expect_refused("bad-token", Fault::TokenOutOfRange, "the token 3, outside [0, 3) (spec().vocab)");
  expect_refused("bad-token-negative", Fault::TokenNegative, "the token -1, outside [0, 3)");
}

TEST(EnvContract, AnUnwrittenTokenIsRefused) {
  expect_refused("bad-token-unwritten", Fault::TokenUnwritten, "observe() left the token of stream 1 unwritten");
}

TEST(EnvContract, ANonFiniteRewardIsRefused) {
  expect_refused("bad-reward-nan", Fault::RewardNaN, "rewards must be finite");
  expect_refused("bad-reward-inf", Fault::RewardInf, "the reward -inf to stream 1");
  expect_refused("bad-reward-unwritten", Fault::RewardUnwritten, "step() left the reward of stream 1 unwritten");
}

TEST(EnvContract, DoneOtherThanZeroOrOneIsRefused) {
  expect_refused("bad-done", Fault::DoneTwo, "set done of stream 1 to 2; done is 0 or 1");
  expect_refused("bad-done-unwritten", Fault::DoneUnwritten, "step() left done of stream 1 unwritten (or set it to 255, the mark of an unwritten one); done is 0 or 1");
}

// A step that changes the number of state_ints() is refused at that step,
// naming the env and the sizes: a checkpoint written after it could not be
// read back by a fresh env.
TEST(EnvContract, AStateThatChangesSizeIsRefusedAtItsStep) {
  auto env = broken("bad-state-grows", Fault::StateGrows, 3);
  const std::string m = run_until_refused(*env, 10);
  EXPECT_NE(m.find("env 'bad-state-grows', step 3: step() changed the number of state_ints() from 4 to 5; "), std::string::npos) << m;
  EXPECT_NE(m.find("docs/agent.md"), std::string::npos) << m;
}

TEST(EnvContract, ATargetOutOfRangeIsRefused) {
  expect_refused("bad-target", Fault::TargetOutOfRange, "the target 7, outside [0, 3) (spec().num_actions) and not kNoTarget");
  expect_refused("bad-target-negative", Fault::TargetNegative, "the target -1, outside [0, 3)");
}

// Vector observations: a value that is not finite, or an observation shorter
// than obs_dim (values left unwritten), is refused.
class Vectors : public Env {
 public:
  Vectors(int64_t batch, uint64_t seed, int64_t dim, int64_t writes, bool nan_at_3)
      : Env(batch, seed), writes_(writes), nan_at_3_(nan_at_3) {
    spec_ = {"vectors", 0, dim, 2, true, "accuracy"};
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t>, std::span<float> v) const override {
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t d = 0; d < writes_; ++d) v[size_t(b * spec_.obs_dim + d)] = 0.5f;
    if (nan_at_3_ && t_ + 1 == 3) v[size_t(spec_.obs_dim + 1)] = std::nanf("");
  }
  void step(std::span<const int64_t>, std::span<float> reward, std::span<uint8_t> done) override {
    ++t_;
    for (int64_t b = 0; b < batch_; ++b) reward[size_t(b)] = 0, done[size_t(b)] = 0;
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t>) const override { return true; }
  EnvSpec spec_;
  int64_t writes_;
  bool nan_at_3_;
  int64_t t_ = 0;
  std::vector<int64_t> s_;
};

TEST(EnvContract, ANonFiniteOrShortVectorObservationIsRefused) {
  ensure("bad-vector-nan", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Vectors>(batch, seed, 4, 4, true);
  });
  ensure("bad-vector-short", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Vectors>(batch, seed, 4, 3, false);  // obs_dim 4, writes 3 values per stream
  });
  auto nan = make_env("bad-vector-nan", 2, 1, {});
  std::string m = run_until_refused(*nan, 10);
  EXPECT_NE(m.find("env 'bad-vector-nan', step 3: observe() gave stream 1 the value nan at 1; observations must be finite"),
            std::string::npos)
      << m;
  auto shorter = make_env("bad-vector-short", 2, 1, {});
  m = run_until_refused(*shorter, 10);
  EXPECT_NE(m.find("env 'bad-vector-short', step 1: observe() left value 3 of stream 0 unwritten (obs_dim is 4)"), std::string::npos)
      << m;
}

TEST(EnvContract, AnImpossibleSpecOrBatchIsRefusedWhenMade) {
  struct Spec final : Vectors {
    Spec(int64_t batch, EnvSpec s) : Vectors(batch, 1, 1, 1, false), s_(std::move(s)) {}
    const EnvSpec& spec() const override { return s_; }
    EnvSpec s_;
  };
  const std::vector<std::pair<EnvSpec, std::string>> cases = {
      {{"both", 3, 4, 2, true, "accuracy"}, "spec() has vocab 3 and obs_dim 4; exactly one must be > 0"},
      {{"neither", 0, 0, 2, true, "accuracy"}, "spec() has vocab 0 and obs_dim 0"},
      {{"no-actions", 3, 0, 0, true, "accuracy"}, "spec().num_actions is 0; must be >= 1"},
      {{"no-measure", 3, 0, 2, true, ""}, "spec().measure is empty"},
      {{"comma-measure", 3, 0, 2, true, "success,rate"}, "spec().measure 'success,rate' holds a comma"},
  };
  for (const auto& [spec, what] : cases) {
    const std::string name = "bad-spec-" + spec.name;
    ensure(name, [spec = spec](int64_t batch, uint64_t, const EnvOptions&) -> std::unique_ptr<Env> {
      return std::make_unique<Spec>(batch, spec);
    });
    const std::string m = message_of<EnvContractError>([&] { (void)make_env(name, 2, 1, {}); });
    EXPECT_NE(m.find("env '" + name + "': " + what), std::string::npos) << m;
  }
  ensure("bad-batch", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch + 1, seed, "bad-batch");
  });
  EXPECT_NE(message_of<EnvContractError>([] { (void)make_env("bad-batch", 2, 1, {}); }).find("batch() is 3, but it was made for 2 streams"),
            std::string::npos);
  ensure("bad-null", [](int64_t, uint64_t, const EnvOptions&) -> std::unique_ptr<Env> { return nullptr; });
  EXPECT_NE(message_of<EnvContractError>([] { (void)make_env("bad-null", 2, 1, {}); }).find("its factory returned no env"),
            std::string::npos);
}

// An env's code that throws something other than a std::exception (which
// nothing could catch by type: the program would terminate) becomes an
// EnvContractError naming the env, the call and the step; and a spec() that
// changes is refused before the env is called with it (it would fill the
// buffers sized by the old one past their end).
TEST(EnvContract, ANonStdExceptionOrAChangingSpecIsRefused) {
  {
    auto env = broken("bad-throws-int", Fault::ThrowsInt, 3);
    const std::string m = run_until_refused(*env, 10);
    EXPECT_NE(m.find("env 'bad-throws-int', step 3: step() threw an exception that is not a std::exception"), std::string::npos) << m;
  }
  {
    auto env = broken("bad-spec-changes", Fault::SpecChanges, 3);
    EXPECT_EQ(env->spec().vocab, 3);
    const std::string m = run_until_refused(*env, 10);
    EXPECT_NE(m.find("env 'bad-spec-changes', step 3: spec() changed before observe(): vocab 3 -> 5"), std::string::npos) << m;
    EXPECT_EQ(env->spec().vocab, 3) << "the checked env reports the spec it was made with";
  }
  ensure("bad-factory-throws", [](int64_t, uint64_t, const EnvOptions&) -> std::unique_ptr<Env> { throw 7; });
  EXPECT_NE(message_of<EnvContractError>([] { (void)make_env("bad-factory-throws", 2, 1, {}); })
                .find("env 'bad-factory-throws': its factory threw an exception that is not a std::exception"),
            std::string::npos);
}

// The caller's side of the contract: an action out of range, or buffers too
// small for B streams, are refused before the env sees them.
TEST(EnvContract, ACallersActionOutOfRangeOrShortBufferIsRefused) {
  auto env = make_env("recall", 2, 1, {});
  std::vector<int64_t> tok(2), a = {0, 4};  // recall's 4 actions: 0..3
  std::vector<float> vec(2), r(2);
  std::vector<uint8_t> done(2);
  env->observe(tok, vec);
  EXPECT_NE(message_of([&] { env->step(a, r, done); }).find("env 'recall', step 1: the caller's action 4 for stream 1 is outside [0, 4)"),
            std::string::npos);
  std::vector<int64_t> one(1);
  EXPECT_NE(message_of([&] { env->observe(one, vec); }).find("the caller's token buffer holds 1 values; this env's 2 streams need 2"),
            std::string::npos);
}

// The built-ins keep the contract over whole episodes (every action, every kind of step).
TEST(EnvContract, TheBuiltInsKeepIt) {
  for (const char* name : {"recall", "tmaze", "dialogue"}) {
    SCOPED_TRACE(name);
    auto env = make_env(name, 8, 3, {});
    const size_t B = 8, D = size_t(std::max<int64_t>(env->spec().obs_dim, 1));
    std::vector<int64_t> tok(B), y(B), a(B);
    std::vector<float> vec(B * D), r(B);
    std::vector<uint8_t> done(B);
    nn::Rng rng(5);
    for (int s = 0; s < 500; ++s) {
      env->observe(tok, vec);
      env->targets(y);
      for (int64_t& x : a) x = int64_t(rng.next_u64() % uint64_t(env->spec().num_actions));
      ASSERT_NO_THROW(env->step(a, r, done)) << "step " << s + 1;
    }
  }
}

// The Trainer gets its env from make_env, so it gets the checks: a broken
// env stops training with the env's name and step.
TEST(EnvContract, TheTrainerRefusesABrokenEnv) {
  (void)broken("bad-reward-trainer", Fault::RewardNaN, 5);
  Trainer tr(config("bad-reward-trainer", "tbptt:4", 64, 2, 8, 4));
  const std::string m = message_of<EnvContractError>([&] {
    while (!tr.done()) (void)tr.run_segment();
  });
  EXPECT_NE(m.find("env 'bad-reward-trainer', step 5: step() gave the reward nan to stream 1"), std::string::npos) << m;
  EXPECT_EQ(tr.step(), 4) << "the segment that met the broken step did not complete";
}

// The size check counts the observation each step keeps: an env with large
// vector observations is refused before training, naming them, where it
// used to pass the check and fill the budget at its seventh step.
TEST(EnvContract, LargeObservationsCountInTheSizeCheck) {
  ensure("big-observations", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Vectors>(batch, seed, 70000, 70000, false);
  });
  TrainConfig c = config("big-observations", "tbptt:32", 64, 32, 16, 8);
  const SizeEstimate e = Trainer::estimate(c);
  EXPECT_EQ(e.observation_bytes, align_up(size_t(32) * 70000 * sizeof(float)));
  const std::string m = message_of<BudgetError>([&] { Trainer tr(c); });
  EXPECT_NE(m.find("a segment of 32 steps keeps at least"), std::string::npos) << m;
  EXPECT_NE(m.find("the observations alone 8.5 MiB per step"), std::string::npos) << m;
}

// A registered env trains through the Trainer like a built-in one.
TEST(EnvRegistry, TheTrainerTrainsARegisteredEnv) {
  ensure("echo", [](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
    return std::make_unique<Echo>(batch, seed, "echo");
  });
  Trainer tr(config("echo", "tbptt:8", 1600, 8, 16, 8));
  while (!tr.done()) (void)tr.run_segment();
  EXPECT_GT(tr.evaluate(200, 9), 0.9) << "echo (the previous token) is learned";
}

// truncations() checked: a stream said truncated that step() did not end, a
// flag other than 0 or 1, a final token out of range, and a return value
// that says otherwise than the flags are refused naming the env, the step
// and the stream; the rows of the streams not truncated come back 0.
TEST(EnvContract, TruncationsAreChecked) {
  enum class Bad { NotDone, Two, Token, Returns, None };
  class BadTruncations final : public Echo {
   public:
    BadTruncations(int64_t batch, uint64_t seed, std::string name, Bad bad) : Echo(batch, seed, std::move(name), true), bad_(bad) {}
    bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float> v) const override {
      const bool any = Echo::truncations(truncated, tokens, v);
      tokens[0] = 7;  // (stream 0 is never truncated: a row the checks give back as 0)
      if (bad_ == Bad::NotDone) truncated[0] = 1;
      if (bad_ == Bad::Two && any) truncated[1] = 2;
      if (bad_ == Bad::Token && any) tokens[1] = 3;
      return bad_ == Bad::Returns ? true : any;
    }

   private:
    Bad bad_;
  };
  for (const auto& [bad, what] : std::vector<std::pair<Bad, std::string>>{
           {Bad::NotDone, "says the episode of stream 0 was truncated, but step() did not end it (done 0)"},
           {Bad::Two, "set truncated of stream 1 to 2; it is 0 or 1"},
           {Bad::Token, "gave stream 1 the final token 3, outside [0, 3)"},
           {Bad::Returns, "returned true but truncated no stream"},
           {Bad::None, ""}}) {
    const std::string name = "bad-truncations-" + std::to_string(int(bad));
    SCOPED_TRACE(name);
    ensure(name, [name, bad = bad](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
      return std::make_unique<BadTruncations>(batch, seed, name, bad);
    });
    auto env = make_env(name, 2, 1, {});
    std::vector<int64_t> tok(2), a(2, 0), final_tok(2);
    std::vector<float> r(2);
    std::vector<uint8_t> done(2), truncated(2);
    std::string m;
    for (int s = 1; s <= 4 && m.empty(); ++s) {
      env->observe(tok, {});
      env->step(a, r, done);
      try {
        (void)env->truncations(truncated, final_tok, {});
      } catch (const EnvContractError& e) {
        m = e.what();
      }
      if (m.empty()) {
        EXPECT_EQ(final_tok[0], 0) << "step " << s;
      }
    }
    if (what.empty()) {
      EXPECT_EQ(m, "");
      EXPECT_EQ(truncated, (std::vector<uint8_t>{0, 1}));
      continue;
    }
    EXPECT_NE(m.find("env '" + name + "', step "), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------- plug-ins

#ifdef SEGTAPE_ENV_TEST_PLUGINS
const std::string kPlugin = SEGTAPE_ENV_TEST_PLUGIN_1, kNotPlugin = SEGTAPE_ENV_TEST_PLUGIN_2, kEmpty = SEGTAPE_ENV_TEST_PLUGIN_3,
                  kClash = SEGTAPE_ENV_TEST_PLUGIN_4;

TEST(EnvPlugin, LoadingRegistersItsEnvsOnce) {
  const std::vector<std::string> names = load_env_plugin(kPlugin);
  EXPECT_EQ(names, (std::vector<std::string>{"plugin-echo", "plugin-echo-2"}));
  EXPECT_TRUE(env_registered("plugin-echo") && env_registered("plugin-echo-2"));
  const size_t n = env_names().size();
  EXPECT_EQ(load_env_plugin(kPlugin), names) << "a second load registers nothing and says what the first did";
  EXPECT_EQ(env_names().size(), n);
  auto env = make_env("plugin-echo", 2, 1, {});
  EXPECT_EQ(env->spec().name, "plugin-echo");
  EXPECT_EQ(run_until_refused(*env, 10), "");
}

// A plug-in's env reports both flags: plugin-echo-2 cuts its odd streams'
// episodes by a time limit (Echo), and through make_env's checks
// truncations() gives those streams, at the step their episode ended, with
// the observation they were cut at; plugin-echo, an env that does not
// override it, truncates none.
TEST(EnvPlugin, APlugInsEnvReportsTerminatedAndTruncatedApart) {
  (void)load_env_plugin(kPlugin);
  for (const char* name : {"plugin-echo", "plugin-echo-2"}) {
    SCOPED_TRACE(name);
    const bool truncates = name == std::string("plugin-echo-2");
    auto env = make_env(name, 2, 1, {});
    std::vector<int64_t> tok(2), a(2, 0), final_tok(2);
    std::vector<float> r(2);
    std::vector<uint8_t> done(2), truncated(2);
    for (int s = 1; s <= 8; ++s) {
      env->observe(tok, {});
      env->step(a, r, done);
      const bool any = env->truncations(truncated, final_tok, {});
      const bool end = s % 4 == 0;
      EXPECT_EQ(done, (std::vector<uint8_t>{uint8_t(end), uint8_t(end)})) << "step " << s;
      EXPECT_EQ(truncated, (std::vector<uint8_t>{0, uint8_t(end && truncates)})) << "step " << s;
      EXPECT_EQ(any, end && truncates) << "step " << s;
      if (end && truncates) {
        EXPECT_EQ(final_tok[1], 1) << "the observation stream 1 was cut at";
      }
    }
  }
}

TEST(EnvPlugin, AMissingFileOrAFileThatIsNotAPluginIsRefused) {
  const std::string dir = std::filesystem::path(kPlugin).parent_path().string();
  EXPECT_EQ(message_of([&] { (void)load_env_plugin(dir + "/no-such-plugin.so"); }), dir + "/no-such-plugin.so: no such file");
  EXPECT_NE(message_of([&] { (void)load_env_plugin(dir); }).find("is a directory"), std::string::npos);
  EXPECT_NE(message_of([] { (void)load_env_plugin(SEGTAPE_SOURCE_DIR "/tests/env_test.cpp"); })
                .find("env_test.cpp: cannot load it as a shared library ("),
            std::string::npos);
  EXPECT_EQ(message_of([&] { (void)load_env_plugin(kNotPlugin); }),
            kNotPlugin + ": not a segtape env plug-in (it defines no extern \"C\" void segtape_register_envs())");
  EXPECT_EQ(message_of([&] { (void)load_env_plugin(kEmpty); }),
            kEmpty + ": segtape_register_envs() registered no env (call register_env in it)");
  // dlopen of a FIFO waited for a writer forever.
  const std::string fifo = (std::filesystem::temp_directory_path() / ("segtape-env-fifo-" + std::to_string(getpid()) + ".so")).string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  EXPECT_EQ(message_of([&] { (void)load_env_plugin(fifo); }), fifo + ": not a regular file, not a shared library");
  std::filesystem::remove(fifo);
  EXPECT_EQ(message_of([] { (void)load_env_plugin("/dev/null"); }), "/dev/null: not a regular file, not a shared library");
}

TEST(EnvPlugin, AFailedRegistrationLeavesTheRegistryAsItWas) {
  const std::vector<std::string> before = env_names();
  const std::string m = message_of([&] { (void)load_env_plugin(kClash); });
  EXPECT_NE(m.find(kClash + ": segtape_register_envs() failed: register_env: an env named 'recall' is already registered"),
            std::string::npos)
      << m;
  EXPECT_EQ(env_names(), before) << "the name it registered before failing is gone again";
}
#endif

}  // namespace

#endif  // SEGTAPE_ENV_TEST_PLUGIN
