// The nn layer against LibTorch 1.13 on identical weights (copied by name,
// which also proves the names match): forward values, losses and every
// gradient of a K=16 TBPTT segment (Embedding, GRUCell, Linear,
// cross_entropy), GRU sequences with 1 and 2 layers, the same for LSTMCell
// and LSTM (1 to 3 layers), dropout between GRU and LSTM layers on recorded
// masks, nn::Dropout, LSTM state_dicts both ways, parameters after 10 steps
// of each optimizer, and clip_grad_norm. float32, relative error
// ||a - b|| / max(||a||, ||b||) <= 1e-5 for every tensor compared.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "segtape/nn.h"
#include "segtape/replay.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

using TT = torch::Tensor;
constexpr double kTol = 1e-5;
constexpr int64_t B = 4, I = 6, H = 8, C = 5, K = 16;
constexpr int64_t T = 3, V = 10;  // embedding check: indices [T, B] over V rows

std::vector<int64_t> sizes(const Shape& s) { return {s.dims.begin(), s.dims.begin() + s.rank}; }
TT to_torch(const Tensor& t) { return torch::from_blob(t.ptr, sizes(t.shape), torch::kFloat).clone(); }
std::vector<double> tvals(const TT& t) {
  TT c = t.detach().to(torch::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Worst relative error of one check, printed so it can be quoted.
struct Worst {
  std::string check;
  double max = 0;
  void add(const std::string& what, const std::vector<double>& ours, const std::vector<double>& theirs) {
    ASSERT_EQ(ours.size(), theirs.size()) << check << " " << what;
    const double e = rel_error(ours, theirs);
    EXPECT_LE(e, kTol) << check << ": " << what;
    max = std::max(max, e);
  }
  ~Worst() { std::printf("nn parity %-24s max relative error %.2e\n", check.c_str(), max); }
};

// Copies our parameters into theirs, matching by name and order.
void copy_weights(const nn::Module& ours, torch::nn::Module& theirs) {
  const auto op = ours.named_parameters();
  const auto tp = theirs.named_parameters();
  ASSERT_EQ(op.size(), tp.size());
  torch::NoGradGuard ng;
  for (size_t i = 0; i < op.size(); ++i) {
    ASSERT_EQ(op[i].first, tp[i].key()) << "parameter " << i;
    ASSERT_EQ(sizes(op[i].second.shape), tp[i].value().sizes().vec()) << op[i].first;
    tp[i].value().copy_(to_torch(op[i].second));
  }
}

void compare_params(Worst& w, const nn::Module& ours, torch::nn::Module& theirs, bool grads) {
  const auto op = ours.named_parameters();
  const auto tp = theirs.named_parameters();
  for (size_t i = 0; i < op.size(); ++i) {
    if (grads) w.add("grad " + op[i].first, values(op[i].second.grad_tensor()), tvals(tp[i].value().grad()));
    else w.add(op[i].first, values(op[i].second), tvals(tp[i].value()));
  }
}

// ---- the recurrent model: GRUCell -> Linear -> cross_entropy

struct Ours : nn::Module {
  nn::GRUCell cell;
  nn::Linear head;
  Ours(Tape& t, nn::Rng& r) : Module(t), cell(t, r, I, H), head(t, r, H, C) {
    register_module("cell", cell);
    register_module("head", head);
  }
};
struct Theirs : torch::nn::Module {
  torch::nn::GRUCell cell{nullptr};
  torch::nn::Linear head{nullptr};
  Theirs() {
    cell = register_module("cell", torch::nn::GRUCell(I, H));
    head = register_module("head", torch::nn::Linear(H, C));
  }
};

struct Data {
  std::vector<float> x, h0;  // [S, B, I], [B, H]
  std::vector<int64_t> y;    // [S, B]
  explicit Data(int64_t steps, unsigned seed) : x(size_t(steps * B * I)), h0(size_t(B * H)), y(size_t(steps * B)) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& v : x) v = u(g);
    for (float& v : h0) v = u(g);
    for (auto& v : y) v = std::uniform_int_distribution<int64_t>(0, C - 1)(g);
  }
  std::span<const float> xt(int64_t t) const { return std::span<const float>(x).subspan(size_t(t * B * I), size_t(B * I)); }
  std::span<const int64_t> yt(int64_t t) const { return std::span<const int64_t>(y).subspan(size_t(t * B), size_t(B)); }
};

// Steps [t0, t0 + n) from h0; the summed loss; per-step logits appended to `logits`.
Tensor unroll(Ours& m, const Data& d, int64_t t0, int64_t n, std::vector<double>* logits = nullptr) {
  Tape& tape = m.tape();
  Tensor h = tape.from(std::span<const float>(d.h0), {B, H}), loss;
  for (int64_t t = t0; t < t0 + n; ++t) {
    h = m.cell(tape.from(d.xt(t), {B, I}), h);
    Tensor z = m.head(h);
    if (logits) for (double v : values(z)) logits->push_back(v);
    Tensor l = nn::cross_entropy(z, tape.from(d.yt(t), {B}));
    loss = t == t0 ? l : add(loss, l);
  }
  return loss;
}
TT unroll(Theirs& m, const Data& d, int64_t t0, int64_t n, std::vector<double>* logits = nullptr) {
  TT h = torch::from_blob(const_cast<float*>(d.h0.data()), {B, H}, torch::kFloat).clone(), loss;
  for (int64_t t = t0; t < t0 + n; ++t) {
    h = m.cell(torch::from_blob(const_cast<float*>(d.xt(t).data()), {B, I}, torch::kFloat), h);
    TT z = m.head(h);
    if (logits) for (double v : tvals(z)) logits->push_back(v);
    TT l = torch::nn::functional::cross_entropy(z, torch::from_blob(const_cast<int64_t*>(d.yt(t).data()), {B}, torch::kLong));
    loss = t == t0 ? l : loss + l;
  }
  return loss;
}

class NnParity : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(NnParity, GruCellLinearCrossEntropyTbpttSegment) {
  Worst w{"gru_cell_tbptt_k16"};
  const Data d(K, 1);
  Tape tape;
  nn::Rng rng(1);
  Ours ours(tape, rng);
  Theirs theirs;
  copy_weights(ours, theirs);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<double> our_logits, their_logits;
  {
    Segment seg = tape.segment();
    Tensor loss = unroll(ours, d, 0, K, &our_logits);
    TT tloss = unroll(theirs, d, 0, K, &their_logits);
    w.add("loss", values(loss), tvals(tloss));
    w.add("logits", our_logits, their_logits);
    seg.backward(loss);
    tloss.backward();
  }
  compare_params(w, ours, theirs, true);
}

// Exact BPTT by segment replay (segtape/replay.h) against LibTorch's full
// BPTT over the whole window, for every horizon, segment length and schedule.
TEST_F(NnParity, ExactBpttByReplayEqualsLibTorchFullBptt) {
  Worst w{"exact_bptt_replay"};
  for (int64_t T : {7, 64, 1000}) {
    const Data d(T, 3);
    Theirs theirs;
    Tape tape;
    nn::Rng rng(2);
    Ours ours(tape, rng);
    copy_weights(ours, theirs);
    ASSERT_FALSE(HasFatalFailure());
    TT tloss = unroll(theirs, d, 0, T);
    tloss.backward();
    Tensor h0 = tape.persistent({B, H});
    h0.from_host(std::span<const float>(d.h0));
    const replay::StepFn step = [&](Tape& t, int64_t s, const Tensor& h, replay::Inputs&) {
      Tensor h1 = ours.cell(t.from(d.xt(s), {B, I}), h);
      return replay::StepResult{h1, nn::cross_entropy(ours.head(h1), t.from(d.yt(s), {B}))};
    };
    for (int64_t K : {1, 8, 32}) {
      for (auto [schedule, snaps] : {std::pair{replay::Schedule::Uniform, int64_t(0)}, std::pair{replay::Schedule::Binomial, int64_t(3)}}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " K=" + std::to_string(K) + (snaps ? " binomial" : " uniform"));
        tape.zero_grad();
        replay::Driver drv(tape, h0, {.horizon = T, .k = K, .schedule = schedule, .snapshots = snaps});
        const replay::Report r = drv.run(step, h0);
        w.add("loss", {r.loss}, tvals(tloss));
        compare_params(w, ours, theirs, true);
      }
    }
  }
}

// Overlapping windows (replay::Driver::slide, --history overlap:K/T/S)
// against LibTorch: every stride's gradients equal LibTorch's full BPTT over
// its window (the last T steps, from the state LibTorch's forward reaches at
// the window's start), whose loss is the stride's S steps'.
TEST_F(NnParity, OverlappingWindowsEqualLibTorchFullBpttOverEachWindow) {
  Worst w{"overlapping_windows"};
  constexpr int64_t T = 48, K = 8, S = 16, N = 120;
  const Data d(N, 5);
  Theirs theirs;
  Tape tape;
  nn::Rng rng(3);
  Ours ours(tape, rng);
  copy_weights(ours, theirs);
  ASSERT_FALSE(HasFatalFailure());
  Tensor h0 = tape.persistent({B, H});
  h0.from_host(std::span<const float>(d.h0));
  const replay::StepFn step = [&](Tape& t, int64_t s, const Tensor& h, replay::Inputs&) {
    Tensor h1 = ours.cell(t.from(d.xt(s), {B, I}), h);
    return replay::StepResult{h1, nn::cross_entropy(ours.head(h1), t.from(d.yt(s), {B}))};
  };
  replay::Driver drv(tape, h0, {.horizon = T, .k = K, .stride = S});
  Tensor h = h0;
  for (int64_t q = 0; q < N; q += S) {
    const int64_t n = std::min(S, N - q), e = q + n, w0 = std::max<int64_t>(0, e - T + K - 1) / K * K;
    SCOPED_TRACE("stride ending at " + std::to_string(e));
    tape.zero_grad();
    theirs.zero_grad();
    const replay::Report r = drv.slide(step, h, n);
    h = drv.final_state();
    TT th = torch::from_blob(const_cast<float*>(d.h0.data()), {B, H}, torch::kFloat).clone(), loss;
    {
      torch::NoGradGuard ng;
      for (int64_t t = 0; t < w0; ++t) th = theirs.cell(torch::from_blob(const_cast<float*>(d.xt(t).data()), {B, I}, torch::kFloat), th);
    }
    for (int64_t t = w0; t < e; ++t) {
      th = theirs.cell(torch::from_blob(const_cast<float*>(d.xt(t).data()), {B, I}, torch::kFloat), th);
      if (t < q) continue;
      TT l = torch::nn::functional::cross_entropy(theirs.head(th), torch::from_blob(const_cast<int64_t*>(d.yt(t).data()), {B}, torch::kLong));
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    w.add("loss", {r.loss}, tvals(loss));
    compare_params(w, ours, theirs, true);
  }
}

TEST_F(NnParity, EmbeddingLinearRank3) {
  Worst w{"embedding_linear"};
  Tape tape;
  nn::Rng rng(2);
  struct E : nn::Module {
    nn::Embedding emb;
    nn::Linear head;
    E(Tape& t, nn::Rng& r) : Module(t), emb(t, r, V, I), head(t, r, I, C) {
      register_module("emb", emb);
      register_module("head", head);
    }
  } ours(tape, rng);
  struct TE : torch::nn::Module {
    torch::nn::Embedding emb{nullptr};
    torch::nn::Linear head{nullptr};
    TE() {
      emb = register_module("emb", torch::nn::Embedding(V, I));
      head = register_module("head", torch::nn::Linear(I, C));
    }
  } theirs;
  copy_weights(ours, theirs);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<int64_t> idx(size_t(T * B)), tgt(size_t(T * B));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t(i * 7 % V), tgt[i] = int64_t(i * 3 % C);
  Segment seg = tape.segment();
  Tensor z = ours.head(ours.emb(tape.from(std::span<const int64_t>(idx), {T, B})));  // [T, B, C]
  Tensor loss = nn::cross_entropy(reshape(z, {T * B, C}), tape.from(std::span<const int64_t>(tgt), {T * B}));
  TT tz = theirs.head(theirs.emb(torch::tensor(idx).reshape({T, B})));
  TT tloss = torch::nn::functional::cross_entropy(tz.reshape({T * B, C}), torch::tensor(tgt));
  w.add("logits", values(z), tvals(tz));
  w.add("loss", values(loss), tvals(tloss));
  seg.backward(loss);
  tloss.backward();
  compare_params(w, ours, theirs, true);
}

void gru_sequence(int64_t L) {
  Worst w{"gru_seq_t16_layers" + std::to_string(L)};
  Tape tape;
  nn::Rng rng(10 + uint64_t(L));
  nn::GRU ours(tape, rng, I, H, L);
  torch::nn::GRU theirs(torch::nn::GRUOptions(I, H).num_layers(L));
  copy_weights(ours, *theirs);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::mt19937 g(5);
  Tensor x = tape.parameter({K, B, I}), h0 = tape.parameter({L, B, H});
  fill_uniform(x, g);
  fill_uniform(h0, g);
  Tensor wo = tape.persistent({K, B, H}), wh = tape.persistent({L, B, H});
  fill_uniform(wo, g);
  fill_uniform(wh, g);
  TT tx = to_torch(x).requires_grad_(true), th0 = to_torch(h0).requires_grad_(true);
  Segment seg = tape.segment();
  auto [out, hn] = ours(x, h0);
  auto [tout, thn] = theirs->forward(tx, th0);
  w.add("output", values(out), tvals(tout));
  w.add("h_n", values(hn), tvals(thn));
  seg.backward(add(sum(mul(out, wo)), sum(mul(hn, wh))));
  ((tout * to_torch(wo)).sum() + (thn * to_torch(wh)).sum()).backward();
  compare_params(w, ours, *theirs, true);
  w.add("grad x", values(x.grad_tensor()), tvals(tx.grad()));
  w.add("grad h0", values(h0.grad_tensor()), tvals(th0.grad()));
}
TEST_F(NnParity, GruSequenceOneLayer) { gru_sequence(1); }
TEST_F(NnParity, GruSequenceTwoLayers) { gru_sequence(2); }

// ---- LSTM: LSTMCell -> Linear -> cross_entropy over a K=16 TBPTT segment

struct OursLstm : nn::Module {
  nn::LSTMCell cell;
  nn::Linear head;
  OursLstm(Tape& t, nn::Rng& r) : Module(t), cell(t, r, I, H), head(t, r, H, C) {
    register_module("cell", cell);
    register_module("head", head);
  }
};
struct TheirsLstm : torch::nn::Module {
  torch::nn::LSTMCell cell{nullptr};
  torch::nn::Linear head{nullptr};
  TheirsLstm() {
    cell = register_module("cell", torch::nn::LSTMCell(I, H));
    head = register_module("head", torch::nn::Linear(H, C));
  }
};

// pair: PyTorch's (h, c) form of the cell, else the state [2, B, H] carried.
void lstm_cell_segment(bool pair) {
  Worst w{pair ? "lstm_cell_pair_tbptt_k16" : "lstm_cell_tbptt_k16"};
  const Data d(K, 7);
  std::vector<float> c0(size_t(B * H));
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = float(std::cos(double(i)));
  Tape tape;
  nn::Rng rng(21);
  OursLstm ours(tape, rng);
  TheirsLstm theirs;
  copy_weights(ours, theirs);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<double> our_logits, their_logits;
  Segment seg = tape.segment();
  Tensor h = tape.from(std::span<const float>(d.h0), {B, H}), c = tape.from(std::span<const float>(c0), {B, H});
  Tensor state = lstm_state(h, c), loss;
  TT th = torch::from_blob(const_cast<float*>(d.h0.data()), {B, H}, torch::kFloat).clone(), tc = torch::from_blob(c0.data(), {B, H}, torch::kFloat).clone(), tloss;
  for (int64_t t = 0; t < K; ++t) {
    const Tensor x = tape.from(d.xt(t), {B, I});
    if (pair) {
      const LstmPair next = ours.cell(x, h, c);
      h = next.h, c = next.c;
    } else {
      state = ours.cell(x, state);
      h = lstm_h(state);
    }
    Tensor z = ours.head(h);
    for (double v : values(z)) our_logits.push_back(v);
    Tensor l = nn::cross_entropy(z, tape.from(d.yt(t), {B}));
    loss = t ? add(loss, l) : l;
    std::tie(th, tc) = theirs.cell(torch::from_blob(const_cast<float*>(d.xt(t).data()), {B, I}, torch::kFloat), std::make_tuple(th, tc));
    TT tz = theirs.head(th);
    for (double v : tvals(tz)) their_logits.push_back(v);
    TT tl = torch::nn::functional::cross_entropy(tz, torch::from_blob(const_cast<int64_t*>(d.yt(t).data()), {B}, torch::kLong));
    tloss = t ? tloss + tl : tl;
  }
  w.add("loss", values(loss), tvals(tloss));
  w.add("logits", our_logits, their_logits);
  w.add("final c", values(pair ? c : lstm_c(state)), tvals(tc));
  seg.backward(loss);
  tloss.backward();
  compare_params(w, ours, theirs, true);
}
TEST_F(NnParity, LstmCellLinearCrossEntropyTbpttSegment) { lstm_cell_segment(false); }
TEST_F(NnParity, LstmCellPairFormTbpttSegment) { lstm_cell_segment(true); }

// A 1-, 2- or 3-layer LSTM over K steps against torch::nn::LSTM (dropout 0):
// output, h_n, c_n and the gradients of every parameter, x, h0 and c0.
void lstm_sequence(int64_t L) {
  Worst w{"lstm_seq_t16_layers" + std::to_string(L)};
  Tape tape;
  nn::Rng rng(30 + uint64_t(L));
  nn::LSTM ours(tape, rng, I, H, L);
  torch::nn::LSTM theirs(torch::nn::LSTMOptions(I, H).num_layers(L));
  copy_weights(ours, *theirs);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::mt19937 g(6);
  Tensor x = tape.parameter({K, B, I}), h0 = tape.parameter({L, B, H}), c0 = tape.parameter({L, B, H});
  for (const Tensor& t : {x, h0, c0}) fill_uniform(t, g);
  Tensor wo = tape.persistent({K, B, H}), wh = tape.persistent({L, B, H}), wc = tape.persistent({L, B, H});
  for (const Tensor& t : {wo, wh, wc}) fill_uniform(t, g);
  TT tx = to_torch(x).requires_grad_(true), th0 = to_torch(h0).requires_grad_(true), tc0 = to_torch(c0).requires_grad_(true);
  Segment seg = tape.segment();
  auto [out, hn, cn] = ours(x, h0, c0);
  auto [tout, thc] = theirs->forward(tx, std::make_tuple(th0, tc0));
  const auto& [thn, tcn] = thc;
  w.add("output", values(out), tvals(tout));
  w.add("h_n", values(hn), tvals(thn));
  w.add("c_n", values(cn), tvals(tcn));
  seg.backward(add(add(sum(mul(out, wo)), sum(mul(hn, wh))), sum(mul(cn, wc))));
  ((tout * to_torch(wo)).sum() + (thn * to_torch(wh)).sum() + (tcn * to_torch(wc)).sum()).backward();
  compare_params(w, ours, *theirs, true);
  w.add("grad x", values(x.grad_tensor()), tvals(tx.grad()));
  w.add("grad h0", values(h0.grad_tensor()), tvals(th0.grad()));
  w.add("grad c0", values(c0.grad_tensor()), tvals(tc0.grad()));
}
TEST_F(NnParity, LstmSequenceOneLayer) { lstm_sequence(1); }
TEST_F(NnParity, LstmSequenceTwoLayers) { lstm_sequence(2); }
TEST_F(NnParity, LstmSequenceThreeLayers) { lstm_sequence(3); }

// Dropout between layers in training mode, on recorded masks: LibTorch runs
// the layers one by one (torch::lstm / torch::gru, one layer each) with the
// same masks multiplying each layer's output but the last, which is what
// PyTorch's dropout= computes given those masks. Forward and every gradient.
template <class Ours>
void rnn_dropout(bool lstm) {
  constexpr int64_t L = 3;
  constexpr double p = 0.3;
  Worst w{lstm ? "lstm_dropout_layers3" : "gru_dropout_layers3"};
  Tape tape;
  nn::Rng rng(40);
  Ours ours(tape, rng, I, H, L, true, DType::F32, p, 9);
  std::vector<float> mv(size_t((L - 1) * K * B * H));
  ours.dropout_masks(mv);
  size_t zeros = 0;
  for (float v : mv) zeros += v == 0.0f;
  EXPECT_GT(zeros, mv.size() / 5);  // the masks drop (about 30 %)
  std::mt19937 g(7);
  Tensor x = tape.parameter({K, B, I});
  fill_uniform(x, g);
  Tensor wo = tape.persistent({K, B, H});
  fill_uniform(wo, g);
  TT tx = to_torch(x).requires_grad_(true);
  std::vector<TT> params;
  for (const auto& [n, t] : ours.named_parameters()) params.push_back(to_torch(t).requires_grad_(true));
  Segment seg = tape.segment();
  const Tensor masks = tape.from(std::span<const float>(mv), {L - 1, K, B, H});
  const Tensor out = ours(x, {}, {}, masks).output;
  TT seq = tx;
  for (int64_t l = 0; l < L; ++l) {
    if (l > 0) seq = seq * torch::from_blob(mv.data() + (l - 1) * K * B * H, {K, B, H}, torch::kFloat);
    const std::vector<TT> wl(params.begin() + 4 * l, params.begin() + 4 * l + 4);
    const TT z = torch::zeros({1, B, H});
    seq = lstm ? std::get<0>(torch::lstm(seq, {z, z}, wl, true, 1, 0.0, true, false, false))
               : std::get<0>(torch::gru(seq, z, wl, true, 1, 0.0, true, false, false));
  }
  w.add("output", values(out), tvals(seq));
  seg.backward(sum(mul(out, wo)));
  (seq * to_torch(wo)).sum().backward();
  const auto named = ours.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) w.add("grad " + named[i].first, values(named[i].second.grad_tensor()), tvals(params[i].grad()));
  w.add("grad x", values(x.grad_tensor()), tvals(tx.grad()));
}
TEST_F(NnParity, LstmDropoutBetweenLayersOnRecordedMasks) { rnn_dropout<nn::LSTM>(true); }
TEST_F(NnParity, GruDropoutBetweenLayersOnRecordedMasks) { rnn_dropout<nn::GRU>(false); }

// nn::Dropout on a mask it drew: x * mask, and x's gradient, as LibTorch's.
TEST_F(NnParity, DropoutOnItsMaskIsLibTorchsProduct) {
  Worst w{"dropout_mask"};
  Tape tape;
  nn::Dropout drop(tape, 0.4, 3);
  std::vector<float> mv(size_t(B * H));
  drop.mask(mv);
  std::mt19937 g(8);
  Tensor x = tape.parameter({B, H});
  fill_uniform(x, g);
  TT tx = to_torch(x).requires_grad_(true);
  Segment seg = tape.segment();
  const Tensor y = drop.apply(x, tape.from(std::span<const float>(mv), {B, H}));
  const TT ty = tx * torch::from_blob(mv.data(), {B, H}, torch::kFloat);
  w.add("y", values(y), tvals(ty));
  seg.backward(sum(mul(y, y)));
  (ty * ty).sum().backward();
  w.add("grad x", values(x.grad_tensor()), tvals(tx.grad()));
}

// state_dicts both ways under PyTorch's names, strictly: segtape's file
// (nn::save) into torch::nn::LSTM by name, every name of each side in the
// other; torch's parameters, written under their own names, into nn::LSTM
// with nn::load(strict).
TEST_F(NnParity, LstmStateDictLoadsBothWays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("segtape_lstm_sd_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Tape tape;
  nn::Rng rng(50);
  nn::LSTM ours(tape, rng, I, H, 2);
  torch::nn::LSTM theirs(torch::nn::LSTMOptions(I, H).num_layers(2));
  nn::save(ours, dir / "ours.safetensors");
  const safetensors::File f = safetensors::load(dir / "ours.safetensors");
  ASSERT_EQ(f.tensors.size(), theirs->named_parameters().size());
  {
    torch::NoGradGuard ng;
    for (const auto& item : theirs->named_parameters()) {
      ASSERT_TRUE(f.find(item.key())) << item.key() << " is not in segtape's file";
      std::vector<float> v = f.values<float>(item.key());
      ASSERT_EQ(int64_t(v.size()), item.value().numel()) << item.key();
      item.value().copy_(torch::from_blob(v.data(), item.value().sizes(), torch::kFloat));
    }
  }
  for (const auto& [n, t] : ours.named_parameters()) EXPECT_EQ(values(t), tvals(theirs->named_parameters()[n])) << n;
  // and back: torch's weights, changed, into segtape
  std::vector<std::vector<float>> data;
  std::vector<safetensors::TensorRef> refs;
  {
    torch::NoGradGuard ng;
    for (const auto& item : theirs->named_parameters()) {
      item.value().mul_(-0.5);
      const TT c = item.value().detach().contiguous();
      data.emplace_back(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
  }
  size_t i = 0;
  for (const auto& item : theirs->named_parameters()) {
    const auto& v = data[i++];
    refs.push_back({item.key(), safetensors::DType::F32, item.value().sizes().vec(), std::as_bytes(std::span<const float>(v))});
  }
  safetensors::save_atomic(dir / "theirs.safetensors", refs);
  const nn::LoadReport r = nn::load(ours, dir / "theirs.safetensors", /*strict=*/true);
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  for (const auto& [n, t] : ours.named_parameters()) EXPECT_EQ(values(t), tvals(theirs->named_parameters()[n])) << n;
  fs::remove_all(dir);
}

// ---- optimizers: 10 training steps on both sides, each a K=4 segment

constexpr int kSteps = 10, kSegK = 4;

template <class MakeOurs, class MakeTheirs>
void train_both(const std::string& name, MakeOurs make_ours, MakeTheirs make_theirs, double clip = 0) {
  Worst w{name};
  const Data d(kSteps * kSegK, 3);
  Tape tape;
  nn::Rng rng(4);
  Ours ours(tape, rng);
  Theirs theirs;
  copy_weights(ours, theirs);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto opt = make_ours(ours);
  auto topt = make_theirs(theirs.parameters());
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    topt.zero_grad();
    Segment seg = tape.segment();
    Tensor loss = unroll(ours, d, s * kSegK, kSegK);
    TT tloss = unroll(theirs, d, s * kSegK, kSegK);
    seg.backward(loss);
    tloss.backward();
    if (clip > 0) {
      const double n = nn::clip_grad_norm(ours, clip);
      const double tn = torch::nn::utils::clip_grad_norm_(theirs.parameters(), clip);
      w.add("norm at step " + std::to_string(s), {n}, {tn});
    }
    opt.step();
    topt.step();
  }
  compare_params(w, ours, theirs, false);
  EXPECT_EQ(opt.step_count(), kSteps);
}

TEST_F(NnParity, SgdMomentumDampening) {
  train_both(
      "sgd_momentum_dampening", [](Ours& m) { return nn::SGD(m, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1}); },
      [](std::vector<TT> p) { return torch::optim::SGD(p, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1)); });
}
TEST_F(NnParity, SgdNesterovWeightDecay) {
  train_both(
      "sgd_nesterov_wd",
      [](Ours& m) { return nn::SGD(m, {.lr = 0.1, .momentum = 0.9, .dampening = 0, .weight_decay = 1e-2, .nesterov = true}); },
      [](std::vector<TT> p) {
        return torch::optim::SGD(p, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0).weight_decay(1e-2).nesterov(true));
      });
}
TEST_F(NnParity, AdamWeightDecay) {
  train_both(
      "adam_wd", [](Ours& m) { return nn::Adam(m, {.lr = 1e-2, .weight_decay = 1e-2}); },
      [](std::vector<TT> p) { return torch::optim::Adam(p, torch::optim::AdamOptions(1e-2).weight_decay(1e-2)); });
}
TEST_F(NnParity, AdamW) {
  train_both(
      "adamw", [](Ours& m) { return nn::AdamW(m, {.lr = 1e-2, .weight_decay = 1e-2}); },
      [](std::vector<TT> p) { return torch::optim::AdamW(p, torch::optim::AdamWOptions(1e-2).weight_decay(1e-2)); });
}
TEST_F(NnParity, AdamWithClipGradNorm) {
  train_both(
      "adam_clip_grad_norm_0.5", [](Ours& m) { return nn::Adam(m, {.lr = 1e-2}); },
      [](std::vector<TT> p) { return torch::optim::Adam(p, torch::optim::AdamOptions(1e-2)); }, 0.5);
}

TEST_F(NnParity, ClipGradNorm) {
  Worst w{"clip_grad_norm"};
  const Data d(K, 6);
  for (double max_norm : {0.1, 1e3}) {  // clips; leaves alone
    Tape tape;
    nn::Rng rng(6);
    Ours ours(tape, rng);
    Theirs theirs;
    copy_weights(ours, theirs);
    ASSERT_FALSE(HasFatalFailure());
    Segment seg = tape.segment();
    seg.backward(unroll(ours, d, 0, K));
    unroll(theirs, d, 0, K).backward();
    const std::vector<Tensor> ps = ours.parameters();
    const double n = nn::clip_grad_norm(ps, max_norm);
    const double tn = torch::nn::utils::clip_grad_norm_(theirs.parameters(), max_norm);
    w.add("norm (max_norm " + std::to_string(max_norm) + ")", {n}, {tn});
    if (max_norm < 1) {
      EXPECT_GT(n, max_norm);  // really clipped
    }
    compare_params(w, ours, theirs, true);
  }
}

}  // namespace
