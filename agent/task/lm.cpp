// lm: a text corpus as B streams of next-token prediction, the way PyTorch's
// word_language_model batchifies one: the part's N tokens cut into B
// contiguous streams of N / B (the tail that does not divide dropped);
// stream b reads token b N/B + i at step i and is asked for the one after
// it. An epoch is N/B - 1 steps; at its last step every stream's episode
// ends (the trainer starts the next epoch from the zero state, as the
// example's init_hidden at each epoch). Scored by next-token accuracy.
// Data parallel (EnvOptions::shards): the text is cut into shards x B
// streams, and each rank's env reads its own B of them.
#include <algorithm>

#include "corpus.h"
#include "task.h"

namespace segtape::agent {
namespace {

class Lm final : public Env {
 public:
  Lm(int64_t B, uint64_t seed, const EnvOptions& o) : Env(B, seed) {
    if (o.data.empty()) throw Error("lm: needs a text to learn (--data FILE)");
    corpus_ = load_corpus(o.data, o.valid, o.test, parse_tokens(o.tokens), o.split);
    const char* part = o.part == EnvOptions::Part::Train ? "training" : o.part == EnvOptions::Part::Valid ? "validation" : "test";
    const std::string& file = o.part == EnvOptions::Part::Test || (o.part == EnvOptions::Part::Valid && !o.valid.empty())
                                  ? (o.part == EnvOptions::Part::Test ? o.test : o.valid)
                                  : o.data;
    ids_ = o.part == EnvOptions::Part::Train ? &corpus_->train : o.part == EnvOptions::Part::Valid ? &corpus_->valid : &corpus_->test;
    if (o.shards < 1 || o.shard < 0 || o.shard >= o.shards) throw Error("lm: shard " + std::to_string(o.shard) + " of " + std::to_string(o.shards));
    per_ = int64_t(ids_->size()) / (B * o.shards);
    first_ = o.shard * B;
    if (per_ < 2)
      throw Error(file + ": its " + part + " part has " + std::to_string(ids_->size()) + " tokens (--tokens " + o.tokens + "), " +
                  "fewer than 2 for each of the " + std::to_string(B * o.shards) + " streams (a token and the next one to predict): a "
                  "longer text, fewer streams (--batch, ranks) or, for the validation part, a larger --split");
    const int64_t V = corpus_->vocab.size();
    spec_ = {"lm", V, 0, V, true, "accuracy", true};
    s_.assign(1, 0);
  }
  const EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tok, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tok[size_t(b)] = (*ids_)[size_t((first_ + b) * per_ + s_[0])];
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = (*ids_)[size_t((first_ + b) * per_ + s_[0] + 1)];
  }
  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) score_num_ += actions[size_t(b)] == (*ids_)[size_t((first_ + b) * per_ + s_[0] + 1)] ? 1 : 0;
    score_den_ += batch_;
    const bool end = ++s_[0] == per_ - 1;  // (the epoch's last step: the next starts at the streams' beginnings)
    if (end) s_[0] = 0;
    std::fill(reward.begin(), reward.end(), 0.0f);
    std::fill(done.begin(), done.end(), uint8_t(end));
  }
  const Corpus& corpus() const { return *corpus_; }

 protected:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> ints) const override { return ints.size() == 1 && ints[0] >= 0 && ints[0] < per_ - 1; }

 private:
  std::shared_ptr<const Corpus> corpus_;
  const std::vector<int32_t>* ids_ = nullptr;
  int64_t per_ = 0;    // tokens per stream
  int64_t first_ = 0;  // the first of the text's streams this env reads (EnvOptions::shard)
  EnvSpec spec_;
  std::vector<int64_t> s_;  // the step in the epoch
};

}  // namespace

std::unique_ptr<Env> lm_task(int64_t batch, uint64_t seed, const EnvOptions& o) { return std::make_unique<Lm>(batch, seed, o); }

}  // namespace segtape::agent
