// Which of segtape's interchangeable kernels run where it has a choice:
// process-wide switches. Every choice computes the same op (the packed
// kernels' two instruction sets even to the bit; the others to rounding), and
// the defaults are the fastest measured (docs/design.md, docs/cuda.md). Tests
// and benchmarks set them to run each path; a program may too.
//
//   kernels::Options k = kernels::options();
//   k.packed = kernels::Packed::Off;     // the GRU's weight products through OpenBLAS
//   kernels::set_options(k);
//
// For a scope (tests): k = kernels::options(); k.fused_gru = false;
// const kernels::Scope off(k); and from text (command lines, Python):
// kernels::set_option("packed", "avx2").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace segtape::kernels {

// CPU products with one row or one column (M = 1 or N = 1: every product of
// a B = 1 step but the batched weight gradients) through BLAS's GEMV or GEMM.
enum class Gemv : uint8_t {
  Auto,  // GEMV, except with OpenBLAS's AVX-512 kernel sets (SkylakeX, Cooperlake, SapphireRapids): GEMM
  On,    // GEMV
  Off,   // GEMM
};

// The GRU's float32 products with its own weights on the CPU: segtape's
// packed kernel (engine/cpu/packed.h) or OpenBLAS's GEMM.
enum class Packed : uint8_t {
  Best,  // the best the CPU has: AVX-512F, else AVX2 + FMA, else none
  Avx2,  // the AVX2 + FMA kernel, also on a CPU with AVX-512F (the same bits); none without AVX2 + FMA
  Off,   // none: OpenBLAS's GEMM for every product
};

struct Options {
  Gemv gemv = Gemv::Auto;
  Packed packed = Packed::Best;
  // CUDA: gru_sequence runs segtape's fused kernels where their plan fits the
  // device and the shape (engine/cuda/fused_gru.h). false: cuDNN's GRU, and a
  // gru_sequence with keep or under Precision::Bf16 composes gru_cell steps
  // (gru_sequence_fused() is false).
  bool fused_gru = true;
  // CUDA: with fused_gru, also the grid plan (fused_gru.h's grid_plan: W_hh
  // over the blocks of one cooperative launch) where no cluster holds the
  // shape, e.g. (32, 512) and (64, 1024). Off until it has run on a GPU
  // (docs/lab/cuda-verification.md, "Pending GPU verification"): those
  // shapes take cuDNN's GRU.
  bool fused_gru_grid = false;
};

// The switches now: the defaults until set_options() changes them.
Options options();
// Sets every switch. Each is read where its choice is made: at each CPU
// product, at each gru_sequence's forward (its backward takes the path its
// forward took). Set them between segments; a product's path inside a
// segment must not change between a run and its replay.
void set_options(const Options& o);

// One switch from text, as command lines and Python give it: name "gemv"
// (auto, on, off), "packed" (best, avx2, off), "fused_gru" or
// "fused_gru_grid" (on, off).
// Raises segtape::Error naming the accepted names or values.
void set_option(std::string_view name, std::string_view value);
// The value of one switch as set_option() takes it ("auto", "avx2", "on", ...).
std::string option_text(std::string_view name);

// Sets every switch to o for as long as it lives, then puts back the ones
// before (start o from options() to change one).
class Scope {
 public:
  explicit Scope(const Options& o) : saved_(options()) { set_options(o); }
  ~Scope() { set_options(saved_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Options saved_;
};

}  // namespace segtape::kernels
