// Updates whose gradient is not finite (TrainConfig::nonfinite): the
// gradient's norm, computed for the clip, is checked before the optimizer
// steps. "stop" throws NonFiniteError naming the update, its steps and the
// first parameter whose gradient is not finite, the parameters and the
// optimizer as they were; "skip" leaves the update out, counts it (kept in
// checkpoints), and throws after max_skips in a row. The env here pays 1 a
// step, and `huge` (3e38, finite: the env boundary takes it) from step
// `from` on: the returns of two such rewards overflow float32.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "agent_util.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/optim.h"
#include "segtape/ops.h"
#include "util.h"

using namespace segtape;
using namespace segtape::agent;
using segtape::test::params_of;
namespace fs = std::filesystem;

namespace {

class HugeRewards final : public Env {
 public:
  HugeRewards(int64_t batch, uint64_t seed, const std::string& name, int64_t from, int64_t until, bool thirds)
      : Env(batch, seed), from_(from), until_(until), thirds_(thirds) {
    spec_ = {name, 3, 0, 2, false, "success"};
    t_.assign(size_t(batch), 0);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float>) const override {
    for (size_t b = 0; b < size_t(batch_); ++b) tokens[b] = t_[b] % 3;
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (size_t b = 0; b < size_t(batch_); ++b) {
      const int64_t t = ++t_[b];
      // (thirds: only in two of every three 8-step segments)
      const bool huge = t > from_ && t <= until_ && (!thirds_ || (t - 1) / 8 % 3 != 2);
      reward[b] = huge ? 3e38f : float(a[b]);
      done[b] = 0;
    }
  }

 private:
  std::vector<int64_t>& state_ints() override { return t_; }
  bool valid_state(std::span<const int64_t> v) const override {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 0; });
  }
  int64_t from_, until_;
  bool thirds_;
  EnvSpec spec_;
  std::vector<int64_t> t_;  // each stream's steps so far
};

// "huge-F-U": 3e38 at the steps after F up to U (thirds: in the first two
// of every three 8-step segments only).
std::string huge_env(int64_t from, int64_t until, bool thirds = false) {
  const std::string name = "huge-" + std::to_string(from) + "-" + std::to_string(until) + (thirds ? "-thirds" : "");
  if (!env_registered(name))
    register_env(name, [name, from, until, thirds](int64_t batch, uint64_t seed, const EnvOptions&) -> std::unique_ptr<Env> {
      return std::make_unique<HugeRewards>(batch, seed, name, from, until, thirds);
    });
  return name;
}

TrainConfig config(const std::string& env, Algo algo, const std::string& policy) {
  TrainConfig c = test::small_config(env, "tbptt:8", 64);
  c.algo = algo;
  c.rollout = 8, c.epochs = 2, c.minibatches = 2;
  c.gamma = 0.99;
  c.nonfinite = policy;
  return c;
}

}  // namespace

// grad_norm and clip_grads_with_norm are clip_grad_norm's halves, bit for
// bit; first_non_finite_grad names the first parameter holding an inf.
TEST(NonFinite, TheClipsHalvesAreTheClip) {
  Tape tape;
  nn::Rng ra(3), rb(3);
  nn::Linear a(tape, ra, 5, 4), b(tape, rb, 5, 4);
  const std::vector<float> x{1, -2, 3, 0.5f, 4, 2, -1, 0, 1, 2};
  for (nn::Linear* m : {&a, &b}) {
    Segment seg = tape.segment();
    const Tensor y = (*m)(tape.from(std::span<const float>(x), {2, 5}));
    seg.backward(sum(mul(y, y)));
  }
  const double total = nn::grad_norm(b);
  EXPECT_GT(total, 0.5);
  EXPECT_EQ(nn::clip_grad_norm(a, 0.5), total);
  nn::clip_grads_with_norm(b, 0.5, total);
  EXPECT_EQ(a.weight.grad_tensor().to_host<float>(), b.weight.grad_tensor().to_host<float>());
  EXPECT_EQ(a.bias.grad_tensor().to_host<float>(), b.bias.grad_tensor().to_host<float>());
  EXPECT_EQ(nn::first_non_finite_grad(a), "");
  static_cast<float*>(b.bias.grad)[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nn::first_non_finite_grad(b), "bias [4]");
  EXPECT_FALSE(std::isfinite(nn::grad_norm(b)));
}

// --nonfinite stop: the first update over a step paid 3e38 (segment 3,
// steps 16 to 24) throws, naming it; the parameters and the step are as
// before it, and a checkpoint written before it loads (its parameters).
TEST(NonFinite, StopNamesTheUpdateAndUpdatesNothing) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_nonfinite_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const Algo algo : {Algo::A2c, Algo::Ppo}) {
    SCOPED_TRACE(algo_name(algo));
    const TrainConfig c = config(huge_env(20, 1000), algo, "stop");
    Trainer tr(c);
    tr.run_segment(), tr.run_segment();  // steps 0 to 16: rewards 0 and 1
    tr.save(dir / "ck.safetensors");
    const std::vector<float> before = params_of(tr);
    const std::string m = test::message_of<NonFiniteError>([&] { tr.run_segment(); });
    // A2C: one update a segment; PPO: 2 epochs x 2 minibatches an iteration.
    const std::string update = algo == Algo::A2c ? "update 3," : "update 9,";
    EXPECT_EQ(m.rfind(update + " in the segment of steps 16 to 24: the gradient's norm is ", 0), 0u) << m;
    EXPECT_NE(m.find("the first parameter whose gradient is not finite is "), std::string::npos) << m;
    EXPECT_NE(m.find("--nonfinite skip"), std::string::npos) << m;
    EXPECT_EQ(params_of(tr), before);
    EXPECT_EQ(tr.step(), 16);
    EXPECT_EQ(tr.skipped_updates(), 0);
    Trainer back(c);
    back.load(dir / "ck.safetensors");
    EXPECT_EQ(params_of(back), before);
    // The trainer stopped part-way through the segment (its env moved on):
    // it trains, saves and evaluates again only once a checkpoint is loaded.
    const std::string again = update.substr(0, update.size() - 1) + " (steps 16 to 24)";
    EXPECT_NE(test::message_of<NonFiniteError>([&] { tr.run_segment(); }).find("run_segment: this trainer stopped at the non-finite " + again),
              std::string::npos);
    EXPECT_NE(test::message_of<NonFiniteError>([&] { tr.save(dir / "no.safetensors"); }).find("save: this trainer stopped"), std::string::npos);
    EXPECT_FALSE(fs::exists(dir / "no.safetensors"));
    EXPECT_NE(test::message_of<NonFiniteError>([&] { (void)tr.evaluate(8, 1); }).find("load a checkpoint first"), std::string::npos);
    tr.load(dir / "ck.safetensors");
    EXPECT_EQ(params_of(tr), before);
    EXPECT_EQ(tr.step(), 16);
  }
  fs::remove_all(dir);
}

// --nonfinite skip: the updates over the 3e38 steps (21 to 24) are left out
// and counted (A2C: segment 3's one; PPO: iteration 3's four), the run goes
// on to its end with finite parameters, and the count is kept in the
// checkpoint (written only where > 0) and read back by a resumed run, which
// continues bit for bit.
TEST(NonFinite, SkipLeavesTheUpdatesOutAndCountsThem) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_nonfinite_skip_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const Algo algo : {Algo::A2c, Algo::Ppo}) {
    SCOPED_TRACE(algo_name(algo));
    const TrainConfig c = config(huge_env(20, 24), algo, "skip");
    Trainer tr(c);
    tr.run_segment(), tr.run_segment();
    const std::vector<float> before = params_of(tr);
    const UpdateResult r = tr.run_segment();
    EXPECT_FALSE(std::isfinite(r.loss_sum));
    const int64_t skipped = algo == Algo::A2c ? 1 : 4;
    EXPECT_EQ(tr.skipped_updates(), skipped);
    EXPECT_EQ(params_of(tr), before);
    EXPECT_EQ(tr.step(), 24);
    tr.run_segment();
    EXPECT_NE(params_of(tr), before) << "the updates after the skipped ones are taken";
    const TrainConfig resumed = test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32);
    EXPECT_EQ(resumed.nonfinite, "stop") << "the policy is not in the checkpoint";
    Trainer back(c);
    back.load(dir / "ck.safetensors");
    EXPECT_EQ(back.skipped_updates(), skipped);
    while (!tr.done()) tr.run_segment();
    for (const float x : params_of(tr)) ASSERT_TRUE(std::isfinite(x));
    EXPECT_EQ(tr.skipped_updates(), skipped);
  }
  fs::remove_all(dir);
}

// --max-skips N: the Nth update in a row whose gradient is not finite
// throws, naming the count; a finite one in between starts the count again.
// --nonfinite and --max-skips are checked.
TEST(NonFinite, SkipStopsAfterMaxSkipsInARow) {
  TrainConfig c = config(huge_env(20, 1000), Algo::A2c, "skip");
  c.max_skips = 3;
  Trainer tr(c);
  tr.run_segment(), tr.run_segment(), tr.run_segment(), tr.run_segment();  // segments 3 and 4 skipped
  EXPECT_EQ(tr.skipped_updates(), 2);
  const std::string m = test::message_of<NonFiniteError>([&] { tr.run_segment(); });
  EXPECT_EQ(m.rfind("update 5, in the segment of steps 32 to 40: ", 0), 0u) << m;
  EXPECT_NE(m.find("3 updates in a row had a gradient that is not finite (--max-skips 3)"), std::string::npos) << m;
  // Two updates skipped in every three (the third's rewards are finite):
  // the finite one starts the count again, so --max-skips 3 is never reached.
  TrainConfig thirds = config(huge_env(0, 1000, true), Algo::A2c, "skip");
  thirds.max_skips = 3, thirds.steps = 96;
  Trainer t3(thirds);
  while (!t3.done()) t3.run_segment();
  EXPECT_EQ(t3.skipped_updates(), 8);
  TrainConfig bad = c;
  bad.nonfinite = "ignore";
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(bad); }).find("--nonfinite 'ignore': choose stop or skip"), std::string::npos);
  bad = c, bad.max_skips = 0;
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(bad); }).find("--max-skips must be in [1, "), std::string::npos);
}
