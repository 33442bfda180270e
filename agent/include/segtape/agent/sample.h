// Text from a language model: what a checkpoint of `segtape train --task lm`
// writes after a prompt (segtape sample).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace segtape::agent {

struct SampleOptions {
  std::string prompt;        // read first (its tokens must be in the vocabulary); "": a first token drawn uniformly
  int64_t length = 500;      // tokens to generate
  double temperature = 1.0;  // the logits divided by it before the softmax (> 0; lower: likelier tokens)
  uint64_t seed = 1;         // the draws (the same seed, the same text)
};

// Loads the model and the vocabulary a language-model checkpoint holds (no
// corpus file is read), reads the prompt, and generates o.length tokens,
// each drawn from the softmax of the logits over the temperature; `out` gets
// the prompt's text, then each token's as it is drawn (words with a space
// between, "<eos>" as a line's end). Refuses (Error naming the checkpoint or
// the flag): a checkpoint that is not a language model's, a prompt's token
// not in the vocabulary, length < 1, a temperature not > 0.
void sample(const std::filesystem::path& checkpoint, const SampleOptions& o, const std::function<void(std::string_view)>& out);

}  // namespace segtape::agent
