#include <cmath>

#include "../device/device_loop.h"
#include "../device/rules.h"
#include "task.h"

namespace segtape::agent {
namespace {

// The device envs' host twins (agent/device/device_loop.h): recall, tmaze
// and dialogue by the device's rules (agent/device/rules.h), whose draws come from a
// counter-based generator, so that each stream's steps are a function of
// its own row and the seed. Their streams are the device env's, row for row
// and step for step; `--env device-recall` trains on them with the host loop.
// As Env's contract has it, recall's reward here is 0 (PPO rewards the
// target, agent/algo/ppo.cpp; the device env gives that reward itself).
template <class Rules>
class Twin final : public Env {
 public:
  // table: dialogue's message table (the rules read it where the twin keeps it)
  Twin(int64_t B, uint64_t seed, Rules rules, EnvSpec spec, std::vector<float> table = {})
      : Env(B, seed), rules_(rules), spec_(std::move(spec)), table_(std::move(table)) {
    if constexpr (Rules::kVector) rules_.table = table_.data();
    s_.assign(size_t(B * Rules::kWidth), 0);
    for (int64_t b = 0; b < B; ++b) rules_.start(row(b), b);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float> vec) const override {
    for (int64_t b = 0; b < batch_; ++b) {
      if constexpr (Rules::kVector) rules_.observe(row(b), b, vec.data() + b * spec_.obs_dim);
      else tok[size_t(b)] = rules_.observe(row(b), b);
    }
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
  std::vector<float> table_;
  std::vector<int64_t> s_;
};

}  // namespace

std::unique_ptr<Env> device_recall_task(int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (o.lag < 0 || o.vocab < 2) throw Error("device-recall: needs lag >= 0 and vocab >= 2");
  if (o.sparse && o.lag < 1) throw Error("device-recall: sparse needs lag >= 1 (a token every lag steps)");
  EnvSpec spec{"device-recall", o.sparse ? o.vocab + 1 : o.vocab, 0, o.vocab, true, "accuracy", true};
  return std::make_unique<Twin<rules::Recall>>(batch, seed, rules::Recall{seed, o.lag, o.vocab, o.sparse}, spec);
}

std::vector<float> device::dialogue_table(int64_t cities, int64_t dim) {
  // `dialogue`'s table (agent/task/dialogue.cpp): fixed, independent of the env's seed
  nn::Rng table_rng(0x5e97a9e);
  std::vector<float> table(size_t((cities + rules::Dialogue::kFillers + rules::Dialogue::kRequests) * dim));
  for (float& v : table) v = float(table_rng.normal(0, 1.0 / std::sqrt(double(dim))));
  return table;
}

std::unique_ptr<Env> device_dialogue_task(int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (o.turns < 2 || o.cities < 1 || o.embed_dim < 1) throw Error("device-dialogue: needs turns >= 2, cities >= 1, embed_dim >= 1");
  if (o.sparse) throw Error("device-dialogue: sparse is recall's option; dialogue has no sparse form");
  EnvSpec spec{"device-dialogue", 0, o.embed_dim, 1 + rules::Dialogue::kRequests * o.cities, true, "accuracy", true};
  return std::make_unique<Twin<rules::Dialogue>>(batch, seed, rules::Dialogue{seed, o.turns, o.cities, o.embed_dim, nullptr}, spec,
                                                 device::dialogue_table(o.cities, o.embed_dim));
}

std::unique_ptr<Env> device_tmaze_task(int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (o.corridor < 1) throw Error("device-tmaze: corridor length must be >= 1");
  if (o.sparse) throw Error("device-tmaze: sparse is recall's option; tmaze has no sparse form");
  return std::make_unique<Twin<rules::TMaze>>(batch, seed, rules::TMaze{seed, o.corridor}, EnvSpec{"device-tmaze", 4, 0, 2, false, "success"});
}

}  // namespace segtape::agent
