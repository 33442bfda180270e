// segtape's own CUDA kernels, as host-callable launchers (kernels.cu,
// gru_kernels.cu). Each is explicitly instantiated for float and double.
// Row-major, contiguous tensors; every pointer is device memory unless said.
// Every launcher checks its launch (check_launch) and returns at once: the
// work runs on `s`, the tape's stream.
//
// Reductions are deterministic (a fixed assignment of elements to threads
// and a fixed tree): the same inputs give the same bits, eager or replayed.
// The one atomicAdd is embedding_backward's scatter of more than 256
// indices (repeated indices); up to 256 it sums in the CPU's order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fused_gru.h"
#include "ops/elementwise.h"
#include "update_math.h"

namespace segtape::cuda {

// What a kernel found wrong with its input (an index out of range). The
// first writer wins; the host reads it after the next synchronisation.
struct ErrorRecord {
  int32_t code = 0;  // ErrorCode
  int32_t pad = 0;
  int64_t value = 0;     // the offending index / target
  int64_t position = 0;  // where in the index tensor
  int64_t limit = 0;     // rows / classes
};
enum ErrorCode : int32_t { kNoError = 0, kEmbeddingIndex = 1, kTargetIndex = 2 };
// rec: device memory. flag: mapped pinned host memory set to 1 by the writer,
// so the host can test for an error after a sync without a copy.
struct ErrorSink {
  ErrorRecord* rec = nullptr;
  int32_t* flag = nullptr;
};

// Scratch for a reduction's partial sums (device memory, `capacity` elements).
template <class T>
struct Partials {
  T* ptr = nullptr;
  int64_t capacity = 0;
};


template <class T> void fill(cudaStream_t s, T* p, int64_t n, T value);
void fill_i32(cudaStream_t s, int32_t* p, int64_t n, int32_t value);
template <class T> void accumulate(cudaStream_t s, T* dst, const T* src, int64_t n);  // dst += src

// The elementwise ops, Op one of the structs of ops/elementwise.h (its
// formulas, with cuda::Math); instantiated for every op of its list.
// o[i] = Op(a[i], b[i % bn]): b has a's shape, a's last dim, or one element.
template <class Op, class T> void binary_forward(cudaStream_t s, const T* a, const T* b, T* o, int64_t n, int64_t bn);
// da[i] += Op::grad_a(g[i], a[i], b[i % bn])
template <class Op, class T> void binary_backward_a(cudaStream_t s, const T* g, const T* a, const T* b, T* da, int64_t n, int64_t bn);
// db[c] += sum over the broadcast rows of Op::grad_b
template <class Op, class T>
void binary_backward_b(cudaStream_t s, const T* g, const T* a, const T* b, T* db, int64_t n, int64_t bn, Partials<T> p);

template <class Op, class T> void unary_forward(cudaStream_t s, const T* x, T* y, int64_t n, T scale);
template <class Op, class T> void unary_backward(cudaStream_t s, const T* g, const T* x, const T* y, T* dx, int64_t n, T scale);

// y[o, i] = sum_j x[o, j, i] / divisor   (x viewed as [outer, n, inner])
template <class T>
void reduce_axis(cudaStream_t s, const T* x, T* y, int64_t outer, int64_t n, int64_t inner, T divisor, Partials<T> p);
// dx[o, j, i] += g[o, i] * scale
template <class T> void reduce_axis_backward(cudaStream_t s, const T* g, T* dx, int64_t outer, int64_t n, int64_t inner, T scale);
// d[c] += sum_r x[r, c] over a [rows, cols] matrix (bias gradients)
template <class T> void column_sums(cudaStream_t s, const T* x, T* d, int64_t rows, int64_t cols, Partials<T> p);

// Along rows of [rows, cols]; log selects log-softmax.
template <class T> void softmax_forward(cudaStream_t s, const T* x, T* y, int64_t rows, int64_t cols, bool log);
template <class T> void softmax_backward(cudaStream_t s, const T* g, const T* y, T* dx, int64_t rows, int64_t cols, bool log);

// Fused log-softmax + NLL. saved [B + 1]: per-row log-sum-exp, then the count
// of counted rows. row_loss [2B]: scratch. out: the scalar loss.
template <class T>
void cross_entropy_forward(cudaStream_t s, const T* logits, const int64_t* targets, int64_t B, int64_t C, int64_t ignore,
                           bool mean, T* saved, T* row_loss, T* out, ErrorSink err);
template <class T>
void cross_entropy_backward(cudaStream_t s, const T* g, const T* logits, const int64_t* targets, const T* saved, int64_t B,
                            int64_t C, int64_t ignore, bool mean, T* dlogits);

template <class T> void mse_forward(cudaStream_t s, const T* a, const T* b, int64_t n, bool mean, T* out, Partials<T> p);
template <class T> void mse_backward(cudaStream_t s, const T* g, const T* a, const T* b, int64_t n, bool mean, T* da, T* db);

// dst[r * dst_pitch + c] += src[r * src_pitch + c] for r < rows, c < width (elements)
template <class T>
void add_strided(cudaStream_t s, T* dst, int64_t dst_pitch, const T* src, int64_t src_pitch, int64_t rows, int64_t width);
// y [C, R] (+)= x [R, C] transposed
template <class T> void transpose(cudaStream_t s, const T* x, T* y, int64_t R, int64_t C, bool accumulate);

// out [count, D] = w [N, D] rows at idx; a bad index gives a zero row and an ErrorRecord.
template <class T>
void embedding_forward(cudaStream_t s, const T* w, const int64_t* idx, T* out, int64_t count, int64_t N, int64_t D, ErrorSink err);
template <class T>
void embedding_backward(cudaStream_t s, const T* g, const int64_t* idx, T* dw, int64_t count, int64_t N, int64_t D);

// *index = smallest i with x[i] not finite (left at its initial all-ones when none)
template <class T> void first_nonfinite(cudaStream_t s, const T* x, int64_t n, unsigned long long* index);

// ---- parameter updates (segtape/update.h): update_math.h's arithmetic per element.
template <class T> void sgd_update(cudaStream_t s, int64_t n, T* p, const T* g, T* buf, detail::SgdScalars<T> sc);
template <class T> void adam_update(cudaStream_t s, int64_t n, T* p, const T* g, T* m, T* v, detail::AdamScalars<T> sc);
// The capturable form: the scalars are computed on the device from the step count *t.
struct AdamConsts {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
};
template <class T>
void adam_update_counted(cudaStream_t s, int64_t n, T* p, const T* g, T* m, T* v, AdamConsts c, const double* t);
template <class T> void add_value(cudaStream_t s, T* x, int64_t n, T value);  // x += value
// *acc = (first ? 0 : *acc) + *v (one thread)
void add_scalar_from(cudaStream_t s, double* acc, const double* v, bool first);
// x *= T(c), c = detail::clip_coefficient(*sum_sq, max_norm), where !(c >= 1)
template <class T> void clip_scale(cudaStream_t s, T* x, int64_t n, const double* sum_sq, double max_norm);
// *out = sum of x[i]^2, accumulated in double (deterministic, like every reduction here)
template <class T> void sum_squares(cudaStream_t s, const T* x, int64_t n, double* out, Partials<double> p);

// ---- the GRU cell's elementwise parts (gru_kernels.cu); the GEMMs around them are cuBLAS.
// gi, gh [B, 3H] = x W_ih^T, h W_hh^T (no biases). S [B, 4H] = r, z, n, W_hn h + b_hn.
// y [B, H] = (1 - z) n + z h, or nullptr (gates only: backward's recompute).
template <class T>
void gru_gates_forward(cudaStream_t s, int64_t B, int64_t H, const T* gi, const T* gh, const T* b_ih, const T* b_hh,
                       const T* h, T* S, T* y);
// g [B, H] the output gradient -> dgi, dgh [B, 3H] (the pre-activation gradients
// of the two GEMMs, biases included) and dh [B, H] += g z (nullable).
template <class T>
void gru_gates_backward(cudaStream_t s, int64_t B, int64_t H, const T* g, const T* h, const T* S, T* dgi, T* dgh, T* dh);

// ---- Precision::Bf16 (bf16_kernels.cu): the rows x cols matrix at src
// (leading dimension ld) rounded to bfloat16 (to nearest, ties to even),
// packed (leading dimension cols) into dst (__nv_bfloat16); and a product P
// [M, N] (leading dimension ldp) rounded to bfloat16 into C: alpha bf16(P),
// plus beta C unless in_place (P is C's own memory there, beta 0).
void round_to_bf16(cudaStream_t s, int64_t rows, int64_t cols, const float* src, int64_t ld, void* dst);
void finish_bf16(cudaStream_t s, int64_t M, int64_t N, float alpha, const float* P, int64_t ldp, float beta, float* C, int64_t ldc,
                 bool in_place);

// ---- the LSTM cell's elementwise parts (lstm_kernels.cu); the GEMMs around them are cuBLAS.
// P [B, 4H] = x W_ih^T + h W_hh^T (no biases), c [B, H] the state's c. S [B, 4H] = i, f, g, o;
// out [2, B, H] = h', c'.
template <class T>
void lstm_gates_forward(cudaStream_t s, int64_t B, int64_t H, const T* P, const T* b_ih, const T* b_hh, const T* c, T* S, T* out);
// g [2, B, H] the output gradient (of h', c'), cy [B, H] = c' -> dP [B, 4H] (the
// pre-activation gradient, biases included) and dc [B, H] += dc' f (nullable).
template <class T>
void lstm_gates_backward(cudaStream_t s, int64_t B, int64_t H, const T* g, const T* c, const T* cy, const T* S, T* dP, T* dc);

// ---- the fused GRU sequence (fused_gru.cu, fused_gru.h): one launch of p.G clusters per pass.
// forward: y (and saved, when non-null) from gi, W_hh, the biases and h0.
// backward: dgi, dgh [T, B, 3H] and dh0 (written) from gout, saved, y and h0.
template <class T> void fused_gru_forward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a);
template <class T> void fused_gru_backward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a);
// Why plan p cannot run on the current device although it fits its limits
// (no sm_90 code in this build; the cluster cannot be resident, e.g. on a MIG
// slice); empty when it can. Elements of `elem` bytes.
std::string fused_gru_unusable(const fused::Plan& p, size_t elem);
// How many of plan p's clusters the current device holds at once, both
// kernels (cudaOccupancyMaxActiveClusters; 0 when it cannot say).
int fused_gru_resident_clusters(const fused::Plan& p, size_t elem);

}  // namespace segtape::cuda
