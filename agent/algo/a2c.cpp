// a2c: advantage actor-critic. Each update runs the history's steps with
// actions sampled from the policy, then learns from their n-step returns
// (bootstrapped from the value of the state after the last step, and at an
// episode cut by a time limit from the value of the observation it was cut
// at: Step::bootstrap_truncated):
// policy gradient -adv * log pi(a), value regression to the return, and an
// entropy bonus, each a mean over the B streams.
#include <algorithm>
#include <cmath>

#include "algorithm.h"
#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class A2c : public Algorithm {
 public:
  A2c(Context& c, HistoryRunner& h, Step& s) : Algorithm(c, h, s), cap_(c.config.history.span()) {
    history_.prepare(c.h_home, true);
    const auto B = size_t(c.config.batch), A = size_t(step_.num_actions());
    for (auto* v : {&rewards_, &returns_}) v->assign(size_t(cap_) * B, 0.0f);
    done_.assign(size_t(cap_) * B, 0);
    actions_.assign(size_t(cap_) * B, 0);
    bootstrap_.assign(B, 0.0f);
    values_.assign(B, 0.0f);
    weights_.assign(B * A, 0.0f);
    kept_.reserve(size_t(cap_));
  }

  UpdateResult update(int64_t remaining) override {
    const int64_t n = std::min(cap_, remaining);
    if (n <= 0) return {};
    loss_sum_ = 0, return_sum_ = 0, episodes_ = 0;
    kept_.clear();  // (an update that threw left its steps' tensors, expired with its segment)
    Steps s;
    s.step = [this](Tape& t, int64_t i, const Tensor& h, replay::Inputs& in) { return step(t, i, h, in); };
    s.after_forward = [this](const Tensor& h, int64_t first, int64_t steps) { return after_forward(h, first, steps); };
    s.update = [this] { c_.update(true); };
    UpdateResult r = result_of(n, history_.run(s, n));
    r.loss_sum += loss_sum_;  // (a live pass's losses, read here; a replaying history's are its own)
    r.loss_steps = n;
    r.return_sum = return_sum_;
    r.episodes = episodes_;
    return r;
  }

 private:
  // Step t's place in the per-step records: a ring of the history's span.
  size_t at(int64_t t) const { return size_t(t % cap_) * size_t(c_.config.batch); }

  replay::StepResult step(Tape& t, int64_t i, const Tensor& h, replay::Inputs& in) {
    const int64_t B = step_.batch();
    const Recurred r = step_.feature(step_.observe(t, in), h);
    const Tensor lp = step_.log_probs(r.feature);  // [B, A]
    const Tensor v = step_.value(r.feature);       // [B, 1]
    // Sampled actions step the env the first time only; the step's reward
    // and done are kept for the returns.
    (void)in.take<int64_t>(size_t(B), [&](std::span<int64_t> a) {
      step_.sample(lp, a);
      step_.act(a);
      step_.note_rewards(return_sum_, episodes_);
      step_.bootstrap_truncated(r.state, c_.config.gamma);  // (a replay reads the rewards kept here)
      std::copy(a.begin(), a.end(), actions_.begin() + ptrdiff_t(at(i)));
      std::copy(step_.rewards.begin(), step_.rewards.end(), rewards_.begin() + ptrdiff_t(at(i)));
      std::copy(step_.done.begin(), step_.done.end(), done_.begin() + ptrdiff_t(at(i)));
    });
    const Tensor next = step_.reset(r.state, step_.done_flags(in));
    // The returns are known once the forward pass is done: a replayed
    // step's loss is computed as it runs, a live step's after them all.
    if (in.replaying()) return {next, in.loss_wanted() ? loss(i, lp, v) : Tensor{}};
    if (!history_.replays()) kept_.push_back({lp, v});
    return {next, {}};
  }

  // The returns of steps [first, first + n), bootstrapped from the value of
  // the state after them; a live pass's losses, the last step's first.
  Tensor after_forward(const Tensor& final_state, int64_t first, int64_t n) {
    bootstrap(final_state);
    for (int64_t i = first + n - 1; i >= first; --i)
      for (size_t b = 0; b < bootstrap_.size(); ++b) {
        const size_t k = at(i) + b;
        bootstrap_[b] = rewards_[k] + float(c_.config.gamma) * bootstrap_[b] * (done_[k] ? 0.0f : 1.0f);
        returns_[k] = bootstrap_[b];
      }
    Tensor loss;
    for (int64_t i = int64_t(kept_.size()) - 1; i >= 0; --i) {
      Tensor l = this->loss(first + i, kept_[size_t(i)].lp, kept_[size_t(i)].v);
      loss_sum_ += l.item();
      loss = loss.defined() ? add(loss, l) : l;
    }
    kept_.clear();
    return loss;
  }

  // The value of the state after the update's last step, from the next
  // observation, without gradient and without committing the history's
  // state (the next update computes that step). Into bootstrap_.
  void bootstrap(const Tensor& h) {
    NoGradGuard ng(*c_.tape);
    step_.value(step_.feature(step_.observe(), h, false).feature).to_host(std::span<float>(bootstrap_));
  }

  // Step t's loss: policy gradient -adv * log pi(a), value regression to the
  // return, entropy bonus; adv = return - value (a constant), each averaged
  // over the B streams. lp [B, A] log-probabilities, v [B, 1] values.
  Tensor loss(int64_t t, const Tensor& lp, const Tensor& v) {
    const int64_t B = step_.batch(), A = step_.num_actions();
    const float* returns = returns_.data() + at(t);
    v.to_host(std::span<float>(values_));
    std::fill(weights_.begin(), weights_.end(), 0.0f);
    const float inv_b = 1.0f / float(B);
    for (int64_t b = 0; b < B; ++b) {
      const float adv = returns[b] - values_[size_t(b)];
      weights_[size_t(b * A + actions_[at(t) + size_t(b)])] = -adv * inv_b;  // policy gradient: -adv * log pi(a)
    }
    Tensor pg = sum(mul(lp, c_.tape->from(std::span<const float>(weights_), {B, A})));
    Tensor vl = scale(mse_loss(v, c_.tape->from(std::span<const float>(returns, size_t(B)), {B, 1}), Reduction::Sum),
                      0.5 * c_.config.value_coef / double(B));
    Tensor neg_entropy = scale(sum(mul(exp(lp), lp)), c_.config.entropy / double(B));
    return add(add(pg, vl), neg_entropy);
  }

  struct Kept {
    Tensor lp, v;  // a live step's log-probabilities [B, A] and value [B, 1], for its loss after the pass
  };
  int64_t cap_;  // steps the records hold: the history's span
  // per step t at at(t): the actions, rewards, done flags and returns [cap, B]
  std::vector<int64_t> actions_;
  std::vector<float> rewards_, returns_;
  std::vector<uint8_t> done_;
  std::vector<float> bootstrap_, values_, weights_;  // [B]: the running return; a step's values; [B, A]: its weights
  std::vector<Kept> kept_;
  double loss_sum_ = 0, return_sum_ = 0;
  int64_t episodes_ = 0;
};

}  // namespace

extern const AlgorithmDef A2cAlgorithm;
const AlgorithmDef A2cAlgorithm{
    .kind = Algo::A2c,
    .name = "a2c",
    .flag = true,
    .help = "a2c (an update per segment; on a supervised env, cross-entropy on its targets)",
    .value_head = true,
    .validate = nullptr,
    .host_bytes = nullptr,
    .make = [](Context& c, HistoryRunner& h, Step& s) -> std::unique_ptr<Algorithm> { return std::make_unique<A2c>(c, h, s); },
};

}  // namespace segtape::agent
