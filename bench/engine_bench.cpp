// Engine micro-benchmarks: ns per op (forward, inside a no-grad segment),
// one GRU-cell step forward + backward, and a training step of a 2-layer
// LSTM and GRU. Benchmarks only: no test asserts time.
#include <benchmark/benchmark.h>

#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "segtape/nn/layers.h"
#include "segtape/nn/optim.h"
#include "segtape/ops.h"

using namespace segtape;

namespace {

void fill(const Tensor& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (float& v : t.span<float>()) v = u(rng);
}

// Runs `op` repeatedly inside one segment, re-opening the segment when the
// arena fills, so what is timed is the op, not memory management.
template <class F>
void run_op(benchmark::State& state, int64_t rows, int64_t cols, F op) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 20});
  Tensor a = tape.parameter({rows, cols}), b = tape.parameter({rows, cols});
  fill(a, 1), fill(b, 2);
  for (auto _ : state) {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    for (int i = 0; i < 64; ++i) benchmark::DoNotOptimize(op(a, b).ptr);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}

void BM_add(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto& b) { return add(a, b); }); }
void BM_mul(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto& b) { return mul(a, b); }); }
void BM_tanh(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto&) { return tanh(a); }); }
void BM_sigmoid(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto&) { return sigmoid(a); }); }
void BM_softmax(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto&) { return softmax(a); }); }
void BM_matmul(benchmark::State& s) { run_op(s, s.range(0), s.range(1), [](auto& a, auto& b) { return matmul(a, b, false, true); }); }
BENCHMARK(BM_add)->Args({1, 128})->Args({32, 512});
BENCHMARK(BM_mul)->Args({1, 128})->Args({32, 512});
BENCHMARK(BM_tanh)->Args({1, 128})->Args({32, 512});
BENCHMARK(BM_sigmoid)->Args({1, 128})->Args({32, 512});
BENCHMARK(BM_softmax)->Args({1, 128})->Args({32, 512});
BENCHMARK(BM_matmul)->Args({1, 128})->Args({32, 512});

// Segments of K = 32 GRU steps, forward + backward, the state carried; `cell`
// maps (x, h) to the next h. Reports time per step.
template <class Cell>
void run_gru_segments(benchmark::State& state, Tape& tape, int64_t B, int64_t I, int64_t H, Cell cell) {
  constexpr int64_t K = 32;
  std::vector<float> x(size_t(B * I), 0.1f);
  Tensor h = tape.persistent({B, H});
  int64_t steps = 0;
  for (auto _ : state) {
    Segment seg = tape.segment();
    Tensor loss;
    for (int64_t t = 0; t < K; ++t) {
      h = cell(tape.from(std::span<const float>(x), {B, I}), h);
      Tensor l = mean(h);
      loss = t ? add(loss, l) : l;
    }
    seg.backward(loss);
    h = seg.carry(h);
    steps += K;
  }
  state.counters["us_per_step"] = benchmark::Counter(double(steps), benchmark::Counter::kIsRate | benchmark::Counter::kInvert,
                                                     benchmark::Counter::kIs1000);
  state.counters["segment_peak_bytes"] = double(tape.stats().last_segment_peak);
}

// One GRU-cell step through the raw engine op.
void BM_gru_step(benchmark::State& state) {
  const int64_t B = state.range(0), H = state.range(1), I = 32;
  Tape tape(Device::cpu(), {.segment_budget = 256 << 20});
  Tensor w_ih = tape.parameter({3 * H, I}), w_hh = tape.parameter({3 * H, H});
  Tensor b_ih = tape.parameter({3 * H}), b_hh = tape.parameter({3 * H});
  fill(w_ih, 1), fill(w_hh, 2), fill(b_ih, 3), fill(b_hh, 4);
  run_gru_segments(state, tape, B, I, H, [&](const Tensor& x, const Tensor& h) { return gru_cell(x, h, w_ih, w_hh, b_ih, b_hh); });
}
BENCHMARK(BM_gru_step)->Args({1, 128})->Args({32, 512})->Unit(benchmark::kMicrosecond);

// The same step through the module API (nn::GRUCell): it must cost what the raw op costs.
void BM_gru_step_module(benchmark::State& state) {
  const int64_t B = state.range(0), H = state.range(1), I = 32;
  Tape tape(Device::cpu(), {.segment_budget = 256 << 20});
  nn::Rng rng(1);
  nn::GRUCell cell(tape, rng, I, H);
  run_gru_segments(state, tape, B, I, H, [&](const Tensor& x, const Tensor& h) { return cell(x, h); });
}
BENCHMARK(BM_gru_step_module)->Args({1, 128})->Args({32, 512})->Unit(benchmark::kMicrosecond);

// A training step of a 2-layer recurrent net, nn::LSTM or nn::GRU (input
// and hidden size H, batch B), over a K = 32-step segment: forward over
// [K, B, H], a mean loss, backward, Adam. Reports us per time step and the
// rate of the step's products (per layer and time step 2 GEMMs forward and 4
// backward, each B x G x H multiply-adds with G = 4H gate rows for the LSTM,
// 3H for the GRU), so that the two cells compare per FLOP.
template <class Net>
void BM_rnn2_train_step(benchmark::State& state) {
  constexpr int64_t K = 32, L = 2;
  const int64_t B = state.range(0), H = state.range(1), G = (std::is_same_v<Net, nn::LSTM> ? 4 : 3) * H;
  Tape tape(Device::cpu(), {.segment_budget = size_t(512) << 20});
  nn::Rng rng(1);
  Net net(tape, rng, H, H, L);
  nn::Adam adam(net, {.lr = 1e-4});
  std::vector<float> x(size_t(K * B * H));
  std::mt19937 gen(2);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(gen);
  int64_t steps = 0;
  for (auto _ : state) {
    Segment seg = tape.segment();
    seg.backward(mean(net(tape.from(std::span<const float>(x), {K, B, H})).output));
    adam.step();
    adam.zero_grad();
    steps += K;
  }
  const double flops_per_step = double(L) * 6 * 2 * double(B) * double(G) * double(H);
  state.counters["us_per_step"] = benchmark::Counter(double(steps), benchmark::Counter::kIsRate | benchmark::Counter::kInvert,
                                                     benchmark::Counter::kIs1000);
  state.counters["GFLOPs"] = benchmark::Counter(double(steps) * flops_per_step * 1e-9, benchmark::Counter::kIsRate);
}
BENCHMARK_TEMPLATE(BM_rnn2_train_step, nn::LSTM)->Args({32, 256})->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_rnn2_train_step, nn::GRU)->Args({32, 256})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
