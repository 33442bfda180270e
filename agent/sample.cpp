#include "segtape/agent/sample.h"

#include <cmath>
#include <vector>

#include "segtape/agent/policy.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/random.h"
#include "segtape/nn/safetensors.h"
#include "segtape/ops.h"
#include "sizing.h"
#include "task/corpus.h"

namespace segtape::agent {

void sample(const std::filesystem::path& checkpoint, const SampleOptions& o, const std::function<void(std::string_view)>& out) {
  if (o.length < 1) throw Error("--length " + std::to_string(o.length) + ": must be >= 1 (tokens to generate)");
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw Error("--temperature " + std::to_string(o.temperature) + ": must be a number > 0");
  const TrainConfig c = Trainer::read_config(checkpoint);
  if (c.env != "lm")
    throw Error(checkpoint.string() + ": a checkpoint of --env " + c.env + ", not of a language model (segtape train --task lm); "
                "segtape sample reads those (segtape eval evaluates this one)");
  const safetensors::File file = safetensors::load(checkpoint);
  const auto it = file.metadata.find(kVocabKey);
  if (it == file.metadata.end()) throw CheckpointError(checkpoint.string() + ": a language model's checkpoint without its vocabulary (" + kVocabKey + ")");
  Vocab vocab = Vocab::from_json(parse_tokens(c.env_options.tokens), it->second);
  std::vector<int32_t> ids;
  tokenize(o.prompt, "--prompt", vocab, false, ids);
  // The model on the CPU, its parameters the checkpoint's, at its --precision.
  Tape tape(Device::cpu(), {.segment_budget = size_t(16) << 20, .precision = tape_options(c).precision});
  nn::Rng init(c.seed), draw(o.seed);
  const int64_t V = vocab.size();
  const EnvSpec spec{"lm", V, 0, V, true, "accuracy", true};
  Policy policy(tape, init, spec, policy_shape(c, spec));
  (void)nn::load(policy, checkpoint, false, "policy.");
  const bool words = vocab.kind() == Tokens::Words;
  const auto text = [&](int64_t id) {
    const std::string& t = vocab.text(id);
    return words ? (t == "<eos>" ? std::string("\n") : t + " ") : t;
  };
  if (ids.empty()) ids.push_back(int32_t(draw.next_u64() % uint64_t(V)));  // (no prompt: a first token at random)
  std::vector<float> probs(static_cast<size_t>(V));
  Tensor h = tape.persistent({c.state_rows(), c.hidden});
  int64_t next = -1;
  for (int64_t t = 0; t < int64_t(ids.size()) + o.length; t += 64) {  // segments of 64 tokens, the state carried between them
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    Tensor state = h;
    for (int64_t i = t; i < t + 64 && i < int64_t(ids.size()) + o.length; ++i) {
      const int64_t tok = i < int64_t(ids.size()) ? ids[size_t(i)] : next;
      out(text(tok));
      if (i + 1 == int64_t(ids.size()) + o.length) break;
      const int64_t one = tok;
      state = policy.recur(policy.encode(tape.from(std::span<const int64_t>(&one, 1), {1})), state);
      if (i + 1 < int64_t(ids.size())) continue;  // (the prompt's tokens: read, not drawn)
      softmax(scale(policy.logits(policy.output(state)), 1.0 / o.temperature)).to_host(std::span<float>(probs));
      double u = draw.uniform(), acc = 0;
      next = V - 1;
      for (int64_t k = 0; k < V; ++k)
        if ((acc += double(probs[size_t(k)])) > u) {
          next = k;
          break;
        }
    }
    copy_into(h, state);
  }
}

}  // namespace segtape::agent
