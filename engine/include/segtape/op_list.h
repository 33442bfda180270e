// Every op segtape records: one line each, in OpKind's order. Made from it:
// the OpKind enum and op_name() (segtape/tape.h); the elementwise ops'
// declarations (segtape/ops.h), public functions, formula structs, CPU loops
// and CUDA kernels (engine/ops/elementwise.h, .cpp, cuda/kernels.cu) and
// both backends' dispatch cases for them; their Python functions and
// methods; and the list of ops the Python package exports
// (python/src/segtape_py.cpp's _ops, python/segtape/__init__.py), which the
// Python package's tests check against the bindings.
//
//   X(A, Family, Kind, name, formulas...)    A: passed through (see below)
//
// Family:
//   Leaf         seg.input()'s leaf (Segment::input): nothing is computed
//   Op           an op of its own family's file (engine/ops/<family>.cpp);
//                name is its public function
//   Unary        y = name(a), then forward y(x, s) and backward dx(g, x, y, s)
//   UnaryScalar  y = name(a, s), the same two formulas
//   Binary       o = name(a, b), b broadcast over a (a's shape, a's last
//                dimension, or one element), then forward o(a, b) and the
//                gradients da(g, a, b), db(g, a, b) (db is summed over the
//                broadcast rows)
// In a formula: x the input (a for binary ops, b the broadcast operand), y
// the output, g the output's gradient, s the op's scalar (scale's factor,
// else 0), T the element type, M the math of the device (M::exp, M::log,
// M::tanh, M::sigmoid, M::log1p). What a backward formula reads (x, y, a,
// b) is found in its text (ops::formula_reads), so a line cannot state it
// wrongly. The formulas are compiled by g++ (C++20) and nvcc (C++17).
//
// Adding a unary op: its line here, and its case in tests/op_cases.h (which
// puts it in gradcheck, LibTorch parity and the device comparison; the
// op table's own test fails without it). docs/design.md, "Adding an
// op", lists what is made from the line.
#pragma once

#define SEGTAPE_OP_LIST(X, A)                                                                               \
  X(A, Leaf, Input, input)                                                                                  \
  X(A, Op, MatMul, matmul)                                                                                  \
  X(A, Binary, Add, add, a + b, g, g)                                                                       \
  X(A, Binary, Sub, sub, a - b, g, -g)                                                                      \
  X(A, Binary, Mul, mul, a * b, g * b, g * a)                                                               \
  X(A, Binary, Div, div, a / b, g / b, -g * a / (b * b))                                                    \
  X(A, Unary, Neg, neg, -x, -g)                                                                             \
  X(A, UnaryScalar, Scale, scale, s * x, s * g)                                                             \
  X(A, Unary, Tanh, tanh, M::tanh(x), g * (T(1) - y * y))                                                   \
  X(A, Unary, Sigmoid, sigmoid, M::sigmoid(x), g * y * (T(1) - y))                                          \
  X(A, Unary, Relu, relu, x < T(0) ? T(0) : x, x > T(0) ? g : T(0))                                        \
  X(A, Unary, Exp, exp, M::exp(x), g * y)                                                                   \
  X(A, Unary, Log, log, M::log(x), g / x)                                                                   \
  X(A, Op, Sum, sum)                                                                                        \
  X(A, Op, Mean, mean)                                                                                      \
  X(A, Op, Softmax, softmax)                                                                                \
  X(A, Op, LogSoftmax, log_softmax)                                                                         \
  X(A, Op, CrossEntropy, cross_entropy)                                                                     \
  X(A, Op, MseLoss, mse_loss)                                                                               \
  X(A, Op, Concat, concat)                                                                                  \
  X(A, Op, Slice, slice)                                                                                    \
  X(A, Op, Reshape, reshape)                                                                                \
  X(A, Op, Transpose, transpose)                                                                            \
  X(A, Op, Embedding, embedding)                                                                            \
  X(A, Op, GruCell, gru_cell)                                                                               \
  X(A, Op, GruSequence, gru_sequence)                                                                       \
  /* log(1 + e^x), PyTorch's softplus (beta 1, threshold 20) */                                             \
  X(A, Unary, Softplus, softplus, x > T(20) ? x : M::log1p(M::exp(x)), x > T(20) ? g : g * M::sigmoid(x)) \
  X(A, Op, LstmCell, lstm_cell)

// Views of the list: each calls the user's X for the ops it selects (X is
// passed through the list as A).
//   SEGTAPE_OPS(X)              X(Kind), every op
//   SEGTAPE_NAMED_OPS(X)        X(Family, Kind, name), every op
//   SEGTAPE_UNARY_PLAIN_OPS(X)  X(Kind, name, forward, backward), Unary
//   SEGTAPE_UNARY_SCALAR_OPS(X) the same, UnaryScalar
//   SEGTAPE_UNARY_OPS(X)        the same, both
//   SEGTAPE_BINARY_OPS(X)       X(Kind, name, forward, da, db), Binary
#define SEGTAPE_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_KIND_, X)
#define SEGTAPE_NAMED_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_NAMED_, X)
#define SEGTAPE_UNARY_PLAIN_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_UNARY_PLAIN_, X)
#define SEGTAPE_UNARY_SCALAR_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_UNARY_SCALAR_, X)
#define SEGTAPE_UNARY_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_UNARY_, X)
#define SEGTAPE_BINARY_OPS(X) SEGTAPE_OP_LIST(SEGTAPE_OP_BINARY_, X)

#define SEGTAPE_OP_KIND_(X, Family, Kind, ...) X(Kind)
#define SEGTAPE_OP_NAMED_(X, Family, Kind, name, ...) X(Family, Kind, name)
#define SEGTAPE_OP_UNARY_PLAIN_(X, Family, ...) SEGTAPE_OP_UNARY_PLAIN_##Family(X, __VA_ARGS__)
#define SEGTAPE_OP_UNARY_SCALAR_(X, Family, ...) SEGTAPE_OP_UNARY_SCALAR_##Family(X, __VA_ARGS__)
#define SEGTAPE_OP_UNARY_(X, Family, ...) SEGTAPE_OP_UNARY_##Family(X, __VA_ARGS__)
#define SEGTAPE_OP_BINARY_(X, Family, ...) SEGTAPE_OP_BINARY_##Family(X, __VA_ARGS__)
// (each family selected or dropped by each view)
#define SEGTAPE_OP_UNARY_PLAIN_Unary(X, ...) X(__VA_ARGS__)
#define SEGTAPE_OP_UNARY_PLAIN_UnaryScalar(X, ...)
#define SEGTAPE_OP_UNARY_PLAIN_Binary(X, ...)
#define SEGTAPE_OP_UNARY_PLAIN_Op(X, ...)
#define SEGTAPE_OP_UNARY_PLAIN_Leaf(X, ...)
#define SEGTAPE_OP_UNARY_SCALAR_Unary(X, ...)
#define SEGTAPE_OP_UNARY_SCALAR_UnaryScalar(X, ...) X(__VA_ARGS__)
#define SEGTAPE_OP_UNARY_SCALAR_Binary(X, ...)
#define SEGTAPE_OP_UNARY_SCALAR_Op(X, ...)
#define SEGTAPE_OP_UNARY_SCALAR_Leaf(X, ...)
#define SEGTAPE_OP_UNARY_Unary(X, ...) X(__VA_ARGS__)
#define SEGTAPE_OP_UNARY_UnaryScalar(X, ...) X(__VA_ARGS__)
#define SEGTAPE_OP_UNARY_Binary(X, ...)
#define SEGTAPE_OP_UNARY_Op(X, ...)
#define SEGTAPE_OP_UNARY_Leaf(X, ...)
#define SEGTAPE_OP_BINARY_Unary(X, ...)
#define SEGTAPE_OP_BINARY_UnaryScalar(X, ...)
#define SEGTAPE_OP_BINARY_Binary(X, ...) X(__VA_ARGS__)
#define SEGTAPE_OP_BINARY_Op(X, ...)
#define SEGTAPE_OP_BINARY_Leaf(X, ...)
