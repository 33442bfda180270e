#include "segtape/tensor.h"

#include <cstring>

#include "segtape/tape.h"
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I64: return "i64";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::F32 ? 4 : 8; }

std::string Device::str() const {
  return kind == Kind::CPU ? "cpu" : "cuda:" + std::to_string(index);
}

Shape::Shape(std::initializer_list<int64_t> d) { *this = of(std::span<const int64_t>(d.begin(), d.size())); }

Shape Shape::of(std::span<const int64_t> d, const char* op) {
  const std::string at = op ? std::string(op) + ": " : std::string();
  if (d.size() > size_t(kMaxRank))
    throw ShapeError(at + "shape of rank " + std::to_string(d.size()) + ": segtape tensors have rank <= 4");
  Shape s;
  for (int64_t v : d) {
    if (v < 0 || v > INT32_MAX) {
      std::string m = at + "shape [";
      for (size_t i = 0; i < d.size(); ++i) {
        if (i) m += ',';
        m += std::to_string(d[i]);
      }
      m += "]: dimension ";
      m += std::to_string(v);
      m += " is out of range [0, 2^31 - 1]";
      if (v == -1) m += " (a dimension is never inferred from -1: give every one)";
      throw ShapeError(m);
    }
    s.dims[s.rank++] = int32_t(v);
  }
  s.check_elements(op);
  return s;
}

void Shape::check_elements(const char* op) const {
  // (no prefix of the product may pass the bound either: a zero dimension
  // later would hide an overflow before it)
  unsigned __int128 n = 1;
  for (int i = 0; i < rank; ++i) n = std::min<unsigned __int128>(n * unsigned(dims[i]), kMaxElements + 1);
  if (n > kMaxElements)
    throw ShapeError((op ? std::string(op) + ": the result " : std::string("shape ")) + str() + " has more than 2^60 elements");
}

void Shape::check(const char* op) const {
  const std::string at = std::string(op) + ": ";
  if (rank < 0 || rank > kMaxRank)
    throw ShapeError(at + "a shape of rank " + std::to_string(rank) + ": segtape tensors have rank 0 to 4 (were Shape's fields "
                     "written by hand? Shape{...} and Shape::of check them)");
  for (int i = 0; i < rank; ++i)
    if (dims[i] < 0) throw ShapeError(at + "shape " + str() + ": dimension " + std::to_string(dims[i]) + " is negative");
  check_elements(op);
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != o.dims[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ',';
    s += std::to_string(dims[i]);
  }
  s += ']';
  return s;
}

bool Tensor::is_live() const { return tape && In::is_live(*tape, *this); }

void Tensor::check_live(const char* what) const {
  if (space == Space::None) throw TapeError(std::string(what) + ": undefined tensor");
  if (!In::is_live(*tape, *this)) throw ExpiredTensorError(In::expired_message(*tape, *this, what));
}

double Tensor::item() const {
  check_live("item()");
  if (numel() != 1) throw ShapeError("item(): tensor " + describe() + " has " + std::to_string(numel()) + " elements, not 1");
  unsigned char v[8];
  detail::tensor_to_host(*this, dtype, v, 1);  // a device tensor: waits for the device, then copies
  auto as = [&]<class T>() {
    T x;
    std::memcpy(&x, v, sizeof x);
    return double(x);
  };
  switch (dtype) {
    case DType::F32: return as.template operator()<float>();
    case DType::F64: return as.template operator()<double>();
    case DType::I64: return as.template operator()<int64_t>();
  }
  return 0;
}

std::string Tensor::describe() const {
  std::string s = std::string(dtype_name(dtype)) + shape.str();
  switch (space) {
    case Space::None: return "undefined tensor";
    case Space::Persistent: return s + " (persistent)";
    case Space::Segment: return s + " (segment " + std::to_string(gen) + ", step " + std::to_string(step) + ")";
    case Space::Carry: return s + " (carried out of segment " + std::to_string(gen) + ")";
  }
  return s;
}

Tensor Tensor::grad_tensor() const {
  check_live("grad_tensor()");
  if (!grad) throw TapeError("grad_tensor(): " + describe() + " is not a parameter (no gradient buffer)");
  Tensor g = *this;
  g.ptr = grad;
  g.grad = nullptr;
  g.node = -1;
  g.requires_grad = false;
  return g;
}

}  // namespace segtape
