// Language models on a text corpus (--task lm): tokenisation and batchify
// as PyTorch's word_language_model lays them out, a short run that learns,
// resume, sampling, memory, and the bad inputs. The corpus is
// tests/data/shakespeare-20k.txt, the first 20,000 bytes of tinyshakespeare.
#include <gtest/gtest.h>
#include <cblas.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "agent_util.h"
#include "alloc_hook.h"
#include "segtape/agent/sample.h"
#include "segtape/agent/trainer.h"

#include "../agent/sizing.h"
#include "../agent/task/corpus.h"
#include "process.h"

using namespace segtape;
using namespace segtape::agent;
using segtape::test::params_of;
namespace fs = std::filesystem;

namespace {

const fs::path kText = fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "data" / "shakespeare-20k.txt";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("segtape_lm_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}

fs::path write(const std::string& name, const std::string& text) {
  const fs::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TrainConfig lm_config(const std::string& data, int64_t steps) {
  TrainConfig c;
  c.env = "lm";
  c.algo = Algo::Lm;
  c.env_options.data = data;
  c.history = History::parse("tbptt:16");
  c.batch = 8;
  c.hidden = 64;
  c.embed = 32;
  c.steps = steps;
  c.lr = 1e-2;
  return c;
}

// The entropy of the tokens' frequencies in nats: what a model that ignores the history can reach.
double unigram_entropy(const std::vector<int32_t>& ids) {
  std::map<int32_t, double> counts;
  for (int32_t t : ids) counts[t] += 1;
  double entropy = 0;
  for (const auto& [t, n] : counts) entropy -= n / double(ids.size()) * std::log(n / double(ids.size()));
  return entropy;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Words as data.py reads them (`for line in f: line.split() + ['<eos>']`,
// ids in order of first appearance over train, valid and test); bytes and
// code points numbered in sorted order; batchify's streams contiguous
// (data.view(bsz, -1).t()), the tail that does not divide dropped, step i
// of stream b reading token b N/B + i and asked for the next.
TEST(Lm, TokensAndBatchifyAreTheExamplesLayout) {
  const fs::path words = write("words.txt", "the cat  sat\non the\n\nmat");
  Corpus w = *load_corpus(words.string(), words.string(), "", Tokens::Words, 0.1);
  // the=0 cat=1 sat=2 <eos>=3 on=4 mat=5
  EXPECT_EQ(w.train, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 3, 3, 5, 3}));
  EXPECT_EQ(w.vocab.size(), 6);
  EXPECT_EQ(w.vocab.text(3), "<eos>");
  const fs::path chars = write("chars.txt", "bca\xc3\xa9" "ab");
  Corpus c = *load_corpus(chars.string(), chars.string(), "", Tokens::Chars, 0.1);
  EXPECT_EQ(c.train, (std::vector<int32_t>{1, 2, 0, 3, 0, 1}));  // a b c é, in code point order
  EXPECT_EQ(c.vocab.text(3), "\xc3\xa9");
  Corpus b = *load_corpus(chars.string(), chars.string(), "", Tokens::Bytes, 0.1);
  EXPECT_EQ(b.train.size(), 7u);
  // batchify: 10 word tokens over B = 3 streams of 3 (the last one dropped)
  EnvOptions o;
  o.data = words.string(), o.valid = words.string(), o.tokens = "words";
  auto env = make_env("lm", 3, 1, o);
  std::vector<int64_t> tok(3), y(3), a(3, 0);
  std::vector<float> r(3);
  std::vector<uint8_t> done(3);
  env->observe(tok, {});
  env->targets(y);
  EXPECT_EQ(tok, (std::vector<int64_t>{0, 3, 3}));  // tokens 0, 3, 6
  EXPECT_EQ(y, (std::vector<int64_t>{1, 4, 3}));
  env->step(a, r, done);
  EXPECT_EQ(done, (std::vector<uint8_t>{0, 0, 0}));
  env->observe(tok, {});
  EXPECT_EQ(tok, (std::vector<int64_t>{1, 4, 3}));
  env->step(a, r, done);  // an epoch is 3 - 1 steps: its last ends every stream's episode, the next starts over
  EXPECT_EQ(done, (std::vector<uint8_t>{1, 1, 1}));
  env->observe(tok, {});
  EXPECT_EQ(tok, (std::vector<int64_t>{0, 3, 3}));
  // --split: the last fraction of the tokens is the validation part
  Corpus s = *load_corpus(words.string(), "", "", Tokens::Words, 0.3);
  EXPECT_EQ(s.train, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 3}));
  EXPECT_EQ(s.valid, (std::vector<int32_t>{3, 5, 3}));
}

// A short run on the excerpt: the validation loss (nats per char) ends well
// below the validation part's unigram entropy (what a model that ignores the
// history could reach), is reported each epoch with its perplexity and bits,
// and the chunks' segment peaks repeat epoch after epoch; resumed from a
// mid-run checkpoint, the run ends with the same parameters bit for bit.
TEST(Lm, AShortRunLearnsBelowTheUnigramEntropyAndResumesBitIdentically) {
  const Corpus corpus = *load_corpus(kText.string(), "", "", Tokens::Chars, 0.1);
  const int64_t epoch = int64_t(corpus.train.size()) / 8 - 1;  // (B = 8)
  ASSERT_EQ(epoch, 2249);
  const TrainConfig c = lm_config(kText.string(), 3 * epoch);
  const double entropy = unigram_entropy(corpus.valid);
  Trainer tr(c), first(c);
  std::vector<std::vector<size_t>> peaks(3);
  std::vector<double> valid;
  while (!tr.done()) {
    const int64_t at = tr.step();
    const UpdateResult r = tr.run_segment();
    peaks[size_t(at / epoch)].push_back(tr.tape().stats().last_segment_peak);
    if (r.metric("valid_loss") > 0) valid.push_back(r.metric("valid_loss"));
  }
  ASSERT_EQ(valid.size(), 3u) << "a validation at each epoch's end";
  EXPECT_LT(valid.back(), 0.85 * entropy) << "unigram entropy " << entropy;
  EXPECT_LT(valid.back(), valid.front());
  EXPECT_EQ(peaks[1], peaks[2]) << "an epoch's chunks reach the high-waters of the one before";
  // resume
  const fs::path ck = scratch("ck.safetensors");
  while (first.step() < 1500) first.run_segment();
  first.save(ck);
  Trainer second(Trainer::read_config(ck));
  second.load(ck);
  while (!second.done()) second.run_segment();
  EXPECT_EQ(params_of(second), params_of(tr));
  // sampling: the same text for a seed, another for another seed
  std::string a, b, d;
  tr.save(ck);
  sample(ck, {.prompt = "ROMEO:", .length = 100, .temperature = 0.8, .seed = 1}, [&](std::string_view t) { a += t; });
  sample(ck, {.prompt = "ROMEO:", .length = 100, .temperature = 0.8, .seed = 1}, [&](std::string_view t) { b += t; });
  sample(ck, {.prompt = "ROMEO:", .length = 100, .temperature = 0.8, .seed = 2}, [&](std::string_view t) { d += t; });
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  EXPECT_EQ(a.rfind("ROMEO:", 0), 0u);
  EXPECT_GE(a.size(), 106u);
  fs::remove_all(ck.parent_path());
}

// A checkpoint resumes only on the data it was trained with: a corpus whose
// vocabulary changed since is refused, naming the vocabulary, even where
// its size did not (every 'z' now U+00A7, which sorts after every other
// character: the ids shift, the model's shapes stay), and the same corpus
// still resumes.
TEST(Lm, ResumeRefusesDataWhoseVocabularyChanged) {
  const TrainConfig c = lm_config(kText.string(), 64);
  const fs::path ck = scratch("vocab.safetensors");
  {
    Trainer tr(c);
    tr.run_segment();
    tr.save(ck);
  }
  std::ifstream in(kText, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string swapped;
  for (char ch : text) swapped += ch == 'z' ? std::string("\xc2\xa7") : std::string(1, ch);
  ASSERT_NE(swapped, text);
  TrainConfig changed = c;
  changed.env_options.data = write("changed.txt", swapped).string();
  Trainer other(changed);
  const std::string m = message_of([&] { other.load(ck); });
  EXPECT_NE(m.find("lm.vocab differs from the one this run made from its data"), std::string::npos) << m;
  Trainer same(c);
  EXPECT_EQ(message_of([&] { same.load(ck); }), "");
  fs::remove_all(ck.parent_path());
}

// word_language_model's other models: two LSTM layers with dropout (on the
// embeddings, between the layers, on the output) and the output layer tied
// to the embeddings, trained with SGD and its schedule; and the same with
// exact BPTT, whose replays must apply the masks the first pass drew (the
// replay driver checks every recomputed boundary state bit for bit). Each
// learns below the unigram entropy (SGD with tbptt, Adam with exact) and resumes bit-identically (the masks'
// generator and the schedule are in the checkpoint); a policy's parameter
// count is what Policy::parameters_for says without building it.
TEST(Lm, LstmStacksWithDropoutAndTiedWeightsLearnAndResume) {
  const Corpus corpus = *load_corpus(kText.string(), "", "", Tokens::Chars, 0.1);
  const double entropy = unigram_entropy(corpus.valid);
  for (const char* history : {"tbptt:16", "exact:8/32"}) {
    SCOPED_TRACE(history);
    TrainConfig c = lm_config(kText.string(), 2 * 2249);
    c.history = History::parse(history);
    c.cell = "lstm", c.layers = 2, c.dropout = 0.2, c.tied = true, c.hidden = c.embed = 64;
    if (c.history.kind == History::Kind::Tbptt) c.optim = "sgd", c.lr = 4, c.clip = 0.25;  // (exact: fewer updates, Adam's 1e-2)
    Trainer tr(c), first(c);
    EXPECT_EQ(tr.policy().parameter_count(),
              Policy::parameters_for(tr.env().spec(), policy_shape(c, tr.env().spec())));
    EXPECT_EQ(test::largest_parameter(tr.policy()), Policy::largest_parameter_for(tr.env().spec(), policy_shape(c, tr.env().spec())));
    const auto names = tr.policy().named_parameters();
    EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const auto& n) { return n.first == "rnn.weight_hh_l1"; }));
    EXPECT_TRUE(std::none_of(names.begin(), names.end(), [](const auto& n) { return n.first == "head.weight"; })) << "tied";
    double valid = 0;
    while (!tr.done()) {
      const UpdateResult r = tr.run_segment();
      if (r.metric("valid_loss") > 0) valid = r.metric("valid_loss");
    }
    EXPECT_LT(valid, 0.9 * entropy) << "unigram entropy " << entropy;
    const fs::path ck = scratch("stack.safetensors");
    while (first.step() < 3000) first.run_segment();
    first.save(ck);
    Trainer second(Trainer::read_config(ck));
    second.load(ck);
    while (!second.done()) second.run_segment();
    EXPECT_EQ(params_of(second), params_of(tr));
    EXPECT_EQ(second.lr(), tr.lr());
  }
}

// PolicyShape::input_table is the same model: layer 0's input gates read
// from the table E W_ih^T + b_ih, made at a segment's first step, give the
// losses and every parameter's gradient of the per-step products (GRU and
// LSTM stacks, float32: within 1e-5), in a second segment too, after the
// weights changed (the table is made again).
TEST(Lm, TheInputTableIsTheSameModel) {
  EnvOptions o;
  o.data = kText.string();
  const EnvSpec spec = make_env("lm", 4, 1, o)->spec();
  const int64_t B = 4, E = 6, H = 8, T = 5;
  for (const bool lstm : {false, true}) {
    SCOPED_TRACE(lstm ? "lstm" : "gru");
    struct Run {
      std::vector<double> losses;
      std::map<std::string, std::vector<float>> grads;
    };
    auto run = [&](bool table) {
      Tape tape;
      nn::Rng rng(7);
      PolicyShape shape{E, H, 0, false};
      shape.lstm = lstm, shape.layers = 2, shape.input_table = table;
      const Policy p(tape, rng, spec, shape);
      Run out;
      for (int segment = 0; segment < 2; ++segment) {
        if (segment == 1)  // the weights change between segments (as an optimizer step)
          for (const auto& [name, w] : p.named_parameters()) {
            std::vector<float> v = w.to_host<float>();
            for (float& x : v) x *= 0.9f;
            w.from_host(std::span<const float>(v));
          }
        Segment seg = tape.segment();
        Tensor h = tape.zeros({shape.state_rows() * B, H}), loss;
        for (int64_t t = 0; t < T; ++t) {
          std::vector<int64_t> tok(static_cast<size_t>(B)), next(static_cast<size_t>(B));
          for (int64_t b = 0; b < B; ++b) {
            tok[size_t(b)] = (t * 7 + b * 3 + segment) % spec.vocab;
            next[size_t(b)] = (tok[size_t(b)] + 1) % spec.vocab;
          }
          const Tensor e = p.encode(tape.from(std::span<const int64_t>(tok), {B}));
          EXPECT_EQ(e.dim(1), table ? (lstm ? 4 : 3) * H : E);
          h = p.recur(e, h);
          const Tensor l = cross_entropy(p.logits(p.output(h)), tape.from(std::span<const int64_t>(next), {B}));
          loss = t ? add(loss, l) : l;
        }
        out.losses.push_back(loss.item());
        seg.backward(loss);
      }
      for (const auto& [name, w] : p.named_parameters()) out.grads[name] = w.grad_tensor().to_host<float>();
      return out;
    };
    const Run plain = run(false), table = run(true);
    ASSERT_EQ(plain.losses.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(table.losses[i], plain.losses[i], 1e-5 * std::abs(plain.losses[i])) << "segment " << i;
    ASSERT_EQ(table.grads.size(), plain.grads.size());
    for (const auto& [name, g] : plain.grads) {
      const std::vector<float>& gt = table.grads.at(name);
      ASSERT_EQ(gt.size(), g.size()) << name;
      double num = 0, den = 0;
      for (size_t i = 0; i < g.size(); ++i) num += double(gt[i] - g[i]) * (gt[i] - g[i]), den += double(g[i]) * g[i];
      EXPECT_GT(den, 0) << name;
      EXPECT_LE(std::sqrt(num / den), 1e-5) << name;
    }
  }
}

// Under tbptt the head runs once over a chunk's steps (in blocks; the
// env's copy stepped ahead of the model): the same model as each step's own
// head, to rounding. The first 700 bytes of the text (an epoch of 77 steps:
// four chunks of 16 and one of 13, then its validation) and a chunk of the
// next epoch, for the one-layer GRU and an LSTM stack with dropout masks
// (drawn in the same order): each update's loss, the validation loss, the
// accuracy and the parameters after them.
TEST(Lm, TheChunksHeadIsTheSameModel) {
  std::ifstream in(kText, std::ios::binary);
  std::string text(700, '\0');
  in.read(text.data(), 700);
  const fs::path excerpt = write("excerpt.txt", text);
  TrainConfig gru = lm_config(excerpt.string(), 77 + 16);
  TrainConfig lstm = gru;
  lstm.cell = "lstm", lstm.layers = 2, lstm.dropout = 0.3;
  for (const TrainConfig* cp : {&gru, &lstm}) {
    SCOPED_TRACE(cp->cell);
    struct Run {
      std::vector<double> losses, valid;
      double score = 0;
      std::vector<float> params;
    };
    auto run = [&](bool each_step) {
      TrainConfig c = *cp;
      c.head_each_step = each_step;
      Trainer tr(c);
      Run out;
      while (!tr.done()) {
        const UpdateResult r = tr.run_segment();
        out.losses.push_back(r.loss_sum / double(r.loss_steps));
        if (r.metric("valid_loss") > 0) out.valid.push_back(r.metric("valid_loss"));
      }
      out.score = tr.env().score();
      out.params = params_of(tr);
      return out;
    };
    const Run step = run(true), chunk = run(false);
    ASSERT_EQ(step.losses.size(), 6u);
    ASSERT_EQ(chunk.losses.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(chunk.losses[i], step.losses[i], 1e-5 * step.losses[i]) << "update " << i;
    ASSERT_EQ(step.valid.size(), 1u) << "the epoch's end";
    ASSERT_EQ(chunk.valid.size(), 1u);
    EXPECT_NEAR(chunk.valid[0], step.valid[0], 1e-5 * step.valid[0]);
    EXPECT_GT(step.score, 0);
    EXPECT_EQ(chunk.score, step.score) << "accuracy";
    ASSERT_EQ(chunk.params.size(), step.params.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < step.params.size(); ++i)
      num += double(chunk.params[i] - step.params[i]) * (chunk.params[i] - step.params[i]), den += double(step.params[i]) * step.params[i];
    EXPECT_LE(std::sqrt(num / den), 1e-6);
  }
  fs::remove(excerpt);
}

// After the first chunk, training allocates nothing on the heap, the
// epoch's end (its validation) included.
// (The one-layer GRU, a stack of LSTM layers with dropout masks, and a
// stack of GRU layers reading its input table.)
TEST(Lm, NoHeapAllocationAfterTheFirstChunk) {
  const TrainConfig plain = lm_config(kText.string(), 2249 + 64);
  TrainConfig stack = lm_config(kText.string(), 2249 + 64);
  stack.cell = "lstm", stack.layers = 2, stack.dropout = 0.3;
  TrainConfig table = lm_config(kText.string(), 2249 + 64);
  table.layers = 2;
  ASSERT_TRUE(policy_shape(table, make_env("lm", table.batch, 1, table.env_options)->spec()).input_table);
  // (The table's products and the chunk's head are OpenBLAS's, above the
  // size its threaded sgemm starts at, which allocates: docs/benchmarks.md.
  // The runs on one thread.)
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  for (const TrainConfig* cp : std::initializer_list<const TrainConfig*>{&plain, &stack, &table}) {
    const TrainConfig& c = *cp;
    Trainer tr(c);
    tr.run_segment();
    const uint64_t before = alloc_hook::count();
    alloc_hook::enable(true);
    while (!tr.done()) tr.run_segment();
    alloc_hook::enable(false);
    EXPECT_EQ(alloc_hook::count() - before, 0u) << c.cell;
  }
  openblas_set_num_threads(threads);
}

TEST(Lm, BadInputNamesTheFileAndWhatIsWrong) {
  const auto refused = [](const TrainConfig& c) { return message_of([&] { Trainer t(c); }); };
  const fs::path missing = scratch("missing.txt"), empty = write("empty.txt", ""), dir = scratch("adir");
  fs::create_directories(dir);
  EXPECT_NE(refused(lm_config(missing.string(), 10)).find(missing.string() + ": no such file"), std::string::npos);
  EXPECT_NE(refused(lm_config(empty.string(), 10)).find(empty.string() + ": is empty"), std::string::npos);
  EXPECT_NE(refused(lm_config(dir.string(), 10)).find(dir.string() + ": is a directory"), std::string::npos);
  std::string text;
  for (int i = 0; i < 4; ++i) text += "caf\xe9 au lait, encore du caf\xe9 au lait; ";
  const fs::path latin1 = write("latin1.txt", text);
  EXPECT_NE(refused(lm_config(latin1.string(), 10)).find(latin1.string() + ": byte 3 (0xe9) is not UTF-8"), std::string::npos);
  TrainConfig bytes = lm_config(latin1.string(), 10);
  bytes.env_options.tokens = "bytes", bytes.batch = 2, bytes.env_options.split = 0.5;
  EXPECT_EQ(refused(bytes), "") << "--tokens bytes reads any file";
  const fs::path tiny = write("tiny.txt", "to be or not");
  EXPECT_NE(refused(lm_config(tiny.string(), 10)).find(tiny.string() + ": its training part has 11 tokens"), std::string::npos);
  TrainConfig split = lm_config(kText.string(), 10);
  split.env_options.split = 1.5;
  EXPECT_NE(refused(split).find("--split must be in (0, 1)"), std::string::npos);
  TrainConfig words = lm_config(kText.string(), 10);
  words.env_options.tokens = "sentences";
  EXPECT_NE(refused(words).find("--tokens 'sentences'"), std::string::npos);
  TrainConfig model = lm_config(kText.string(), 10);
  model.cell = "rnn";
  EXPECT_NE(refused(model).find("--cell 'rnn': choose gru or lstm"), std::string::npos);
  model.cell = "lstm", model.tied = true;
  EXPECT_NE(refused(model).find("--tied shares the embeddings with the output layer: --hidden 64 must equal --embed 32"), std::string::npos);
  TrainConfig gru_agent;
  gru_agent.layers = 2;
  EXPECT_NE(refused(gru_agent).find("--layers, --dropout, --tied and --optim are --task lm's"), std::string::npos);
  TrainConfig supervised_lstm;  // (an LSTM is RL's too, not the supervised trainer's)
  supervised_lstm.env = "recall", supervised_lstm.algo = Algo::Supervised, supervised_lstm.cell = "lstm";
  EXPECT_NE(refused(supervised_lstm).find("--cell lstm is --task lm's or RL's"), std::string::npos);
  TrainConfig recall;
  recall.algo = Algo::Lm;
  EXPECT_NE(refused(recall).find("--algo lm learns a text corpus: --task lm --data FILE"), std::string::npos);
  // sample: an agent's checkpoint, an unknown token in the prompt
  TrainConfig agent;
  agent.steps = 32, agent.batch = 2, agent.hidden = 8;
  Trainer at(agent);
  at.run_segment();
  const fs::path ack = scratch("agent.safetensors");
  at.save(ack);
  EXPECT_NE(message_of([&] { sample(ack, {}, [](std::string_view) {}); }).find("a checkpoint of --env recall, not of a language model"),
            std::string::npos);
  Trainer lm(lm_config(kText.string(), 16));
  lm.run_segment();
  const fs::path lck = scratch("lm.safetensors");
  lm.save(lck);
  EXPECT_NE(message_of([&] { sample(lck, {.prompt = "caf\xc3\xa9", .length = 10, .temperature = 1, .seed = 1}, [](std::string_view) {}); }).find("--prompt: the token '\xc3\xa9' at byte 3 is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(message_of([&] { sample(lck, {.prompt = "", .length = 10, .temperature = 0, .seed = 1}, [](std::string_view) {}); }).find("--temperature"), std::string::npos);
  fs::remove_all(missing.parent_path());
}
