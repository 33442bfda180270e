// segtape's own CUDA kernels (declared in kernels.h): elementwise ops (the
// formulas of segtape/op_list.h as ops/elementwise.h makes them, shared with the CPU), deterministic
// reductions, softmax / cross-entropy rows, copies, embedding. The CPU kernels
// of the other families are in engine/ops/<family>.cpp; the formulas here
// follow them term by term.
#include <cfloat>
#include <climits>

#include "device_math.cuh"
#include "kernels.h"

namespace segtape::cuda {
namespace {

__device__ void report(ErrorSink e, int32_t code, int64_t value, int64_t position, int64_t limit) {
  if (atomicCAS(&e.rec->code, 0, code) == 0) {  // the first error wins
    e.rec->value = value;
    e.rec->position = position;
    e.rec->limit = limit;
    *reinterpret_cast<volatile int32_t*>(e.flag) = 1;
  }
}

// ---- the reduction: out[o, i] = sum_j value(o, j, i) / divisor (+ out when
// accumulating), x viewed as [outer, n, inner].
//
// A block covers (bx columns i) x (by lanes over j); each lane sums its j's in
// order, then a fixed tree over the lanes. Long reductions with few outputs
// are split into `chunks` along j, written to partial sums, and reduced again:
// the same assignment every time, so the bits never change.
template <class T, class F>
__global__ void reduce_kernel(int64_t outer, int64_t n, int64_t inner, int64_t chunk, F value, T* out, T divisor,
                              bool accumulate, T* partial) {
  __shared__ T lanes[kThreads];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col_blocks = (inner + bx - 1) / bx;
  const int64_t o = blockIdx.x / col_blocks;
  const int64_t i = (blockIdx.x % col_blocks) * bx + tx;
  const int64_t j0 = int64_t(blockIdx.y) * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
  T acc = 0;
  if (i < inner)
    for (int64_t j = j0 + ty; j < j1; j += by) acc += value(o, j, i);
  lanes[ty * bx + tx] = acc;
  __syncthreads();
  for (int step = by / 2; step > 0; step /= 2) {
    if (ty < step) lanes[ty * bx + tx] += lanes[(ty + step) * bx + tx];
    __syncthreads();
  }
  if (ty != 0 || i >= inner) return;
  const T sum = lanes[tx];
  if (gridDim.y > 1) {
    partial[(int64_t(blockIdx.y) * outer + o) * inner + i] = sum;
  } else {
    const T v = sum / divisor;
    out[o * inner + i] = accumulate ? out[o * inner + i] + v : v;
  }
}

template <class T>
struct PartialValue {
  const T* p;
  int64_t width;
  __device__ T operator()(int64_t, int64_t j, int64_t i) const { return p[j * width + i]; }
};

template <class T, class F>
void launch_reduce(cudaStream_t s, int64_t outer, int64_t n, int64_t inner, F value, T* out, T divisor, bool accumulate,
                   Partials<T> partials, const char* name) {
  if (outer <= 0 || inner <= 0) return;
  if (n == 0) {  // an empty sum is 0
    if (!accumulate) each(s, outer * inner, [=] __device__(int64_t k) { out[k] = T(0) / divisor; }, name);
    return;
  }
  const int bx = inner >= 32 ? 32 : 1, by = kThreads / bx;
  const int64_t blocks = outer * ((inner + bx - 1) / bx);
  // Split j only when the outputs alone cannot fill the GPU and j is long.
  int64_t chunks = 1;
  if (blocks < 256 && n > int64_t(by) * 64) {
    chunks = (n + int64_t(by) * 64 - 1) / (int64_t(by) * 64);
    if (chunks > 1024) chunks = 1024;
    if (partials.ptr == nullptr || chunks * outer * inner > partials.capacity) chunks = 1;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  if (blocks > INT_MAX) throw Error(std::string(name) + ": tensor too large for one reduction launch");
  reduce_kernel<T><<<dim3(unsigned(blocks), unsigned(chunks)), dim3(bx, by), 0, s>>>(outer, n, inner, chunk, value, out,
                                                                                      divisor, accumulate, partials.ptr);
  check_launch(name);
  if (chunks == 1) return;
  // The partials [chunks, outer * inner] reduced over the chunks, in order.
  const int64_t width = outer * inner;
  const int bx2 = width >= 32 ? 32 : 1, by2 = kThreads / bx2;
  const int64_t blocks2 = (width + bx2 - 1) / bx2;
  reduce_kernel<T><<<dim3(unsigned(blocks2), 1), dim3(bx2, by2), 0, s>>>(1, chunks, width, chunks, PartialValue<T>{partials.ptr, width},
                                                                          out, divisor, accumulate, nullptr);
  check_launch(name);
}

// ---- transpose through a shared tile (coalesced reads and writes)
constexpr int kTile = 32;
template <class T>
// Row tiles are strided over grid y (at most 65535 blocks there), so any
// number of rows fits one launch; the loop bound depends on the block only,
// so every thread of a block reaches the same barriers.
__global__ void transpose_kernel(const T* x, T* y, int64_t R, int64_t C, bool accumulate) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  for (int64_t r0 = int64_t(blockIdx.y) * kTile; r0 < R; r0 += int64_t(gridDim.y) * kTile) {
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < R && c < C) tile[k][threadIdx.x] = x[r * C + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const int64_t c = c0 + k, r = r0 + threadIdx.x;  // y[c, r]
      if (r < R && c < C) {
        const T v = tile[threadIdx.x][k];
        y[c * R + r] = accumulate ? y[c * R + r] + v : v;
      }
    }
    __syncthreads();  // the tile is refilled by the next row tile
  }
}

// ---- softmax rows: one block per row

// A row's maximum m and sum of exp(x - m), known to every thread of the
// block (softmax, log-softmax and cross-entropy rows).
template <class T>
struct RowExp {
  T m, sum;
};
template <class T>
__device__ RowExp<T> row_exp(const T* xr, int64_t cols) {
  T m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = dmax<T>(m, xr[c]);
  m = block_reduce(m, [](T a, T b) { return dmax<T>(a, b); });
  T sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += dexp<T>(xr[c] - m);
  sum = block_reduce(sum, [](T a, T b) { return a + b; });
  return {m, sum};
}

template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t cols, bool log) {
  const T* xr = x + int64_t(blockIdx.x) * cols;
  T* yr = y + int64_t(blockIdx.x) * cols;
  const auto [m, sum] = row_exp(xr, cols);
  if (log) {
    const T lse = m + dlog<T>(sum);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = xr[c] - lse;
  } else {
    const T inv = T(1) / sum;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = dexp<T>(xr[c] - m) * inv;
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* g, const T* y, T* dx, int64_t cols, bool log) {
  const int64_t off = int64_t(blockIdx.x) * cols;
  const T *gr = g + off, *yr = y + off;
  T* dr = dx + off;
  T s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += log ? gr[c] : gr[c] * yr[c];
  s = block_reduce(s, [](T a, T b) { return a + b; });
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dr[c] += log ? gr[c] - dexp<T>(yr[c]) * s : yr[c] * (gr[c] - s);
}

// ---- cross-entropy: per row log-sum-exp and loss, then one block sums them.
template <class T>
__global__ void cross_entropy_rows(const T* x, const int64_t* targets, int64_t C, int64_t ignore, T* lse_out, T* row_loss,
                                   T* row_count, ErrorSink err) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * C;
  const auto [m, sum] = row_exp(xr, C);
  if (threadIdx.x != 0) return;
  const T lse = m + dlog<T>(sum);
  lse_out[i] = lse;
  const int64_t y = targets[i];
  const bool counted = y != ignore && y >= 0 && y < C;
  if (y != ignore && !counted) report(err, kTargetIndex, y, i, C);
  row_loss[i] = counted ? lse - xr[y] : T(0);
  row_count[i] = counted ? T(1) : T(0);
}

template <class T>
__global__ void cross_entropy_total(const T* row_loss, const T* row_count, int64_t B, bool mean, T* count_out, T* out) {
  T total = 0, count = 0;
  for (int64_t i = threadIdx.x; i < B; i += blockDim.x) total += row_loss[i], count += row_count[i];
  total = block_reduce(total, [](T a, T b) { return a + b; });
  count = block_reduce(count, [](T a, T b) { return a + b; });
  if (threadIdx.x == 0) {
    *count_out = count;
    *out = mean ? total / count : total;
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <class T> void fill(cudaStream_t s, T* p, int64_t n, T value) {
  each(s, n, [=] __device__(int64_t i) { p[i] = value; }, "fill");
}
void fill_i32(cudaStream_t s, int32_t* p, int64_t n, int32_t value) {
  each(s, n, [=] __device__(int64_t i) { p[i] = value; }, "fill_i32");
}
template <class T> void accumulate(cudaStream_t s, T* dst, const T* src, int64_t n) {
  each(s, n, [=] __device__(int64_t i) { dst[i] += src[i]; }, "accumulate");
}

template <class Op, class T> void binary_forward(cudaStream_t s, const T* a, const T* b, T* o, int64_t n, int64_t bn) {
  each(s, n, [=] __device__(int64_t i) { o[i] = Op::forward(a[i], b[i % bn]); }, "binary_forward");
}

template <class Op, class T>
void binary_backward_a(cudaStream_t s, const T* g, const T* a, const T* b, T* da, int64_t n, int64_t bn) {
  each(s, n, [=] __device__(int64_t i) { da[i] += Op::grad_a(g[i], a[i], b[i % bn]); }, "binary_backward_a");
}

template <class Op, class T>
void binary_backward_b(cudaStream_t s, const T* g, const T* a, const T* b, T* db, int64_t n, int64_t bn, Partials<T> p) {
  // db[c] += sum_r term(r * bn + c): the rows of the broadcast.
  auto term = [=] __device__(int64_t, int64_t r, int64_t c) -> T {
    const int64_t i = r * bn + c;
    return Op::grad_b(g[i], a[i], b[c]);
  };
  if (n == bn) {  // same shape: elementwise
    each(s, n, [=] __device__(int64_t i) { db[i] += term(0, 0, i); }, "binary_backward_b");
    return;
  }
  launch_reduce<T>(s, 1, n / bn, bn, term, db, T(1), true, p, "binary_backward_b");
}

template <class Op, class T> void unary_forward(cudaStream_t s, const T* x, T* y, int64_t n, T scale) {
  each(s, n, [=] __device__(int64_t i) { y[i] = Op::template forward<Math>(x[i], scale); }, "unary_forward");
}

template <class Op, class T> void unary_backward(cudaStream_t s, const T* g, const T* x, const T* y, T* dx, int64_t n, T scale) {
  each(s, n, [=] __device__(int64_t i) { dx[i] += Op::template backward<Math>(g[i], x[i], y[i], scale); }, "unary_backward");
}

template <class T>
void reduce_axis(cudaStream_t s, const T* x, T* y, int64_t outer, int64_t n, int64_t inner, T divisor, Partials<T> p) {
  auto value = [=] __device__(int64_t o, int64_t j, int64_t i) { return x[(o * n + j) * inner + i]; };
  launch_reduce<T>(s, outer, n, inner, value, y, divisor, false, p, "reduce_axis");
}

template <class T> void reduce_axis_backward(cudaStream_t s, const T* g, T* dx, int64_t outer, int64_t n, int64_t inner, T scale) {
  each(s, outer * n * inner, [=] __device__(int64_t k) {
    const int64_t i = k % inner, o = k / (n * inner);
    dx[k] += scale * g[o * inner + i];
  }, "reduce_axis_backward");
}

template <class T> void column_sums(cudaStream_t s, const T* x, T* d, int64_t rows, int64_t cols, Partials<T> p) {
  auto value = [=] __device__(int64_t, int64_t r, int64_t c) { return x[r * cols + c]; };
  launch_reduce<T>(s, 1, rows, cols, value, d, T(1), true, p, "column_sums");
}

template <class T> void softmax_forward(cudaStream_t s, const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  if (rows <= 0 || cols <= 0) return;
  if (rows > INT_MAX) throw Error("softmax: too many rows for one launch");
  softmax_kernel<T><<<unsigned(rows), row_threads(cols), 0, s>>>(x, y, cols, log);
  check_launch("softmax_forward");
}

template <class T> void softmax_backward(cudaStream_t s, const T* g, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  if (rows <= 0 || cols <= 0) return;
  if (rows > INT_MAX) throw Error("softmax: too many rows for one launch");
  softmax_backward_kernel<T><<<unsigned(rows), row_threads(cols), 0, s>>>(g, y, dx, cols, log);
  check_launch("softmax_backward");
}

template <class T>
void cross_entropy_forward(cudaStream_t s, const T* logits, const int64_t* targets, int64_t B, int64_t C, int64_t ignore,
                           bool mean, T* saved, T* row_loss, T* out, ErrorSink err) {
  if (B > INT_MAX) throw Error("cross_entropy: too many rows for one launch");
  if (B > 0) {
    cross_entropy_rows<T><<<unsigned(B), row_threads(C), 0, s>>>(logits, targets, C, ignore, saved, row_loss, row_loss + B, err);
    check_launch("cross_entropy_rows");
  }
  cross_entropy_total<T><<<1, kThreads, 0, s>>>(row_loss, row_loss + B, B, mean, saved + B, out);
  check_launch("cross_entropy_total");
}

template <class T>
void cross_entropy_backward(cudaStream_t s, const T* g, const T* logits, const int64_t* targets, const T* saved, int64_t B,
                            int64_t C, int64_t ignore, bool mean, T* dlogits) {
  each(s, B * C, [=] __device__(int64_t k) {
    const int64_t i = k / C, c = k % C, y = targets[i];
    if (y == ignore || y < 0 || y >= C) return;  // ignored (or reported in forward)
    const T sc = mean ? g[0] / saved[B] : g[0];
    dlogits[k] += sc * dexp<T>(logits[k] - saved[i]) - (c == y ? sc : T(0));
  }, "cross_entropy_backward");
}

template <class T> void mse_forward(cudaStream_t s, const T* a, const T* b, int64_t n, bool mean, T* out, Partials<T> p) {
  auto value = [=] __device__(int64_t, int64_t j, int64_t) { return (a[j] - b[j]) * (a[j] - b[j]); };
  launch_reduce<T>(s, 1, n, 1, value, out, mean ? T(n) : T(1), false, p, "mse_forward");
}

template <class T> void mse_backward(cudaStream_t s, const T* g, const T* a, const T* b, int64_t n, bool mean, T* da, T* db) {
  each(s, n, [=] __device__(int64_t i) {
    const T sc = mean ? T(2) * g[0] / T(n) : T(2) * g[0];
    const T d = sc * (a[i] - b[i]);
    if (da) da[i] += d;
    if (db) db[i] -= d;
  }, "mse_backward");
}

template <class T>
void add_strided(cudaStream_t s, T* dst, int64_t dst_pitch, const T* src, int64_t src_pitch, int64_t rows, int64_t width) {
  if (width <= 0) return;
  each(s, rows * width, [=] __device__(int64_t k) {
    const int64_t r = k / width, c = k % width;
    dst[r * dst_pitch + c] += src[r * src_pitch + c];
  }, "add_strided");
}

template <class T> void transpose(cudaStream_t s, const T* x, T* y, int64_t R, int64_t C, bool accumulate) {
  if (R <= 0 || C <= 0) return;
  const int64_t gx = (C + kTile - 1) / kTile, gy = (R + kTile - 1) / kTile;
  if (gx > INT_MAX) throw Error("transpose: matrix too wide for one launch (" + std::to_string(C) + " columns)");
  transpose_kernel<T><<<dim3(unsigned(gx), unsigned(gy < 65535 ? gy : 65535)), dim3(kTile, 8), 0, s>>>(x, y, R, C, accumulate);
  check_launch("transpose");
}

template <class T> void sgd_update(cudaStream_t s, int64_t n, T* p, const T* g, T* buf, detail::SgdScalars<T> sc) {
  each(s, n, [=] __device__(int64_t i) { detail::sgd_element(p[i], g[i], buf ? buf + i : nullptr, sc); }, "sgd_update");
}

template <class T> void adam_update(cudaStream_t s, int64_t n, T* p, const T* g, T* m, T* v, detail::AdamScalars<T> sc) {
  each(s, n, [=] __device__(int64_t i) { detail::adam_element(p[i], g[i], m[i], v[i], sc); }, "adam_update");
}

template <class T>
void adam_update_counted(cudaStream_t s, int64_t n, T* p, const T* g, T* m, T* v, AdamConsts c, const double* t) {
  each(s, n, [=] __device__(int64_t i) {
    const auto sc = detail::adam_scalars<T>(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.decoupled, *t);
    detail::adam_element(p[i], g[i], m[i], v[i], sc);
  }, "adam_update_counted");
}

template <class T> void add_value(cudaStream_t s, T* x, int64_t n, T value) {
  each(s, n, [=] __device__(int64_t i) { x[i] = x[i] + value; }, "add_value");
}

void add_scalar_from(cudaStream_t s, double* acc, const double* v, bool first) {
  each(s, 1, [=] __device__(int64_t) { *acc = (first ? 0.0 : *acc) + *v; }, "add_scalar_from");
}

template <class T> void clip_scale(cudaStream_t s, T* x, int64_t n, const double* sum_sq, double max_norm) {
  each(s, n, [=] __device__(int64_t i) {
    const double c = detail::clip_coefficient(*sum_sq, max_norm);
    if (!(c >= 1.0)) x[i] = x[i] * T(c);
  }, "clip_scale");
}

template <class T> void sum_squares(cudaStream_t s, const T* x, int64_t n, double* out, Partials<double> p) {
  auto value = [=] __device__(int64_t, int64_t j, int64_t) { const double v = double(x[j]); return v * v; };
  launch_reduce<double>(s, 1, n, 1, value, out, 1.0, false, p, "sum_squares");
}

template <class T>
void embedding_forward(cudaStream_t s, const T* w, const int64_t* idx, T* out, int64_t count, int64_t N, int64_t D, ErrorSink err) {
  each(s, count * D, [=] __device__(int64_t k) {
    const int64_t i = k / D, j = k % D, v = idx[i];
    if (v < 0 || v >= N) {
      if (j == 0) report(err, kEmbeddingIndex, v, i, N);
      out[k] = T(0);
    } else {
      out[k] = w[v * D + j];
    }
  }, "embedding_forward");
}

// Up to kEmbeddingOrdered indices, deterministic and the CPU's order: the
// first occurrence of each index sums its rows' gradients in index order
// onto dW's row (count^2 D comparisons); beyond, atomicAdd (repeated indices
// accumulate in whatever order the hardware takes them: run to run, results
// may differ in the last bits).
constexpr int64_t kEmbeddingOrdered = 256;

template <class T>
void embedding_backward(cudaStream_t s, const T* g, const int64_t* idx, T* dw, int64_t count, int64_t N, int64_t D) {
  if (count <= kEmbeddingOrdered) {
    each(s, count * D, [=] __device__(int64_t k) {
      const int64_t i = k / D, j = k % D, v = idx[i];
      if (v < 0 || v >= N) return;
      for (int64_t e = 0; e < i; ++e)
        if (idx[e] == v) return;  // an earlier occurrence sums this one
      T acc = dw[v * D + j] + g[k];
      for (int64_t e = i + 1; e < count; ++e)
        if (idx[e] == v) acc = acc + g[e * D + j];
      dw[v * D + j] = acc;
    }, "embedding_backward");
    return;
  }
  each(s, count * D, [=] __device__(int64_t k) {
    const int64_t i = k / D, j = k % D, v = idx[i];
    if (v >= 0 && v < N) atomicAdd(dw + v * D + j, g[k]);  // repeated indices accumulate
  }, "embedding_backward");
}

template <class T> void first_nonfinite(cudaStream_t s, const T* x, int64_t n, unsigned long long* index) {
  each(s, n, [=] __device__(int64_t i) {
    if (!isfinite(x[i])) atomicMin(index, (unsigned long long)i);
  }, "first_nonfinite");
}

#define SEGTAPE_INSTANTIATE(T)                                                                                       \
  template void fill<T>(cudaStream_t, T*, int64_t, T);                                                              \
  template void accumulate<T>(cudaStream_t, T*, const T*, int64_t);                                                 \
  template void reduce_axis<T>(cudaStream_t, const T*, T*, int64_t, int64_t, int64_t, T, Partials<T>);              \
  template void reduce_axis_backward<T>(cudaStream_t, const T*, T*, int64_t, int64_t, int64_t, T);                  \
  template void column_sums<T>(cudaStream_t, const T*, T*, int64_t, int64_t, Partials<T>);                          \
  template void softmax_forward<T>(cudaStream_t, const T*, T*, int64_t, int64_t, bool);                             \
  template void softmax_backward<T>(cudaStream_t, const T*, const T*, T*, int64_t, int64_t, bool);                  \
  template void cross_entropy_forward<T>(cudaStream_t, const T*, const int64_t*, int64_t, int64_t, int64_t, bool, T*, T*, T*, \
                                         ErrorSink);                                                                 \
  template void cross_entropy_backward<T>(cudaStream_t, const T*, const T*, const int64_t*, const T*, int64_t, int64_t, int64_t, \
                                          bool, T*);                                                                 \
  template void mse_forward<T>(cudaStream_t, const T*, const T*, int64_t, bool, T*, Partials<T>);                   \
  template void mse_backward<T>(cudaStream_t, const T*, const T*, const T*, int64_t, bool, T*, T*);                 \
  template void add_strided<T>(cudaStream_t, T*, int64_t, const T*, int64_t, int64_t, int64_t);                     \
  template void transpose<T>(cudaStream_t, const T*, T*, int64_t, int64_t, bool);                                   \
  template void embedding_forward<T>(cudaStream_t, const T*, const int64_t*, T*, int64_t, int64_t, int64_t, ErrorSink); \
  template void embedding_backward<T>(cudaStream_t, const T*, const int64_t*, T*, int64_t, int64_t, int64_t);        \
  template void first_nonfinite<T>(cudaStream_t, const T*, int64_t, unsigned long long*);                            \
  template void sgd_update<T>(cudaStream_t, int64_t, T*, const T*, T*, detail::SgdScalars<T>);                       \
  template void adam_update<T>(cudaStream_t, int64_t, T*, const T*, T*, T*, detail::AdamScalars<T>);                 \
  template void adam_update_counted<T>(cudaStream_t, int64_t, T*, const T*, T*, T*, AdamConsts, const double*);      \
  template void add_value<T>(cudaStream_t, T*, int64_t, T);                                                          \
  template void clip_scale<T>(cudaStream_t, T*, int64_t, const double*, double);                                      \
  template void sum_squares<T>(cudaStream_t, const T*, int64_t, double*, Partials<double>);

SEGTAPE_INSTANTIATE(float)
SEGTAPE_INSTANTIATE(double)
#undef SEGTAPE_INSTANTIATE

// Every elementwise op of ops/elementwise.h, in float and double.
#define SEGTAPE_INSTANTIATE_UNARY_T(Op, T)                                                       \
  template void unary_forward<ops::Op, T>(cudaStream_t, const T*, T*, int64_t, T);               \
  template void unary_backward<ops::Op, T>(cudaStream_t, const T*, const T*, const T*, T*, int64_t, T);
#define SEGTAPE_INSTANTIATE_UNARY(Op, ...) SEGTAPE_INSTANTIATE_UNARY_T(Op, float) SEGTAPE_INSTANTIATE_UNARY_T(Op, double)
SEGTAPE_UNARY_OPS(SEGTAPE_INSTANTIATE_UNARY)
#undef SEGTAPE_INSTANTIATE_UNARY
#undef SEGTAPE_INSTANTIATE_UNARY_T
#define SEGTAPE_INSTANTIATE_BINARY_T(Op, T)                                                                       \
  template void binary_forward<ops::Op, T>(cudaStream_t, const T*, const T*, T*, int64_t, int64_t);              \
  template void binary_backward_a<ops::Op, T>(cudaStream_t, const T*, const T*, const T*, T*, int64_t, int64_t); \
  template void binary_backward_b<ops::Op, T>(cudaStream_t, const T*, const T*, const T*, T*, int64_t, int64_t, Partials<T>);
#define SEGTAPE_INSTANTIATE_BINARY(Op, ...) SEGTAPE_INSTANTIATE_BINARY_T(Op, float) SEGTAPE_INSTANTIATE_BINARY_T(Op, double)
SEGTAPE_BINARY_OPS(SEGTAPE_INSTANTIATE_BINARY)
#undef SEGTAPE_INSTANTIATE_BINARY
#undef SEGTAPE_INSTANTIATE_BINARY_T

}  // namespace segtape::cuda
