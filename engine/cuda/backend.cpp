// The CUDA backend's setup, memory, copies, synchronisation and CUDA-graph
// capture / replay (cuda_backend.h; design in docs/cuda.md).
#include <cstring>
#include <initializer_list>
#include <string>

#include "check.h"
#include "cuda_backend.h"
#include "ops/op.h"

namespace segtape::cuda {
namespace {

constexpr size_t kCublasWorkspace = size_t(32) << 20;  // NVIDIA's recommendation for Hopper
constexpr size_t kInternalWords = 4096;                // error record, first_nonfinite's result

// ---- chunk allocators for the arenas (engine/arena.h); ctx is the backend.
void* device_take(void* ctx, size_t bytes, const char* what) {
  auto* be = static_cast<CudaBackend*>(ctx);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) return p;
  (void)cudaGetLastError();
  size_t free = 0, total = 0;
  const bool info = cudaMemGetInfo(&free, &total) == cudaSuccess;
  (void)cudaGetLastError();
  throw OutOfMemoryError("Tape(" + be->device().str() + "): out of device memory: reserving the " + what + " asked cudaMalloc for " +
              format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes) and got " + cudaGetErrorName(e) +
              (info ? "; " + format_bytes(free) + " of " + format_bytes(total) + " are free on the device" : std::string()) +
              ". Lower that option (or the others: segment_budget, device_persistent, device_carry, device_workspace).",
      what);
}

void device_give(void* ctx, void* p) {
  // The stream may still use the memory: wait for it first (no throwing here).
  cudaStreamSynchronize(static_cast<CudaBackend*>(ctx)->stream());
  cudaFree(p);
  (void)cudaGetLastError();
}

void* pinned_take(void* ctx, size_t bytes, const char* what) {
  auto* be = static_cast<CudaBackend*>(ctx);
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped);
  if (e == cudaSuccess) return p;
  (void)cudaGetLastError();
  throw OutOfMemoryError("Tape(" + be->device().str() + "): cannot reserve the " + what + ": cudaHostAlloc of " +
                             format_bytes(bytes) + " failed with " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")",
                         what);
}

void pinned_give(void*, void* p) {
  cudaFreeHost(p);
  (void)cudaGetLastError();
}



}  // namespace

CudaBackend::CudaBackend(const Device& device, const TapeOptions& options)
    : device_(device), options_(options), schedule_(options.graph_replay, options.graph_replay ? align_up(options.graph_staging) : 0) {
  if (options.grow)
    throw Error("Tape(" + device.str() + "): TapeOptions::grow (the teaching policy) is CPU-only: a device arena is one "
                "allocation of segment_budget bytes made at setup");
  detail::check_graph_options(device, options);
  // Without a driver (or a GPU) this is where it shows: cudaErrorInsufficientDriver, cudaErrorNoDevice, ...
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(std::string("Device::cuda(): no CUDA GPU found (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")");
  }
  if (count == 0) throw DeviceError("Device::cuda(): no CUDA GPU found (cudaGetDeviceCount: 0 devices)");
  if (device.index < 0 || device.index >= count)
    throw DeviceError("Device::cuda(" + std::to_string(device.index) + "): this machine has " + std::to_string(count) +
                          " CUDA GPU(s), numbered from 0",
                      true);
  try {
    SEGTAPE_CHECK(cudaSetDevice(device.index));
    cudaDeviceProp prop{};
    SEGTAPE_CHECK(cudaGetDeviceProperties(&prop, device.index));
    name_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    if (const std::string why = precision_unsupported(options.precision, prop.major, prop.minor, device.str() + ", " + name_); !why.empty())
      throw Error(why);
    SEGTAPE_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SEGTAPE_CHECK(cublasCreate(&blas_));
    SEGTAPE_CHECK(cublasSetStream(blas_, stream_));
    SEGTAPE_CHECK(cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST));
    // Default math keeps float32 products in float32; TF32 only when allowed.
    SEGTAPE_CHECK(cublasSetMathMode(blas_, options.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    SEGTAPE_CHECK(cudnnCreate(&dnn_));
    SEGTAPE_CHECK(cudnnSetStream(dnn_, stream_));
    // One device allocation for the backend's own memory.
    internal_ = std::make_unique<Arena>(kCublasWorkspace + kInternalWords + options.device_workspace, false, 0,
                                        allocator("backend workspace (TapeOptions::device_workspace)"));
    void* cublas_ws = internal_->try_alloc(kCublasWorkspace);
    SEGTAPE_CHECK(cublasSetWorkspace(blas_, cublas_ws, kCublasWorkspace));  // cuBLAS then allocates nothing (graph capture)
    error_record_ = static_cast<ErrorRecord*>(internal_->try_alloc(sizeof(ErrorRecord)));
    scratch_word_ = static_cast<unsigned long long*>(internal_->try_alloc(sizeof(unsigned long long)));
    temp_base_ = static_cast<std::byte*>(internal_->try_alloc(options.device_workspace));
    temp_cap_ = options.device_workspace;
    SEGTAPE_CHECK(cudaMemsetAsync(error_record_, 0, sizeof(ErrorRecord), stream_));
    // One pinned host allocation: the error flag the kernels raise, and the staging of graph segments.
    const size_t staging = options.graph_replay ? align_up(options.graph_staging) : 0;
    pinned_ = std::make_unique<Arena>(kAlign + staging, false, 0,
                                      ChunkAllocator{pinned_take, pinned_give, this,
                                                     "pinned staging (TapeOptions::graph_staging)", false});
    error_flag_ = static_cast<int32_t*>(pinned_->try_alloc(sizeof(int32_t)));
    *error_flag_ = 0;
    void* flag_device = nullptr;
    SEGTAPE_CHECK(cudaHostGetDevicePointer(&flag_device, error_flag_, 0));
    error_flag_device_ = static_cast<int32_t*>(flag_device);
    if (staging) {
      staging_base_ = static_cast<std::byte*>(pinned_->try_alloc(staging));
    }
    SEGTAPE_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() { release(); }

void CudaBackend::release() noexcept {
  if (stream_) cudaStreamSynchronize(stream_);
  drop_graph();
  gru_plans_.clear();
  // The handles before the memory they were given (cuBLAS's workspace), the
  // memory before the stream its release waits on.
  if (dnn_) cudnnDestroy(dnn_);
  if (blas_) cublasDestroy(blas_);
  internal_.reset();
  pinned_.reset();
  if (stream_) cudaStreamDestroy(stream_);
  dnn_ = nullptr, blas_ = nullptr, stream_ = nullptr;
  (void)cudaGetLastError();
}

ChunkAllocator CudaBackend::allocator(const char* what) { return {device_take, device_give, this, what, true}; }

std::string CudaBackend::describe() const { return device_.str() + ": " + name_; }

size_t CudaBackend::internal_device_bytes() const { return internal_ ? internal_->reserved() : 0; }

void* CudaBackend::temp_bytes(size_t bytes) {
  const size_t at = (temp_used_ + kAlign - 1) & ~(kAlign - 1);
  if (at + bytes > temp_cap_)
    throw BudgetError("CUDA backend: the op temporaries need more than TapeOptions::device_workspace (" + format_bytes(temp_cap_) +
                      "): raise it");
  temp_used_ = at + bytes;
  return temp_base_ + at;
}

// ---------------------------------------------------------------- ops

void CudaBackend::forward(Tape& tape, Node& n) {
  temp_used_ = 0;
  if (n.op == OpKind::GruSequence) return gru_sequence_forward(*this, tape, n);  // gates itself after its arena allocations
  if (issue(detail::op_signature(n, nullptr, nullptr), op_name(n.op))) forward_op(*this, tape, n);
}

void CudaBackend::backward(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) {
  temp_used_ = 0;
  if (n.op == OpKind::GruSequence) return gru_sequence_backward(*this, tape, n, gout, dst);
  if (issue(detail::op_signature(n, gout, &dst), op_name(n.op))) backward_op(*this, tape, n, gout, dst);
}

namespace {
cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                         const float* A, int lda, const float* B, int ldb, const float* beta, float* C, int ldc) {
  return cublasSgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const double* alpha,
                         const double* A, int lda, const double* B, int ldb, const double* beta, double* C, int ldc) {
  return cublasDgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// cuBLAS takes int sizes.
void check_int_dims(std::initializer_list<int64_t> dims) {
  for (int64_t v : dims)
    if (v > INT32_MAX) throw ShapeError("matmul: dimension " + std::to_string(v) + " is too large for cuBLAS");
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the
// operands and the sizes; each row-major matrix is its transpose in
// column-major with the same leading dimension. Here and in gemm_bf16 (its
// packed bfloat16 operands).
template <class T>
void row_major_gemm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  check_int_dims({M, N, K, lda, ldb, ldc});
  check(blas_gemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K), &alpha, B,
                  int(ldb < 1 ? 1 : ldb), A, int(lda < 1 ? 1 : lda), &beta, C, int(ldc < 1 ? 1 : ldc)),
        sizeof(T) == 4 ? "cublasSgemm" : "cublasDgemm");
}
}  // namespace

void CudaBackend::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                       const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (options_.precision == Precision::Bf16 && M > 0 && N > 0) return gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  row_major_gemm(blas_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Precision::Bf16: C = alpha bf16(op(bf16(A)) op(bf16(B))) + beta C, the
// CPU's cpu::gemm_bf16. The operands are rounded and packed into the op's
// temporaries, cuBLAS multiplies them on the tensor cores (bfloat16 inputs,
// float32 accumulation: CUBLAS_COMPUTE_32F), and one kernel rounds the
// product and adds it to C. With beta = 0 the product is made in C. The
// temporaries are given back after the call: the kernels that read them
// run before anything later on the stream can reuse them.
void CudaBackend::gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_int_dims({M, N, K, lda, ldb, ldc});
  const size_t mark = temp_used_;
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  void* a = temp_bytes(size_t(a_rows * a_cols) * 2);
  void* b = temp_bytes(size_t(b_rows * b_cols) * 2);
  const bool in_place = beta == 0.0f;
  float* product = in_place ? C : temp<float>(M * N);
  const int64_t ldp = in_place ? ldc : N;
  cuda::round_to_bf16(stream_, a_rows, a_cols, A, lda, a);
  cuda::round_to_bf16(stream_, b_rows, b_cols, B, ldb, b);
  const float one = 1.0f, zero = 0.0f;
  // (row-major as column-major, as row_major_gemm: the operands and sizes swapped)
  check(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K), &one, b,
                     CUDA_R_16BF, int(b_cols < 1 ? 1 : b_cols), a, CUDA_R_16BF, int(a_cols < 1 ? 1 : a_cols), &zero, product, CUDA_R_32F,
                     int(ldp < 1 ? 1 : ldp), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (bfloat16)");
  cuda::finish_bf16(stream_, M, N, alpha, product, ldp, beta, C, ldc, in_place);
  temp_used_ = mark;
}

void CudaBackend::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                       const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  row_major_gemm(blas_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// ---------------------------------------------------------------- memory

void CudaBackend::copy(void* dst, const void* src, size_t bytes, Copy kind) {
  if (!bytes) return;
  switch (kind) {
    case Copy::HostToDevice: {
      if (!in_graph_segment()) {
        // Pageable source: CUDA stages it before returning, so the caller may reuse it at once.
        SEGTAPE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        return;
      }
      // A graph segment copies from pinned staging at a fixed place; the host
      // refills it once no launched graph can still read it (while a segment
      // replays, its calls issue nothing: the stream may be waited for here;
      // a capture's wait came before it began, segment_begin).
      const size_t at = schedule_.stage(bytes);
      wait_for_staging();
      std::memcpy(staging_base_ + at, src, bytes);
      if (issue(detail::call::host_to_device(dst, at, bytes), "tape.from() (host to device copy)"))
        SEGTAPE_CHECK(cudaMemcpyAsync(dst, staging_base_ + at, bytes, cudaMemcpyHostToDevice, stream_));
      return;
    }
    case Copy::DeviceToHost:
      schedule_.check_host_read();
      raise_pending();  // a graph segment that did not run: its values are undefined, say so
      SEGTAPE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
      wait();
      raise_device_errors();
      return;
    case Copy::DeviceToDevice:
      if (issue(detail::call::device_copy(dst, src, bytes), "device copy"))
        SEGTAPE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
  }
}

void CudaBackend::zero(void* dst, size_t bytes) {
  if (bytes && issue(detail::call::zero(dst, bytes), "zero fill"))
    SEGTAPE_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::fill(void* dst, int64_t n, DType d, double value) {
  if (n <= 0 || !issue(detail::call::fill(dst, n, d, value), "fill")) return;
  if (d == DType::F32) cuda::fill<float>(stream_, static_cast<float*>(dst), n, float(value));
  else if (d == DType::F64) cuda::fill<double>(stream_, static_cast<double*>(dst), n, value);
  else throw TapeError("fill: integer tensors are not filled on the device");
}

std::pair<int64_t, double> CudaBackend::first_nonfinite(const Tensor& t) {
  schedule_.check_host_read();  // anomaly mode: excluded at setup with graph replay; defensive
  raise_pending();
  SEGTAPE_CHECK(cudaMemsetAsync(scratch_word_, 0xff, sizeof(unsigned long long), stream_));
  if (t.dtype == DType::F32) cuda::first_nonfinite<float>(stream_, static_cast<const float*>(t.ptr), t.numel(), scratch_word_);
  else cuda::first_nonfinite<double>(stream_, static_cast<const double*>(t.ptr), t.numel(), scratch_word_);
  unsigned long long index = 0;
  copy(&index, scratch_word_, sizeof index, Copy::DeviceToHost);
  if (index == ~0ull) return {-1, 0.0};
  double v = 0;
  if (t.dtype == DType::F32) {
    float f = 0;
    copy(&f, static_cast<const float*>(t.ptr) + index, sizeof f, Copy::DeviceToHost);
    v = f;
  } else {
    copy(&v, static_cast<const double*>(t.ptr) + index, sizeof v, Copy::DeviceToHost);
  }
  return {int64_t(index), v};
}

void CudaBackend::synchronize() {
  schedule_.check_synchronize();
  wait();
  raise_device_errors();
  raise_pending();
}

// ---------------------------------------------------------------- parameter updates
//
// Outside a segment (where nn's optimizers run them) these are plain eager
// work. Inside a graph segment they are captured like any device call; their
// signature holds the scalars, so a step whose scalars change (Adam's bias
// corrections) must run outside the graph segments, as docs/cuda.md says,
// unless the step count is read on the device (the capturable adam_step:
// its signature holds the count's address, not its value).

void CudaBackend::sgd_step(DType d, int64_t n, void* p, const void* g, void* buf, const SgdOptions& s, bool first) {
  if (n <= 0 || !issue(detail::call::sgd(p, g, buf, n, d, s, first), "sgd_step")) return;
  detail::dispatch(d, [&]<class T>() {
    cuda::sgd_update<T>(stream_, n, static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(buf),
                        detail::sgd_scalars<T>(s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov, first, buf != nullptr));
  });
}

void CudaBackend::adam_step(DType d, int64_t n, void* p, const void* g, void* m, void* v, const AdamOptions& s, bool decoupled, int64_t step,
                            const double* step_at) {
  if (n <= 0 || !issue(detail::call::adam(p, g, m, v, n, d, s, decoupled, step, step_at), "adam_step")) return;
  detail::dispatch(d, [&]<class T>() {
    if (step_at)
      cuda::adam_update_counted<T>(stream_, n, static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(m), static_cast<T*>(v),
                                   {s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, decoupled}, step_at);
    else
      cuda::adam_update<T>(stream_, n, static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(m), static_cast<T*>(v),
                           detail::adam_scalars<T>(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, decoupled, double(step)));
  });
}

void CudaBackend::scale(void* x, int64_t n, DType d, double factor) {
  if (n <= 0 || !issue(detail::call::scale(x, n, d, factor), "scale_grad")) return;
  detail::dispatch(d, [&]<class T>() {
    cuda::unary_forward<ops::Scale, T>(stream_, static_cast<const T*>(x), static_cast<T*>(x), n, T(factor));
  });
}

void CudaBackend::add_scalar(void* x, int64_t n, DType d, double value) {
  if (n <= 0 || !issue(detail::call::add_scalar(x, n, d, value), "add_scalar")) return;
  detail::dispatch(d, [&]<class T>() { cuda::add_value<T>(stream_, static_cast<T*>(x), n, T(value)); });
}

void CudaBackend::add_sum_squares(const void* x, int64_t n, DType d, double* acc, bool first) {
  if (!issue(detail::call::add_sum_squares(x, n, d, acc, first), "add_grad_squares")) return;
  temp_used_ = 0;
  double* part = temp<double>(1);
  if (n > 0)
    detail::dispatch(d, [&]<class T>() { cuda::sum_squares<T>(stream_, static_cast<const T*>(x), n, part, partials<double>()); });
  else
    cuda::fill<double>(stream_, part, 1, 0.0);
  cuda::add_scalar_from(stream_, acc, part, first);
}

void CudaBackend::clip_scale(void* x, int64_t n, DType d, const double* sum_sq, double max_norm) {
  if (n <= 0 || !issue(detail::call::clip_scale(x, n, d, sum_sq, max_norm), "clip_grad")) return;
  detail::dispatch(d, [&]<class T>() { cuda::clip_scale<T>(stream_, static_cast<T*>(x), n, sum_sq, max_norm); });
}

void CudaBackend::device_call(const DeviceFunction& fn, const CallArgs& a) {
  if (!issue(detail::call::device_function(fn, a), fn.name)) return;
  fn.cuda(a, stream_);  // (device_call() refused a function without a CUDA form)
  cuda::check_launch(fn.name);
}

double CudaBackend::sum_squares(const void* x, int64_t n, DType d) {
  schedule_.check_norm();
  raise_pending();
  if (n <= 0) return 0;
  temp_used_ = 0;
  double* out = temp<double>(1);
  detail::dispatch(d, [&]<class T>() { cuda::sum_squares<T>(stream_, static_cast<const T*>(x), n, out, partials<double>()); });
  double r = 0;
  copy(&r, out, sizeof r, Copy::DeviceToHost);
  return r;
}

void CudaBackend::raise_device_errors() {
  if (*reinterpret_cast<volatile int32_t*>(error_flag_) == 0) return;
  ErrorRecord r;
  // On the tape's stream, and waited for: the legacy default stream does not
  // order with a non-blocking stream, so a plain cudaMemset could race the
  // next kernel that reports (and wipe its record).
  SEGTAPE_CHECK(cudaMemcpyAsync(&r, error_record_, sizeof r, cudaMemcpyDeviceToHost, stream_));
  SEGTAPE_CHECK(cudaMemsetAsync(error_record_, 0, sizeof r, stream_));
  SEGTAPE_CHECK(cudaStreamSynchronize(stream_));
  *error_flag_ = 0;
  const std::string where = " (found by a kernel on " + device_.str() +
                            " and reported at the first synchronisation after it; work issued in between used";
  if (r.code == kEmbeddingIndex)
    throw IndexError("embedding: index " + std::to_string(r.value) + " at position " + std::to_string(r.position) +
                     " is out of range for " + std::to_string(r.limit) + " rows" + where + " a zero row for it)");
  throw IndexError("cross_entropy: target " + std::to_string(r.value) + " at row " + std::to_string(r.position) +
                   " is out of range for " + std::to_string(r.limit) + " classes" + where +
                   " a loss without that row)");
}

void CudaBackend::raise_pending() {
  if (pending_.empty()) return;
  const std::string m = std::move(pending_);
  pending_.clear();
  throw TapeError(m);
}

// ---------------------------------------------------------------- CUDA graphs
//
// With TapeOptions::graph_replay the first segment runs eagerly (warm-up:
// cuBLAS / cuDNN initialise lazily there); the second and third are captured
// with cudaStreamBeginCapture / EndCapture, instantiated and launched at their
// end; every later segment replays the one captured from a segment of the same
// parity (carried values alternate between two buffers, so segment s repeats
// the addresses of segment s - 2). The host still runs the ops (tape nodes,
// arena bookkeeping, checks), but instead of issuing device work each call
// checks that it matches the captured one (issue()), and segment_end launches
// the graph. The arena gives every tensor the same address in every such
// segment, so the captured kernels read and write the right memory.

bool CudaBackend::issue(uint64_t sig, const char* what) { return schedule_.issue(sig, what); }

void CudaBackend::wait() {
  SEGTAPE_CHECK(cudaStreamSynchronize(stream_));
  staging_busy_ = false;
}

void CudaBackend::wait_for_staging() {
  if (staging_busy_) wait();
}

void CudaBackend::segment_begin(uint32_t index, bool graph, unsigned slot) {
  raise_pending();
  segment_ = index;
  if (!options_.graph_replay) return;
  // No wait here, so that the host records the next segments while the
  // device runs the last one's graph: the host waits only before it writes
  // the staging that graph may read (wait_for_staging). Errors the kernels
  // have flagged by now surface here (the flag is mapped host memory);
  // later ones at the next read or wait.
  raise_device_errors();
  if (schedule_.begin(index, graph, slot) != detail::GraphSchedule::Mode::Capturing) return;
  try {
    wait_for_staging();  // (a capturing stream cannot be waited for: before the capture begins)
  } catch (...) {
    schedule_.cancel_capture();  // (no segment opened: the schedule is not left capturing)
    throw;
  }
  const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    schedule_.cancel_capture();
    check(e, "cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)");
  }
}

void CudaBackend::segment_end(bool abandoned) noexcept {
  if (!options_.graph_replay) return;
  using End = detail::GraphSchedule::End;
  try {
    switch (schedule_.end(abandoned, pending_)) {
      case End::Nothing: return;
      case End::DropCapture: {  // an exception left the segment half issued: keep nothing
        cudaGraph_t g = nullptr;
        (void)cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return;
      }
      case End::Instantiate: {
        cudaGraph_t g = nullptr;
        check(cudaStreamEndCapture(stream_, &g), "cudaStreamEndCapture(stream_, &g)");
        cudaGraphExec_t exec = nullptr;
        const cudaError_t ie = cudaGraphInstantiateWithFlags(&exec, g, 0);
        cudaGraphDestroy(g);
        check(ie, "cudaGraphInstantiateWithFlags(&exec, g, 0)");
        exec_[schedule_.graph_index()] = exec;
        schedule_.captured();
        SEGTAPE_CHECK(cudaGraphLaunch(exec, stream_));  // the captured segment's own work runs now
        staging_busy_ = true;
        return;
      }
      case End::Launch:
        SEGTAPE_CHECK(cudaGraphLaunch(exec_[schedule_.graph_index()], stream_));
        staging_busy_ = true;
        return;
    }
  } catch (const std::exception& e) {
    pending_ = e.what();
    drop_graph();
  }
}

void CudaBackend::drop_graph() noexcept {
  for (cudaGraphExec_t& x : exec_) {
    if (x) cudaGraphExecDestroy(x);
    x = nullptr;
  }
  schedule_.forget();
  (void)cudaGetLastError();
}

void CudaBackend::discard_graph() {
  schedule_.discard();  // refused inside a graph segment
  drop_graph();
}

}  // namespace segtape::cuda

namespace segtape {
bool Device::cuda_built() { return true; }
}  // namespace segtape

namespace segtape::detail {
std::unique_ptr<Backend> make_cuda_backend(const Device& device, const TapeOptions& options) {
  return std::make_unique<cuda::CudaBackend>(device, options);
}
}  // namespace segtape::detail
