#include "segtape/tensor.h"

#include <cstring>

#include "backend.h"
#include "segtape/tape.h"
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;

const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "f32"; }

std::optional<Precision> parse_precision(std::string_view s) {
  if (s == "f32") return Precision::F32;
  if (s == "bf16") return Precision::Bf16;
  return std::nullopt;
}

std::string precision_unsupported(Precision p, int major, int minor, const std::string& gpu) {
  if (p != Precision::Bf16 || major >= 8) return "";
  return "TapeOptions::precision bf16 (--precision bf16) on " + gpu + ": bfloat16 matrix products need bfloat16 tensor cores, "
         "compute capability 8.0 (Ampere) or later, and this GPU is " + std::to_string(major) + "." + std::to_string(minor) +
         ". Nothing was run; use precision f32 on this GPU (float32 products), or bf16 on the CPU (--device cpu) or a "
         "newer GPU";
}

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

// ---- host access to tensor memory: through the tape's backend (a device's
// copies wait for its stream).

bool Tensor::on_device() const { return tape && space != Space::None && In::device_pools(*tape); }

namespace detail {
namespace {
void check_host_copy(const Tensor& t, DType d, size_t count, const char* what) {
  t.check_live(what);
  if (t.dtype != d)
    throw ShapeError(std::string(what) + ": " + dtype_name(d) + " values for tensor " + t.describe());
  if (count != size_t(t.numel()))
    throw ShapeError(std::string(what) + ": " + std::to_string(count) + " values for tensor " + t.describe() + " (" +
                     std::to_string(t.numel()) + " elements)");
}
void check_byte_copy(const Tensor& t, size_t bytes, const char* what) {
  t.check_live(what);
  if (bytes != t.nbytes())
    throw ShapeError(std::string(what) + ": " + std::to_string(bytes) + " bytes for tensor " + t.describe() + " (" +
                     std::to_string(t.nbytes()) + " bytes)");
}
// The copy itself, after the checks; written_by: the writer's name, when the copy writes t.
void copy_bytes(const Tensor& t, void* host, size_t bytes, bool to_host, const char* written_by = nullptr) {
  if (!bytes) return;
  if (!to_host) tensor_written(t, written_by);  // (also a view of a weight: by its bytes)
  else In::count_host_read(*t.tape);
  In::backend(*t.tape)->copy(to_host ? host : t.ptr, to_host ? t.ptr : host, bytes,
                             to_host ? Backend::Copy::DeviceToHost : Backend::Copy::HostToDevice);
}
}  // namespace

void tensor_to_host(const Tensor& t, DType d, void* out, size_t count) {
  check_host_copy(t, d, count, "to_host()");
  copy_bytes(t, out, t.nbytes(), true);
}

void tensor_from_host(const Tensor& t, DType d, const void* in, size_t count) {
  check_host_copy(t, d, count, "from_host()");
  copy_bytes(t, const_cast<void*>(in), t.nbytes(), false, "from_host");
}

void tensor_written(const Tensor& t, const char* by) {
  In::backend(*t.tape)->bytes_written(t.ptr, t.nbytes());
  In::note_write(*t.tape, t.ptr, t.nbytes(), by);
}

void device_data_error(const Tensor& t, const char* dtype) {
  throw TapeError(std::string("data<") + dtype + ">(): tensor " + t.describe() + " lives in " + t.tape->device().str() +
                  " memory, which the host cannot read or write directly; copy it with t.to_host(span) / "
                  "t.to_host<T>() (or write it with t.from_host(span))");
}
}  // namespace detail

void Tensor::to_host_bytes(std::span<std::byte> out) const {
  detail::check_byte_copy(*this, out.size(), "to_host_bytes()");
  detail::copy_bytes(*this, out.data(), out.size(), true);
}

void Tensor::from_host_bytes(std::span<const std::byte> in) const {
  detail::check_byte_copy(*this, in.size(), "from_host_bytes()");
  detail::copy_bytes(*this, const_cast<std::byte*>(in.data()), in.size(), false, "from_host_bytes");
}

}  // namespace segtape
