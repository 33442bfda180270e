// gru_sequence on CUDA: PyTorch's single-layer GRU over T steps as one
// cuDNN call per direction of the pass (cudnnRNNForward, then
// cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8).
//
// Weights. cuDNN keeps its parameters in one opaque "weight space"; segtape
// keeps PyTorch's four tensors. cuDNN's GRU (CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS)
// computes, per gate, W x + b_W + R h + b_R with
//   r = s(W_r x + b_Wr + R_r h + b_Rr)    z = s(W_z x + b_Wz + R_z h + b_Rz)
//   h~ = tanh(W_h x + b_Wh + r * (R_h h + b_Rh))    h' = (1 - z) h~ + z h
// which is PyTorch's GRU with W = weight_ih, R = weight_hh, b_W = bias_ih,
// b_R = bias_hh, gate by gate in the same order r, z, n (cuDNN's
// linLayerID 0, 1, 2 for W and 3, 4, 5 for R). cudnnGetRNNWeightParams gives
// where each [H, I] / [H, H] matrix and [H] bias lives in the weight space;
// forward copies PyTorch's row blocks there (12 device copies), backward adds
// cuDNN's weight gradients back into PyTorch's gradient blocks.
//
// Memory: the weight space and cuDNN's reserve space (what backward needs)
// are saved in the segment arena with the node; cuDNN's workspace is taken
// from the arena too (forward: the op's bytes; backward: Grad bytes).
//
// Where the shapes fit (fused_gru.h's best_plan: sm_90, W_hh and the state in
// the shared memory of a cluster of up to 8 blocks; else W_hh over the blocks
// of a cooperative grid, the state streamed from L2), the fused kernels run
// instead: x W_ih^T for all steps in one GEMM, the recurrence in one
// persistent launch, and in backward the recurrence in one launch in reverse
// followed by the GEMMs of dx and the weight gradients over all steps.
// n.ia[3] says which path the forward took (0 cuDNN, 1 fused, 2 fused with
// per-stream resets: only the fused kernels take gru_sequence's `keep`).
#include <algorithm>
#include <cstring>
#include <vector>

#include "check.h"
#include "cuda_backend.h"
#include "ops/op.h"
#include "segtape/kernels.h"
#include "tape_internals.h"

namespace segtape::cuda {

using In = detail::TapeInternals;
namespace {

cudnnDataType_t dnn_type(DType d) { return d == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

// cuDNN's buffers start on 256 bytes (as cudaMalloc's do): the arena aligns
// to 64, so take up to 192 bytes more and round up.
constexpr size_t kDnnAlign = 256;
size_t dnn_align(size_t n) { return (n + kDnnAlign - 1) & ~(kDnnAlign - 1); }
template <class Kind>  // OpKind, or GradBuffers
std::byte* dnn_alloc(Tape& tape, size_t bytes, Kind kind, const char* op) {
  auto* p = static_cast<std::byte*>(In::alloc(tape, bytes + kDnnAlign - kAlign, kind, op));
  const size_t off = reinterpret_cast<uintptr_t>(p) & (kDnnAlign - 1);  // a multiple of kAlign
  return off ? p + (kDnnAlign - off) : p;
}
size_t dnn_bytes(size_t bytes) { return align_up(bytes + kDnnAlign - kAlign); }  // what dnn_alloc takes from the arena

// Finds where cuDNN put each matrix and bias of pseudo-layer 0, relative to
// `space`, and checks their shapes are the ones this file maps.
void find_offsets(CudaBackend& be, GruPlan& p, const void* space) {
  cudnnTensorDescriptor_t m = nullptr, b = nullptr;
  SEGTAPE_CHECK(cudnnCreateTensorDescriptor(&m));
  try {
    SEGTAPE_CHECK(cudnnCreateTensorDescriptor(&b));
  } catch (...) {
    cudnnDestroyTensorDescriptor(m);
    throw;
  }
  auto elements = [](cudnnTensorDescriptor_t d) {
    cudnnDataType_t t;
    int nb = 0, dims[8] = {}, strides[8] = {};
    SEGTAPE_CHECK(cudnnGetTensorNdDescriptor(d, 8, &t, &nb, dims, strides));
    int64_t e = 1;
    for (int i = 0; i < nb; ++i) e *= dims[i];
    return e;
  };
  try {
    for (int id = 0; id < 6; ++id) {
      void* ma = nullptr;
      void* ba = nullptr;
      SEGTAPE_CHECK(cudnnGetRNNWeightParams(be.dnn(), p.rnn, 0, p.weight_bytes, space, id, m, &ma, b, &ba));
      const int64_t want = p.H * (id < 3 ? p.I : p.H);
      if (!ma || !ba || elements(m) != want || elements(b) != p.H)
        throw Error("gru_sequence: cuDNN's GRU weight layout (linLayerID " + std::to_string(id) + ": " +
                    std::to_string(elements(m)) + " weights, " + std::to_string(elements(b)) +
                    " biases) is not the [H, I|H] + [H] per gate that segtape maps to PyTorch's tensors");
      p.matrix[size_t(id)] = size_t(static_cast<const char*>(ma) - static_cast<const char*>(space));
      p.bias[size_t(id)] = size_t(static_cast<const char*>(ba) - static_cast<const char*>(space));
    }
  } catch (...) {
    cudnnDestroyTensorDescriptor(m);
    cudnnDestroyTensorDescriptor(b);
    throw;
  }
  cudnnDestroyTensorDescriptor(m);
  cudnnDestroyTensorDescriptor(b);
  p.offsets_known = true;
}

// PyTorch's blocks of gate g: rows [gH, (g+1)H) of w_ih / w_hh, elements
// [gH, (g+1)H) of the biases, in the order of linLayerID.
struct Blocks {
  const void* src[12];
  size_t bytes[12];
  size_t at[12];  // offset in the weight space
};
Blocks blocks(const GruPlan& p, const Node& nd) {
  const size_t es = dtype_size(p.dtype);
  const size_t HI = size_t(p.H * p.I) * es, HH = size_t(p.H * p.H) * es, Hb = size_t(p.H) * es;
  Blocks k{};
  for (int gate = 0; gate < 3; ++gate) {
    const size_t g = size_t(gate);
    k.src[g] = static_cast<const char*>(nd.in[2].ptr) + g * HI, k.bytes[g] = HI, k.at[g] = p.matrix[g];
    k.src[3 + g] = static_cast<const char*>(nd.in[3].ptr) + g * HH, k.bytes[3 + g] = HH, k.at[3 + g] = p.matrix[3 + g];
    k.src[6 + g] = static_cast<const char*>(nd.in[4].ptr) + g * Hb, k.bytes[6 + g] = Hb, k.at[6 + g] = p.bias[g];
    k.src[9 + g] = static_cast<const char*>(nd.in[5].ptr) + g * Hb, k.bytes[9 + g] = Hb, k.at[9 + g] = p.bias[3 + g];
  }
  return k;
}

// ---- the fused path
size_t arena_bytes(int64_t n, DType d) { return align_up(size_t(n) * dtype_size(d)); }

// The plan's blocks per group of rows as the node records them: C for a
// cluster, -C for the grid plan.
int64_t plan_blocks(const fused::Plan& p) { return p.grid ? -int64_t(p.C) : int64_t(p.C); }

// The whole batch's arguments, B the plan's rows per cluster (fused_gru.h).
template <class T>
fused::Args<T> fused_args(const CudaBackend& be, const Node& n, const fused::Plan& p) {
  const Tensor &x = n.in[0], &h0 = n.in[1];
  fused::Args<T> a{};
  a.steps = x.dim(0), a.B = p.Bg, a.ld = x.dim(1), a.H = h0.dim(1), a.Hs = p.Hs, a.S = p.S;
  a.w_hh = static_cast<const T*>(n.in[3].ptr);
  a.b_ih = static_cast<const T*>(n.in[4].ptr);
  a.b_hh = static_cast<const T*>(n.in[5].ptr);
  a.h0 = static_cast<const T*>(h0.ptr);
  a.y = static_cast<T*>(n.out.ptr);
  a.saved = static_cast<T*>(n.saved);
  a.bf16 = std::is_same_v<T, float> && be.options().precision == Precision::Bf16;  // (the products as gemm_bf16's)
  return a;
}

// The arena bytes of the fused forward's saved gates [T, B, 4H]: n.saved's
// first part, which keep's copy follows (the layout both passes use).
size_t gates_bytes(const Node& n) { return arena_bytes(n.in[0].dim(0) * n.in[0].dim(1) * 4 * n.in[1].dim(1), n.in[0].dtype); }

// The copy of gru_sequence's keep [T, B] that the fused forward made: after
// the gates in n.saved (n.ia[3] == 2), or nullptr.
template <class T>
const T* saved_keep(const Node& n) {
  if (n.ia[3] != 2 || !n.saved) return nullptr;
  return reinterpret_cast<const T*>(static_cast<const char*>(n.saved) + gates_bytes(n));
}

// On entry n.saved is gru_sequence's keep [T, B] (the op's, engine/ops/gru.cpp)
// or nullptr. After: n.saved = the gates [T, B, 4H] when a gradient is wanted,
// followed by a copy of keep when given (backward reads the copy: the caller's
// keep may change after the op; n.ia[3] = 2 says it is there); gi [T, B, 3H]
// in the arena too (and keep's copy in inference mode).
void fused_forward(CudaBackend& be, Tape& tape, Node& n, const fused::Plan& p) {
  const Tensor& x = n.in[0];
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = n.in[1].dim(1);
  const void* keep_src = n.saved;
  const bool training = n.ia[0] != 0;
  const size_t gi_bytes = arena_bytes(T * B * 3 * H, x.dtype), saved_bytes = training ? gates_bytes(n) : 0;
  const size_t keep_bytes = keep_src ? arena_bytes(T * B, x.dtype) : 0;
  void* gi = In::alloc(tape, gi_bytes, OpKind::GruSequence, "gru_sequence");
  n.saved = training ? In::alloc(tape, saved_bytes + keep_bytes, OpKind::GruSequence, "gru_sequence") : nullptr;
  void* keep = !keep_src ? nullptr
               : training ? static_cast<char*>(n.saved) + saved_bytes
                          : In::alloc(tape, keep_bytes, OpKind::GruSequence, "gru_sequence");
  n.ia = {training, plan_blocks(p), p.S, keep ? 2 : 1};  // the plan's blocks and lanes, for backward; 2: keep's copy follows the gates
  n.bytes += gi_bytes + saved_bytes + keep_bytes;
  // (a signed call of its own: a graph replay checks the source's address)
  if (keep) be.copy(keep, keep_src, size_t(T * B) * dtype_size(x.dtype), detail::Backend::Copy::DeviceToDevice);
  if (!be.issue(detail::op_signature(n, nullptr, nullptr), "gru_sequence")) return;
  detail::dispatch(x.dtype, [&]<class E>() {
    fused::Args<E> a = fused_args<E>(be, n, p);
    a.gi = static_cast<const E*>(gi);
    a.keep = static_cast<const E*>(keep);
    be.gemm(false, true, T * B, 3 * H, I, E(1), static_cast<const E*>(x.ptr), I, static_cast<const E*>(n.in[2].ptr), I, E(0),
            static_cast<E*>(gi), 3 * H);
    fused_gru_forward<E>(be.stream(), p, a);
  });
}

void fused_backward(CudaBackend& be, Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) {
  const Tensor &x = n.in[0], &h0 = n.in[1];
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = h0.dim(1);
  const fused::Plan p = be.fused_gru_plan(B, H, x.dtype, /*honour_switch=*/false);  // what the forward ran, whatever the switch says now
  if (!p.use || plan_blocks(p) != n.ia[1] || p.S != n.ia[2])
    throw TapeError("gru_sequence: backward of a fused forward that its plan no longer gives (" +
                    (p.use ? (p.grid ? "grid of " : "cluster ") + std::to_string(p.C) + ", " + std::to_string(p.S) + " lanes" : p.why_not) + ")");
  void* dgi = In::alloc(tape, arena_bytes(T * B * 3 * H, x.dtype), GradBuffers{}, "backward");
  void* dgh = In::alloc(tape, arena_bytes(T * B * 3 * H, x.dtype), GradBuffers{}, "backward");
  void* dh0 = In::alloc(tape, h0.nbytes(), GradBuffers{}, "backward");
  const bool keeps = n.ia[3] == 2;  // the state entering each step masked by keep: dW_hh's rows, written by the kernel
  void* hk = keeps && dst[3] ? In::alloc(tape, arena_bytes(T * B * H, x.dtype), GradBuffers{}, "backward") : nullptr;
  if (!be.issue(detail::op_signature(n, gout, &dst), "gru_sequence backward")) return;
  const cudaStream_t s = be.stream();
  detail::dispatch(x.dtype, [&]<class E>() {
    fused::Args<E> a = fused_args<E>(be, n, p);
    a.gout = static_cast<const E*>(gout);
    a.dgi = static_cast<E*>(dgi), a.dgh = static_cast<E*>(dgh), a.dh0 = static_cast<E*>(dh0);
    a.keep = saved_keep<E>(n), a.hk = static_cast<E*>(hk);
    fused_gru_backward<E>(s, p, a);
    const E* gI = a.dgi;
    const E* gH = a.dgh;
    const E* xs = static_cast<const E*>(x.ptr);
    if (E* d = static_cast<E*>(dst[0])) be.gemm(false, false, T * B, I, 3 * H, E(1), gI, 3 * H, static_cast<const E*>(n.in[2].ptr), I, E(1), d, I);
    if (E* d = static_cast<E*>(dst[1])) accumulate<E>(s, d, a.dh0, B * H);
    if (E* d = static_cast<E*>(dst[2])) be.gemm(true, false, 3 * H, I, T * B, E(1), gI, 3 * H, xs, I, E(1), d, I);
    if (E* d = static_cast<E*>(dst[3])) {  // sum over t of dgh[t]^T h_{t-1}: h0, then y[0 .. T-2]
      if (a.hk) {  // ... as the steps took them, masked by keep
        be.gemm(true, false, 3 * H, H, T * B, E(1), gH, 3 * H, a.hk, H, E(1), d, H);
      } else {
        be.gemm(true, false, 3 * H, H, B, E(1), gH, 3 * H, a.h0, H, E(1), d, H);
        if (T > 1) be.gemm(true, false, 3 * H, H, (T - 1) * B, E(1), gH + B * 3 * H, 3 * H, a.y, H, E(1), d, H);
      }
    }
    if (E* d = static_cast<E*>(dst[4])) column_sums<E>(s, gI, d, T * B, 3 * H, be.partials<E>());
    if (E* d = static_cast<E*>(dst[5])) column_sums<E>(s, gH, d, T * B, 3 * H, be.partials<E>());
  });
}

}  // namespace

fused::Plan fused::device_plan(int64_t B, int64_t H, size_t elem) {
  int dev = 0, major = 0, smem = 0, sms = 0, coop = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    Plan none;
    none.why_not = "the CUDA device cannot be queried";
    return none;
  }
  // A plan that fits the limits: can this build's kernels run it here?
  const auto usable = [&](Plan q) {
    if (!q.use) return q;
    std::string why = fused_gru_unusable(q, elem);
    if (why.empty()) return q;
    Plan none;
    none.why_not = std::move(why);
    return none;
  };
  Limits lim{size_t(smem), 8, major >= 9, sms, coop != 0};
  Plan p = usable(best_plan(B, H, elem, lim));
  // One wave: a cluster's blocks share a GPC, so fewer clusters than
  // multiprocessors / C may fit at once; plan again for as many as do.
  for (int k = 0; k < 4 && p.use && !p.grid && p.G > 1; ++k) {
    const int fit = fused_gru_resident_clusters(p, elem);
    p.resident = fit;
    if (fit <= 0 || fit >= p.G) break;
    lim.sms = fit * p.C;
    const Plan q = plan(B, H, elem, lim);
    if (!q.use) break;
    p = usable(q);
  }
  return p;
}

bool CudaBackend::gru_sequence_keeps(int64_t B, int64_t H, DType d) { return fused_gru_plan(B, H, d).use; }

std::string CudaBackend::gru_sequence_path(int64_t B, int64_t H, DType d) {
  const fused::Plan p = fused_gru_plan(B, H, d);
  const std::string shape = "[" + std::to_string(B) + ", " + std::to_string(H) + "] " + dtype_name(d);
  if (!p.use) return "gru_cell steps: the fused GRU kernels do not run for " + shape + " on " + name_ + " (" + p.why_not + ")";
  const std::string fused = "segtape's fused GRU kernels for " + shape + " on " + name_ + ": ";
  const std::string products = d == DType::F32 && options_.precision == Precision::Bf16 ? ", bfloat16 products" : "";
  if (p.grid)
    return fused + "grid plan, " + std::to_string(p.G) + " groups of " + std::to_string(p.Bg) + " rows x " + std::to_string(p.C) +
           " blocks of " + std::to_string(p.Hs) + " units" + products;
  return fused + std::to_string(p.G) + " clusters of " + std::to_string(p.C) + " blocks, " + std::to_string(p.Bg) + " rows each" + products;
}

fused::Plan CudaBackend::fused_gru_plan(int64_t B, int64_t H, DType d, bool honour_switch) {
  if (honour_switch && !kernels::options().fused_gru) {
    fused::Plan off;
    off.why_not = "kernels::Options::fused_gru is off";
    return off;
  }
  const auto switched = [&](const fused::Plan& p) {
    if (!honour_switch || !p.grid || kernels::options().fused_gru_grid) return p;
    fused::Plan off;
    off.why_not = "the grid plan fits, but kernels::Options::fused_gru_grid is off (it has not run on a GPU yet)";
    return off;
  };
  for (const FusedPlan& f : fused_plans_)
    if (f.B == B && f.H == H && f.dtype == d) return switched(f.plan);
  fused_plans_.push_back({B, H, d, fused::device_plan(B, H, dtype_size(d))});
  return switched(fused_plans_.back().plan);
}

GruPlan::~GruPlan() {
  if (h) cudnnDestroyTensorDescriptor(h);
  if (y) cudnnDestroyRNNDataDescriptor(y);
  if (x) cudnnDestroyRNNDataDescriptor(x);
  if (rnn) cudnnDestroyRNNDescriptor(rnn);
  if (dropout) cudnnDestroyDropoutDescriptor(dropout);
}

GruPlan& CudaBackend::gru_plan(int64_t T, int64_t B, int64_t I, int64_t H, DType d) {
  for (auto& p : gru_plans_)
    if (p->T == T && p->B == B && p->I == I && p->H == H && p->dtype == d) return *p;
  if (in_graph_segment())
    throw TapeError("gru_sequence: a new shape [" + std::to_string(T) + ", " + std::to_string(B) + ", " + std::to_string(I) +
                    "] inside a CUDA-graph segment; graph replay needs the shapes of the segment it captured");
  // cuDNN takes int sizes and strides: the products it forms must fit too.
  const int64_t widest = std::max(I, H);
  if (T > INT32_MAX || B * widest > INT32_MAX || T * B * widest > INT32_MAX || 3 * H * widest > INT32_MAX)
    throw ShapeError("gru_sequence: [T, B, I] = [" + std::to_string(T) + ", " + std::to_string(B) + ", " + std::to_string(I) +
                     "] with H = " + std::to_string(H) + " is too large for cuDNN's 32-bit sizes");
  auto plan = std::make_unique<GruPlan>();
  GruPlan& p = *plan;
  p.T = T, p.B = B, p.I = I, p.H = H, p.dtype = d;
  const cudnnDataType_t dt = dnn_type(d);
  SEGTAPE_CHECK(cudnnCreateDropoutDescriptor(&p.dropout));
  SEGTAPE_CHECK(cudnnSetDropoutDescriptor(p.dropout, dnn(), 0.0f, nullptr, 0, 0));  // no dropout: no RNG state
  SEGTAPE_CHECK(cudnnCreateRNNDescriptor(&p.rnn));
  // FMA math keeps float32 products in float32 (no TF32) unless allowed.
  const cudnnMathType_t math = d == DType::F32 && !options().allow_tf32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  SEGTAPE_CHECK(cudnnSetRNNDescriptor_v8(p.rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS,
                                         CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, dt, math, int32_t(I), int32_t(H),
                                         int32_t(H), 1, p.dropout, CUDNN_RNN_PADDED_IO_DISABLED));
  // x [T, B, I] and y [T, B, H] sequence-major, every sequence T long: the
  // packed layout is then exactly the contiguous [T, B, *] tensor.
  const std::vector<int> lengths(static_cast<size_t>(B), static_cast<int>(T));
  SEGTAPE_CHECK(cudnnCreateRNNDataDescriptor(&p.x));
  SEGTAPE_CHECK(cudnnSetRNNDataDescriptor(p.x, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, int(T), int(B), int(I),
                                          lengths.data(), nullptr));
  SEGTAPE_CHECK(cudnnCreateRNNDataDescriptor(&p.y));
  SEGTAPE_CHECK(cudnnSetRNNDataDescriptor(p.y, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, int(T), int(B), int(H),
                                          lengths.data(), nullptr));
  // h0 [layers = 1, B, H]
  const int hdims[3] = {1, int(B), int(H)}, hstrides[3] = {int(B * H), int(H), 1};
  SEGTAPE_CHECK(cudnnCreateTensorDescriptor(&p.h));
  SEGTAPE_CHECK(cudnnSetTensorNdDescriptor(p.h, dt, 3, hdims, hstrides));
  SEGTAPE_CHECK(cudnnGetRNNWeightSpaceSize(dnn(), p.rnn, &p.weight_bytes));
  SEGTAPE_CHECK(cudnnGetRNNTempSpaceSizes(dnn(), p.rnn, CUDNN_FWD_MODE_TRAINING, p.x, &p.work_train, &p.reserve_bytes));
  size_t no_reserve = 0;
  SEGTAPE_CHECK(cudnnGetRNNTempSpaceSizes(dnn(), p.rnn, CUDNN_FWD_MODE_INFERENCE, p.x, &p.work_infer, &no_reserve));
  gru_plans_.push_back(std::move(plan));
  return p;
}

// n.ia[0]: a gradient is wanted (training mode: keep cuDNN's reserve space).
// Sets n.saved = [weight space | reserve space] and n.ia = {training,
// weight bytes, reserve bytes, 0}; adds the arena bytes taken to n.bytes.
void gru_sequence_forward(CudaBackend& be, Tape& tape, Node& n) {
  const Tensor &x = n.in[0], &h0 = n.in[1];
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = h0.dim(1);
  if (const fused::Plan fp = be.fused_gru_plan(B, H, x.dtype); fp.use) return fused_forward(be, tape, n, fp);
  if (n.saved)  // a keep: the op composes cells where the fused kernels do not run (gru_sequence_keeps)
    throw TapeError("gru_sequence: per-stream resets (keep) reached cuDNN's GRU, which has none");
  if (be.options().precision == Precision::Bf16)  // (likewise: engine/ops/gru.cpp)
    throw TapeError("gru_sequence: Precision::Bf16 reached cuDNN's GRU, whose bfloat16 RNN keeps its state in bfloat16");
  GruPlan& p = be.gru_plan(T, B, I, H, x.dtype);
  const bool training = n.ia[0] != 0;
  const size_t wbytes = dnn_align(p.weight_bytes), rbytes = training ? dnn_align(p.reserve_bytes) : 0;
  const size_t work_bytes = training ? p.work_train : p.work_infer;
  // Arena first (host bookkeeping that a replayed segment must repeat too).
  std::byte* block = dnn_alloc(tape, wbytes + rbytes, OpKind::GruSequence, "gru_sequence");  // [weights | reserve]
  void* work = work_bytes ? dnn_alloc(tape, work_bytes, OpKind::GruSequence, "gru_sequence") : nullptr;
  n.saved = block;
  n.ia = {training, int64_t(wbytes), int64_t(rbytes), 0};
  n.bytes += dnn_bytes(wbytes + rbytes) + (work_bytes ? dnn_bytes(work_bytes) : 0);
  int32_t* lengths = be.temp<int32_t>(B);  // cuDNN's devSeqLengths: every sequence T long
  if (!p.offsets_known) find_offsets(be, p, block);
  if (!be.issue(detail::op_signature(n, nullptr, nullptr), "gru_sequence")) return;
  const cudaStream_t s = be.stream();
  fill_i32(s, lengths, B, int32_t(T));
  const Blocks k = blocks(p, n);
  for (int i = 0; i < 12; ++i)
    SEGTAPE_CHECK(cudaMemcpyAsync(block + k.at[i], k.src[i], k.bytes[i], cudaMemcpyDeviceToDevice, s));
  SEGTAPE_CHECK(cudnnRNNForward(be.dnn(), p.rnn, training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, lengths, p.x,
                                x.ptr, p.y, n.out.ptr, p.h, h0.ptr, /*hy=*/nullptr, /*cDesc (LSTM only)=*/p.h, nullptr,
                                nullptr, p.weight_bytes, block, work_bytes, work, training ? p.reserve_bytes : 0,
                                training ? block + wbytes : nullptr));
}

void gru_sequence_backward(CudaBackend& be, Tape& tape, const Node& n, const void* gout,
                           const std::array<void*, Node::kMaxInputs>& dst) {
  if (n.ia[3] != 0 && n.saved) return fused_backward(be, tape, n, gout, dst);
  const Tensor &x = n.in[0], &h0 = n.in[1];
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = h0.dim(1);
  if (!n.ia[0] || !n.saved)  // recorded only when a gradient is wanted, i.e. after a training-mode forward
    throw TapeError("gru_sequence: backward of a forward that ran in inference mode (no cuDNN reserve space or saved gates)");
  GruPlan& p = be.gru_plan(T, B, I, H, x.dtype);
  std::byte* block = static_cast<std::byte*>(n.saved);
  const size_t wbytes = size_t(n.ia[1]);
  const bool weights = dst[2] || dst[3] || dst[4] || dst[5];
  // cuDNN writes (not adds) dx and dhx: into arena buffers, then added to dst.
  void* work = p.work_train ? dnn_alloc(tape, p.work_train, GradBuffers{}, "backward") : nullptr;
  void* dx = In::alloc(tape, x.nbytes(), GradBuffers{}, "backward");
  void* dhx = dst[1] ? In::alloc(tape, h0.nbytes(), GradBuffers{}, "backward") : nullptr;
  void* dw = weights ? dnn_alloc(tape, p.weight_bytes, GradBuffers{}, "backward") : nullptr;
  int32_t* lengths = be.temp<int32_t>(B);
  if (!be.issue(detail::op_signature(n, gout, &dst), "gru_sequence backward")) return;
  const cudaStream_t s = be.stream();
  fill_i32(s, lengths, B, int32_t(T));
  // Data gradients first: cuDNN requires them before the weight gradients (same reserve space).
  SEGTAPE_CHECK(cudnnRNNBackwardData_v8(be.dnn(), p.rnn, lengths, p.y, n.out.ptr, gout, p.x, dx, p.h, h0.ptr,
                                        /*dhy=*/nullptr, dhx, /*cDesc (LSTM only)=*/p.h, nullptr, nullptr, nullptr,
                                        p.weight_bytes, block, p.work_train, work, p.reserve_bytes, block + wbytes));
  const int64_t es = int64_t(dtype_size(x.dtype));
  auto add = [&](void* to, const void* from, int64_t bytes) {
    if (x.dtype == DType::F32) accumulate<float>(s, static_cast<float*>(to), static_cast<const float*>(from), bytes / es);
    else accumulate<double>(s, static_cast<double*>(to), static_cast<const double*>(from), bytes / es);
  };
  if (dst[0]) add(dst[0], dx, int64_t(x.nbytes()));
  if (dst[1]) add(dst[1], dhx, int64_t(h0.nbytes()));
  if (!weights) return;
  SEGTAPE_CHECK(cudaMemsetAsync(dw, 0, p.weight_bytes, s));  // cuDNN 9 only adds weight gradients
  SEGTAPE_CHECK(cudnnRNNBackwardWeights_v8(be.dnn(), p.rnn, CUDNN_WGRAD_MODE_ADD, lengths, p.x, x.ptr, p.h, h0.ptr, p.y,
                                           n.out.ptr, p.weight_bytes, dw, p.work_train, work, p.reserve_bytes,
                                           block + wbytes));
  const Blocks k = blocks(p, n);
  for (int i = 0; i < 12; ++i) {
    const size_t which = 2 + size_t(i) / 3;  // w_ih, w_hh, b_ih, b_hh: 3 gate blocks each
    void* to = dst[which];
    if (!to) continue;
    const size_t into = static_cast<const char*>(k.src[i]) - static_cast<const char*>(n.in[which].ptr);
    add(static_cast<char*>(to) + into, static_cast<const std::byte*>(dw) + k.at[i], int64_t(k.bytes[i]));
  }
}

}  // namespace segtape::cuda
