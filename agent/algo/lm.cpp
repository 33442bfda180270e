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

class Lm : public Algorithm {
 public:
  Lm(Context& c, HistoryRunner& h, Step& s) : Algorithm(c, h, s) {
    const EnvOptions& o = c.config.env_options;
    corpus_ = load_corpus(o.data, o.valid, o.test, parse_tokens(o.tokens), o.split);
    epoch_ = int64_t(corpus_->train.size()) / (c.config.batch * c.ranks()) - 1;  // (data parallel: the ranks' streams share the text)
    history_.prepare(c.h_home, true);
    eval_h_ = c.tape->persistent({c.config.state_rows() * kEvalStreams, c.config.hidden});
    eval_zero_.assign(size_t(eval_h_.numel()), 0.0f);
    eval_tokens_.assign(size_t(kEvalStreams), 0), eval_targets_.assign(size_t(kEvalStreams), 0);
    eval_done_.assign(size_t(kEvalStreams), 0), eval_rewards_.assign(size_t(kEvalStreams), 0.0f);
    // The parts' envs, made once (an evaluation starts them at their beginning)
    for (const EnvOptions::Part part : {EnvOptions::Part::Valid, EnvOptions::Part::Test}) {
      if (part == EnvOptions::Part::Test && corpus_->test.empty()) continue;
      EnvOptions p = o;
      p.part = part;
      eval_env_[size_t(part)] = make_env(c.config.env, kEvalStreams, 0, p);
      eval_start_[size_t(part)] = eval_env_[size_t(part)]->save_state();
    }
  }

  void save_metadata(std::map<std::string, std::string>& meta) const override { meta[kVocabKey] = corpus_->vocab.to_json(); }

  // --optim sgd: the schedule's learning rate and best validation loss (doubles, bit for bit)
  void entries(std::vector<nn::Entry>& e) override {
    if (c_.config.optim != "sgd") return;
    std::memcpy(schedule_.data(), &lr_, 8), std::memcpy(schedule_.data() + 1, &best_, 8);
    e.push_back(nn::entry("lm.schedule", std::span<int64_t>(schedule_), {2}));
  }
  void loaded() override {
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
    const double scale = 1.0 / double(n);  // (the chunk's mean over its n x B tokens)
    Steps s;
    s.step = [this, scale](Tape& t, int64_t, const Tensor& h, replay::Inputs& in) {
      return cross_entropy_step(c_, step_, t, h, in, scale, loss_steps_);
    };
    s.update = [this] { c_.update(loss_steps_ > 0); };
    const auto t0 = std::chrono::steady_clock::now();
    UpdateResult r = result_of(n, history_.run(s, n));
    train_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), trained_ += n;
    r.loss_sum *= double(n);  // (the steps' mean losses, each read scaled by 1/n)
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
      Tensor sum;
      for (int64_t i = 0; i < K && done < steps; ++i, ++done) {
        env->observe(eval_tokens_, {});
        env->targets(eval_targets_);
        const Recurred r = step_.feature(c_.tape->from(std::span<const int64_t>(eval_tokens_), {kEvalStreams}), h);
        const Tensor l = cross_entropy(step_.logits(r.feature), c_.tape->from(std::span<const int64_t>(eval_targets_), {kEvalStreams}),
                                       Reduction::Sum);
        sum = sum.defined() ? add(sum, l) : l;
        env->step(eval_targets_, eval_rewards_, eval_done_);  // (the targets as actions: the score is not read)
        h = r.state;
      }
      total += sum.item();
      copy_into(eval_h_, h);
      h = eval_h_;
    }
    return total / double(steps * kEvalStreams);
  }

  std::shared_ptr<const Corpus> corpus_;
  int64_t epoch_ = 0;  // steps per epoch: the training part's tokens per stream, less one
  int64_t loss_steps_ = 0;
  std::array<Metric, 8> metrics_{};
  double train_seconds_ = 0;  // the chunks' time since the last report, and their steps
  int64_t trained_ = 0;
  double lr_ = c_.config.lr, best_ = std::numeric_limits<double>::infinity();  // --optim sgd's schedule
  std::array<int64_t, 2> schedule_{};  // (their bits in a checkpoint)
  Tensor eval_h_;  // the evaluation's state [state_rows x 10, hidden] (persistent)
  std::vector<float> eval_zero_;
  std::vector<int64_t> eval_tokens_, eval_targets_;
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
