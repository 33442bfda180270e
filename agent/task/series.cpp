// series: a time series (CSV columns, series_data.h) as B streams of
// next-value regression, batchified as lm batchifies a corpus: the part's N
// rows cut into B contiguous streams of N / B (the tail that does not divide
// dropped); stream b observes row b N/B + i's features (normalised) at step i
// and is asked for the target of the row after it (target_values). An epoch is
// N/B - 1 steps; at its last every stream's episode ends (the next epoch
// starts from the zero state). The env scores nothing (measure "none"): its
// actions are the policy's argmax over one output, always 0; what a run
// learns is the series algorithm's figures (agent/algo/series.cpp).
#include <algorithm>

#include "series_data.h"
#include "task.h"

namespace segtape::agent {
namespace {

class SeriesEnv final : public Env {
 public:
  SeriesEnv(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed) {
    series_ = load_series(o.data, o.valid, o.test, o.target, o.features, o.split);
    const SeriesData& s = *series_;
    const bool train = o.part == EnvOptions::Part::Train, valid = o.part == EnvOptions::Part::Valid;
    begin_ = train ? 0 : valid ? s.train_end : s.valid_end;
    const int64_t end = train ? s.train_end : valid ? s.valid_end : s.rows;
    const std::string& file = train || (valid && o.valid.empty()) ? o.data : valid ? o.valid : o.test;
    per_ = (end - begin_) / B;
    if (per_ < 2)
      throw Error(file + ": its " + (train ? "training" : valid ? "validation" : "test") + " part has " + std::to_string(end - begin_) +
                  " rows, fewer than 2 for each of the " + std::to_string(B) + " streams (a row and the next one to predict): a " +
                  "longer series or fewer streams (--batch)");
    spec_ = {"series", 0, s.dim(), 1, true, "none", true};
    s_.assign(1, 0);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t>, std::span<float> vec) const override {
    const auto F = size_t(series_->dim());
    for (int64_t b = 0; b < batch_; ++b)
      std::copy_n(series_->x.begin() + ptrdiff_t(size_t(row(b)) * F), F, vec.begin() + ptrdiff_t(size_t(b) * F));
  }
  void target_values(std::span<float> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = series_->y[size_t(row(b) + 1)];
  }
  void step(std::span<const int64_t>, std::span<float> reward, std::span<uint8_t> done) override {
    const bool end = ++s_[0] == per_ - 1;  // (the epoch's last step: the next starts at the streams' beginnings)
    if (end) s_[0] = 0;
    std::fill(reward.begin(), reward.end(), 0.0f);
    std::fill(done.begin(), done.end(), uint8_t(end));
  }

 protected:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> ints) const override { return ints.size() == 1 && ints[0] >= 0 && ints[0] < per_ - 1; }

 private:
  int64_t row(int64_t b) const { return begin_ + b * per_ + s_[0]; }

  std::shared_ptr<const SeriesData> series_;
  int64_t begin_ = 0, per_ = 0;  // the part's first row; rows per stream
  EnvSpec spec_;
  std::vector<int64_t> s_;  // the step in the epoch
};

}  // namespace

std::unique_ptr<Env> series_task(int64_t batch, uint64_t seed, const EnvOptions& o) { return std::make_unique<SeriesEnv>(batch, seed, o); }

}  // namespace segtape::agent
