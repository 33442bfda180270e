// The CUDA backend (engine-internal; see engine/backend.h for the contract
// and docs/cuda.md for the design). One per CUDA tape: one stream, one cuBLAS
// and one cuDNN handle, its own device workspace, and the CUDA-graph state.
//
//   backend.cpp        setup, memory, copies, synchronisation, graph capture / replay
//   op_table.cpp       every op to its family's CUDA code (engine/ops/<family>.cpp)
//   gru_sequence.cpp   the whole-sequence GRU through cuDNN
//   kernels.cu, gru_kernels.cu   segtape's own kernels (kernels.h)
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "graph_schedule.h"
#include "kernels.h"

namespace segtape::cuda {

// cuDNN descriptors and sizes of one GRU sequence shape, made on first use
// (in an eager segment) and kept for the tape's life.
struct GruPlan {
  int64_t T = 0, B = 0, I = 0, H = 0;
  DType dtype = DType::F32;
  cudnnDropoutDescriptor_t dropout = nullptr;
  cudnnRNNDescriptor_t rnn = nullptr;
  cudnnRNNDataDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t h = nullptr;
  size_t weight_bytes = 0, work_train = 0, work_infer = 0, reserve_bytes = 0;
  // Byte offsets in the weight space of cuDNN's matrices and biases by
  // linLayerID: 0..2 input (r, z, n), 3..5 recurrent (r, z, n).
  std::array<size_t, 6> matrix{}, bias{};
  bool offsets_known = false;
  ~GruPlan();
};

class CudaBackend final : public detail::Backend {
 public:
  CudaBackend(const Device& device, const TapeOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // ---- detail::Backend
  ChunkAllocator allocator(const char* what) override;
  // cuDNN's or the fused kernels (gru_sequence.cpp); with keep or under
  // Precision::Bf16 the fused kernels only (bfloat16 products there), else
  // the op composes gru_cell steps (engine/ops/gru.cpp).
  bool has_gru_sequence() const override { return true; }
  bool gru_sequence_keeps(int64_t B, int64_t H, DType d) override;  // where the fused kernels run (gru_sequence.cpp)
  std::string gru_sequence_path(int64_t B, int64_t H, DType d) override;
  void forward(Tape& tape, Node& n) override;
  void backward(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) override;
  void copy(void* dst, const void* src, size_t bytes, Copy kind) override;
  void zero(void* dst, size_t bytes) override;
  void fill(void* dst, int64_t n, DType d, double value) override;
  std::pair<int64_t, double> first_nonfinite(const Tensor& t) override;
  void synchronize() override;
  void sgd_step(DType d, int64_t n, void* p, const void* g, void* buf, const SgdOptions& s, bool first) override;
  void adam_step(DType d, int64_t n, void* p, const void* g, void* m, void* v, const AdamOptions& s, bool decoupled, int64_t step,
                 const double* step_at) override;
  void scale(void* x, int64_t n, DType d, double factor) override;
  void add_scalar(void* x, int64_t n, DType d, double value) override;
  double sum_squares(const void* x, int64_t n, DType d) override;
  void add_sum_squares(const void* x, int64_t n, DType d, double* acc, bool first) override;
  void clip_scale(void* x, int64_t n, DType d, const double* sum_sq, double max_norm) override;
  void device_call(const DeviceFunction& fn, const CallArgs& a) override;
  void segment_begin(uint32_t index, bool graph, unsigned slot) override;
  void segment_end(bool abandoned) noexcept override;
  void discard_graph() override;
  std::pair<uint64_t, uint64_t> graph_counts() const override { return {schedule_.captures(), schedule_.replays()}; }
  size_t internal_device_bytes() const override;
  std::string describe() const override;
  void* native_stream() const override { return stream_; }

  // ---- for the op implementations
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t dnn() const { return dnn_; }
  const TapeOptions& options() const { return options_; }
  const Device& device() const { return device_; }
  ErrorSink errors() const { return {error_record_, error_flag_device_}; }
  // Temporaries of the op being run (the backend's own workspace), valid
  // until the op returns; the region is reused by the next op.
  void* temp_bytes(size_t bytes);
  template <class T> T* temp(int64_t n) { return static_cast<T*>(temp_bytes(size_t(n) * sizeof(T))); }
  // What is left of the temporaries, for a reduction's partial sums (take last).
  template <class T> Partials<T> partials() {
    const size_t at = (temp_used_ + 63) & ~size_t(63);
    return {reinterpret_cast<T*>(temp_base_ + at), int64_t(at < temp_cap_ ? (temp_cap_ - at) / sizeof(T) : 0)};
  }
  // Graph replay gate, called before an op's device work and after its arena
  // allocations: true = issue the work (eager, or being captured); false =
  // the replayed graph already holds it (and the call matched the capture).
  bool issue(uint64_t signature, const char* what);
  // C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, row-major with row strides
  // lda / ldb / ldc as stored: cpu::gemm's contract, through cuBLAS.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc);
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda, const double* B,
            int64_t ldb, double beta, double* C, int64_t ldc);
  GruPlan& gru_plan(int64_t T, int64_t B, int64_t I, int64_t H, DType d);
  // Whether gru_sequence of [*, B, *] with H units runs fused on this device,
  // and how (fused::device_plan, made once per shape). With honour_switch,
  // kernels::Options::fused_gru false (segtape/kernels.h) says no.
  fused::Plan fused_gru_plan(int64_t B, int64_t H, DType d, bool honour_switch = true);

 private:
  // gemm(float) under Precision::Bf16 (backend.cpp).
  void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc);
  bool in_graph_segment() const { return schedule_.in_graph_segment(); }
  void raise_device_errors();  // after a sync: what the kernels recorded
  void raise_pending();        // what segment_end could not throw
  void drop_graph() noexcept;
  void release() noexcept;

  Device device_;
  TapeOptions options_;
  std::string name_;  // "NVIDIA H200 (sm_90)"
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  // One device allocation: cuBLAS workspace, error record, scratch words, op temporaries.
  std::unique_ptr<Arena> internal_;
  // One pinned host allocation: the error flag, and tape.from()'s staging under graph replay.
  std::unique_ptr<Arena> pinned_;
  ErrorRecord* error_record_ = nullptr;
  int32_t* error_flag_ = nullptr;  // host pointer (mapped)
  int32_t* error_flag_device_ = nullptr;  // the same flag, as the kernels address it
  unsigned long long* scratch_word_ = nullptr;  // first_nonfinite's result
  std::byte* temp_base_ = nullptr;
  size_t temp_cap_ = 0, temp_used_ = 0;
  std::byte* staging_base_ = nullptr;
  // A graph launched since the stream was last waited for may still read
  // the staging: the host waits before it writes the staging again
  // (wait_for_staging), not at every segment's start.
  bool staging_busy_ = false;
  void wait();              // for the stream's work: the staging is free after it
  void wait_for_staging();  // wait() where a launched graph may still read the staging
  std::vector<std::unique_ptr<GruPlan>> gru_plans_;
  struct FusedPlan {
    int64_t B, H;
    DType dtype;
    fused::Plan plan;
  };
  std::vector<FusedPlan> fused_plans_;  // fused::device_plan, once per shape
  // CUDA graph replay (TapeOptions::graph_replay): the schedule and the
  // signatures (engine/graph_schedule.h, shared with the host-emulated
  // device), and the two graphs, one per segment parity: carried values
  // alternate between the two carry buffers, so a segment repeats the
  // addresses of the segment two before it.
  detail::GraphSchedule schedule_;
  std::array<cudaGraphExec_t, 2 * detail::GraphSchedule::kSlots> exec_{};  // GraphSchedule::graph_index()'s
  uint32_t segment_ = 0;
  std::string pending_;  // an error segment_end() could not throw
};

// op_table.cpp: every op but GruSequence. gru_sequence.cpp: GruSequence.
void forward_op(CudaBackend& be, Tape& tape, Node& n);
void backward_op(CudaBackend& be, Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst);
void gru_sequence_forward(CudaBackend& be, Tape& tape, Node& n);
void gru_sequence_backward(CudaBackend& be, Tape& tape, const Node& n, const void* gout,
                           const std::array<void*, Node::kMaxInputs>& dst);

}  // namespace segtape::cuda
