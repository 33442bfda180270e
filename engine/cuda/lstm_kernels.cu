// The fused LSTM cell's elementwise kernels (kernels.h). The two GEMMs before
// the forward and the four after the backward are cuBLAS calls in
// engine/ops/lstm.cpp's CUDA section. The formulas are the CPU's (the same
// file: lstm_gate_row, lstm_backward_row), term by term, one thread per
// (row, unit). Compiled in every CUDA build; not yet run on a GPU (docs/cuda.md).
#include "device_math.cuh"
#include "kernels.h"

namespace segtape::cuda {

template <class T>
void lstm_gates_forward(cudaStream_t s, int64_t B, int64_t H, const T* P, const T* b_ih, const T* b_hh, const T* c, T* S,
                        T* out) {
  each(s, B * H, [=] __device__(int64_t k) {
    const int64_t b = k / H, j = k % H;
    const T* Pr = P + b * 4 * H;  // [4H] = x W_ih^T + h W_hh^T: i, f, g, o blocks
    T* Sr = S + b * 4 * H;        // [4H] = i, f, g, o
    const T i = dsigmoid<T>(Pr[j] + b_ih[j] + b_hh[j]);
    const T f = dsigmoid<T>(Pr[H + j] + b_ih[H + j] + b_hh[H + j]);
    const T g = dtanh<T>(Pr[2 * H + j] + b_ih[2 * H + j] + b_hh[2 * H + j]);
    const T o = dsigmoid<T>(Pr[3 * H + j] + b_ih[3 * H + j] + b_hh[3 * H + j]);
    Sr[j] = i, Sr[H + j] = f, Sr[2 * H + j] = g, Sr[3 * H + j] = o;
    const T c1 = f * c[k] + i * g;
    out[B * H + k] = c1;         // c'
    out[k] = o * dtanh<T>(c1);   // h'
  }, "lstm_gates_forward");
}

template <class T>
void lstm_gates_backward(cudaStream_t s, int64_t B, int64_t H, const T* g, const T* c, const T* cy, const T* S, T* dP, T* dc) {
  each(s, B * H, [=] __device__(int64_t k) {
    const int64_t b = k / H, j = k % H;
    const T* Sr = S + b * 4 * H;
    const T i = Sr[j], f = Sr[H + j], gg = Sr[2 * H + j], o = Sr[3 * H + j];
    const T gh = g[k], gc = g[B * H + k];
    const T tc = dtanh<T>(cy[k]);
    const T dcy = gc + gh * o * (T(1) - tc * tc);
    T* dPr = dP + b * 4 * H;
    dPr[j] = dcy * gg * i * (T(1) - i);
    dPr[H + j] = dcy * c[k] * f * (T(1) - f);
    dPr[2 * H + j] = dcy * i * (T(1) - gg * gg);
    dPr[3 * H + j] = gh * tc * o * (T(1) - o);
    if (dc) dc[k] += dcy * f;
  }, "lstm_gates_backward");
}

template void lstm_gates_forward<float>(cudaStream_t, int64_t, int64_t, const float*, const float*, const float*, const float*,
                                        float*, float*);
template void lstm_gates_forward<double>(cudaStream_t, int64_t, int64_t, const double*, const double*, const double*,
                                         const double*, double*, double*);
template void lstm_gates_backward<float>(cudaStream_t, int64_t, int64_t, const float*, const float*, const float*, const float*,
                                         float*, float*);
template void lstm_gates_backward<double>(cudaStream_t, int64_t, int64_t, const double*, const double*, const double*,
                                          const double*, double*, double*);

}  // namespace segtape::cuda
