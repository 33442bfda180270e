// What every op shares: the entry checks, and emit() (engine/ops/op.h).
#include <span>

#include "backend.h"
#include "ops/op.h"
#include "tape_internals.h"

namespace segtape::ops {

using In = detail::TapeInternals;

std::string list(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) s += (s.empty() ? "" : " and ") + t->describe();
  return s;
}

void require_segment(const Tape& t, const char* op) {
  if (!t.segment_open())
    throw TapeError(std::string(op) + ": no segment is open; open one with tape.segment() (an op's output and its "
                    "tape node belong to the open segment)");
}

Tape& check(const char* op, std::initializer_list<const Tensor*> ts, bool integers) {
  Tape* tape = nullptr;
  DType d = DType::F32;
  bool first = true;
  for (const Tensor* t : ts) {
    t->check_live(op);
    if (!tape) tape = t->tape;
    else if (tape != t->tape) throw TapeError(std::string(op) + ": inputs belong to different tapes");
    if (t->dtype == DType::I64 && !integers) throw ShapeError(std::string(op) + ": expects floating-point inputs, got " + t->describe());
    if (first) d = t->dtype, first = false;
    else if (t->dtype != d) throw ShapeError(std::string(op) + ": dtypes differ: " + list(ts));
  }
  require_segment(*tape, op);
  return *tape;
}

void check_index(const char* op, const Tape& t, const Tensor& idx, std::initializer_list<const Tensor*> ts) {
  idx.check_live(op);
  if (idx.tape != &t) throw TapeError(std::string(op) + ": inputs belong to different tapes: " + list(ts));
}

void shape_error(const char* op, const std::string& why, std::initializer_list<const Tensor*> ts) {
  throw ShapeError(std::string(op) + ": " + why + ": " + list(ts));
}

int norm_axis(const char* op, const Tensor& a, int axis) {
  const int ax = axis < 0 ? axis + a.rank() : axis;
  if (ax < 0 || ax >= a.rank())
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " out of range for " + a.describe());
  return ax;
}

Node node(OpKind k, std::span<const Tensor> ins) {
  Node n;
  n.op = k;
  n.n_in = uint8_t(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) n.in[i] = ins[i];
  return n;
}

Tensor emit(Tape& t, Node& n, const Shape& s, const char* op, Saved saved) {
  return emit(t, n, s, n.in[0].dtype, op, saved);
}

Tensor emit(Tape& t, Node& n, const Shape& s, DType d, const char* op, Saved saved) {
  const std::span<const Tensor> ins(n.in.data(), n.n_in);
  const bool grad = In::wants_grad(t, ins);
  n.out = In::make(t, s, d, n.op, op);
  n.bytes = n.out.nbytes();
  if (saved.bytes) {
    const bool keep = grad && saved.keep;
    In::scratch_reset(t);
    n.saved = keep ? In::alloc(t, saved.bytes, n.op, op) : In::scratch(t, saved.bytes);
    if (keep) n.bytes += saved.bytes;
  }
  In::backend(t)->forward(t, n);
  In::check_output(t, n.out, n.op);
  if (!grad) return n.out;
  if (saved.bytes && !saved.keep) n.saved = nullptr;  // recompute mode: backward computes it again
  return In::record(t, n).out;
}

}  // namespace segtape::ops
