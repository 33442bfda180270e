#include "../device/rules.h"
#include "task.h"

namespace segtape::agent {
namespace {

// The device envs' host twins (agent/device/device_loop.h): recall and tmaze
// by the device's rules (agent/device/rules.h), whose draws come from a
// counter-based generator, so that each stream's steps are a function of
// its own row and the seed. Their streams are the device env's, row for row
// and step for step; `--env device-recall` trains on them with the host loop.
// As Env's contract has it, recall's reward here is 0 (PPO rewards the
// target, agent/algo/ppo.cpp; the device env gives that reward itself).
template <class Rules>
class Twin final : public Env {
 public:
  Twin(int64_t B, uint64_t seed, Rules rules, EnvSpec spec) : Env(B, seed), rules_(rules), spec_(std::move(spec)) {
    s_.assign(size_t(B * Rules::kWidth), 0);
    for (int64_t b = 0; b < B; ++b) rules_.start(row(b), b);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tok[size_t(b)] = rules_.observe(row(b), b);
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = rules_.target(row(b), b);
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t* r = row(b);
      const int64_t num = r[Rules::kWidth - 2], den = r[Rules::kWidth - 1];
      rules_.step(r, b, a[size_t(b)], reward[size_t(b)], done[size_t(b)]);
      score_num_ += r[Rules::kWidth - 2] - num, score_den_ += r[Rules::kWidth - 1] - den;
      if (spec_.supervised) reward[size_t(b)] = 0;
    }
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {
    for (size_t i = 0; i + Rules::kWidth <= v.size(); i += Rules::kWidth)
      if (!rules_.valid(v.data() + i)) return false;
    return v.size() % Rules::kWidth == 0;
  }
  int64_t* row(int64_t b) { return s_.data() + b * Rules::kWidth; }
  const int64_t* row(int64_t b) const { return s_.data() + b * Rules::kWidth; }
  Rules rules_;
  EnvSpec spec_;
  std::vector<int64_t> s_;
};

}  // namespace

std::unique_ptr<Env> device_recall_task(int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (o.lag < 0 || o.vocab < 2) throw Error("device-recall: needs lag >= 0 and vocab >= 2");
  if (o.sparse && o.lag < 1) throw Error("device-recall: sparse needs lag >= 1 (a token every lag steps)");
  EnvSpec spec{"device-recall", o.sparse ? o.vocab + 1 : o.vocab, 0, o.vocab, true, "accuracy", true};
  return std::make_unique<Twin<rules::Recall>>(batch, seed, rules::Recall{seed, o.lag, o.vocab, o.sparse}, spec);
}

std::unique_ptr<Env> device_tmaze_task(int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (o.corridor < 1) throw Error("device-tmaze: corridor length must be >= 1");
  if (o.sparse) throw Error("device-tmaze: sparse is recall's option; tmaze has no sparse form");
  return std::make_unique<Twin<rules::TMaze>>(batch, seed, rules::TMaze{seed, o.corridor}, EnvSpec{"device-tmaze", 4, 0, 2, false, "success"});
}

}  // namespace segtape::agent
