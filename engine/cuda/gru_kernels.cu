// The fused GRU cell's elementwise kernels (kernels.h). The two GEMMs before
// the forward and the four after the backward are cuBLAS calls in
// engine/ops/gru.cpp's CUDA section. The formulas are the CPU's (the same
// file: gru_gate_row, gru_backward_row), term by term, one thread per (row, unit).
#include "device_math.cuh"
#include "kernels.h"

namespace segtape::cuda {

template <class T>
void gru_gates_forward(cudaStream_t s, int64_t B, int64_t H, const T* gi, const T* gh, const T* b_ih, const T* b_hh,
                       const T* h, T* S, T* y) {
  each(s, B * H, [=] __device__(int64_t k) {
    const int64_t b = k / H, j = k % H;
    const T* gir = gi + b * 3 * H;  // [3H] = x W_ih^T: r, z, n blocks
    const T* ghr = gh + b * 3 * H;  // [3H] = h W_hh^T
    T* Sr = S + b * 4 * H;          // [4H] = r, z, n, W_hn h + b_hn
    const T r = dsigmoid<T>(gir[j] + b_ih[j] + ghr[j] + b_hh[j]);
    const T z = dsigmoid<T>(gir[H + j] + b_ih[H + j] + ghr[H + j] + b_hh[H + j]);
    const T hn = ghr[2 * H + j] + b_hh[2 * H + j];
    const T n = dtanh<T>(gir[2 * H + j] + b_ih[2 * H + j] + r * hn);
    Sr[j] = r, Sr[H + j] = z, Sr[2 * H + j] = n, Sr[3 * H + j] = hn;
    if (y) y[k] = (T(1) - z) * n + z * h[k];
  }, "gru_gates_forward");
}

template <class T>
void gru_gates_backward(cudaStream_t s, int64_t B, int64_t H, const T* g, const T* h, const T* S, T* dgi, T* dgh, T* dh) {
  each(s, B * H, [=] __device__(int64_t k) {
    const int64_t b = k / H, j = k % H;
    const T* Sr = S + b * 4 * H;
    const T r = Sr[j], z = Sr[H + j], n = Sr[2 * H + j], hn = Sr[3 * H + j];
    const T dn = g[k] * (T(1) - z) * (T(1) - n * n);  // through tanh
    const T dz = g[k] * (h[k] - n) * z * (T(1) - z);
    const T dr = dn * hn * r * (T(1) - r);
    T* dgir = dgi + b * 3 * H;
    T* dghr = dgh + b * 3 * H;
    dgir[j] = dr, dgir[H + j] = dz, dgir[2 * H + j] = dn;
    dghr[j] = dr, dghr[H + j] = dz, dghr[2 * H + j] = dn * r;
    if (dh) dh[k] += g[k] * z;
  }, "gru_gates_backward");
}

template void gru_gates_forward<float>(cudaStream_t, int64_t, int64_t, const float*, const float*, const float*, const float*,
                                       const float*, float*, float*);
template void gru_gates_forward<double>(cudaStream_t, int64_t, int64_t, const double*, const double*, const double*,
                                        const double*, const double*, double*, double*);
template void gru_gates_backward<float>(cudaStream_t, int64_t, int64_t, const float*, const float*, const float*, float*,
                                        float*, float*);
template void gru_gates_backward<double>(cudaStream_t, int64_t, int64_t, const double*, const double*, const double*,
                                         double*, double*, double*);

}  // namespace segtape::cuda
