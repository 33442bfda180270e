// lm_torch: PyTorch's examples/word_language_model (main.py and model.py),
// its training loop ported to LibTorch, the reference side of the language
// model benchmark (bench/lm_bench.py runs it beside `segtape train --task lm`).
//
// What main.py does, and so what this does:
//   - the corpus as one sequence of token ids, batchified into B streams:
//     trimmed to a multiple of B, viewed [B, N/B] and transposed to
//     [N/B, B] (row i holds each stream's i-th token);
//   - an epoch: chunks of bptt rows from row 0 (the last one shorter), the
//     input rows i .. i+len-1, the targets one row later; the state zero at
//     the epoch's start and detached at each chunk (repackage_hidden); the
//     loss the cross-entropy averaged over the chunk's len x B tokens; the
//     gradient's norm clipped, then an optimizer step (SGD as main.py's
//     p -= lr * grad, or Adam / AdamW);
//   - after each epoch evaluate(): the validation part batchified into 10
//     streams, the state zero at its start and carried over the whole part,
//     no gradient, dropout off; the mean cross-entropy per token
//     (sum over chunks of len x mean / (rows - 1));
//   - SGD only: the learning rate divided by 4 after an epoch whose
//     validation loss is no better than the best so far.
//   - the model (model.py's RNNModel): Embedding(V, E) -> dropout ->
//     GRU or LSTM(E, H, layers, dropout between layers) -> dropout ->
//     Linear(H, V), optionally tied (the decoder's weight is the encoder's,
//     H == E); init_weights: encoder and decoder weights uniform in
//     [-0.1, 0.1], the decoder's bias zero, the RNN at LibTorch's default.
//
// Tokens are segtape's (agent/task/corpus.cpp), reimplemented here so that
// the two programs see the same ids: chars = UTF-8 code points, bytes, or
// words (whitespace-separated, "<eos>" at each line's end); code points and
// bytes numbered in sorted order, words in first-appearance order; the
// vocabulary over the whole file; --split F keeps the last F of the tokens
// for validation. --print-layout prints the vocabulary and the parts' sizes
// as JSON and exits (the driver compares them with segtape's).
//
// Timing: a steady_clock around each epoch's training loop alone (the
// evaluation timed apart). Peak RSS: getrusage's ru_maxrss at the end.
//
//   build/bench/lm_torch --data FILE [--tokens chars] [--cell gru] [--layers 2] [--hidden 256]
//       [--embed 128] [--bptt 64] [--batch 32] [--optim adam] [--lr 2e-3] [--clip 0.25]
//       [--epochs 1] [--seed 1] [--threads 1] [--out FILE.json]
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

namespace {

using Clock = std::chrono::steady_clock;

// ---- Tokens, as agent/task/corpus.cpp makes them ----

// The length of the UTF-8 sequence at p (of at most n bytes), or 0 where it
// is not one (a stray continuation byte, an overlong form, a surrogate, above
// U+10FFFF, cut short); its code point in *cp.
size_t utf8_length(const unsigned char* p, size_t n, uint32_t* cp) {
  const unsigned char c = p[0];
  size_t len = 0;
  uint32_t v = 0, least = 0;
  if (c < 0x80) return *cp = c, 1;
  if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, least = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, least = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, least = 0x10000;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (p[i] & 0x3F);
  }
  if (v < least || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  return *cp = v, len;
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Corpus {
  std::vector<std::string> vocab;  // token texts by id
  std::vector<int64_t> train, valid;
};

// The file's tokens, their vocabulary, and the last `split` of them as the validation part.
Corpus load_corpus(const std::string& file, const std::string& kind, double split) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file + ": cannot read it");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty()) throw std::runtime_error(file + ": is empty");
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  Corpus c;
  std::vector<int64_t>& ids = c.train;
  if (kind == "bytes" || kind == "chars") {
    // Ids first as the code point (or byte) itself, then renumbered in
    // sorted order: UTF-8's byte order is its code points' order, so this
    // is segtape's sort of the tokens' texts.
    std::vector<size_t> at;  // each token's byte offset (its text, for the vocabulary)
    std::vector<uint8_t> len_of;
    for (size_t i = 0; i < n;) {
      uint32_t cp = p[i];
      size_t len = 1;
      if (kind == "chars" && (len = utf8_length(p + i, n - i, &cp)) == 0)
        throw std::runtime_error(file + ": byte " + std::to_string(i) + " is not UTF-8 (--tokens chars reads UTF-8 text)");
      ids.push_back(int64_t(cp));
      at.push_back(i), len_of.push_back(uint8_t(len));
      i += len;
    }
    std::vector<int64_t> id_of(0x110000, -1);
    for (size_t t = 0; t < ids.size(); ++t)
      if (id_of[size_t(ids[t])] < 0) id_of[size_t(ids[t])] = 0, c.vocab.emplace_back(text.substr(at[t], len_of[t]));
    int64_t next = 0;
    for (int64_t& id : id_of)
      if (id == 0) id = next++;
    std::sort(c.vocab.begin(), c.vocab.end());
    for (int64_t& id : ids) id = id_of[size_t(id)];
  } else if (kind == "words") {
    // As Python's `for line in f: line.split() + ['<eos>']`: lines end at
    // '\n' (the last one also without it), words are runs of other than whitespace.
    std::unordered_map<std::string, int64_t> id_of;
    auto token = [&](std::string_view t) {
      const auto [it, added] = id_of.try_emplace(std::string(t), int64_t(c.vocab.size()));
      if (added) c.vocab.emplace_back(t);
      ids.push_back(it->second);
    };
    const std::string_view all(text);
    for (size_t i = 0; i < n;) {
      const size_t end = std::min(n, all.find('\n', i));
      for (size_t j = i; j < end;) {
        while (j < end && is_space(p[j])) ++j;
        size_t k = j;
        while (k < end && !is_space(p[k])) ++k;
        if (k > j) token(all.substr(j, k - j));
        j = k;
      }
      token("<eos>");
      i = end + 1;
    }
  } else {
    throw std::runtime_error("--tokens '" + kind + "': choose bytes, chars or words");
  }
  const auto nv = size_t(double(ids.size()) * split);  // (segtape's formula, to the token)
  c.valid.assign(ids.end() - ptrdiff_t(nv), ids.end());
  c.train.resize(ids.size() - nv);
  return c;
}

// main.py's batchify: [N] -> [N / B, B], stream b in column b.
torch::Tensor batchify(const std::vector<int64_t>& ids, int64_t B) {
  const int64_t rows = int64_t(ids.size()) / B;
  torch::Tensor t = torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + rows * B), torch::kLong);
  return t.view({B, rows}).t().contiguous();
}

// ---- The model: model.py's RNNModel ----

struct State {
  torch::Tensor h, c;  // [layers, B, H] each; c for the LSTM only
};

// model.py's decoder, nn.Linear(H, V): its weight [V, H] and bias [V],
// drawn as nn.Linear draws them (init_weights redraws both); tied, the
// weight is the encoder's and this holds none (model.py replaces it).
struct DecoderImpl : torch::nn::Module {
  DecoderImpl(int64_t H, int64_t V, bool tied) {
    torch::NoGradGuard ng;
    // nn.Linear.reset_parameters' draws; registered in nn.Linear's order
    // (the order of parameters(), so of clip_grad_norm_'s sum)
    torch::Tensor w = torch::empty({V, H});
    torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
    if (!tied) weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::empty({V}).uniform_(-1.0 / std::sqrt(double(H)), 1.0 / std::sqrt(double(H))));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Decoder);

struct RNNModelImpl : torch::nn::Module {
  RNNModelImpl(bool lstm, int64_t V, int64_t E, int64_t H, int64_t layers, double dropout, bool tied)
      : lstm_(lstm), tied_(tied), layers_(layers), hidden_(H) {
    // The order of model.py's __init__ (the RNG's draws follow it).
    drop_ = register_module("drop", torch::nn::Dropout(dropout));
    encoder_ = register_module("encoder", torch::nn::Embedding(V, E));
    if (lstm)
      lstm_rnn_ = register_module("rnn", torch::nn::LSTM(torch::nn::LSTMOptions(E, H).num_layers(layers).dropout(dropout)));
    else
      gru_rnn_ = register_module("rnn", torch::nn::GRU(torch::nn::GRUOptions(E, H).num_layers(layers).dropout(dropout)));
    if (tied && H != E) throw std::runtime_error("--tied: --hidden must equal --embed");
    decoder_ = register_module("decoder", Decoder(H, V, tied));
    // init_weights (tied, the second draw is the encoder's weight's again, as in model.py)
    torch::NoGradGuard ng;
    encoder_->weight.uniform_(-0.1, 0.1);
    decoder_->bias.zero_();
    weight().uniform_(-0.1, 0.1);
  }
  const torch::Tensor& weight() const { return tied_ ? encoder_->weight : decoder_->weight; }

  // x [T, B] token ids -> logits [T * B, V]; `s` becomes the state after the last step.
  torch::Tensor forward(const torch::Tensor& x, State& s) {
    torch::Tensor emb = drop_(encoder_(x));  // [T, B, E]
    torch::Tensor out;                       // [T, B, H]
    if (lstm_) {
      auto [o, hc] = lstm_rnn_(emb, std::make_tuple(s.h, s.c));
      out = o, s.h = std::get<0>(hc), s.c = std::get<1>(hc);
    } else {
      std::tie(out, s.h) = gru_rnn_(emb, s.h);
    }
    out = drop_(out);
    torch::Tensor logits = torch::nn::functional::linear(out, weight(), decoder_->bias);  // [T, B, V]
    return logits.view({-1, logits.size(2)});
  }

  State init_hidden(int64_t B) const {
    return {torch::zeros({layers_, B, hidden_}), lstm_ ? torch::zeros({layers_, B, hidden_}) : torch::Tensor()};
  }
  bool lstm_, tied_;
  int64_t layers_, hidden_;
  torch::nn::Dropout drop_{nullptr};
  torch::nn::Embedding encoder_{nullptr};
  torch::nn::GRU gru_rnn_{nullptr};
  torch::nn::LSTM lstm_rnn_{nullptr};
  Decoder decoder_{nullptr};
};
TORCH_MODULE(RNNModel);

State detached(const State& s) { return {s.h.detach(), s.c.defined() ? s.c.detach() : torch::Tensor()}; }

// main.py's get_batch: rows i .. i+len-1 and their targets one row later.
int64_t chunk_length(int64_t bptt, int64_t rows, int64_t i) { return std::min(bptt, rows - 1 - i); }

// main.py's evaluate(): the mean cross-entropy per token over the part, from the zero state.
double evaluate(RNNModel& model, const torch::Tensor& data, int64_t bptt) {
  model->eval();
  torch::NoGradGuard ng;
  const int64_t rows = data.size(0);
  State s = model->init_hidden(data.size(1));
  double total = 0;
  for (int64_t i = 0; i < rows - 1; i += bptt) {
    const int64_t len = chunk_length(bptt, rows, i);
    const torch::Tensor logits = model->forward(data.narrow(0, i, len), s);
    total += double(len) * torch::nn::functional::cross_entropy(logits, data.narrow(0, i + 1, len).reshape(-1)).item<double>();
  }
  return total / double(rows - 1);
}

struct Args {
  std::string data, tokens = "chars", cell = "gru", optim = "adam", out;
  double split = 0.1, dropout = 0, lr = 2e-3, clip = 0.25, weight_decay = -1;
  int64_t layers = 2, hidden = 256, embed = 128, bptt = 64, batch = 32, epochs = 1, threads = 1;
  uint64_t seed = 1;
  bool tied = false, print_layout = false;
};

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // (Linux: KiB)
}

int run(const Args& a) {
  // Both pools sized before any parallel work (the inter-op pool only can be set once, before use).
  at::set_num_interop_threads(int(a.threads));
  torch::set_num_threads(int(a.threads));
  constexpr int64_t kEvalBatch = 10;  // main.py's eval_batch_size

  const Corpus corpus = load_corpus(a.data, a.tokens, a.split);
  const auto V = int64_t(corpus.vocab.size());
  nlohmann::json layout = {{"data", a.data},
                           {"tokens", a.tokens},
                           {"split", a.split},
                           {"vocab_size", V},
                           {"train_tokens", corpus.train.size()},
                           {"valid_tokens", corpus.valid.size()},
                           {"steps_per_epoch", int64_t(corpus.train.size()) / a.batch - 1},
                           {"valid_steps", int64_t(corpus.valid.size()) / kEvalBatch - 1}};
  if (a.print_layout) {
    layout["vocab"] = corpus.vocab;
    std::printf("%s\n", layout.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  if (int64_t(corpus.train.size()) / a.batch < 2) throw std::runtime_error("the training part is too short for --batch");
  if (int64_t(corpus.valid.size()) / kEvalBatch < 2) throw std::runtime_error("the validation part is too short for 10 streams");

  torch::manual_seed(a.seed);
  const torch::Tensor train = batchify(corpus.train, a.batch);   // [rows, B]
  const torch::Tensor valid = batchify(corpus.valid, kEvalBatch);  // [rows, 10]
  RNNModel model(a.cell == "lstm", V, a.embed, a.hidden, a.layers, a.dropout, a.tied);
  const std::vector<torch::Tensor> params = model->parameters();
  int64_t n_params = 0;
  for (const auto& p : params) n_params += p.numel();

  std::unique_ptr<torch::optim::Optimizer> opt;  // (none for SGD: main.py's own update)
  if (a.optim == "adam")
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(a.lr).weight_decay(std::max(0.0, a.weight_decay)));
  else if (a.optim == "adamw")
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay >= 0 ? a.weight_decay : 1e-2));
  else if (a.optim != "sgd")
    throw std::runtime_error("--optim '" + a.optim + "': choose sgd, adam or adamw");

  const int64_t rows = train.size(0);
  double lr = a.lr, best_valid = std::numeric_limits<double>::infinity();
  nlohmann::json epochs = nlohmann::json::array();
  for (int64_t epoch = 1; epoch <= a.epochs; ++epoch) {
    // ---- train(): timed alone ----
    model->train();
    State s = model->init_hidden(a.batch);
    double loss_sum = 0;
    int64_t chunks = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < rows - 1; i += a.bptt, ++chunks) {
      const int64_t len = chunk_length(a.bptt, rows, i);
      const torch::Tensor x = train.narrow(0, i, len), y = train.narrow(0, i + 1, len).reshape(-1);
      s = detached(s);  // repackage_hidden
      model->zero_grad();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x, s), y);
      loss.backward();
      if (a.clip > 0) torch::nn::utils::clip_grad_norm_(params, a.clip);
      if (opt) {
        opt->step();
      } else {
        torch::NoGradGuard ng;
        for (const auto& p : params) p.add_(p.grad(), -lr);  // main.py: p.data.add_(p.grad, alpha=-lr)
      }
      loss_sum += double(len) * loss.item<double>();
    }
    const double train_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // ---- evaluate(val_data) ----
    const auto t1 = Clock::now();
    const double valid_loss = evaluate(model, valid, a.bptt);
    const double valid_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    const int64_t tokens = (rows - 1) * a.batch;
    epochs.push_back({{"epoch", epoch},
                      {"lr", lr},
                      {"train_loss", loss_sum / double(rows - 1)},
                      {"train_tokens", tokens},
                      {"train_seconds", train_seconds},
                      {"tokens_per_s", double(tokens) / train_seconds},
                      {"valid_loss", valid_loss},
                      {"valid_seconds", valid_seconds}});
    std::fprintf(stderr, "| end of epoch %3ld | chunks %ld | train %.2f s (%.0f tokens/s) | train loss %.4f | valid loss %.4f (%.2f s)\n",
                 long(epoch), long(chunks), train_seconds, double(tokens) / train_seconds, loss_sum / double(rows - 1), valid_loss,
                 valid_seconds);
    // main.py: anneal the learning rate when the validation loss does not improve (its SGD only)
    if (valid_loss < best_valid) best_valid = valid_loss;
    else if (!opt) lr /= 4.0;
  }

  nlohmann::json settings = {{"data", a.data},     {"tokens", a.tokens}, {"split", a.split},     {"cell", a.cell},   {"layers", a.layers},
                             {"hidden", a.hidden}, {"embed", a.embed},   {"dropout", a.dropout}, {"tied", a.tied},   {"bptt", a.bptt},
                             {"batch", a.batch},   {"optim", a.optim},   {"lr", a.lr},           {"clip", a.clip},   {"epochs", a.epochs},
                             {"seed", a.seed},     {"threads", a.threads}};
  if (a.optim != "sgd") settings["weight_decay"] = a.weight_decay >= 0 ? a.weight_decay : (a.optim == "adamw" ? 1e-2 : 0.0);
  const nlohmann::json result = {{"engine", "libtorch"},
                                 {"torch_version", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                                                       std::to_string(TORCH_VERSION_PATCH)},
                                 {"torch_threads", at::get_num_threads()},
                                 {"torch_interop_threads", at::get_num_interop_threads()},
                                 {"settings", settings},
                                 {"layout", layout},
                                 {"parameters", n_params},
                                 {"epochs", epochs},
                                 {"peak_rss_bytes", peak_rss_bytes()}};
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    f << result.dump(2) << '\n';
    if (!f) throw std::runtime_error(a.out + ": write failed");
  } else {
    std::printf("%s\n", result.dump(2).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PyTorch's word_language_model training loop in LibTorch (the language model benchmark's reference)"};
  Args a;
  app.add_option("--data", a.data, "The text (one file; the last --split of its tokens are the validation part)")->required();
  app.add_option("--split", a.split, "Fraction of the tokens kept for validation")->check(CLI::Range(0.0, 1.0));
  app.add_option("--tokens", a.tokens, "bytes, chars (UTF-8 code points) or words (<eos> at each line's end)")
      ->check(CLI::IsMember({"bytes", "chars", "words"}));
  app.add_option("--cell", a.cell, "gru or lstm")->check(CLI::IsMember({"gru", "lstm"}));
  app.add_option("--layers", a.layers, "Recurrent layers")->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.hidden, "Hidden size H")->check(CLI::PositiveNumber);
  app.add_option("--embed", a.embed, "Embedding size E")->check(CLI::PositiveNumber);
  app.add_option("--dropout", a.dropout, "Dropout after the embedding, between layers and before the decoder")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--tied", a.tied, "The decoder's weight is the encoder's (needs --hidden == --embed)");
  app.add_option("--bptt", a.bptt, "Chunk length (truncated BPTT)")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "Training streams B")->check(CLI::PositiveNumber);
  app.add_option("--optim", a.optim, "sgd (main.py's, lr / 4 on a validation plateau), adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", a.lr, "Learning rate")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", a.weight_decay, "Adam / AdamW weight decay (default: LibTorch's, 0 / 0.01)");
  app.add_option("--clip", a.clip, "Gradient norm clip (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", a.epochs, "Epochs")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "torch::manual_seed");
  app.add_option("--threads", a.threads, "torch::set_num_threads and the inter-op pool")->check(CLI::PositiveNumber);
  app.add_option("--out", a.out, "Write the results here as JSON (default: stdout)");
  app.add_flag("--print-layout", a.print_layout, "Print the vocabulary and the parts' sizes as JSON and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lm_torch: %s\n", e.what());
    return 1;
  }
}
