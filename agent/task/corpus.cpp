#include "corpus.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "segtape/error.h"

namespace segtape::agent {

Tokens parse_tokens(const std::string& s) {
  if (s == "bytes") return Tokens::Bytes;
  if (s == "chars") return Tokens::Chars;
  if (s == "words") return Tokens::Words;
  throw Error("--tokens '" + s + "': choose bytes, chars (UTF-8 code points) or words");
}

const char* tokens_name(Tokens t) {
  switch (t) {
    case Tokens::Bytes: return "bytes";
    case Tokens::Chars: return "chars";
    case Tokens::Words: return "words";
  }
  return "?";
}

int64_t Vocab::id(std::string_view text) const {
  const auto it = ids_.find(std::string(text));
  return it == ids_.end() ? -1 : it->second;
}

int64_t Vocab::add(std::string_view text) {
  const auto [it, added] = ids_.try_emplace(std::string(text), int64_t(texts_.size()));
  if (added) texts_.emplace_back(text);
  return it->second;
}

std::vector<int32_t> Vocab::sort() {
  std::vector<int64_t> order(texts_.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return texts_[size_t(a)] < texts_[size_t(b)]; });
  std::vector<int32_t> renumber(texts_.size());
  std::vector<std::string> texts(texts_.size());
  for (size_t n = 0; n < order.size(); ++n) {
    renumber[size_t(order[n])] = int32_t(n);
    texts[n] = std::move(texts_[size_t(order[n])]);
  }
  texts_ = std::move(texts);
  for (size_t n = 0; n < texts_.size(); ++n) ids_[texts_[n]] = int64_t(n);
  return renumber;
}

std::string Vocab::to_json() const { return nlohmann::json(texts_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

Vocab Vocab::from_json(Tokens kind, const std::string& json) {
  Vocab v(kind);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(std::string("the vocabulary in the checkpoint is not valid JSON: ") + e.what());
  }
  if (!j.is_array() || j.empty()) throw CheckpointError("the vocabulary in the checkpoint is not an array of its tokens");
  for (const auto& t : j) {
    if (!t.is_string()) throw CheckpointError("the vocabulary in the checkpoint holds a token that is not a string");
    if (v.add(t.get<std::string>()) != v.size() - 1) throw CheckpointError("the vocabulary in the checkpoint holds a token twice");
  }
  return v;
}

namespace {

// The length of the UTF-8 sequence at p (1 to 4 bytes, of at most n), or 0
// where it is not one: a stray continuation byte, an overlong form, a
// surrogate, a code point above U+10FFFF, or a sequence the text cuts.
size_t utf8_length(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  size_t len = 0;
  uint32_t cp = 0, least = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, least = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, least = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, least = 0x10000;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// A file's bytes through a memory map, unmapped when it goes.
class Mapped {
 public:
  explicit Mapped(const std::filesystem::path& file) {
    const std::string name = file.string();
    struct stat st {};
    if (::stat(name.c_str(), &st) != 0)
      throw Error(name + ": " + (errno == ENOENT ? std::string("no such file") : "cannot read it (" + std::string(std::strerror(errno)) + ")"));
    if (S_ISDIR(st.st_mode)) throw Error(name + ": is a directory, not a text file");
    if (!S_ISREG(st.st_mode)) throw Error(name + ": not a regular file");
    const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(name + ": cannot read it (" + std::string(std::strerror(errno)) + ")");
    size_ = size_t(st.st_size);
    if (size_ == 0) {
      ::close(fd);
      throw Error(name + ": is empty");
    }
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw Error(name + ": cannot read it (" + std::string(std::strerror(err)) + ")");
    data_ = static_cast<const unsigned char*>(p);
  }
  ~Mapped() { ::munmap(const_cast<unsigned char*>(data_), size_); }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// The token at [at, at + n) of `what`: its id (added, or refused where the vocab lacks it).
int32_t token_id(std::string_view tok, const std::string& what, size_t at, Vocab& vocab, bool grow) {
  const int64_t id = grow ? vocab.add(tok) : vocab.id(tok);
  if (id < 0) {
    std::string shown;
    for (const char ch : tok) shown += (ch == '\n' ? std::string("\\n") : std::string(1, ch));
    throw Error(what + ": the token '" + shown + "' at byte " + std::to_string(at) + " is not in the vocabulary (" +
                std::to_string(vocab.size()) + " tokens, made from the training data)");
  }
  if (id > INT32_MAX) throw Error(what + ": more than 2^31 distinct tokens");
  return int32_t(id);
}

}  // namespace

void tokenize(std::string_view text, const std::string& what, Vocab& vocab, bool grow, std::vector<int32_t>& ids) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  switch (vocab.kind()) {
    case Tokens::Bytes:
      for (size_t i = 0; i < n; ++i) ids.push_back(token_id(text.substr(i, 1), what, i, vocab, grow));
      return;
    case Tokens::Chars:
      for (size_t i = 0; i < n;) {
        const size_t len = utf8_length(p + i, n - i);
        if (len == 0)
          throw Error(what + ": byte " + std::to_string(i) + " (0x" + "0123456789abcdef"[p[i] >> 4] + "0123456789abcdef"[p[i] & 15] +
                      ") is not UTF-8; --tokens chars reads UTF-8 text (--tokens bytes reads any file)");
        ids.push_back(token_id(text.substr(i, len), what, i, vocab, grow));
        i += len;
      }
      return;
    case Tokens::Words:
      // As Python's `for line in f: line.split() + ['<eos>']`: lines end at
      // '\n' (the last one also without it), words are runs of other than whitespace.
      for (size_t i = 0; i < n;) {
        const size_t end = std::min(n, text.find('\n', i));
        for (size_t j = i; j < end;) {
          while (j < end && is_space(p[j])) ++j;
          size_t k = j;
          while (k < end && !is_space(p[k])) ++k;
          if (k > j) ids.push_back(token_id(text.substr(j, k - j), what, j, vocab, grow));
          j = k;
        }
        ids.push_back(token_id("<eos>", what, end, vocab, grow));
        i = end + 1;
      }
      return;
  }
}

void tokenize(const std::filesystem::path& file, Vocab& vocab, bool grow, std::vector<int32_t>& ids) {
  const Mapped m(file);
  tokenize(m.text(), file.string(), vocab, grow, ids);
}

std::shared_ptr<const Corpus> load_corpus(const std::string& data, const std::string& valid, const std::string& test, Tokens kind,
                                          double split) {
  // One per process and set of files (an evaluation, a sample and the trainer share it).
  static std::mutex lock;
  static std::map<std::tuple<std::string, std::string, std::string, Tokens, double>, std::weak_ptr<const Corpus>> loaded;
  const std::lock_guard<std::mutex> hold(lock);
  const auto key = std::make_tuple(data, valid, test, kind, split);
  if (auto it = loaded.find(key); it != loaded.end())
    if (std::shared_ptr<const Corpus> c = it->second.lock()) return c;
  auto c = std::make_shared<Corpus>(kind);
  tokenize(data, c->vocab, true, c->train);
  if (!valid.empty()) {
    tokenize(valid, c->vocab, true, c->valid);
  } else {  // the last `split` of the tokens
    const auto n = size_t(double(c->train.size()) * split);
    c->valid.assign(c->train.end() - ptrdiff_t(n), c->train.end());
    c->train.resize(c->train.size() - n);
  }
  if (!test.empty()) tokenize(test, c->vocab, true, c->test);
  if (kind != Tokens::Words) {  // bytes and code points in their order, over all the parts
    const std::vector<int32_t> renumber = c->vocab.sort();
    for (auto* part : {&c->train, &c->valid, &c->test})
      for (int32_t& i : *part) i = renumber[size_t(i)];
  }
  loaded[key] = c;
  return c;
}

}  // namespace segtape::agent
