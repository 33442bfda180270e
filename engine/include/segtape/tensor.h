// Tensor: a small value type (a handle), not a refcounted graph node.
// It points into memory owned by a Tape (segment arena, carry buffer or the
// persistent pool) and carries a generation stamp so that a handle that
// outlives its segment is caught and reported instead of read.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "segtape/error.h"

namespace segtape {

class Tape;

enum class DType : uint8_t { F32, F64, I64 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }

struct Device {
  enum class Kind : uint8_t { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {Kind::CUDA, i}; }
  bool operator==(const Device&) const = default;
  std::string str() const;
  // Whether this build has the CUDA backend (nvcc was found when it was
  // configured). A GPU is still needed to use it.
  static bool cuda_built();
};

// Rank <= 4, row-major, contiguous.
struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<int32_t, kMaxRank> dims{};
  int32_t rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  // Checks each dimension and check_elements(); errors start with `op` when given.
  static Shape of(std::span<const int64_t> d, const char* op = nullptr);
  static constexpr int64_t kMaxElements = int64_t(1) << 60;
  // Throws ShapeError (starting with `op` when given) when the dimensions'
  // product, counted without overflow, exceeds kMaxElements: every byte count
  // of such a tensor fits an int64.
  void check_elements(const char* op = nullptr) const;
  // Throws ShapeError (starting with `op`) unless rank is in [0, kMaxRank],
  // each used dimension >= 0, and check_elements() holds: a Shape whose
  // public fields were written by hand (of() and the constructor check).
  void check(const char* op) const;
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  int64_t last() const { return rank ? dims[rank - 1] : 1; }
  int64_t rows() const {  // the product of all but the last dim (not numel() / last(): the last may be 0)
    int64_t n = 1;
    for (int i = 0; i + 1 < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const;
  std::string str() const;
};

// Where a tensor's bytes live, which decides how long the handle is valid.
enum class Space : uint8_t {
  None,        // undefined handle
  Persistent,  // parameters, gradients, optimizer state: valid as long as the Tape
  Segment,     // made inside a segment: valid until that segment ends
  Carry,       // made by Segment::carry: valid through the next segment
};

struct Tensor {
  void* ptr = nullptr;    // first element
  Tape* tape = nullptr;   // owner
  void* grad = nullptr;   // persistent gradient buffer of a leaf that requires grad
  Shape shape;
  uint32_t gen = 0;       // segment index the bytes belong to (Segment / Carry)
  uint32_t step = 0;      // tape step at creation (for messages)
  int32_t node = -1;      // producing tape node; -1: no history
  DType dtype = DType::F32;
  Space space = Space::None;
  bool requires_grad = false;

  bool defined() const { return space != Space::None; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int rank() const { return shape.rank; }
  int64_t dim(int i) const { return shape[i]; }

  // Checked access: throws ExpiredTensorError for a dead handle and
  // ShapeError for the wrong element type. Never reads freed memory.
  // Host memory only: on a CUDA tensor it raises (use to_host / from_host).
  // data<float>() hands the bytes out to be written, and counts as a write
  // (a recorded op that reads them makes backward refuse, as PyTorch does
  // after an in-place change); data<const float>() is a read.
  template <class T> T* data() const;
  template <class T> std::span<T> span() const { return {data<T>(), size_t(numel())}; }
  double item() const;  // the single element of a 1-element tensor, as double (CUDA: waits for the device)
  // Copies of the values, on any device (CUDA: to_host waits for the device).
  // The span must hold numel() elements of the tensor's dtype.
  template <class T> void to_host(std::span<T> out) const;
  template <class T> std::vector<T> to_host() const;
  template <class T> void from_host(std::span<const T> in) const;  // tensor <- host values
  // The same for the raw bytes (exactly nbytes() of them, any alignment): serialisation.
  void to_host_bytes(std::span<std::byte> out) const;
  void from_host_bytes(std::span<const std::byte> in) const;
  bool on_device() const;  // the bytes are in device memory (a CUDA tape)
  void check_live(const char* what) const;
  bool is_live() const;
  // "f32[32,128] (segment 3, step 17)"
  std::string describe() const;
  // The gradient of a persistent leaf (parameter) as a persistent tensor.
  Tensor grad_tensor() const;
};

namespace detail {
// Copies between a tensor's bytes and host memory (tensor.cpp): checks
// liveness, dtype and size, and goes through the device backend on CUDA.
void tensor_to_host(const Tensor& t, DType d, void* out, size_t count);
void tensor_from_host(const Tensor& t, DType d, const void* in, size_t count);
[[noreturn]] void device_data_error(const Tensor& t, const char* dtype);
// t's bytes were written by `by`, or handed out to be written (data<T>()):
// the packed copies of the weights they belong to are repacked before their
// next product (the CPU backend's, through Backend::bytes_written), and a
// backward through an op recorded before the write that reads those bytes is
// refused (the write would change its gradient).
void tensor_written(const Tensor& t, const char* by);
}  // namespace detail

template <class T> T* Tensor::data() const {
  using V = std::remove_const_t<T>;
  check_live("data access");
  if (dtype != dtype_of<V>())
    throw ShapeError("data<" + std::string(dtype_name(dtype_of<V>())) + ">() on a tensor of dtype " + dtype_name(dtype));
  if (on_device()) detail::device_data_error(*this, dtype_name(dtype_of<V>()));
  if constexpr (!std::is_const_v<T>) detail::tensor_written(*this, "data<T>() (non-const T: a write)");
  return static_cast<T*>(ptr);
}

template <class T> void Tensor::to_host(std::span<T> out) const {
  detail::tensor_to_host(*this, dtype_of<std::remove_const_t<T>>(), out.data(), out.size());
}
template <class T> std::vector<T> Tensor::to_host() const {
  std::vector<T> v(static_cast<size_t>(numel()));
  to_host(std::span<T>(v));
  return v;
}
template <class T> void Tensor::from_host(std::span<const T> in) const {
  detail::tensor_from_host(*this, dtype_of<T>(), in.data(), in.size());
}

}  // namespace segtape
