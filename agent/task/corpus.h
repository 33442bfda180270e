// A text corpus as token ids (private to the agent library): a file read
// through a memory map and tokenised into one buffer of ids, by bytes, by
// UTF-8 code points or by words (whitespace-separated, an end-of-line token
// after each line, as PyTorch's word_language_model). No second copy of the
// text is kept: the ids are the corpus.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace segtape::agent {

enum class Tokens : uint8_t {
  Bytes,  // a token per byte
  Chars,  // a token per UTF-8 code point (the file must be UTF-8)
  Words,  // a token per whitespace-separated word, and "<eos>" at each line's end
};
Tokens parse_tokens(const std::string& s);  // "bytes", "chars", "words"; an Error naming --tokens otherwise
const char* tokens_name(Tokens t);

// Token ids and their texts. Bytes and code points are numbered in their
// order (the sorted set of those the corpus has, as char-rnn's vocabulary);
// words in the order they first appear (word_language_model's Dictionary).
class Vocab {
 public:
  explicit Vocab(Tokens kind) : kind_(kind) {}
  Tokens kind() const { return kind_; }
  int64_t size() const { return int64_t(texts_.size()); }
  const std::string& text(int64_t id) const { return texts_[size_t(id)]; }
  // The id of a token's text, or -1.
  int64_t id(std::string_view text) const;
  int64_t add(std::string_view text);  // its id, added where new
  // Bytes and code points numbered in sorted order (after a corpus added
  // them as it met them): returns each old id's new one.
  std::vector<int32_t> sort();
  // One line of JSON (an array of the texts by id), for a checkpoint's metadata, and back.
  std::string to_json() const;
  static Vocab from_json(Tokens kind, const std::string& json);

 private:
  Tokens kind_;
  std::vector<std::string> texts_;
  std::unordered_map<std::string, int64_t> ids_;
};

// A file's text as token ids, appended to `ids`. grow: a token the vocab
// lacks is added; otherwise it is refused, naming the file, the token and
// where it stands. Refuses (Error naming the file and what is wrong): no
// such file, a directory, unreadable, empty, bytes that are not UTF-8 under
// Chars (their offset).
void tokenize(const std::filesystem::path& file, Vocab& vocab, bool grow, std::vector<int32_t>& ids);
// The same for a text in memory (a prompt), named `what` in messages.
void tokenize(std::string_view text, const std::string& what, Vocab& vocab, bool grow, std::vector<int32_t>& ids);

// The checkpoint metadata key of a language model's vocabulary (Vocab::to_json).
inline constexpr const char* kVocabKey = "lm.vocab";

// A language-model corpus: the training, validation and test parts' ids and
// their one vocabulary (built over all the parts, as word_language_model's).
struct Corpus {
  explicit Corpus(Tokens kind) : vocab(kind) {}
  Vocab vocab;
  std::vector<int32_t> train, valid, test;
};

// The corpus of `data` (and `valid`, `test` where given; else the last
// `split` of data's tokens is the validation part and no test part), read
// once per process and shared (a trainer, its evaluations and samples use
// the same one).
std::shared_ptr<const Corpus> load_corpus(const std::string& data, const std::string& valid, const std::string& test, Tokens kind,
                                          double split);

}  // namespace segtape::agent
