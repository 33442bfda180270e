// series: next-value regression on a time series (--task series: --env
// series --algo series). The series batchified into B streams as lm's corpus
// (agent/task/series.cpp), chunks of K steps (the history's segments; a
// chunk never crosses an epoch's end), the policy's one output the next
// value of the target (normalised by the training part's mean and standard
// deviation, series_data.h), each chunk's loss the squared error averaged
// over its n x B values (mse_loss), the state carried from chunk to chunk and
// zeroed at each epoch's start.
//
// At each epoch's end the validation part is evaluated, and at the run's end
// the test part where there is one: one stream from the zero state through
// the whole series up to the part's end, no gradient, the state carried, so
// the part's first prediction has read all the rows before it (as the
// series would be forecast); only the part's targets are scored. Beside the
// model's mean squared error (normalised units) stands the naive last-value
// forecast's over the same targets (y[t+1] predicted as y[t]), and both
// RMSEs in the target's own units: valid_mse, naive_mse, valid_rmse,
// naive_rmse (test_... at the end).
//
// The targets are real numbers: they come from the env's target_values()
// (env.h), a channel beside the integer targets() so that no classification
// env, wrapper or plug-in changes; they go through the step's
// replay::Inputs as the observations do, so a replaying history sees them again.
#include <array>
#include <cmath>

#include "../task/series_data.h"
#include "algorithm.h"
#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class SeriesAlgo : public Algorithm {
 public:
  SeriesAlgo(Context& c, HistoryRunner& h, Step& s) : Algorithm(c, h, s) {
    const EnvOptions& o = c.config.env_options;
    series_ = load_series(o.data, o.valid, o.test, o.target, o.features, o.split);
    epoch_ = series_->train_end / c.config.batch - 1;
    history_.prepare(c.h_home, true);
    eval_h_ = c.tape->persistent({1, c.h_home.dim(1)});
    eval_zero_.assign(size_t(eval_h_.numel()), 0.0f);
    naive_[0] = naive_mse(series_->train_end, series_->valid_end);
    naive_[1] = naive_mse(series_->valid_end, series_->rows);
  }

  void save_metadata(std::map<std::string, std::string>& meta) const override {
    meta[kSeriesNormalisationKey] = series_->normalisation_json();
  }

  UpdateResult update(int64_t remaining) override {
    // A chunk of K steps, cut at the epoch's end.
    const int64_t n = std::min({c_.config.history.span(), remaining, epoch_ - c_.step % epoch_});
    if (n <= 0) return {};
    loss_steps_ = 0;
    const double scale = 1.0 / double(n);  // (the chunk's mean over its n x B values)
    Steps s;
    s.step = [this, scale](Tape& t, int64_t, const Tensor& h, replay::Inputs& in) { return regression_step(t, h, in, scale); };
    s.update = [this] { c_.update(loss_steps_ > 0); };
    UpdateResult r = result_of(n, history_.run(s, n));
    r.loss_sum *= double(n);  // (the steps' mean losses, each read scaled by 1/n)
    r.loss_steps = loss_steps_;
    const bool test = n == remaining && series_->rows > series_->valid_end;
    size_t m = 0;
    if (c_.step % epoch_ == 0 || test) {
      copy_into(c_.h_home, c_.h);  // (the carried state would expire in the evaluation's segments)
      c_.h = c_.h_home;
    }
    if (c_.step % epoch_ == 0) m = report(false, m);
    if (test) m = report(true, m);
    r.metrics = std::span<const Metric>(metrics_).first(m);
    return r;
  }

 private:
  // encode -> recur -> the one output, the squared error against the env's
  // real target (the streams' mean, times `scale`) where the pass wants the
  // loss; the env stepped with action 0 (its only one); the resets.
  replay::StepResult regression_step(Tape& t, const Tensor& h, replay::Inputs& in, double scale) {
    const int64_t B = step_.batch();
    const Recurred r = step_.feature(step_.observe(t, in), h);
    const Tensor prediction = step_.logits(r.feature);  // [B, 1]
    auto y = in.take<float>(size_t(B), [&](std::span<float> v) { c_.env->target_values(v); });
    Tensor loss;
    if (in.loss_wanted()) {
      loss = mse_loss(prediction, t.from(y, {B, 1}));
      if (scale != 1) loss = segtape::scale(loss, scale);
    }
    if (!in.replaying()) ++loss_steps_;
    (void)in.take<int64_t>(size_t(B), [&](std::span<int64_t> a) {
      std::fill(a.begin(), a.end(), int64_t(0));
      step_.act(a);
    });
    return {step_.reset(r.state, step_.done_flags(in)), loss};
  }

  // The naive last-value forecast's mean squared error over the targets of rows [lo, hi) (normalised units).
  double naive_mse(int64_t lo, int64_t hi) const {
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double d = double(series_->y[size_t(i)]) - double(series_->y[size_t(i - 1)]);
      sum += d * d;
    }
    return hi > lo ? sum / double(hi - lo) : 0.0;
  }

  // The part's figures into metrics_ from m on.
  size_t report(bool test, size_t m) {
    const int64_t lo = test ? series_->valid_end : series_->train_end, hi = test ? series_->rows : series_->valid_end;
    const double mse = evaluate(lo, hi), naive = naive_[test ? 1 : 0], sd = series_->target_std;
    metrics_[m++] = {test ? "test_mse" : "valid_mse", mse};
    metrics_[m++] = {test ? "test_naive_mse" : "naive_mse", naive};
    metrics_[m++] = {test ? "test_rmse" : "valid_rmse", std::sqrt(mse) * sd};
    metrics_[m++] = {test ? "test_naive_rmse" : "naive_rmse", std::sqrt(naive) * sd};
    return m;
  }

  // The model's mean squared error over the targets of rows [lo, hi): one
  // stream from the zero state through rows [0, hi - 1), no gradient.
  double evaluate(int64_t lo, int64_t hi) {
    const SeriesData& s = *series_;
    const int64_t F = s.dim();
    eval_h_.from_host(std::span<const float>(eval_zero_));
    Tensor h = eval_h_;
    double total = 0;
    const int64_t K = std::max<int64_t>(c_.config.history.k, 32);
    for (int64_t i = 0; i + 1 < hi;) {
      Segment seg = c_.tape->eager_segment();
      NoGradGuard ng(*c_.tape);
      Tensor sum;
      for (int64_t k = 0; k < K && i + 1 < hi; ++k, ++i) {
        const Tensor x = c_.tape->from(std::span<const float>(s.x).subspan(size_t(i * F), size_t(F)), {1, F});
        const Recurred r = step_.feature(x, h);
        if (i + 1 >= lo) {
          const Tensor y = c_.tape->from(std::span<const float>(s.y).subspan(size_t(i + 1), 1), {1, 1});
          const Tensor l = mse_loss(step_.logits(r.feature), y, Reduction::Sum);
          sum = sum.defined() ? add(sum, l) : l;
        }
        h = r.state;
      }
      if (sum.defined()) total += sum.item();
      copy_into(eval_h_, h);
      h = eval_h_;
    }
    return total / double(hi - lo);
  }

  std::shared_ptr<const SeriesData> series_;
  int64_t epoch_ = 0;  // steps per epoch: the training part's rows per stream, less one
  int64_t loss_steps_ = 0;
  std::array<double, 2> naive_{};  // the naive forecast's MSE on the validation and test parts
  std::array<Metric, 8> metrics_{};
  Tensor eval_h_;  // the evaluation's state [1, hidden] (persistent)
  std::vector<float> eval_zero_;
};

void validate(const TrainConfig& c) {
  if (c.env != "series")
    throw Error("--algo series learns a time series: --task series --data FILE.csv --target COLUMN (--env series), not --env " + c.env);
  const HistoryDef& h = history_def(c.history.kind);
  if (!h.recurrent || h.grows)
    throw Error("--task series carries a recurrent state from chunk to chunk: --history " + c.history.str() + " has none to carry (choose " +
                history_choices([](const HistoryDef& d) { return d.recurrent && !d.grows; }) + ")");
}

}  // namespace

extern const AlgorithmDef SeriesAlgorithm;
const AlgorithmDef SeriesAlgorithm{
    .kind = Algo::Series,
    .name = "series",
    .flag = true,
    .help = "series (next-value regression on a time series, --task series: each chunk's mean squared error, the validation "
            "MSE each epoch beside the naive last-value forecast's)",
    .value_head = false,
    .validate = validate,
    .host_bytes = nullptr,
    .make = [](Context& c, HistoryRunner& h, Step& s) -> std::unique_ptr<Algorithm> { return std::make_unique<SeriesAlgo>(c, h, s); },
};

}  // namespace segtape::agent
