// supervised: an env with targets (recall, dialogue; --algo a2c on such an
// env), learned by cross-entropy: each step's loss is the mean over the
// streams that have a target, the segment's the sum over its steps; the
// greedy actions step the env and are scored.
//
// On a GPU (--device cuda) with an open-loop env, a segment runs as one CUDA
// graph (docs/agent.md, "CUDA graphs"): its inputs are taken first from a
// copy of the env (its observations, targets and done flags do not depend on
// the actions), the segment records the same ops as step by step (or its
// recurrence as one gru_sequence, where that fuses), copies each step's
// logits and loss into persistent tensors, and updates; then the env takes
// the steps with the model's greedy actions and must show what its copy showed.
#include <algorithm>
#include <cmath>

#include "algorithm.h"
#include "segtape/fnv.h"
#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Supervised : public Algorithm {
 public:
  Supervised(Context& c, HistoryRunner& h, Step& s) : Algorithm(c, h, s) {
    history_.prepare(c.h_home, true);
    if (c.graph) make_graph_buffers();
  }

  UpdateResult update(int64_t remaining) override {
    const int64_t n = std::min(c_.config.history.span(), remaining);
    if (n <= 0) return {};
    if (c_.graph) return graph_update(n);
    loss_steps_ = 0;
    Steps s;
    s.step = [this](Tape& t, int64_t, const Tensor& h, replay::Inputs& in) { return cross_entropy_step(c_, step_, t, h, in, 1, loss_steps_); };
    s.update = [this] { learn(); };
    UpdateResult r = result_of(n, history_.run(s, n));
    r.loss_steps = loss_steps_;
    return r;
  }
  bool sequence() const override { return sequence_; }

 private:
  // A segment without a target takes no step (its gradients are zero, but
  // Adam would still move by its momentum); under data parallelism every
  // rank joins the update's all-reduce.
  void learn() {
    if (loss_steps_ > 0 || c_.avg) c_.update(loss_steps_ > 0);
  }

  // ---- CUDA-graph segments

  void make_graph_buffers() {
    const TrainConfig& c = c_.config;
    const EnvSpec& spec = c_.env->spec();
    for (int64_t i = 0; i < c.history.k; ++i) {
      logits_.push_back(c_.tape->persistent({c.batch, spec.num_actions}));
      losses_.push_back(c_.tape->persistent(Shape{}));
    }
    all_logits_ = c_.tape->persistent({c.history.k * c.batch, spec.num_actions});
    ahead_ = c_.make_training_env();
    const size_t KB = size_t(c.history.k * c.batch);
    tokens_.assign(KB, 0);
    targets_.assign(KB, kNoTarget);
    vectors_.assign(KB * size_t(std::max<int64_t>(spec.obs_dim, 1)), 0.0f);
    done_.assign(KB, 0);
    keep_.assign(KB, 1.0f);
    encoded_.resize(size_t(c.history.k));
    host_all_.assign(KB * size_t(spec.num_actions), 0.0f);
    sequence_ = c.state_rows() == 1 && history_.sequence(c.batch);  // (gru_sequence: the GRU's; an LSTM steps)
  }

  template <class V>
  static auto row(V& v, int64_t i, int64_t len) {
    return std::span(v.data() + i * len, size_t(len));
  }
  bool has_target(int64_t i) {
    const auto tg = row(targets_, i, step_.batch());
    return std::any_of(tg.begin(), tg.end(), [](int64_t y) { return y != kNoTarget; });
  }

  uint64_t take_ahead(int64_t n);
  Tensor record(int64_t n, bool graph);
  Tensor record_sequence(int64_t n, bool graph);
  UpdateResult graph_update(int64_t n);

  int64_t loss_steps_ = 0;
  // graph segments: the env's copy stepped ahead; its observations, targets
  // and done flags [K, B] (vectors [K, B, obs_dim]), the keep factors of the
  // segment's gru_sequence [K, B] and its encoded steps; each step's logits
  // [B, A] and loss in persistent tensors, read once the segment's graph has
  // run; in one gru_sequence, the head over all the segment's steps at once,
  // its logits [K B, A] (persistent) and their host copy.
  bool sequence_ = false;  // the recurrence as one gru_sequence (where it fuses)
  std::unique_ptr<Env> ahead_;
  std::vector<int64_t> tokens_, targets_;
  std::vector<float> vectors_;
  std::vector<uint8_t> done_;
  std::vector<float> keep_;      // [K, B]: 0 where the stream's episode ended the step before
  std::vector<Tensor> encoded_;  // a segment's encoded observations, [B, embed] each
  std::vector<Tensor> logits_, losses_;
  Tensor all_logits_;
  std::vector<float> host_all_;
  int64_t target_steps_ = 0, count_ = -1;  // the segment's steps with a target, and their common count (0: counts differ)
};

// The env's copy, given the env's state, takes the segment's n steps with
// placeholder actions; returns the steps' pattern: which have a target (a
// loss), which reset a stream. In one gru_sequence the resets before the
// last step are keep's values, not ops; and where every step with a target
// has the same count c of them (recall: all B), the loss is one
// cross-entropy summed over the segment's rows, scaled by 1/c (the sum over
// the steps of their means, as step by step), so only c, not which steps
// have targets, is an op.
uint64_t Supervised::take_ahead(int64_t n) {
  const int64_t B = step_.batch(), D = std::max<int64_t>(c_.env->spec().obs_dim, 1);
  std::fill(step_.actions.begin(), step_.actions.end(), 0);
  ahead_->load_state(c_.env->save_state());
  uint64_t key = fnv::kOffset ^ uint64_t(n);
  target_steps_ = 0, count_ = -1;
  bool reset = false;  // (the step's: after the loop, the last step's)
  for (int64_t i = 0; i < n; ++i) {
    ahead_->observe(row(tokens_, i, B), row(vectors_, i, B * D));
    ahead_->targets(row(targets_, i, B));
    ahead_->step(step_.actions, step_.rewards, row(done_, i, B));
    const auto dn = row(done_, i, B);
    for (int64_t b = 0; b < B && i + 1 < n; ++b) keep_[size_t((i + 1) * B + b)] = dn[size_t(b)] ? 0.0f : 1.0f;
    const bool target = has_target(i);
    if (target) {
      const auto tg = row(targets_, i, B);
      const int64_t c = std::count_if(tg.begin(), tg.end(), [](int64_t y) { return y != kNoTarget; });
      count_ = count_ < 0 || count_ == c ? c : 0;
      ++target_steps_;
    }
    reset = (!sequence_ || i == n - 1) && std::any_of(dn.begin(), dn.end(), [](uint8_t d) { return d != 0; });
    fnv::mix(key, uint64_t(target) | uint64_t(reset) << 1);
  }
  if (sequence_ && count_ > 0) {  // the pattern without the target steps: n, c and whether the last step resets
    key = fnv::kOffset;
    fnv::mix(key, uint64_t(n) ^ uint64_t(count_) << 32 ^ uint64_t(reset) << 31);
  }
  return key | 1;  // (0: none)
}

// The segment's ops step by step, each step's logits and loss copied into persistent tensors.
Tensor Supervised::record(int64_t n, bool) {
  const int64_t B = step_.batch(), D = std::max<int64_t>(c_.env->spec().obs_dim, 1);
  Tensor loss;
  for (int64_t i = 0; i < n; ++i, c_.tape->next_step()) {
    c_.h = step_.feature(step_.observation(row(tokens_, i, B), row(vectors_, i, B * D), B), c_.h).state;
    const Tensor logits = step_.logits(c_.h);
    if (has_target(i)) {
      Tensor l = cross_entropy(logits, c_.tape->from(std::span<const int64_t>(row(targets_, i, B)), {B}), Reduction::Mean, kNoTarget);
      copy_into(losses_[size_t(i)], l);
      loss = loss.defined() ? add(loss, l) : l;
    }
    copy_into(logits_[size_t(i)], logits);
    c_.h = step_.reset(c_.h, row(done_, i, B));
  }
  return loss;
}

// The recurrence of the n steps as one gru_sequence (the fused kernel), the
// resets inside it (keep), the encoder step by step, and the head over all n
// steps at once: one product of [n B, hidden] rows, whose logits reach the
// host in one copy; the loss, the sum of the steps' mean cross-entropies,
// one cross-entropy over the rows where the target steps' counts agree, else
// each step's on its rows. (Tape steps label the encoders step by step, the
// sequence and what follows it the last step.)
Tensor Supervised::record_sequence(int64_t n, bool graph) {
  const int64_t B = step_.batch(), D = std::max<int64_t>(c_.env->spec().obs_dim, 1), A = step_.num_actions();
  for (int64_t i = 0; i < n; ++i) {
    encoded_[size_t(i)] = c_.policy->encode(step_.observation(row(tokens_, i, B), row(vectors_, i, B * D), B));
    if (i + 1 < n) c_.tape->next_step();
  }
  const Tensor e = concat(std::span<const Tensor>(encoded_.data(), size_t(n)), 0);
  const Tensor states = c_.policy->recur_sequence(reshape(e, {n, B, e.dim(1)}), c_.h,
                                                  c_.tape->from(std::span<const float>(row(keep_, 0, n * B)), {n, B}));
  const Tensor logits = c_.policy->logits(reshape(states, {n * B, c_.config.hidden}));  // [n B, A]
  Tensor loss;
  if (count_ > 0) {
    loss = scale(cross_entropy(logits, c_.tape->from(std::span<const int64_t>(row(targets_, 0, n * B)), {n * B}), Reduction::Sum, kNoTarget),
                 1.0 / double(count_));
  } else {  // the counts differ: each step's mean on its rows
    for (int64_t i = 0; i < n; ++i) {
      if (!has_target(i)) continue;
      const Tensor l = cross_entropy(slice(logits, 0, i * B, B), c_.tape->from(std::span<const int64_t>(row(targets_, i, B)), {B}),
                                     Reduction::Mean, kNoTarget);
      loss = loss.defined() ? add(loss, l) : l;
    }
  }
  if (graph) copy_into(all_logits_, logits);
  else logits.to_host(std::span<float>(host_all_).first(size_t(n * B * A)));  // (an eager segment may read)
  c_.h = step_.reset(reshape(slice(states, 0, n - 1, 1), {B, c_.config.hidden}), row(done_, n - 1, B));
  c_.tape->next_step();
  return loss;
}

UpdateResult Supervised::graph_update(int64_t n) {
  UpdateResult r;
  const EnvSpec& spec = c_.env->spec();
  const int64_t B = step_.batch(), A = step_.num_actions(), D = std::max<int64_t>(spec.obs_dim, 1);
  Steps s;
  s.update = [this] { c_.update(true); };
  s.graph_key = take_ahead(n);
  s.record = [&](bool graph) { return sequence_ ? record_sequence(n, graph) : record(n, graph); };
  const Ran ran = history_.run(s, n);
  c_.committed = true;  // (the segment ran: errors from here on, the device's at the first to_host included, leave its update in place)
  r.steps = n;
  r.loss_steps = target_steps_;
  // The env takes the steps with the model's actions; what it shows must be what its copy showed.
  if (sequence_ && ran.graph) all_logits_.to_host(std::span<float>(host_all_));
  for (int64_t i = 0; i < n; ++i) {
    c_.env->observe(step_.tokens, step_.vectors);
    c_.env->targets(step_.targets);
    const float* rows = step_.rows.data();
    if (sequence_) rows = host_all_.data() + i * B * A;
    else logits_[size_t(i)].to_host(std::span<float>(step_.rows));
    for (int64_t b = 0; b < B; ++b) step_.actions[size_t(b)] = Step::argmax_row(rows + b * A, A);
    step_.act(step_.actions);
    const bool same = (spec.vocab > 0 ? std::ranges::equal(step_.tokens, row(tokens_, i, B))
                                      : std::ranges::equal(std::span(step_.vectors.data(), size_t(B * D)), row(vectors_, i, B * D))) &&
                      std::ranges::equal(step_.targets, row(targets_, i, B)) && std::ranges::equal(step_.done, row(done_, i, B));
    if (!same)
      throw EnvContractError("env '" + spec.name + "' says its spec is open_loop, but at step " + std::to_string(c_.step - n + i + 1) +
                             " (step " + std::to_string(i + 1) + " of the segment) it showed other observations, targets or done "
                             "flags after the model's actions than after the placeholder actions its copy took (the Env contract: "
                             "segtape/agent/env.h); the segment's update, which used its copy's, stands; set open_loop = false");
    if (!has_target(i)) continue;
    if (!sequence_) {
      r.loss_sum += losses_[size_t(i)].item();
      continue;
    }
    // The step's mean cross-entropy, from its logits on the host (the loss was one sum over the steps)
    double step_loss = 0;
    int64_t targets = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t y = step_.targets[size_t(b)];
      if (y == kNoTarget) continue;
      const float* l = rows + b * A;
      const double top = *std::max_element(l, l + A);
      double z = 0;
      for (int64_t a = 0; a < A; ++a) z += std::exp(double(l[a]) - top);
      step_loss += top + std::log(z) - double(l[y]);
      ++targets;
    }
    r.loss_sum += step_loss / double(targets);
  }
  return r;
}

}  // namespace

extern const AlgorithmDef SupervisedAlgorithm;
const AlgorithmDef SupervisedAlgorithm{
    .kind = Algo::Supervised,
    .name = "supervised",
    .flag = false,
    .help = "supervised (cross-entropy on the env's targets)",
    .value_head = false,
    .validate = nullptr,
    .host_bytes = nullptr,
    .make = [](Context& c, HistoryRunner& h, Step& s) -> std::unique_ptr<Algorithm> { return std::make_unique<Supervised>(c, h, s); },
};

}  // namespace segtape::agent
