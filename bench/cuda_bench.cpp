// The benchmark workload of bench/workload.h on a GPU: GRUCell(I = 32, H) ->
// Linear(H, 16) -> cross-entropy, float32, segments of K = 32 steps with the
// state carried, one training step = forward + backward + SGD (lr 1e-3).
// SGD, not workload.h's Adam: on CUDA segtape's optimizer is written with
// engine ops (which have no sqrt), and both engines must run the same step.
//
// One source, two programs that never share a process (each engine brings
// its own CUDA runtime, cuBLAS and cuDNN):
//   cuda_bench         segtape: eager, and with CUDA-graph replay (modes
//                      eager, graph); and the segment's K steps as one
//                      gru_sequence op (sequence, sequence-graph; and
//                      sequence-graph-tf32, TapeOptions::allow_tf32)
//   cuda_bench_torch   LibTorch on CUDA (-DSEGTAPE_BENCH_TORCH_CUDA): eager,
//                      and the whole segment captured as a CUDA graph (eager,
//                      graph); and torch::nn::GRU over the segment's K steps,
//                      cuDNN's GRU, eager (cudnn-gru): PyTorch's fastest
//                      way to train this model when a segment's inputs are
//                      known up front, with cuDNN's TF32 default; and the
//                      same with TF32 off (cudnn-gru-fp32), segtape's precision
// The sequence modes compute the same loss (the sum over the K steps of
// each step's mean cross-entropy, as K times the mean over all K B rows).
// Each prints one CSV row per (mode, B, H):
//   engine,mode,B,H,us_per_step,engine_peak_bytes,engine_reserved_bytes,footprint_bytes,final_loss
// engine_peak: segtape's arena high-water / LibTorch's allocator peak of
// allocated bytes; engine_reserved: what the engine holds on the device
// (segtape: all its fixed pools; LibTorch: allocator reserved peak);
// footprint: the drop in the device's free memory from before the model was
// made to after the run (cudaMemGetInfo; includes cuBLAS / cuDNN handles).
//
//   cuda_bench [--segments N] [--sizes 1x128,32x128,32x512,64x1024,512x1024] [--modes eager,...,graph-bf16] [--device cpu]
//              [--fused-gru on|off] [--fused-gru-grid on|off]
// segtape's sequence modes run the fused GRU kernels where they fit (mode
// "sequence (fused)"; "sequence (fused grid)" where the grid plan runs, which
// takes --fused-gru-grid on: kernels::Options::fused_gru_grid, off by
// default), cuDNN's GRU elsewhere or with --fused-gru off
// (kernels::Options::fused_gru, segtape/kernels.h) ("sequence (cuDNN)").
// --device cpu (segtape only) runs the same segments on the CPU, where graph
// replay is ignored: a check without a GPU that every mode computes the same
// training (ctest cuda_bench_modes_agree compares their final losses); its
// times are not a benchmark of anything.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "workload_data.h"  // kI, kC, kK, Data: header-only, the inputs are the same in both programs

#ifdef SEGTAPE_BENCH_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>
#else
#include "cuda/fused_gru.h"  // engine-internal: which GRU a sequence mode runs
#include "segtape/kernels.h"
#include "segtape/ops.h"
#endif

namespace {

using segtape::bench::Data;
using segtape::bench::kC;
using segtape::bench::kI;
using segtape::bench::kK;
constexpr double kLr = 1e-3;

// Initial parameters, PyTorch's bounds: U(-1/sqrt(H), 1/sqrt(H)) for all.
std::vector<float> init(segtape::nn::Rng& rng, int64_t n, int64_t fan) {
  std::vector<float> v(static_cast<size_t>(n));
  const double b = 1.0 / std::sqrt(double(fan));
  for (float& x : v) x = float(rng.uniform(-b, b));
  return v;
}

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
}

using Clock = std::chrono::steady_clock;
bool g_cpu = false;  // --device cpu

enum class Mode { Eager, Graph, Sequence, SequenceGraph, SequenceGraphTf32, SequenceFp32, GraphBf16, SequenceGraphBf16 };

void row(const char* engine, const char* mode, int64_t B, int64_t H, double us, double peak, double reserved, double footprint,
         double loss) {
  std::printf("%s,%s,%lld,%lld,%.2f,%.0f,%.0f,%.0f,%.6f\n", engine, mode, (long long)B, (long long)H, us, peak, reserved,
              footprint, loss);
  std::fflush(stdout);
}

#ifndef SEGTAPE_BENCH_TORCH_CUDA
// ------------------------------------------------------------------ segtape
using namespace segtape;

struct Model {
  Tape tape;
  std::vector<Tensor> p;  // w_ih [3H, I], w_hh [3H, H], b_ih, b_hh [3H], w_out [C, H], b_out [C]
  Tensor h, loss;         // persistent: the carried state's start, the last segment's loss
  const Data& data;
  int64_t H;
  Model(int64_t H_, const Data& d, bool graph, size_t budget, bool tf32, bool bf16 = false)
      : tape(g_cpu ? Device::cpu() : Device::cuda(), [&] {
          TapeOptions o;
          o.segment_budget = budget;
          o.device_persistent = size_t(64) << 20;
          o.device_carry = size_t(4) << 20;
          o.device_workspace = size_t(32) << 20;
          o.graph_replay = graph;
          o.allow_tf32 = tf32;
          o.precision = bf16 ? Precision::Bf16 : Precision::F32;
          return o;
        }()),
        data(d),
        H(H_) {
    nn::Rng rng(1);
    const std::vector<Shape> shapes = {{3 * H, kI}, {3 * H, H}, {3 * H}, {3 * H}, {kC, H}, {kC}};
    for (size_t k = 0; k < shapes.size(); ++k) {
      p.push_back(tape.parameter(shapes[k]));
      const std::vector<float> v = init(rng, shapes[k].numel(), H);  // (the GRU's and the head's fan-in alike)
      p.back().from_host(std::span<const float>(v));
    }
    h = tape.persistent({d.B, H});
    loss = tape.persistent({1});
  }
  void segment() {
    Segment seg = tape.segment();
    Tensor total;
    const int64_t B = data.B;
    for (int64_t t = 0; t < kK; ++t) {
      Tensor x = tape.from(data.xt(t), {B, kI});
      Tensor y = tape.from(data.yt(t), {B});
      h = gru_cell(x, h, p[0], p[1], p[2], p[3]);
      Tensor l = cross_entropy(add(matmul(h, p[4], false, true), p[5]), y);
      total = t ? add(total, l) : l;
    }
    finish(seg, total);
  }
  // The K steps as one op: gru_sequence (cuDNN's GRU on CUDA), the head and
  // the loss over all K B rows at once.
  void sequence_segment() {
    Segment seg = tape.segment();
    const int64_t B = data.B;
    Tensor x = tape.from(std::span<const float>(data.x), {kK, B, kI});
    Tensor y = tape.from(std::span<const int64_t>(data.y), {kK * B});
    Tensor hs = gru_sequence(x, h, p[0], p[1], p[2], p[3]);  // [K, B, H]
    Tensor logits = add(matmul(reshape(hs, {kK * B, H}), p[4], false, true), p[5]);
    Tensor total = scale(cross_entropy(logits, y), double(kK));
    h = slice(hs, 0, kK - 1, 1);  // [1, B, H]: the last step's state
    h = reshape(h, {B, H});
    finish(seg, total);
  }
  void finish(Segment& seg, const Tensor& total) {
    seg.backward(total);
    {
      NoGradGuard ng(tape);
      for (const Tensor& w : p) copy_into(w, sub(w, scale(w.grad_tensor(), kLr)));
      copy_into(loss, reshape(total, {1}));
    }
    tape.zero_grad();
    h = seg.carry(h);
  }
};

// sequence-graph-tf32: sequence-graph with TapeOptions::allow_tf32 (cuBLAS
// and cuDNN may use TF32 tensor cores, PyTorch's cuDNN default; the fused
// kernels compute in float32 either way), beside LibTorch's cudnn-gru.
// graph-bf16 (run only where --modes names it: its loss is not float32's):
// graph with TapeOptions::precision bf16, every product on cuBLAS's bfloat16
// GEMM (docs/precision.md). sequence-graph-bf16 (likewise only where named):
// sequence-graph under bf16, the fused kernels with bfloat16 products where
// their plan fits, else the same cells as graph-bf16 (never cuDNN's GRU).
const std::vector<std::pair<Mode, const char*>> kModes = {{Mode::Eager, "eager"},
                                                          {Mode::Graph, "graph"},
                                                          {Mode::Sequence, "sequence"},
                                                          {Mode::SequenceGraph, "sequence-graph"},
                                                          {Mode::SequenceGraphTf32, "sequence-graph-tf32"},
                                                          {Mode::GraphBf16, "graph-bf16"},
                                                          {Mode::SequenceGraphBf16, "sequence-graph-bf16"}};

// The sequence modes name the GRU they ran: the fused kernels where their
// plan fits this GPU (engine/cuda/fused_gru.h) and --fused-gru is not off, else cuDNN's.
std::string mode_name(Mode mode, const char* name, int64_t B, int64_t H) {
  if (g_cpu || (mode != Mode::Sequence && mode != Mode::SequenceGraph && mode != Mode::SequenceGraphTf32 && mode != Mode::SequenceGraphBf16))
    return name;
  const cuda::fused::Plan p = cuda::fused::device_plan(B, H, sizeof(float));
  const bool fused = kernels::options().fused_gru && p.use && (!p.grid || kernels::options().fused_gru_grid);
  if (fused && p.grid)  // (stderr: the plan, beside the CSV)
    std::fprintf(stderr, "B=%lld H=%lld %s: fused grid plan %d groups of %lld rows x %d blocks of %lld units, %d lanes per output, tiles of %lld\n",
                 (long long)B, (long long)H, name, p.G, (long long)p.Bg, p.C, (long long)p.Hs, p.S, (long long)p.kt);
  else if (fused)
    std::fprintf(stderr, "B=%lld H=%lld %s: fused plan %d clusters of %d blocks, %lld rows each, %d lanes per output; %d clusters resident at once\n",
                 (long long)B, (long long)H, name, p.G, p.C, (long long)p.Bg, p.S, p.resident);
  else
    std::fprintf(stderr, "B=%lld H=%lld %s: %s (%s)\n", (long long)B, (long long)H, name,
                 mode == Mode::SequenceGraphBf16 ? "cells" : "cuDNN", p.why_not.c_str());
  return std::string(name) + (fused ? (p.grid ? " (fused grid)" : " (fused)") : mode == Mode::SequenceGraphBf16 ? " (cells)" : " (cuDNN)");
}

void run(int64_t B, int64_t H, int segments, Mode mode, const char* mode_label) {
  const std::string label = mode_name(mode, mode_label, B, H);
  const char* name = label.c_str();
  const Data data(B);
  const size_t free_before = free_device_bytes();
  const bool bf16 = mode == Mode::GraphBf16 || mode == Mode::SequenceGraphBf16;
  const bool graph = mode == Mode::Graph || mode == Mode::SequenceGraph || mode == Mode::SequenceGraphTf32 || bf16;
  const bool sequence = mode == Mode::Sequence || mode == Mode::SequenceGraph || mode == Mode::SequenceGraphTf32 || mode == Mode::SequenceGraphBf16;
  // The segment's arena: 512 MiB, or for one gru_sequence 24 times its K B H
  // outputs' bytes (at B 512, H 1024 its forward alone, cuDNN's reserve space
  // and workspace, asked for 679 MiB, 10.6 times: 512 MiB was too little).
  const size_t outputs = size_t(kK * B * H) * sizeof(float);
  Model m(H, data, graph, std::max(size_t(512) << 20, sequence ? 24 * outputs : 0), mode == Mode::SequenceGraphTf32, bf16);
  const auto one = [&] { sequence ? m.sequence_segment() : m.segment(); };
  for (int s = 0; s < 4; ++s) one();  // warm-up (and, with graphs, the two captures)
  m.tape.synchronize();
  const auto t0 = Clock::now();
  for (int s = 0; s < segments; ++s) one();
  m.tape.synchronize();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / double(segments * kK);
  const TapeStats st = m.tape.stats();
  row("segtape", name, B, H, us, double(st.last_segment_peak), double(st.device_bytes),
      double(free_before - free_device_bytes()), m.loss.item());
}

#else
// ------------------------------------------------------------------ LibTorch
// The stepped model (GRUCell, K steps), or with `sequence` torch::nn::GRU
// over the segment's K steps (cuDNN's GRU) and the head and the loss over all
// K B rows at once; SGD; the state carried detached.
struct Model {
  torch::nn::GRUCell cell;  // stepped (null with sequence)
  torch::nn::GRU gru;       // sequence (null otherwise)
  torch::nn::Linear head;
  std::unique_ptr<torch::optim::SGD> opt;
  torch::Tensor h, x, y, loss;
  Model(int64_t B, int64_t H, const Data& d, bool sequence)
      : cell(sequence ? torch::nn::GRUCell(nullptr) : torch::nn::GRUCell(kI, H)),
        gru(sequence ? torch::nn::GRU(torch::nn::GRUOptions(kI, H)) : torch::nn::GRU(nullptr)),
        head(H, kC) {
    if (sequence) gru->to(torch::kCUDA);
    else cell->to(torch::kCUDA);
    head->to(torch::kCUDA);
    std::vector<torch::Tensor> params = sequence ? gru->parameters() : cell->parameters();
    for (auto& q : head->parameters()) params.push_back(q);
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(kLr));
    const auto f = torch::TensorOptions().device(torch::kCUDA);
    h = sequence ? torch::zeros({1, B, H}, f) : torch::zeros({B, H}, f);
    loss = torch::zeros({}, f);
    x = torch::from_blob(const_cast<float*>(d.x.data()), {kK, B, kI}, torch::kFloat).to(torch::kCUDA);
    y = torch::from_blob(const_cast<int64_t*>(d.y.data()), {kK, B}, torch::kLong).to(torch::kCUDA);
    if (sequence) y = y.reshape({kK * B});
  }
  // forward + backward + SGD; the state and loss written in place (static
  // addresses, so the same code can be captured as a graph).
  void body() {
    torch::Tensor hh, total;
    if (!gru.is_empty()) {
      auto [out, h_last] = gru(x, h);  // out [K, B, H]
      total = torch::nn::functional::cross_entropy(head(out.reshape({-1, out.size(2)})), y) * double(kK);
      hh = h_last;
    } else {
      hh = h;
      for (int64_t t = 0; t < kK; ++t) {
        hh = cell(x[t], hh);
        torch::Tensor l = torch::nn::functional::cross_entropy(head(hh), y[t]);
        total = t ? total + l : l;
      }
    }
    total.backward();
    opt->step();
    torch::NoGradGuard ng;
    h.copy_(hh);
    loss.copy_(total);
  }
  void segment() {
    opt->zero_grad();
    body();
  }
};

// cudnn-gru as PyTorch runs it by default (torch.backends.cudnn.allow_tf32:
// TF32 tensor cores inside cuDNN's GRU), and with TF32 off: float32 FMA
// math, the precision of every other row here (segtape's cuDNN calls ask
// for CUDNN_FMA_MATH unless TapeOptions::allow_tf32).
const std::vector<std::pair<Mode, const char*>> kModes = {
    {Mode::Eager, "eager"}, {Mode::Graph, "graph"}, {Mode::Sequence, "cudnn-gru"}, {Mode::SequenceFp32, "cudnn-gru-fp32"}};

void run(int64_t B, int64_t H, int segments, Mode mode, const char* name) {
  const bool graph = mode == Mode::Graph;
  constexpr size_t kAggregate = 0;  // StatType::AGGREGATE; its namespace moved between releases
  const Data data(B);
  torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA));  // the context and allocator exist now
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  const size_t free_before = free_device_bytes();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(mode != Mode::SequenceFp32 && tf32);
  struct Restore {
    bool v;
    ~Restore() { at::globalContext().setAllowTF32CuDNN(v); }
  } restore{tf32};
  Model m(B, H, data, mode == Mode::Sequence || mode == Mode::SequenceFp32);
  // A side stream, as graph capture requires (eager uses it too, for the same conditions).
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(stream);
  for (int s = 0; s < 4; ++s) m.segment();  // warm-up (and cuDNN's plans)
  torch::cuda::synchronize();
  at::cuda::CUDAGraph g;
  if (graph) {
    // No gradient tensors before the capture: backward makes them inside the
    // graph's pool, and every replay overwrites them (zero_grad(set_to_none)).
    for (auto& group : m.opt->param_groups())
      for (auto& q : group.params()) q.mutable_grad().reset();
    g.capture_begin();
    m.body();
    g.capture_end();
    torch::cuda::synchronize();
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < segments; ++s) graph ? g.replay() : m.segment();
  torch::cuda::synchronize();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / double(segments * kK);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  row("libtorch", name, B, H, us, double(stats.allocated_bytes[kAggregate].peak),
      double(stats.reserved_bytes[kAggregate].peak), double(free_before - free_device_bytes()), m.loss.item<double>());
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int segments = 50;
  std::string only;  // --modes a,b: only these modes (by name)
  // The sizes of issue 19's targets.
  std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 128}, {32, 128}, {32, 512}, {64, 1024}, {512, 1024}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--segments") segments = std::atoi(argv[i + 1]);
    else if (a == "--device") g_cpu = std::string(argv[i + 1]) == "cpu";
    else if (a == "--modes") only = "," + std::string(argv[i + 1]) + ",";
#ifndef SEGTAPE_BENCH_TORCH_CUDA
    else if (a == "--fused-gru") {
      try {
        segtape::kernels::set_option("fused_gru", argv[i + 1]);
      } catch (const segtape::Error& e) {
        std::fprintf(stderr, "cuda_bench: --fused-gru: %s\n", e.what());
        return 2;
      }
    } else if (a == "--fused-gru-grid") {
      try {
        segtape::kernels::set_option("fused_gru_grid", argv[i + 1]);
      } catch (const segtape::Error& e) {
        std::fprintf(stderr, "cuda_bench: --fused-gru-grid: %s\n", e.what());
        return 2;
      }
    }
#endif
    else if (a == "--sizes") {
      sizes.clear();
      std::string s = argv[i + 1];
      size_t at = 0;
      while (at < s.size()) {
        const size_t end = s.find(',', at) == std::string::npos ? s.size() : s.find(',', at);
        const std::string one = s.substr(at, end - at);
        const size_t x = one.find('x');
        sizes.push_back({std::atoll(one.substr(0, x).c_str()), std::atoll(one.substr(x + 1).c_str())});
        at = end + 1;
      }
    }
  }
#ifdef SEGTAPE_BENCH_TORCH_CUDA
  if (g_cpu) {
    std::fprintf(stderr, "cuda_bench_torch: --device cpu is cuda_bench's (segtape's) check; LibTorch runs on CUDA here\n");
    return 2;
  }
#endif
  std::printf("engine,mode,B,H,us_per_step,engine_peak_bytes,engine_reserved_bytes,footprint_bytes,final_loss\n");
  int failures = 0;
  for (const auto& [B, H] : sizes)
    for (const auto& [mode, name] : kModes) {
      if (only.empty() ? mode == Mode::GraphBf16 || mode == Mode::SequenceGraphBf16 : only.find("," + std::string(name) + ",") == std::string::npos) continue;
      try {
        run(B, H, segments, mode, name);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "B=%lld H=%lld %s: %s\n", (long long)B, (long long)H, name, e.what());
        ++failures;
      }
    }
  return failures ? 1 : 0;
}
