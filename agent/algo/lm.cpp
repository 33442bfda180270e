// lm: a language model on a text corpus (--task lm: --env lm --algo lm), the
// recipe of PyTorch's word_language_model: the corpus batchified into B
// streams, chunks of K steps (the history's segments, tbptt:K being the
// example's bptt; a chunk never crosses an epoch's end, so an epoch's last
// one is shorter), each chunk's loss the cross-entropy averaged over its
// tokens, the state carried from chunk to chunk and zeroed at each epoch's
// start. At each epoch's end the validation part is evaluated (10 streams,
// the state carried over the whole part, as the example's evaluate()): its
// loss in nats per token, its perplexity and bits per token; at the run's end
// the test part too, where there is one. Reported as the algorithm's figures.
// With --optim sgd the learning rate is divided by 4 after each epoch whose
// validation loss is not below the best so far (the example's schedule).
//
// Under a history that runs each step once (tbptt, detach, nograd-history)
// the head runs once per chunk, as the example's loop does: the steps
// recur, then one product of the chunk's [K B, hidden] outputs with the
// decoder and one cross-entropy over its K B tokens (a word model's decoder,
// 200 x 25,671, is most of a step's work; at B rows a step it is packed
// anew for each). The env is open loop (its tokens do not depend on the
// actions, which are only scored), so the chunk's tokens are taken first
// from a copy of it stepped ahead; once the chunk's logits are known the
// env takes the steps with their greedy actions (its accuracy) and must show
// what its copy showed. Under exact and overlapping histories, which replay
// steps, each step has its own head.
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "../task/corpus.h"
#include "algorithm.h"
#include "segtape/ops.h"

namespace segtape::agent {
namespace {

constexpr int64_t kEvalStreams = 10;  // word_language_model's eval_batch_size
constexpr int64_t kHeadBlockBytes = int64_t(16) << 20;  // the logits of a block of a chunk's head (Lm::chunk_loss)

class Lm : public Algorithm {
 public:
  Lm(Context& c, HistoryRunner& h, Step& s) : Algorithm(c, h, s) {
    const EnvOptions& o = c.config.env_options;
    corpus_ = load_corpus(o.data, o.valid, o.test, parse_tokens(o.tokens), o.split);
    epoch_ = int64_t(corpus_->train.size()) / (c.config.batch * c.ranks()) - 1;  // (data parallel: the ranks' streams share the text)
    history_.prepare(c.h_home, true);
    eval_h_ = c.tape->persistent({c.config.state_rows() * kEvalStreams, c.config.hidden});
    eval_zero_.assign(size_t(eval_h_.numel()), 0.0f);
    eval_tokens_.assign(size_t(kEvalStreams), 0);
    eval_done_.assign(size_t(kEvalStreams), 0), eval_rewards_.assign(size_t(kEvalStreams), 0.0f);
    // The parts' envs, made once (an evaluation starts them at their beginning)
    for (const EnvOptions::Part part : {EnvOptions::Part::Valid, EnvOptions::Part::Test}) {
      if (part == EnvOptions::Part::Test && corpus_->test.empty()) continue;
      EnvOptions p = o;
      p.part = part;
      eval_env_[size_t(part)] = make_env(c.config.env, kEvalStreams, 0, p);
      eval_start_[size_t(part)] = eval_env_[size_t(part)]->save_state();
    }
    if (chunk_head_) {
      const auto KB = size_t(c.config.history.span() * c.config.batch);
      ahead_ = c.make_training_env();
      ahead_->load_state(c.env->save_state());
      tokens_.assign(KB, 0), targets_.assign(KB, 0), actions_.assign(KB, 0), done_.assign(KB, 0);
      features_.resize(size_t(c.config.history.span()));
    }
    const int64_t eval_k = std::max<int64_t>(c.config.history.k, 32);
    eval_features_.resize(size_t(eval_k)), eval_chunk_targets_.assign(size_t(eval_k * kEvalStreams), 0);
  }

  void save_metadata(std::map<std::string, std::string>& meta) const override { meta[kVocabKey] = corpus_->vocab.to_json(); }

  // --optim sgd: the schedule's learning rate and best validation loss (doubles, bit for bit)
  void entries(std::vector<nn::Entry>& e) override {
    if (c_.config.optim != "sgd") return;
    std::memcpy(schedule_.data(), &lr_, 8), std::memcpy(schedule_.data() + 1, &best_, 8);
    e.push_back(nn::entry("lm.schedule", std::span<int64_t>(schedule_), {2}));
  }
  void loaded() override {
    if (ahead_) ahead_->load_state(c_.env->save_state());  // (the env's copy at the env's new place)
    if (c_.config.optim != "sgd") return;
    std::memcpy(&lr_, schedule_.data(), 8), std::memcpy(&best_, schedule_.data() + 1, 8);
    if (!(lr_ > 0 && lr_ <= c_.config.lr) || std::isnan(best_)) throw CheckpointError("lm.schedule out of range: a damaged checkpoint?");
    c_.set_lr(lr_);
  }

  UpdateResult update(int64_t remaining) override {
    // A chunk of K steps, cut at the epoch's end.
    const int64_t n = std::min({c_.config.history.span(), remaining, epoch_ - c_.step % epoch_});
    if (n <= 0) return {};
    loss_steps_ = 0;
    const auto t0 = std::chrono::steady_clock::now();
    UpdateResult r = chunk_head_ ? chunk_update(n) : step_update(n);
    train_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), trained_ += n;
    r.loss_steps = loss_steps_;
    size_t m = 0;
    if (c_.step % epoch_ == 0 || (n == remaining && !corpus_->test.empty())) keep_state();
    if (c_.step % epoch_ == 0) {
      m = report(EnvOptions::Part::Valid, m);
      // The training's speed since the last epoch's end: its chunks alone (no evaluation, checkpoint or log)
      metrics_[m++] = {"train_tokens_per_s", train_seconds_ > 0 ? double(trained_ * c_.config.batch) / train_seconds_ : 0.0};
      train_seconds_ = 0, trained_ = 0;
      if (c_.config.optim == "sgd") {  // the example's: lr / 4 when the validation loss did not improve
        if (metrics_[0].value < best_) best_ = metrics_[0].value;
        else c_.set_lr(lr_ /= 4);
        metrics_[m++] = {"lr", lr_};
      }
    }
    if (n == remaining && !corpus_->test.empty()) m = report(EnvOptions::Part::Test, m);
    r.metrics = std::span<const Metric>(metrics_).first(m);
    return r;
  }

  // Stopped mid-epoch (Ctrl-C): the validation part evaluated where the model is now.
  UpdateResult stopped() override {
    UpdateResult r;
    if (c_.step % epoch_ == 0) return r;  // (its epoch's end reported it)
    keep_state();
    r.metrics = std::span<const Metric>(metrics_).first(report(EnvOptions::Part::Valid, 0));
    return r;
  }

 private:
  template <class V>
  auto row(V& v, int64_t i) const {
    const int64_t B = step_.batch();
    return std::span(v.data() + i * B, size_t(B));
  }

  // A chunk step by step, each step's head and greedy actions its own (the
  // histories that replay steps).
  UpdateResult step_update(int64_t n) {
    const double scale = 1.0 / double(n);  // (the chunk's mean over its n x B tokens)
    Steps s;
    s.step = [this, scale](Tape& t, int64_t, const Tensor& h, replay::Inputs& in) {
      return cross_entropy_step(c_, step_, t, h, in, scale, loss_steps_);
    };
    s.update = [this] { c_.update(loss_steps_ > 0); };
    UpdateResult r = result_of(n, history_.run(s, n));
    r.loss_sum *= double(n);  // (the steps' mean losses, each read scaled by 1/n)
    return r;
  }

  // A chunk with its head once over its steps (the header's account).
  UpdateResult chunk_update(int64_t n) {
    const int64_t B = step_.batch();
    take_ahead(n);
    const int64_t first = c_.step;
    Steps s;
    s.step = [this, first](Tape& t, int64_t at, const Tensor& h, replay::Inputs& in) {
      const int64_t i = at - first;
      const Recurred r = step_.feature(t, t.from(std::span<const int64_t>(row(tokens_, i)), {step_.batch()}), h, in);
      features_[size_t(i)] = r.feature;
      return replay::StepResult{step_.reset(r.state, row(done_, i)), Tensor()};
    };
    s.after_forward = [this](const Tensor&, int64_t, int64_t steps) { return chunk_loss(steps); };
    s.update = [this] { c_.update(loss_steps_ > 0); };
    UpdateResult r = result_of(n, history_.run(s, n));
    r.loss_sum = chunk_loss_ * double(loss_steps_);  // (the steps' mean losses: every step has its B targets)
    // The env takes the chunk's steps with the model's actions; what it shows must be what its copy showed.
    for (int64_t i = 0; i < n; ++i) {
      c_.env->observe(step_.tokens, step_.vectors);
      c_.env->targets(step_.targets);
      step_.act(row(actions_, i));
      if (!std::ranges::equal(step_.tokens, row(tokens_, i)) || !std::ranges::equal(step_.targets, row(targets_, i)) ||
          !std::ranges::equal(step_.done, row(done_, i)))
        throw EnvContractError("lm: the env showed other tokens, targets or done flags at step " + std::to_string(c_.step - n + i + 1) +
                               " than its copy stepped ahead of the model did (step " + std::to_string(i + 1) + " of " +
                               std::to_string(n) + " of the chunk; " + std::to_string(B) + " streams)");
    }
    return r;
  }

  // The copy of the env takes the chunk's n steps ahead (its actions a
  // placeholder: only scored): their tokens, targets and done flags. It
  // steps as the env does, chunk after chunk, and takes the env's state when
  // a checkpoint is loaded (loaded()); where it shows other tokens or
  // targets than the env at the chunk's start all the same (a data-parallel
  // rank's streams set from a checkpoint, which calls no loaded()), it takes
  // the env's state then. (A copy that showed the same first step from
  // another place would be caught after the chunk: the env must show what
  // it showed.)
  void take_ahead(int64_t n) {
    c_.env->observe(step_.tokens, step_.vectors), c_.env->targets(step_.targets);
    ahead_->observe(row(tokens_, 0), {}), ahead_->targets(row(targets_, 0));
    if (!std::ranges::equal(step_.tokens, row(tokens_, 0)) || !std::ranges::equal(step_.targets, row(targets_, 0)))
      ahead_->load_state(c_.env->save_state());
    std::fill(step_.actions.begin(), step_.actions.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      ahead_->observe(row(tokens_, i), {});
      ahead_->targets(row(targets_, i));
      ahead_->step(step_.actions, step_.rewards, row(done_, i));
    }
    loss_steps_ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto y = row(targets_, i);
      loss_steps_ += std::any_of(y.begin(), y.end(), [](int64_t v) { return v != kNoTarget; }) ? 1 : 0;
    }
  }

  // The chunk's head and loss over its steps' outputs: the mean
  // cross-entropy over its tokens (read on the host), and each token's
  // greedy action. The head runs over blocks of as many steps as keep a
  // block's logits within kHeadBlockBytes (a word model's 160 rows; a
  // character model's whole chunk): the product's rows amortise the
  // decoder's packing, and backward's gradient of the logits is a block's,
  // not the chunk's.
  Tensor chunk_loss(int64_t n) {
    const int64_t B = step_.batch(), V = step_.num_actions();
    if (loss_steps_ == 0) return {};
    const int64_t per = std::max<int64_t>(1, kHeadBlockBytes / (B * V * int64_t(sizeof(float))));  // steps a block
    int64_t count = 0;
    for (int64_t j = 0; j < n * B; ++j) count += targets_[size_t(j)] != kNoTarget ? 1 : 0;
    Tensor loss;
    for (int64_t i0 = 0; i0 < n; i0 += per) {
      const int64_t m = std::min(per, n - i0);
      const Tensor logits = step_.logits(concat(std::span<const Tensor>(features_.data() + i0, size_t(m)), 0));  // [m B, V]
      const Tensor y = c_.tape->from(std::span<const int64_t>(targets_).subspan(size_t(i0 * B), size_t(m * B)), {m * B});
      const Tensor l = cross_entropy(logits, y, Reduction::Sum, kNoTarget);
      loss = loss.defined() ? add(loss, l) : l;
      const float* rows = nullptr;
      if (logits.on_device()) {  // (a GPU's: a block's logits reach the host in one copy; the first chunk's blocks are the largest)
        if (host_logits_.size() < size_t(m * B * V)) host_logits_.resize(size_t(m * B * V));
        logits.to_host(std::span<float>(host_logits_).first(size_t(m * B * V)));
        rows = host_logits_.data();
      } else {
        rows = logits.data<const float>();
      }
      for (int64_t j = 0; j < m * B; ++j) actions_[size_t(i0 * B + j)] = Step::argmax_row(rows + j * V, V);
    }
    loss = scale(loss, 1.0 / double(count));
    chunk_loss_ = loss.item();
    return loss;
  }

  // The carried state into its persistent home before an evaluation, whose
  // segments would expire it.
  void keep_state() {
    copy_into(c_.h_home, c_.h);
    c_.h = c_.h_home;
  }

  // The part's loss in nats per token, its perplexity and bits per token into metrics_ from m on.
  size_t report(EnvOptions::Part part, size_t m) {
    const double loss = evaluate(part);
    const bool valid = part == EnvOptions::Part::Valid;
    metrics_[m++] = {valid ? "valid_loss" : "test_loss", loss};
    metrics_[m++] = {valid ? "valid_perplexity" : "test_perplexity", std::exp(loss)};
    metrics_[m++] = {valid ? "valid_bits_per_token" : "test_bits_per_token", loss / std::log(2.0)};
    return m;
  }

  // The mean cross-entropy over a part's tokens: its 10 streams from the
  // zero state, the state carried over the whole part, no gradient.
  double evaluate(EnvOptions::Part part) {
    Env* env = eval_env_[size_t(part)].get();
    env->load_state(eval_start_[size_t(part)]);
    const int64_t steps = int64_t((part == EnvOptions::Part::Valid ? corpus_->valid : corpus_->test).size()) / kEvalStreams - 1;
    eval_h_.from_host(std::span<const float>(eval_zero_));
    Tensor h = eval_h_;
    double total = 0;
    const int64_t K = std::max<int64_t>(c_.config.history.k, 32);
    for (int64_t done = 0; done < steps;) {
      Segment seg = c_.tape->eager_segment();
      NoGradGuard ng(*c_.tape);
      int64_t i = 0;
      for (; i < K && done < steps; ++i, ++done) {
        env->observe(eval_tokens_, {});
        env->targets(std::span<int64_t>(eval_chunk_targets_).subspan(size_t(i * kEvalStreams), size_t(kEvalStreams)));
        const Recurred r = step_.feature(c_.tape->from(std::span<const int64_t>(eval_tokens_), {kEvalStreams}), h);
        eval_features_[size_t(i)] = r.feature;
        env->step(eval_tokens_, eval_rewards_, eval_done_);  // (placeholder actions: the score is not read)
        h = r.state;
      }
      // The segment's head at once (as training's chunks): one product and one cross-entropy over its i x 10 tokens
      const Tensor logits = step_.logits(concat(std::span<const Tensor>(eval_features_.data(), size_t(i)), 0));
      total += cross_entropy(logits, c_.tape->from(std::span<const int64_t>(eval_chunk_targets_).first(size_t(i * kEvalStreams)),
                                                   {i * kEvalStreams}),
                             Reduction::Sum)
                   .item();
      copy_into(eval_h_, h);
      h = eval_h_;
    }
    return total / double(steps * kEvalStreams);
  }

  std::shared_ptr<const Corpus> corpus_;
  // The head once per chunk (the header): the env's copy stepped ahead, the
  // chunk's tokens, targets, greedy actions and done flags [K, B], its
  // steps' outputs, its mean loss; a GPU's host copy of its logits.
  const bool chunk_head_ = !history_.replays() && !c_.config.head_each_step;
  std::unique_ptr<Env> ahead_;
  std::vector<int64_t> tokens_, targets_, actions_;
  std::vector<uint8_t> done_;
  std::vector<Tensor> features_;
  double chunk_loss_ = 0;
  std::vector<float> host_logits_;
  int64_t epoch_ = 0;  // steps per epoch: the training part's tokens per stream, less one
  int64_t loss_steps_ = 0;
  std::array<Metric, 8> metrics_{};
  double train_seconds_ = 0;  // the chunks' time since the last report, and their steps
  int64_t trained_ = 0;
  double lr_ = c_.config.lr, best_ = std::numeric_limits<double>::infinity();  // --optim sgd's schedule
  std::array<int64_t, 2> schedule_{};  // (their bits in a checkpoint)
  Tensor eval_h_;  // the evaluation's state [state_rows x 10, hidden] (persistent)
  std::vector<float> eval_zero_;
  std::vector<int64_t> eval_tokens_, eval_chunk_targets_;  // a step's tokens; an evaluation segment's targets [K, 10]
  std::vector<Tensor> eval_features_;                       // its steps' outputs
  std::vector<uint8_t> eval_done_;
  std::vector<float> eval_rewards_;
  std::array<std::unique_ptr<Env>, 3> eval_env_;  // by EnvOptions::Part: the validation and test parts' 10 streams
  std::array<std::vector<int64_t>, 3> eval_start_;  // their state at their beginning
};

void validate(const TrainConfig& c) {
  if (c.env != "lm") throw Error("--algo lm learns a text corpus: --task lm --data FILE (--env lm), not --env " + c.env);
  const HistoryDef& h = history_def(c.history.kind);
  if (!h.recurrent || h.grows)
    throw Error("--task lm carries a recurrent state from chunk to chunk: --history " + c.history.str() + " has none to carry (choose " +
                history_choices([](const HistoryDef& d) { return d.recurrent && !d.grows; }) + ")");
}

}  // namespace

extern const AlgorithmDef LmAlgorithm;
const AlgorithmDef LmAlgorithm{
    .kind = Algo::Lm,
    .name = "lm",
    .flag = true,
    .help = "lm (a language model of a text corpus, --task lm: each chunk's mean cross-entropy over its tokens, validation "
            "loss, perplexity and bits per token each epoch)",
    .value_head = false,
    .validate = validate,
    .host_bytes = nullptr,
    .make = [](Context& c, HistoryRunner& h, Step& s) -> std::unique_ptr<Algorithm> { return std::make_unique<Lm>(c, h, s); },
};

}  // namespace segtape::agent
