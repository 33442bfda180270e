// The bad-input catalog: one table per layer walks segtape's public surface
// with bad input — mismatched shapes for every op, expired handles, tape
// misuse, budget overflow, bad indices, NaN under anomaly mode, corrupt and
// mismatched checkpoints, unwritable paths, and the `segtape` program's bad
// arguments. Each row names the exception type (or, for the program, the exit
// and the one-line "segtape: error:" message) and a message fragment. Every
// row must fail cleanly: the right type, a useful message, no crash, no
// sanitizer report, and nothing already on disk lost (a good checkpoint's
// bytes are compared after every row that could touch it). Focused tests of
// single behaviours live in errors_test, safetensors_test and agent_test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "segtape/agent/trainer.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/layers.h"
#include "segtape/nn/optim.h"
#include "segtape/nn/safetensors.h"
#include "segtape/ops.h"
#include "segtape/update.h"

#include "process.h"

using namespace segtape;
namespace fs = std::filesystem;
namespace st = segtape::safetensors;

namespace {

// ------------------------------------------------------------ the walker

enum class Kind { Shape, Expired, Budget, Tape, Index, Checkpoint, Anomaly, Error };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Shape: return "ShapeError";
    case Kind::Expired: return "ExpiredTensorError";
    case Kind::Budget: return "BudgetError";
    case Kind::Tape: return "TapeError";
    case Kind::Index: return "IndexError";
    case Kind::Checkpoint: return "CheckpointError";
    case Kind::Anomaly: return "AnomalyError";
    case Kind::Error: return "segtape::Error";
  }
  return "?";
}

bool is_kind(const segtape::Error& e, Kind k) {
  switch (k) {
    case Kind::Shape: return dynamic_cast<const ShapeError*>(&e) != nullptr;
    case Kind::Expired: return dynamic_cast<const ExpiredTensorError*>(&e) != nullptr;
    case Kind::Budget: return dynamic_cast<const BudgetError*>(&e) != nullptr;
    case Kind::Tape: return dynamic_cast<const TapeError*>(&e) != nullptr;
    case Kind::Index: return dynamic_cast<const IndexError*>(&e) != nullptr;
    case Kind::Checkpoint: return dynamic_cast<const CheckpointError*>(&e) != nullptr;
    case Kind::Anomaly: return dynamic_cast<const AnomalyError*>(&e) != nullptr;
    case Kind::Error: return true;
  }
  return false;
}

struct Row {
  std::string what;      // the bad input, in words
  Kind kind;             // the exception type it must raise
  std::string fragment;  // a piece of the message that says what went wrong
  std::function<void()> run;
};

// Runs every row; `after` (optional) checks that nothing was damaged by it.
int walk(const std::vector<Row>& rows, const std::function<void(const Row&)>& after = {}) {
  int n = 0;
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    try {
      r.run();
      ADD_FAILURE() << r.what << ": no error raised (expected " << kind_name(r.kind) << ")";
    } catch (const segtape::Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(is_kind(e, r.kind)) << r.what << ": expected " << kind_name(r.kind) << ", got: " << m;
      EXPECT_NE(m.find(r.fragment), std::string::npos) << r.what << ": message lacks '" << r.fragment << "': " << m;
    } catch (const std::exception& e) {
      ADD_FAILURE() << r.what << ": raised a non-segtape exception (" << typeid(e).name() << "): " << e.what();
    }
    if (after) after(r);
    ++n;
  }
  return n;
}

using test::slurp;
void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o << bytes;
}

// A scratch directory per test, removed afterwards.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("segtape_catalog_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path operator/(const std::string& f) const { return dir / f; }
};

// Damaged copies of a good file: a catalog of what a crash or a hostile
// writer leaves (the parser's full catalog is tests/fuzz/corpus).
std::vector<std::pair<std::string, std::string>> damaged(const std::string& good) {
  std::string flipped_len = good;
  flipped_len[5] = '\x7f';  // header length ~ 2^46
  std::string bad_json = good;
  bad_json[8] = '[';  // the header's opening brace
  return {{"empty file", ""},
          {"truncated to 7 bytes", good.substr(0, 7)},
          {"truncated inside the header", good.substr(0, 40)},
          {"truncated inside the data", good.substr(0, good.size() - 3)},
          {"a byte appended", good + "x"},
          {"huge header length", flipped_len},
          {"header not a JSON object", bad_json},
          {"text file", "step,loss\n1,2\n"}};
}

// ------------------------------------------------------------ engine: ops

TEST(Catalog, OpsRejectMismatchedShapesDtypesAndIndices) {
  Tape tape;
  const Tensor a = tape.parameter({2, 3}), b = tape.parameter({4, 5}), v = tape.parameter({3});
  const Tensor d = tape.parameter({2, 3}, DType::F64), w = tape.parameter({4, 3});
  const Tensor w_ih = tape.parameter({12, 3}), w_hh = tape.parameter({12, 4}), bias = tape.parameter({12});
  Tape other;
  const Tensor foreign_idx = other.persistent({2}, DType::I64);  // indices / targets of another tape
  Segment seg = tape.segment();
  const Tensor x = tape.zeros({2, 3}), h = tape.zeros({2, 4}), h5 = tape.zeros({5, 4});
  const Tensor scalar = sum(a);
  const int64_t idx_v[] = {1, 4}, neg_v[] = {0, -1}, cls_v[] = {0, 3}, ok2[] = {0, 1}, ok3[] = {0, 1, 2};
  const Tensor idx = tape.from(std::span<const int64_t>(idx_v), {2});
  const Tensor neg = tape.from(std::span<const int64_t>(neg_v), {2});
  const Tensor cls = tape.from(std::span<const int64_t>(cls_v), {2});
  const Tensor y2 = tape.from(std::span<const int64_t>(ok2), {2}), y3 = tape.from(std::span<const int64_t>(ok3), {3});
  const float five[] = {1, 2, 3, 4, 5};
  const Tensor none;

  const std::vector<Row> rows = {
      {"matmul [2,3] x [4,5]", Kind::Shape, "[4,5]", [&] { (void)matmul(a, b); }},
      {"matmul of a vector", Kind::Shape, "matmul", [&] { (void)matmul(v, a); }},
      {"matmul transposed the wrong way", Kind::Shape, "matmul", [&] { (void)matmul(a, a, false, false); }},
      {"add [2,3] + [4,5]", Kind::Shape, "add: shapes do not broadcast", [&] { (void)add(a, b); }},
      {"sub [2,3] - [4,5]", Kind::Shape, "sub", [&] { (void)sub(a, b); }},
      {"mul [2,3] * [4,5]", Kind::Shape, "mul", [&] { (void)mul(a, b); }},
      {"div [2,3] / [4,5]", Kind::Shape, "div", [&] { (void)div(a, b); }},
      {"add f32 + f64", Kind::Shape, "dtypes differ", [&] { (void)add(a, d); }},
      {"add f32 + i64", Kind::Shape, "floating-point", [&] { (void)add(y2, y2); }},
      {"tanh of an undefined tensor", Kind::Tape, "undefined tensor", [&] { (void)tanh(none); }},
      {"mse_loss [2,3] vs [4,5]", Kind::Shape, "mse_loss", [&] { (void)mse_loss(a, b); }},
      {"concat along 0 of [2,3] and [4,5]", Kind::Shape, "concat", [&] { (void)concat({a, b}, 0); }},
      {"concat along axis 5", Kind::Shape, "concat", [&] { (void)concat({a, a}, 5); }},
      {"concat of nothing", Kind::Shape, "no tensors", [&] { (void)concat(std::span<const Tensor>(), 0); }},
      {"concat past 2^31 - 1 along an axis", Kind::Shape, "more than a dimension can hold", [&] {
         const Tensor z = tape.zeros({INT32_MAX, 0});
         (void)concat({z, z}, 0);
       }},
      {"slice past the end", Kind::Shape, "slice: start 2, length 2 outside axis 1", [&] { (void)slice(a, 1, 2, 2); }},
      {"slice whose end overflows int64", Kind::Shape, "slice: start 1", [&] { (void)slice(a, 1, 1, INT64_MAX); }},
      {"a shape of 2^64 elements", Kind::Shape, "more than 2^60 elements", [&] { (void)Shape({65536, 65536, 65536, 65536}); }},
      {"reshape to 2^64 elements", Kind::Shape, "more than 2^60", [&] { (void)reshape(a, {65536, 65536, 65536, 65536}); }},
      {"slice of axis 3 of a matrix", Kind::Shape, "axis 3", [&] { (void)slice(a, 3, 0, 1); }},
      {"slice of negative length", Kind::Shape, "slice", [&] { (void)slice(a, 1, 0, -1); }},
      {"reshape 6 elements as 7", Kind::Shape, "reshape: cannot view", [&] { (void)reshape(a, {7}); }},
      {"reshape to rank 5", Kind::Shape, "rank <= 4", [&] { (void)reshape(a, {1, 1, 1, 2, 3}); }},
      {"reshape to a negative dim", Kind::Shape, "out of range", [&] { (void)reshape(a, {-6}); }},
      {"transpose of a vector", Kind::Shape, "transpose", [&] { (void)transpose(v); }},
      {"embedding with float indices", Kind::Shape, "embedding", [&] { (void)embedding(w, a); }},
      {"embedding of a vector table", Kind::Shape, "embedding", [&] { (void)embedding(v, y2); }},
      {"embedding index 4 of 4 rows", Kind::Index, "index 4 at position 1 is out of range for 4 rows",
       [&] { (void)embedding(w, idx); }},
      {"embedding index -1", Kind::Index, "index -1", [&] { (void)embedding(w, neg); }},
      {"embedding with indices of another tape", Kind::Tape, "embedding: inputs belong to different tapes",
       [&] { (void)embedding(w, foreign_idx); }},
      {"cross_entropy with targets of another tape", Kind::Tape, "cross_entropy: inputs belong to different tapes",
       [&] { (void)cross_entropy(a, foreign_idx); }},
      {"gru_cell x [2,3] with h [5,4]", Kind::Shape, "gru_cell", [&] { (void)gru_cell(x, h5, w_ih, w_hh, bias, bias); }},
      {"gru_cell with W_hh for another H", Kind::Shape, "gru_cell", [&] { (void)gru_cell(x, h, w_ih, w_ih, bias, bias); }},
      {"gru_cell with a short bias", Kind::Shape, "gru_cell", [&] { (void)gru_cell(x, h, w_ih, w_hh, v, bias); }},
      {"cross_entropy of vector logits", Kind::Shape, "cross_entropy", [&] { (void)cross_entropy(v, y2); }},
      {"cross_entropy with 3 targets for 2 rows", Kind::Shape, "cross_entropy", [&] { (void)cross_entropy(a, y3); }},
      {"cross_entropy with float targets", Kind::Shape, "cross_entropy", [&] { (void)cross_entropy(a, a); }},
      {"cross_entropy class 3 of 3", Kind::Index, "target 3 at row 1 is out of range for 3 classes",
       [&] { (void)cross_entropy(a, cls); }},
      {"cross_entropy class -1", Kind::Index, "target -1", [&] { (void)cross_entropy(a, neg); }},
      {"sum over axis 2 of a matrix", Kind::Shape, "axis 2", [&] { (void)sum(a, 2); }},
      {"mean over axis -3 of a matrix", Kind::Shape, "axis -3", [&] { (void)mean(a, -3); }},
      {"sum over axis 0 of a scalar", Kind::Shape, "axis 0", [&] { (void)sum(scalar, 0); }},
      {"softmax of a scalar", Kind::Shape, "softmax", [&] { (void)softmax(scalar); }},
      {"log_softmax of a scalar", Kind::Shape, "log_softmax", [&] { (void)log_softmax(scalar); }},
      {"item() of 6 elements", Kind::Shape, "item()", [&] { (void)a.item(); }},
      {"data<double>() of f32", Kind::Shape, "dtype", [&] { (void)a.data<double>(); }},
      {"tape.from: 5 values for [2,3]", Kind::Shape, "5 values for shape",
       [&] { (void)tape.from(std::span<const float>(five), {2, 3}); }},
      {"copy_into [2,3] <- [4,5]", Kind::Shape, "copy_into", [&] { copy_into(a, b); }},
      {"an i64 parameter", Kind::Shape, "floating point", [&] { (void)tape.parameter({2}, DType::I64); }},
      {"grad_tensor() of a non-parameter", Kind::Tape, "not a parameter", [&] { (void)x.grad_tensor(); }},
      {"backward of a [2,3] loss", Kind::Shape, "single-element", [&] { seg.backward(tanh(a)); }},
      {"backward with a [4,5] output gradient", Kind::Shape, "does not match", [&] { seg.backward(tanh(a), b); }},
  };
  // After every refusal the segment is still usable and recorded nothing broken.
  const int n = walk(rows, [&](const Row& r) { EXPECT_NO_THROW(seg.backward(sum(mul(a, a)))) << "after: " << r.what; });
  EXPECT_GE(n, 45);
}

// ------------------------------------------------------------ engine: parameter updates and host copies

TEST(Catalog, UpdatesAndHostCopiesRejectBadTensors) {
  Tape tape, other;
  const Tensor p = tape.parameter({2, 3}), pd = tape.parameter({2, 3}, DType::F64);
  const Tensor st = tape.persistent({2, 3}), st2 = tape.persistent({2, 3}), wrong = tape.persistent({3, 2}), st64 = tape.persistent({2, 3}, DType::F64);
  const Tensor foreign = other.persistent({2, 3});
  const std::vector<float> init = {1, 2, 3, 4, 5, 6};
  p.from_host(std::span<const float>(init));
  Segment seg = tape.segment();
  const Tensor x = tape.zeros({2, 3});
  std::vector<std::byte> five(5);
  const std::vector<Row> rows = {
      {"sgd_step of a segment tensor", Kind::Error, "not a parameter", [&] { sgd_step(x, {}, {}, false); }},
      {"sgd_step with momentum and no buffer", Kind::Error, "needs a momentum buffer",
       [&] { sgd_step(p, {}, {.momentum = 0.9}, false); }},
      {"sgd_step with a [3,2] buffer for [2,3]", Kind::Shape, "momentum buffer", [&] { sgd_step(p, wrong, {.momentum = 0.9}, false); }},
      {"adam_step with exp_avg of another tape", Kind::Tape, "another tape", [&] { adam_step(p, foreign, st, {}, false, 1); }},
      {"adam_step with f32 state for an f64 parameter", Kind::Shape, "exp_avg_sq", [&] { adam_step(pd, st64, st, {}, false, 1); }},
      {"adam_step at step 0", Kind::Error, "step must be >= 1", [&] { adam_step(p, st, st2, {}, false, 0); }},
      {"adam_step with one tensor as both moments", Kind::Error, "the same tensor", [&] { adam_step(p, st, st, {}, false, 1); }},
      {"adam_step with the parameter as its state", Kind::Error, "parameter's own values", [&] { adam_step(p, p, st, {}, false, 1); }},
      {"sgd_step with a buffer and momentum 0", Kind::Error, "momentum 0", [&] { sgd_step(p, st, {}, false); }},
      {"zero_grad of an undefined tensor", Kind::Error, "undefined", [&] { zero_grad(Tensor{}); }},
      {"scale_grad of a segment tensor", Kind::Error, "not a parameter", [&] { scale_grad(x, 2); }},
      {"grad_squared_norm of optimizer state", Kind::Error, "not a parameter", [&] { (void)grad_squared_norm(st); }},
      {"to_host_bytes: 5 bytes for 24", Kind::Shape, "5 bytes for tensor", [&] { x.to_host_bytes(five); }},
      {"from_host_bytes: 5 bytes for 24", Kind::Shape, "5 bytes for tensor", [&] { p.from_host_bytes(five); }},
  };
  const int n = walk(rows, [&](const Row& r) {
    EXPECT_EQ(p.to_host<float>(), init) << "a refused update changed the parameter: " << r.what;
  });
  EXPECT_EQ(n, 14);
}

// ------------------------------------------------------------ engine: tape and segments

TEST(Catalog, TapeMisuseLifetimesBudgetAndAnomalies) {
  Tape tape;
  const Tensor w = tape.parameter({2, 2});
  Tensor stale, carried, stale_data, stale_view;
  {
    Segment s1 = tape.segment();
    tape.next_step();
    tape.next_step();
    stale = tanh(w);  // segment 1, step 2
    carried = s1.carry(tanh(w));
    stale_view = reshape(w, {4});  // records a node: a tensor of segment 1
  }
  { Segment s2 = tape.segment(); }  // the carry lives through segment 2 only
  Tape other;
  const Tensor foreign = other.parameter({2, 2});

  std::vector<Row> rows = {
      {"an op outside any segment", Kind::Tape, "no segment is open", [&] { (void)tanh(w); }},
      {"a view outside any segment", Kind::Tape, "reshape: no segment is open", [&] { (void)reshape(w, {4}); }},
      {"detach outside any segment", Kind::Tape, "detach: no segment is open", [&] { (void)detach(w); }},
      {"a view of a parameter made in an ended segment", Kind::Expired, "made in segment 1", [&] {
         Segment s = tape.segment();
         (void)add(stale_view, stale_view);
       }},
      {"seg.grad of a tensor that is not an input() leaf", Kind::Tape, "not an input() leaf", [&] {
         Segment s = tape.segment();
         (void)s.grad(tanh(w));
       }},
      {"seg.input under NoGradGuard", Kind::Tape, "under NoGradGuard", [&] {
         Segment s = tape.segment();
         NoGradGuard ng(tape);
         (void)s.input(w);
       }},
      {"a seed of another shape", Kind::Shape, "does not match its tensor", [&] {
         Segment s = tape.segment();
         Tensor y = tanh(w);
         s.backward({{y, tape.zeros({3})}});
       }},
      {"a second segment while one is open", Kind::Tape, "still open", [&] {
         Segment s = tape.segment();
         (void)tape.segment();
       }},
      {"a tensor of an ended segment", Kind::Expired, "segment 1 at step 2", [&] {
         Segment s = tape.segment();
         (void)matmul(stale, w);
       }},
      {"reading an ended segment's tensor", Kind::Expired, "seg.carry", [&] {
         Segment s = tape.segment();
         (void)stale.data<float>();
       }},
      {"a carried tensor two segments later", Kind::Expired, "carried out of segment 1", [&] {
         Segment s = tape.segment();
         (void)add(carried, w);
       }},
      {"carrying an expired tensor", Kind::Expired, "carry", [&] {
         Segment s = tape.segment();
         (void)s.carry(stale);
       }},
      {"ops on tensors of two tapes", Kind::Tape, "different tapes", [&] {
         Segment s = tape.segment();
         (void)add(w, foreign);
       }},
      {"carrying another tape's tensor", Kind::Tape, "belongs to another tape", [&] {
         Segment s = tape.segment();
         Segment o = other.segment();
         (void)s.carry(tanh(foreign));
       }},
      {"backward of another tape's loss", Kind::Tape, "another tape", [&] {
         Segment s = tape.segment();
         Segment o = other.segment();
         s.backward(sum(foreign));
       }},
      {"backward twice without retain_graph", Kind::Tape, "second time", [&] {
         Segment s = tape.segment();
         Tensor y = tanh(w);
         s.backward(sum(y));
         s.backward(sum(mul(y, y)));
       }},
      {"backward of a no-grad result", Kind::Tape, "backward", [&] {
         Segment s = tape.segment();
         NoGradGuard ng(tape);
         s.backward(sum(w));
       }},
  };
  // Budgets: strict and the teaching policy's growth limit.
  Tape small(Device::cpu(), {.segment_budget = 64 << 10});
  Tape growing(Device::cpu(), {.segment_budget = 16 << 10, .grow = true, .grow_limit = 256 << 10});
  for (Tape* t : {&small, &growing}) {
    rows.push_back({t == &small ? "a segment past its budget" : "a growing segment past its limit", Kind::Budget,
                    "segment budget exceeded", [t] {
                      const Tensor w_ih = t->parameter({96, 32}), w_hh = t->parameter({96, 32}), b = t->parameter({96});
                      Segment s = t->segment();
                      Tensor h = t->zeros({4, 32});
                      for (int i = 0; i < 100000; ++i, t->next_step()) h = gru_cell(h, h, w_ih, w_hh, b, b);
                    }});
  }
  // Tape nodes count in the budget: zero-byte views cannot grow the heap.
  Tape nodes_only(Device::cpu(), {.segment_budget = 64 << 10});
  const Tensor nw = nodes_only.parameter({4});
  rows.push_back({"zero-byte views past the budget (tape nodes)", Kind::Budget, "the largest share is tape nodes", [&] {
                    Segment s = nodes_only.segment();
                    for (int i = 0; i < 200000; ++i) (void)reshape(nw, {2, 2});
                  }});
  // Anomaly mode: the first op that makes a NaN or Inf is named.
  Tape anomalous(Device::cpu(), {.anomaly = true});
  const Tensor p = anomalous.parameter({2});
  p.data<float>()[0] = -1.0f;
  p.data<float>()[1] = 2.0f;
  const Tensor nan_in = anomalous.parameter({2});
  nan_in.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  const Tensor zero = anomalous.parameter({2});
  rows.push_back({"log(-1) under anomaly mode", Kind::Anomaly, "op 'Log'", [&] {
                    Segment s = anomalous.segment();
                    (void)log(p);
                  }});
  rows.push_back({"a NaN input under anomaly mode", Kind::Anomaly, "NaN", [&] {
                    Segment s = anomalous.segment();
                    (void)tanh(nan_in);
                  }});
  rows.push_back({"a product overflowing to Inf under anomaly mode", Kind::Anomaly, "Inf", [&] {
                    Segment s = anomalous.segment();
                    const Tensor big = scale(p, 1e30);
                    (void)mul(big, big);
                  }});
  rows.push_back({"division by zero under anomaly mode", Kind::Anomaly, "op 'Div'", [&] {
                    Segment s = anomalous.segment();
                    (void)div(p, zero);
                  }});
  EXPECT_GE(walk(rows), 23);

  // Every tape still works after all that: a fresh segment trains.
  for (Tape* t : {&tape, &small, &growing, &anomalous, &nodes_only}) {
    const Tensor q = t->parameter({2});
    Segment s = t->segment();
    EXPECT_NO_THROW(s.backward(sum(tanh(q))));
  }
}

// ------------------------------------------------------------ nn: layers, optimizers, checkpoints

TEST(Catalog, LayersOptimizersAndCheckpoints) {
  Scratch dir("nn");
  Tape tape;
  nn::Rng rng(1);
  nn::Linear lin(tape, rng, 3, 4);
  nn::GRUCell cell(tape, rng, 3, 4);
  nn::GRU gru(tape, rng, 3, 4);
  nn::Linear wider(tape, rng, 3, 5);
  nn::Adam adam(lin, {});
  nn::SGD sgd(lin, {});
  const fs::path good = dir / "good.safetensors";
  nn::save(lin, good);
  nn::save_training_state(dir / "state.safetensors", lin, adam, rng, 7);
  const std::string good_bytes = slurp(good);
  const std::vector<float> lin_before(lin.weight.span<float>().begin(), lin.weight.span<float>().end());
  fs::path file_not_dir = dir / "a-file";
  spit(file_not_dir, "x");
  const st::TensorRef bad_ref{"w", st::DType::F32, {2, 2}, {}};  // 16 bytes promised, none given

  std::vector<Row> rows = {
      {"Linear(3, 4) on [2, 5]", Kind::Shape, "nn::Linear", [&] {
         Segment s = tape.segment();
         (void)lin(tape.zeros({2, 5}));
       }},
      {"GRUCell(3, 4) with h [2, 5]", Kind::Shape, "gru_cell", [&] {
         Segment s = tape.segment();
         (void)cell(tape.zeros({2, 3}), tape.zeros({2, 5}));
       }},
      {"GRU on a matrix", Kind::Shape, "[T, B, 3]", [&] {
         Segment s = tape.segment();
         (void)gru(tape.zeros({2, 3}));
       }},
      {"Linear with 0 inputs", Kind::Shape, "must be in [1, 2^31 - 1]", [&] { nn::Linear l(tape, rng, 0, 4); }},
      {"Adam with lr -1", Kind::Error, "invalid option", [&] { nn::Adam o(lin, {.lr = -1}); }},
      {"Adam with beta1 NaN", Kind::Error, "invalid option",
       [&] { nn::Adam o(lin, {.beta1 = std::numeric_limits<double>::quiet_NaN()}); }},
      {"SGD with nesterov and no momentum", Kind::Error, "invalid option", [&] { nn::SGD o(lin, {.nesterov = true}); }},
      {"Adam's lr set to NaN after construction", Kind::Error, "Adam: invalid option: lr nan", [&] {
         nn::Adam o(lin, {});
         o.options().lr = std::numeric_limits<double>::quiet_NaN();
         o.step();
       }},
      {"SGD's lr set to -1 after construction", Kind::Error, "SGD: invalid option: lr -1", [&] {
         nn::SGD o(lin, {.lr = 0.1});
         o.options().lr = -1;
         o.step();
       }},
      {"clip_grad_norm to a NaN norm", Kind::Error, "max_norm nan",
       [&] { (void)nn::clip_grad_norm(lin, std::numeric_limits<double>::quiet_NaN()); }},
      {"clip_grad_norm to a negative norm", Kind::Error, "max_norm -1", [&] { (void)nn::clip_grad_norm(lin, -1.0); }},
      {"an optimizer of nothing", Kind::Error, "empty parameter list",
       [&] { nn::SGD o(std::vector<nn::NamedTensor>{}, {}); }},
      {"load into a model of other shapes", Kind::Checkpoint, "wrong shape", [&] { nn::load(wider, good); }},
      {"load into a model of other names", Kind::Checkpoint, "missing", [&] { nn::load(cell, good); }},
      {"load of a missing file", Kind::Checkpoint, "cannot open", [&] { nn::load(lin, dir / "nope.safetensors"); }},
      {"load of a directory", Kind::Checkpoint, "not a regular file", [&] { nn::load(lin, dir.dir); }},
      {"training state into another optimizer", Kind::Checkpoint, "state.safetensors",
       [&] { nn::load_training_state(dir / "state.safetensors", lin, sgd, rng); }},
      {"save under /proc", Kind::Checkpoint, "cannot create temporary file",
       [&] { nn::save(lin, "/proc/segtape-catalog.safetensors"); }},
      {"save under a regular file", Kind::Checkpoint, "Not a directory", [&] { nn::save(lin, file_not_dir / "x.safetensors"); }},
      {"save over a good file, tensor data missing", Kind::Checkpoint, "needs 16 bytes",
       [&] { st::save_atomic(good, std::span<const st::TensorRef>(&bad_ref, 1), {}); }},
      {"save with a reserved metadata key", Kind::Checkpoint, "reserved",
       [&] { nn::save_training_state(good, lin, adam, rng, 1, {{"segtape.kind", "x"}}); }},
  };
  for (const auto& [what, bytes] : damaged(good_bytes)) {
    const fs::path p = dir / ("damaged-" + std::to_string(rows.size()) + ".safetensors");
    spit(p, bytes);
    rows.push_back({"load of a file " + what, Kind::Checkpoint, p.filename().string(), [&lin, p] { nn::load(lin, p); }});
  }
  const int n = walk(rows, [&](const Row& r) {
    EXPECT_EQ(slurp(good), good_bytes) << "the good checkpoint changed after: " << r.what;
    EXPECT_TRUE(std::equal(lin_before.begin(), lin_before.end(), lin.weight.span<float>().begin()))
        << "a failed load changed the model: " << r.what;
  });
  EXPECT_GE(n, 25);
  // No temporary file is left behind by the refused writes.
  for (const auto& e : fs::directory_iterator(dir.dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  EXPECT_NO_THROW(nn::load(lin, good));
}

// ------------------------------------------------------------ agent: configs and trainer checkpoints

agent::TrainConfig small(const std::string& env = "recall") {
  agent::TrainConfig c;
  c.env = env;
  c.history = agent::History::parse("tbptt:8");
  c.steps = 16;
  c.batch = 2;
  c.hidden = 8;
  c.embed = 4;
  return c;
}

// The checkpoint `good` with one integer of one I64 tensor replaced, written
// to `out`: a well-formed file whose values are out of range.
fs::path tampered(const fs::path& good, const std::string& tensor, size_t index, int64_t value, const fs::path& out) {
  const st::File f = st::load(good);
  std::vector<std::vector<std::byte>> bytes;
  bytes.reserve(f.tensors.size());
  std::vector<st::TensorRef> refs;
  for (const st::TensorInfo& t : f.tensors) {
    const auto d = f.data(t);
    bytes.emplace_back(d.begin(), d.end());
    if (t.name == tensor) std::memcpy(bytes.back().data() + index * sizeof value, &value, sizeof value);
    refs.push_back({t.name, t.dtype, t.shape, bytes.back()});
  }
  st::save_atomic(out, refs, f.metadata);
  return out;
}

TEST(Catalog, TrainerConfigsAndCheckpoints) {
  Scratch dir("agent");
  agent::Trainer trainer(small());
  trainer.run_segment();
  const fs::path good = dir / "checkpoint.safetensors";
  trainer.save(good);
  const std::string good_bytes = slurp(good);
  auto other = [&](const std::function<void(agent::TrainConfig&)>& change, const std::string& name) {
    agent::TrainConfig c = small();
    change(c);
    agent::Trainer t(c);
    const fs::path p = dir / name;
    t.save(p);
    return p;
  };
  const fs::path bad_window = tampered(good, "train.counters", 2, 5, dir / "bad-window.safetensors");
  const fs::path bad_steps = tampered(good, "train.counters", 1, -3, dir / "bad-steps.safetensors");
  const fs::path bad_env = tampered(good, "env.state", 4, -7, dir / "bad-env.safetensors");
  const fs::path wider = other([](agent::TrainConfig& c) { c.hidden = 12; }, "wider.safetensors");
  const fs::path tmaze = other([](agent::TrainConfig& c) { c.env = "tmaze"; }, "tmaze.safetensors");
  const fs::path k4 = other([](agent::TrainConfig& c) { c.history = agent::History::parse("tbptt:4"); }, "k4.safetensors");
  Tape t;
  nn::Rng rng(1);
  nn::Linear lin(t, rng, 2, 2);
  nn::save(lin, dir / "state_dict.safetensors");
  auto invalid = [](const std::function<void(agent::TrainConfig&)>& change) {
    return [change] {
      agent::TrainConfig c = small();
      change(c);
      c.validate();
    };
  };
  agent::TrainConfig full = small();
  full.history = agent::History::parse("full");
  full.steps = 64;  // two updates: after the first the run is half done
  agent::Trainer full_trainer(full);
  full_trainer.run_segment();

  std::vector<Row> rows = {
      {"--history sometimes", Kind::Error, "unknown --history 'sometimes'", [] { (void)agent::History::parse("sometimes"); }},
      {"--history tbptt:0", Kind::Error, "K must be an integer", [] { (void)agent::History::parse("tbptt:0"); }},
      {"--history window:x", Kind::Error, "N must be an integer", [] { (void)agent::History::parse("window:x"); }},
      {"--env chess", Kind::Error, "unknown --env 'chess'", invalid([](agent::TrainConfig& c) { c.env = "chess"; })},
      {"--steps 0", Kind::Error, "--steps", invalid([](agent::TrainConfig& c) { c.steps = 0; })},
      {"--batch 0", Kind::Error, "--batch", invalid([](agent::TrainConfig& c) { c.batch = 0; })},
      {"--lr nan", Kind::Error, "--lr", invalid([](agent::TrainConfig& c) { c.lr = std::nan(""); })},
      {"--clip -1", Kind::Error, "--clip", invalid([](agent::TrainConfig& c) { c.clip = -1; })},
      {"--device tpu", Kind::Error, "--device", invalid([](agent::TrainConfig& c) { c.device = "tpu"; })},
      {"--nonfinite ignore", Kind::Error, "--nonfinite 'ignore': choose stop or skip",
       invalid([](agent::TrainConfig& c) { c.nonfinite = "ignore"; })},
      {"--max-skips 0", Kind::Error, "--max-skips must be in [1, ", invalid([](agent::TrainConfig& c) { c.max_skips = 0; })},
      {"--precision fp16", Kind::Error, "--precision 'fp16': choose f32 or bf16", invalid([](agent::TrainConfig& c) { c.precision = "fp16"; })},
      {"--adam-eps 0", Kind::Error, "--adam-eps must be in (0, 1]", invalid([](agent::TrainConfig& c) { c.adam_eps = 0; })},
      {"--adam-eps with --optim sgd", Kind::Error, "--adam-eps is Adam's and AdamW's", invalid([](agent::TrainConfig& c) {
         c.optim = "sgd";
         c.adam_eps = 1e-5;
       })},
      {"--history full on cuda", Kind::Error, "CPU-only", invalid([](agent::TrainConfig& c) {
         c.device = "cuda";
         c.history = agent::History::parse("full");
       })},
      {"--history window:100", Kind::Error, "window:N", invalid([](agent::TrainConfig& c) {
         c.history = agent::History::parse("window:100");
       })},
      {"a trainer of an invalid config", Kind::Error, "--hidden", [] {
         agent::TrainConfig c = small();
         c.hidden = 0;
         agent::Trainer t(c);
       }},
      {"load a checkpoint with another --hidden", Kind::Checkpoint, "another --batch/--hidden/--embed",
       [&] { trainer.load(wider); }},
      {"load a checkpoint of another --env", Kind::Checkpoint, "another --env", [&] { trainer.load(tmaze); }},
      {"load a checkpoint whose window position is past the ring", Kind::Checkpoint, "train.counters out of range",
       [&] { trainer.load(bad_window); }},
      {"load a checkpoint with a negative optimizer step count", Kind::Checkpoint, "train.counters out of range",
       [&] { trainer.load(bad_steps); }},
      {"load a checkpoint whose env state is out of range", Kind::Error, "saved state is out of range",
       [&] { trainer.load(bad_env); }},
      {"load a checkpoint with another --history", Kind::Checkpoint, "another --history", [&] { trainer.load(k4); }},
      {"read_config of a state_dict", Kind::Checkpoint, "not a segtape training checkpoint",
       [&] { (void)agent::Trainer::read_config(dir / "state_dict.safetensors"); }},
      {"load of a state_dict", Kind::Checkpoint, "lacks", [&] { trainer.load(dir / "state_dict.safetensors"); }},
      {"save under /proc", Kind::Checkpoint, "cannot create temporary file", [&] { trainer.save("/proc/segtape-ck.safetensors"); }},
      {"save of history full mid-run", Kind::Error, "history 'full'", [&] { full_trainer.save(dir / "full.safetensors"); }},
      {"evaluate of history full mid-run", Kind::Error, "evaluate: history 'full' keeps its whole run in one open segment",
       [&] { (void)full_trainer.evaluate(16, 1); }},
  };
  for (const auto& [what, bytes] : damaged(good_bytes)) {
    const fs::path p = dir / ("damaged-" + std::to_string(rows.size()) + ".safetensors");
    spit(p, bytes);
    rows.push_back({"trainer load of a file " + what, Kind::Checkpoint, p.filename().string(), [&trainer, p] { trainer.load(p); }});
  }
  // A refused load leaves the trainer as it was: it saves the same bytes.
  const int n = walk(rows, [&](const Row& r) {
    EXPECT_EQ(slurp(good), good_bytes) << "after: " << r.what;
    trainer.save(dir / "again.safetensors");
    EXPECT_EQ(slurp(dir / "again.safetensors"), good_bytes) << "a refused load changed the trainer: " << r.what;
  });
  EXPECT_GE(n, 25);
}

// ------------------------------------------------------------ the segtape program

struct Exit {
  bool exited;      // ended by exit(), not by a signal
  int code;
  std::string err;  // standard error
};

Exit run(const std::string& args) {
  // stderr only (stdout to /dev/null): what a user sees when it fails.
  const test::Process r = test::run_shell(std::string(SEGTAPE_BIN) + " " + args + " 2>&1 >/dev/null");
  return {r.exited, r.code, r.output};
}

TEST(Catalog, ProgramArgumentsAndPaths) {
  Scratch dir("cli");
  const std::string good = (dir / "good").string();
  const Exit made = run("train --steps 64 --batch 2 --hidden 8 --log-every 32 --eval-steps 16 --out " + good);
  ASSERT_TRUE(made.exited && made.code == 0) << made.err;
  const fs::path ck = dir / "good" / "checkpoint.safetensors";
  const std::string ck_bytes = slurp(ck), csv_bytes = slurp(dir / "good" / "metrics.csv");
  spit(dir / "a-file", "x");
  fs::create_directories(dir / "oldlab");
  spit(dir / "oldlab" / "retention.json", "{}");
  fs::create_directories(dir / "corrupt");
  spit(dir / "corrupt" / "checkpoint.safetensors", ck_bytes.substr(0, ck_bytes.size() / 2));
  spit(dir / "truncated.safetensors", ck_bytes.substr(0, ck_bytes.size() - 1));
  tampered(ck, "train.counters", 2, 5, dir / "bad-counters.safetensors");  // window position 5 of a ring of 1
  {
    Tape t;
    nn::Rng rng(1);
    nn::Linear lin(t, rng, 2, 2);
    nn::save(lin, dir / "state_dict.safetensors");
  }
  const std::string d = dir.dir.string(), fresh = " --out " + d + "/fresh";

  // segtape: error rows: exit 2 and exactly one line on stderr, "segtape: error: <what>".
  // cli11 rows: refused by the argument parser (exit code 2 too, its own wording).
  enum Format { segtape, cli11 };
  struct Case {
    const char* what;
    std::string args;
    Format format;
    std::string fragment;
  } cases[] = {
      {"no command", "", segtape, "a command is required: train, eval, sample or retention"},
      {"--task lm without --data", "train --task lm" + fresh, segtape, "--task lm needs a text to learn: --data FILE"},
      {"--task of no task", "train --task chess" + fresh, segtape, "--task 'chess': choose lm"},
      {"--data on another env", "train --data x.txt" + fresh, segtape, "--data is --env lm's; this run is --env recall"},
      {"--task series without --target", "train --task series --data x.csv" + fresh, segtape, "--task series needs the column to predict: --target COLUMN"},
      {"--task series of a missing file", "train --task series --data " + d + "/none.csv --target y" + fresh, segtape, d + "/none.csv: no such file"},
      {"--target on another env", "train --target y" + fresh, segtape, "--target is --env series's; this run is --env recall"},
      {"--tokens on --task series", "train --task series --data x.csv --target y --tokens words --steps 10" + fresh, segtape, "--tokens is --env lm's; this run is --env series"},
      {"sample of an agent's checkpoint", "sample --checkpoint " + ck.string(), segtape, "not of a language model (segtape train --task lm)"},
      {"an unknown command", "fly", segtape, "unknown command 'fly'"},
      {"help for an unknown command", "help fly", segtape, "no command 'fly'"},
      {"an unknown option", "train --frobnicate 1", cli11, "frobnicate"},
      {"a word for a number", "train --steps many", cli11, "Could not convert"},
      {"an unknown env", "train --env chess" + fresh, cli11, "chess"},
      {"an unknown env lists the registered ones", "train --env chess" + fresh, cli11,
       "unknown env 'chess' (registered: recall, tmaze, dialogue, lm, series, device-recall, device-tmaze, device-dialogue; an env of your own: --env-plugin FILE)"},
      {"--env-plugin of a missing file", "train --env-plugin " + d + "/none.so --env recall" + fresh, segtape,
       "--env-plugin " + d + "/none.so: no such file"},
      {"--env-plugin of a file that is no library", "train --env-plugin " + d + "/a-file" + fresh, segtape,
       "--env-plugin " + d + "/a-file: cannot load it as a shared library"},
      {"eval --env-plugin of a missing file", "eval --env-plugin " + d + "/none.so --checkpoint " + ck.string(), segtape,
       "--env-plugin " + d + "/none.so: no such file"},
      {"eval without --checkpoint", "eval", cli11, "--checkpoint is required"},
      {"--steps 0", "train --steps 0" + fresh, segtape, "--steps must be in [1, 1e9]"},
      {"--batch 0", "train --batch 0" + fresh, segtape, "--batch must be in"},
      {"--hidden -3", "train --hidden -3" + fresh, segtape, "--hidden must be in"},
      {"--lr -1", "train --lr -1" + fresh, segtape, "--lr must be"},
      {"--lr nan", "train --lr nan" + fresh, segtape, "--lr must be"},
      {"--history tbptt:0", "train --history tbptt:0" + fresh, segtape, "K must be an integer"},
      {"--history window:100", "train --history window:100" + fresh, segtape, "window:N"},
      {"--history sometimes", "train --history sometimes" + fresh, segtape, "unknown --history 'sometimes'"},
      {"--history exact with T < K", "train --history exact:8/4" + fresh, segtape, "exact:K/T needs T >= K"},
      {"--history overlap with S not a multiple of K", "train --history overlap:8/32/12" + fresh, segtape,
       "--history overlap:8/32/12: S = 12 must be a multiple of K = 8"},
      {"--history overlap with S > T", "train --history overlap:8/32/64" + fresh, segtape, "S = 64 is more than T = 32"},
      {"--history overlap with S = 0", "train --history overlap:8/32/0" + fresh, segtape, "S must be an integer in [1, 1000000]"},
      {"--kernel without NAME=VALUE", "train --kernel fused_gru" + fresh, segtape, "--kernel fused_gru: give NAME=VALUE"},
      {"--kernel of no switch", "train --kernel bogus=1" + fresh, segtape, "kernel option 'bogus': expected gemv, packed, fused_gru or fused_gru_grid"},
      {"--budget lots", "train --budget lots" + fresh, segtape, "--budget 'lots'"},
      {"--budget 0", "train --budget 0" + fresh, segtape, "--budget '0': must be a positive size"},
      {"--budget on --resume", "train --resume " + good + " --budget 1MiB", segtape, "--budget cannot change on --resume"},
      {"--precision on --resume", "train --resume " + good + " --precision bf16", segtape, "--precision cannot change on --resume"},
      {"--eval-steps 0", "train --eval-steps 0" + fresh, segtape, "--eval-steps 0: must be in [1, 1e9]"},
      {"--log-every 0", "train --log-every 0" + fresh, segtape, "--log-every 0: must be in [1, 1e9]"},
      {"--checkpoint-every 0", "train --checkpoint-every 0" + fresh, segtape, "--checkpoint-every 0: must be in [1, 1e9]"},
      {"eval --steps -1", "eval --steps -1 --checkpoint " + ck.string(), segtape, "--steps -1: must be >= 1"},
      {"a model whose segment cannot fit the budget", "train --hidden 16384" + fresh, segtape,
       "a segment of 32 steps keeps at least 320.1 MiB"},
      {"a model larger than the machine's memory", "train --vocab 1000000 --embed 16384 --history tbptt:1 --batch 1" + fresh,
       segtape, "but this process may reach ("},
      {"--size-check maybe", "train --size-check maybe" + fresh, segtape, "--size-check = maybe"},
      {"one step larger than the budget", "train --batch 65536 --budget 1MiB --history tbptt:1" + fresh, segtape,
       "more than the 1.0 MiB --budget"},
      {"--device cuda", "train --device cuda" + fresh, segtape,
       Device::cuda_built() ? "no CUDA GPU found" : "--device cuda: this build of segtape has no CUDA backend"},
      {"retention --dot of a directory", "retention --no-libtorch --dot " + d + "/ --out " + d + "/lab", segtape,
       "--dot " + d + "/: is a directory"},
      {"retention --dot in a missing directory", "retention --no-libtorch --dot " + d + "/none/tape.dot --out " + d + "/lab",
       segtape, "--dot " + d + "/none/tape.dot: the directory"},
      {"retention --out of an existing lab run", "retention --no-libtorch --out " + d + "/oldlab", segtape,
       "already holds a lab run; pass --force"},
      {"--device tpu", "train --device tpu" + fresh, segtape, "--device tpu: must be cpu or cuda"},
      {"--out under /proc", "train --steps 32 --out /proc/segtape-catalog", segtape, "--out /proc/segtape-catalog"},
      {"--out under a regular file", "train --steps 32 --out " + d + "/a-file/run", segtape, "cannot create the directory"},
      {"--out of an existing run", "train --steps 32 --out " + good, segtape, "already holds a run"},
      {"--log-dir under a regular file", "train --steps 32 --log-dir " + d + "/a-file/logs" + fresh, segtape,
       "--log-dir " + d + "/a-file/logs: cannot make the folder"},
      {"--env-shards that does not divide --batch", "train --batch 8 --env-shards 3" + fresh, segtape,
       "--env-shards 3: must be >= 1 and divide --batch 8"},
      {"--dist-timeout 0", "train --dist-timeout 0" + fresh, segtape, "--dist-timeout 0: must be a finite number of seconds >= 1"},
      {"--dist-timeout inf", "train --dist-timeout inf" + fresh, segtape, "--dist-timeout inf: must be a finite number of seconds >= 1"},
      {"--dist-timeout 1e-9", "train --dist-timeout 1e-9" + fresh, segtape, "--dist-timeout 1e-09: must be a finite number of seconds >= 1"},
      {"--resume with another --env-shards", "train --resume " + good + " --env-shards 2", segtape, "--env-shards cannot change on --resume"},
      {"--resume with another --hidden", "train --resume " + good + " --hidden 32", segtape, "--hidden cannot change on --resume"},
      {"--resume of an empty place", "train --resume " + d + "/nothing-here", segtape, "no checkpoint.safetensors"},
      {"--resume of a corrupt checkpoint", "train --resume " + d + "/corrupt", segtape, "checkpoint.safetensors"},
      {"eval of a missing file", "eval --checkpoint " + d + "/missing.safetensors", segtape, "cannot open"},
      {"eval of a directory", "eval --checkpoint " + d, segtape, "not a regular file"},
      {"eval of metrics.csv", "eval --checkpoint " + good + "/metrics.csv", segtape, "header length"},
      {"eval of a truncated checkpoint", "eval --checkpoint " + d + "/truncated.safetensors", segtape, "truncated.safetensors"},
      {"eval of a checkpoint with counters out of range (the problems in one line)",
       "eval --checkpoint " + d + "/bad-counters.safetensors", segtape,
       "bad-counters.safetensors: cannot load the training checkpoint: 1 problem (nothing was loaded): train.counters out of range"},
      {"eval of a state_dict", "eval --checkpoint " + d + "/state_dict.safetensors", segtape, "not a segtape training checkpoint"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Exit r = run(c.args);
    EXPECT_TRUE(r.exited) << c.args << ": killed by a signal\n" << r.err;
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find(c.fragment), std::string::npos) << c.args << ": stderr lacks '" << c.fragment << "':\n" << r.err;
    for (const char* crash : {"terminate called", "Sanitizer", "runtime error:", "Aborted"})
      EXPECT_EQ(r.err.find(crash), std::string::npos) << c.args << "\n" << r.err;
    if (c.format == segtape) {
      EXPECT_EQ(r.code, 2) << c.args;
      EXPECT_EQ(r.err.rfind("segtape: error: ", 0), 0u) << c.args << ":\n" << r.err;
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << c.args << ": not one line:\n" << r.err;
    } else {
      EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    }
    EXPECT_EQ(slurp(ck), ck_bytes) << "the good checkpoint changed after: " << c.args;
    EXPECT_EQ(slurp(dir / "good" / "metrics.csv"), csv_bytes) << "metrics.csv changed after: " << c.args;
  }
  EXPECT_FALSE(fs::exists(dir / "fresh")) << "a refused run made its directory";
  EXPECT_FALSE(fs::exists(dir / "lab")) << "a refused lab made its directory";
  EXPECT_EQ(slurp(dir / "oldlab" / "retention.json"), "{}") << "a refused lab overwrote a lab run";
  // And the good run still evaluates.
  const Exit ev = run("eval --steps 16 --checkpoint " + ck.string());
  EXPECT_TRUE(ev.exited && ev.code == 0) << ev.err;
}

// ------------------------------------------------------------ checkpoint integrity

// Damage that keeps a file well-formed (one bit of tensor data flipped) is
// caught by the stored checksums on every load path, and a file of another
// kind is called what it is.
TEST(Catalog, CheckpointIntegrity) {
  Scratch dir("integrity");
  // A copy of `good` with the low bit of the first data byte of `tensor` flipped.
  auto flipped = [&](const fs::path& good, const std::string& tensor, const std::string& name) {
    const st::File f = st::load(good);
    const st::TensorInfo* t = f.find(tensor);
    EXPECT_TRUE(t && t->end > t->begin) << tensor;
    std::string bytes = slurp(good);
    if (t && t->end > t->begin) bytes[f.data_start + t->begin] ^= 1;
    spit(dir / name, bytes);
    return dir / name;
  };
  Tape tape;
  nn::Rng rng(1);
  nn::Linear lin(tape, rng, 3, 4);
  const fs::path lin_good = dir / "linear.safetensors";
  nn::save(lin, lin_good);
  const std::string lin_bytes = slurp(lin_good);
  const std::vector<float> lin_before(lin.weight.span<float>().begin(), lin.weight.span<float>().end());
  const fs::path lin_bad = flipped(lin_good, "weight", "linear-flipped.safetensors");

  agent::Trainer trainer(small());
  trainer.run_segment();
  const fs::path tr_good = dir / "checkpoint.safetensors";
  trainer.save(tr_good);
  const std::string tr_bytes = slurp(tr_good);
  const std::string policy_tensor = "policy." + trainer.policy().named_parameters().front().first;
  const fs::path tr_bad = flipped(tr_good, policy_tensor, "checkpoint-flipped.safetensors");
  const fs::path tr_bad_h = flipped(tr_good, "state.h", "checkpoint-flipped-h.safetensors");

  const fs::path json = dir / "metrics.json";
  spit(json, "{\n  \"eval_accuracy\": 0.5,\n  \"steps\": 64\n}\n");

  const std::string mismatch = "data bytes do not match the stored checksum";
  std::vector<Row> rows = {
      {"nn::load of a checkpoint with a flipped data byte", Kind::Checkpoint,
       "linear-flipped.safetensors: tensor 'weight': its 48 " + mismatch, [&] { nn::load(lin, lin_bad); }},
      {"non-strict nn::load of a checkpoint with a flipped data byte", Kind::Checkpoint, "the file is damaged",
       [&] { nn::load(lin, lin_bad, /*strict=*/false); }},
      {"trainer load of a checkpoint with a flipped parameter byte", Kind::Checkpoint,
       "checkpoint-flipped.safetensors: tensor '" + policy_tensor + "': its", [&] { trainer.load(tr_bad); }},
      {"trainer load of a checkpoint with a flipped recurrent-state byte", Kind::Checkpoint,
       "tensor 'state.h': its", [&] { trainer.load(tr_bad_h); }},
      {"read_config (segtape eval) of a checkpoint with a flipped byte", Kind::Checkpoint, mismatch,
       [&] { (void)agent::Trainer::read_config(tr_bad); }},
      {"read_config (segtape eval) of a JSON file", Kind::Checkpoint, "metrics.json: not a safetensors file",
       [&] { (void)agent::Trainer::read_config(json); }},
      {"trainer load of a JSON file", Kind::Checkpoint, "metrics.json: not a safetensors file",
       [&] { trainer.load(json); }},
      {"nn::load of a JSON file", Kind::Checkpoint, "metrics.json: not a safetensors file", [&] { nn::load(lin, json); }},
  };
  const int n = walk(rows, [&](const Row& r) {
    EXPECT_EQ(slurp(lin_good), lin_bytes) << "after: " << r.what;
    EXPECT_EQ(slurp(tr_good), tr_bytes) << "after: " << r.what;
    EXPECT_TRUE(std::equal(lin_before.begin(), lin_before.end(), lin.weight.span<float>().begin()))
        << "a refused load changed the model: " << r.what;
    trainer.save(dir / "again.safetensors");
    EXPECT_EQ(slurp(dir / "again.safetensors"), tr_bytes) << "a refused load changed the trainer: " << r.what;
  });
  EXPECT_EQ(n, 8);
  // The program says the same on its one error line.
  const Exit r = run("eval --checkpoint " + json.string());
  EXPECT_TRUE(r.exited && r.code == 2) << r.err;
  EXPECT_EQ(r.err.rfind("segtape: error: " + json.string() + ": not a safetensors file (", 0), 0u) << r.err;
  // And the good files still load.
  EXPECT_NO_THROW(nn::load(lin, lin_good));
  EXPECT_NO_THROW(trainer.load(tr_good));
}

// ------------------------------------------------------------ fixed gaps

// Regression rows for faults this catalog found under UBSan:
//  - Segment::carry / backward on an ended or moved-from Segment raise
//    TapeError (a null Tape* was dereferenced);
//  - `segtape train --history full` writes its final checkpoint: the state is
//    carried out of the one segment before it ends (it expired with it).
TEST(Catalog, FormerGaps) {
  Tape tape;
  const Tensor w = tape.parameter({2});
  std::vector<Row> rows = {
      {"carry from an ended segment", Kind::Tape, "segment", [&] {
         Segment s = tape.segment();
         const Tensor y = tanh(w);
         s.end();
         (void)s.carry(y);
       }},
      {"backward on a moved-from segment", Kind::Tape, "segment", [&] {
         Segment s = tape.segment();
         Segment t = std::move(s);
         s.backward(sum(tanh(w)));  // NOLINT(bugprone-use-after-move): the misuse under test
       }},
  };
  walk(rows);
  {  // rows of length 0: Shape::rows() divided by the last dim (an integer division by zero, SIGFPE)
    const Tensor e = tape.parameter({3, 0});
    Segment s = tape.segment();
    const Tensor y = softmax(e), z = log_softmax(e);
    EXPECT_EQ(y.shape, (Shape{3, 0}));
    EXPECT_EQ(z.shape, (Shape{3, 0}));
    EXPECT_EQ(e.shape.rows(), 3);
    EXPECT_NO_THROW(s.backward(add(sum(y), sum(z))));
  }
  Scratch dir("gaps");
  const Exit r = run("train --history full --steps 64 --batch 2 --hidden 8 --eval-steps 16 --out " + (dir / "full").string());
  EXPECT_TRUE(r.exited && r.code == 0) << r.err;
  // (its checkpoint cannot be evaluated: the refusal names the file, which it did not)
  const std::string ck = (dir / "full" / "checkpoint.safetensors").string();
  const Exit e = run("eval --checkpoint " + ck);
  EXPECT_TRUE(e.exited && e.code == 2) << e.err;
  EXPECT_NE(e.err.find(ck + ": a --history full run's checkpoint cannot be resumed or evaluated"), std::string::npos) << e.err;
}

}  // namespace

// ------------------------------------------------------------ the retention lab's arguments

// --cases takes the names the lab's table prints (tbptt:8, window:8, "1
// hidden-not-detached") as well as the bare ones; an unknown name or another
// K is one "segtape: error:" line listing the valid names, before anything is
// written.
TEST(Catalog, RetentionLabArguments) {
  Scratch dir("retention");
  const std::string out = " --out " + (dir / "refused").string();
  struct Case {
    const char* what;
    std::string args;
    std::vector<std::string> fragments;
  } cases[] = {
      {"an unknown case", "retention --cases nonsense" + out,
       {"unknown retention case 'nonsense'", "valid names: 1 hidden-not-detached,", "tbptt:8", "window:8", "gru-state (tbptt:32)"}},
      {"an unknown case after good ones", "retention --cases loss-sum,tbptt:8,bogus" + out, {"unknown retention case 'bogus'"}},
      {"a K the lab does not run", "retention --cases tbptt:16" + out, {"retention case 'tbptt:16': with these settings the lab runs tbptt:8", "valid names:"}},
      {"a fix by number", "retention --cases 8" + out, {"unknown retention case '8'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Exit r = run(c.args);
    EXPECT_TRUE(r.exited && r.code == 2) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("segtape: error: ", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line:\n" << r.err;
    for (const std::string& f : c.fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "stderr lacks '" << f << "':\n" << r.err;
    EXPECT_FALSE(fs::exists(dir / "refused")) << "a refused run wrote its directory";
  }
  // The table's names run (tiny sizes: the lab also measures anomaly mode on the agent loop).
  const Exit ok = run("retention --cases 'tbptt:8, 2 loss-sum' --steps 16 --batch 1 --hidden 8 --no-libtorch --out " +
                      (dir / "ok").string());
  ASSERT_TRUE(ok.exited && ok.code == 0) << ok.err;
  const std::string json = slurp(dir / "ok" / "retention.json");
  EXPECT_NE(json.find("\"label\": \"tbptt:8\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"label\": \"2 loss-sum\""), std::string::npos) << json;
}
