// Engine-internal: the elementwise ops, each written once. Their lines in
// segtape/op_list.h hold each one's forward and backward; here they become
// formula structs (ops::Tanh, ...), over which the CPU loops
// (ops/elementwise.cpp, with the vectorized cpu::Math) and the CUDA kernels
// (cuda/kernels.cu, with cuda::Math) are generic, so a line added there adds
// the op on every device.
//
// Compiled by g++ (C++20) and nvcc (C++17): no C++20 here.
#pragma once
#include <cstdint>

#include "hd.h"
#include "segtape/op_list.h"

namespace segtape::ops {

// Whether the one-letter name c is a token of the formula text f: what a
// backward formula reads, found in the formula itself (x or y of a unary op,
// a or b of a binary one), so a new op's line cannot state it wrongly. The
// tape refuses a backward through an op whose operand it reads was written
// after the op was recorded (Node::reads).
constexpr bool formula_reads(const char* f, char c) {
  auto ident = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
  };
  for (int i = 0; f[i]; ++i)
    if (f[i] == c && (i == 0 || !ident(f[i - 1])) && !ident(f[i + 1])) return true;
  return false;
}

#define SEGTAPE_UNARY_STRUCT(Kind, name, fwd, bwd)                                                        \
  struct Kind {                                                                                            \
    template <class M, class T> SEGTAPE_HD static T forward(T x, T s) { (void)s; return fwd; }             \
    template <class M, class T> SEGTAPE_HD static T backward(T g, T x, T y, T s) { (void)x, (void)y, (void)s; return bwd; } \
    static constexpr bool reads_x = formula_reads(#bwd, 'x'), reads_y = formula_reads(#bwd, 'y');          \
  };
SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_STRUCT)
#undef SEGTAPE_UNARY_STRUCT

#define SEGTAPE_BINARY_STRUCT(Kind, name, fwd, da, db)                                               \
  struct Kind {                                                                                       \
    template <class T> SEGTAPE_HD static T forward(T a, T b) { return fwd; }                          \
    template <class T> SEGTAPE_HD static T grad_a(T g, T a, T b) { (void)a, (void)b; return da; }     \
    template <class T> SEGTAPE_HD static T grad_b(T g, T a, T b) { (void)a, (void)b; return db; }     \
    /* what each gradient reads: bit 0 a, bit 1 b */                                                  \
    static constexpr int da_reads = (formula_reads(#da, 'a') ? 1 : 0) | (formula_reads(#da, 'b') ? 2 : 0); \
    static constexpr int db_reads = (formula_reads(#db, 'a') ? 1 : 0) | (formula_reads(#db, 'b') ? 2 : 0); \
  };
SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_STRUCT)
#undef SEGTAPE_BINARY_STRUCT

}  // namespace segtape::ops
