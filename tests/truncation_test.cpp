// Episodes cut by a time limit (Env::truncations) are bootstrapped from the
// value of the observation they were cut at, in A2C's n-step returns and in
// PPO's advantages (Step::bootstrap_truncated); episodes the task ended are
// not. The env here pays 1 at every step and cuts each episode after L steps:
// with the cut bootstrapped every state is worth 1 / (1 - gamma), as if the
// episode went on; without, the last step before the cut is worth 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "segtape/agent/trainer.h"
#include "segtape/ops.h"

using namespace segtape;
using namespace segtape::agent;

namespace {

// Token 0 at every step, reward 1 for either action, each stream's episode
// cut after L steps: truncated (a time limit; its final observation token
// 0), or with `terminates` ended by the task.
class TimeLimit final : public Env {
 public:
  TimeLimit(int64_t batch, uint64_t seed, const std::string& name, int64_t limit, bool terminates)
      : Env(batch, seed), limit_(limit), terminates_(terminates), cut_(size_t(batch), 0) {
    spec_ = {name, 1, 0, 2, false, "success"};
    s_.assign(size_t(batch), 0);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float>) const override { std::fill_n(tokens.begin(), batch_, 0); }
  void step(std::span<const int64_t>, std::span<float> reward, std::span<uint8_t> done) override {
    for (size_t b = 0; b < size_t(batch_); ++b) {
      reward[b] = 1.0f;
      done[b] = cut_[b] = uint8_t(++s_[b] == limit_);
      if (done[b]) s_[b] = 0, ++score_den_;
    }
  }
  bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float>) const override {
    bool any = false;
    for (size_t b = 0; b < size_t(batch_); ++b) {
      truncated[b] = uint8_t(cut_[b] && !terminates_);
      if (truncated[b]) tokens[b] = 0, any = true;
    }
    return any;
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {
    return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x >= 0 && x < limit_; });
  }
  int64_t limit_;
  bool terminates_;
  std::vector<uint8_t> cut_;  // the last step's ends
  EnvSpec spec_;
  std::vector<int64_t> s_;  // each stream's step in its episode
};

void ensure_envs(int64_t limit) {
  for (const bool terminates : {false, true}) {
    const std::string name = std::string(terminates ? "time-limit-terminates-" : "time-limit-") + std::to_string(limit);
    if (!env_registered(name))
      register_env(name, [name, limit, terminates](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
        return std::make_unique<TimeLimit>(batch, seed, name, limit, terminates);
      });
  }
}

TrainConfig config(const std::string& env, const std::string& history, Algo algo) {
  TrainConfig c;
  c.env = env;
  c.algo = algo;
  c.history = History::parse(history);
  c.batch = 2;
  c.hidden = 8;
  c.embed = 4;
  return c;
}

// The policy's value at each step of an episode, from the zero state.
std::vector<double> values_along_an_episode(Trainer& tr, int64_t limit) {
  Tape& t = tr.tape();
  const Policy& p = tr.policy();
  Segment seg = t.segment();
  NoGradGuard ng(t);
  Tensor h = t.zeros({1, tr.config().hidden});
  std::vector<double> v;
  const std::vector<int64_t> token{0};
  for (int64_t k = 0; k < limit; ++k) {
    h = p.recur(p.encode(t.from(std::span<const int64_t>(token), {1})), h);
    v.push_back(p.value(p.output(h)).item());
  }
  return v;
}

}  // namespace

// A2C's first update, from a policy whose head gives both actions the same
// probability and whose value is 1 everywhere (their weights 0, the value's
// bias 1), gamma 0.5, no entropy bonus: its loss is the sum over the 8 steps
// of log 2 * adv + 0.5 * value_coef * adv^2, adv = R - 1, and the returns R
// are the hand computation below — the cut at steps 3 and 6 (limit 3)
// bootstrapped: that step's reward 1 + gamma * 1 — under tbptt, and under
// exact windows, whose replays read the rewards their first pass kept. The
// same env ending its episodes instead gives another loss.
TEST(Truncation, A2cReturnsBootstrapTheCutByHand) {
  ensure_envs(3);
  const double gamma = 0.5, value_coef = 0.5;
  auto expected = [&](bool bootstrapped) {
    std::vector<double> R(8);
    double next = 1.0;  // the value after the update's last step
    for (int t = 7; t >= 0; --t) {
      const bool cut = t % 3 == 2;
      R[size_t(t)] = 1.0 + (cut ? (bootstrapped ? gamma * 1.0 : 0.0) : gamma * next);
      next = R[size_t(t)];
    }
    double loss = 0;
    for (double r : R) loss += std::log(2.0) * (r - 1) + 0.5 * value_coef * (r - 1) * (r - 1);
    return loss;
  };
  EXPECT_NEAR(expected(true), std::log(2.0) * 5.5 + 0.25 * 3.96875, 1e-12);  // (R = 1.875, 1.75, 1.5, 1.875, 1.75, 1.5, 1.75, 1.5)
  for (const char* history : {"tbptt:8", "exact:4/8"})
    for (const bool terminates : {false, true}) {
      SCOPED_TRACE(std::string(history) + (terminates ? ", terminated" : ", truncated"));
      TrainConfig c = config(terminates ? "time-limit-terminates-3" : "time-limit-3", history, Algo::A2c);
      c.gamma = gamma, c.value_coef = value_coef, c.entropy = 0, c.steps = 8;
      Trainer tr(c);
      for (const auto& [name, w] : tr.policy().named_parameters()) {
        if (name.rfind("head.", 0) != 0 && name.rfind("value.", 0) != 0) continue;
        std::vector<float> v(size_t(w.numel()), name == "value.bias" ? 1.0f : 0.0f);
        w.from_host(std::span<const float>(v));
      }
      const UpdateResult r = tr.run_segment();
      ASSERT_EQ(r.steps, 8);
      EXPECT_NEAR(r.loss_sum, expected(!terminates), 1e-5);
    }
  EXPECT_GT(std::fabs(expected(true) - expected(false)), 1.0);
}

// Learning: A2C and PPO on the env that pays 1 a step, gamma 0.5, episodes
// of 4 steps. Cut by a time limit and bootstrapped, every state of an
// episode is worth 1 / (1 - gamma) = 2; ended by the task, the last step's
// is worth 1 and the first's 1.875.
TEST(Truncation, A2cAndPpoLearnTheValueOfAStateCutByATimeLimit) {
  ensure_envs(4);
  for (const Algo algo : {Algo::A2c, Algo::Ppo})
    for (const bool terminates : {false, true}) {
      SCOPED_TRACE(std::string(algo == Algo::A2c ? "a2c" : "ppo") + (terminates ? ", terminated" : ", truncated"));
      TrainConfig c = config(terminates ? "time-limit-terminates-4" : "time-limit-4", "tbptt:8", algo);
      c.gamma = 0.5, c.entropy = 0, c.lr = 1e-2, c.steps = 4000;
      if (algo == Algo::Ppo) c.rollout = 16, c.epochs = 4, c.minibatches = 1, c.gae_lambda = 0.95;
      Trainer tr(c);
      while (!tr.done()) tr.run_segment();
      const std::vector<double> v = values_along_an_episode(tr, 4);
      const std::vector<double> want = terminates ? std::vector<double>{1.875, 1.75, 1.5, 1.0} : std::vector<double>{2, 2, 2, 2};
      for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(v[k], want[k], 0.1) << "the value at step " << k + 1 << " of the episode";
    }
}
