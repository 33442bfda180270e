// The packed-weight products (engine/cpu/packed.h): the kernel against a
// double reference and, to the bit, against the chain of FMAs it computes,
// over every block boundary and tail; and the GRU cell through it against
// float64 (which takes OpenBLAS), including a weight changed inside a
// segment. ctest runs this file three times: as is (the best kernel the CPU
// has), with --kernel packed=avx2 (kernels::Packed::Avx2: the AVX2 kernel,
// also on a CPU with AVX-512F), and with --kernel packed=off, where the same
// GRU checks run on OpenBLAS's GEMM (tests/kernels_main.cpp sets them).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include <cblas.h>

#include "cpu/packed.h"
#include "ops/op.h"
#include "segtape/blas.h"
#include "segtape/kernels.h"
#include "segtape/update.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

bool packed_off() { return kernels::options().packed == kernels::Packed::Off; }

// Each element of C is, per block of the inner dimension (cpu::packed_k_block),
// one chain of FMAs in k order from zero, added to C (beta 1 or a later
// block) — the same bits from the AVX-512 and the AVX2 kernel.
TEST(PackedGemm, EqualsADoubleReferenceAndItsFmaChainAtEveryBlockBoundaryAndTail) {
  if (!cpu::packed_available()) GTEST_SKIP() << "no AVX-512F or AVX2 + FMA here (or kernels::Packed::Off): the packed kernel never runs";
  SCOPED_TRACE(std::string("kernel ") + cpu::packed_kernel());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  int checked = 0;
  for (int64_t M : {1, 2, 3, 4, 11, 12, 13, 25, 64})
    for (int64_t N : {1, 17, 31, 32, 33, 100, 129})
      for (int64_t K : {1, 7, 768, 769, 1100})
        for (int form = 0; form < 4; ++form)  // W^T, W, and each with A given transposed
          for (float beta : {0.0f, 1.0f}) {
            const bool trans = form % 2 == 0, trans_a = form >= 2;
            const int64_t lda = K + 3, ldc = N + 5;
            std::vector<float> A(size_t(M * lda)), W(size_t(K * N)), C(size_t(M * ldc));
            for (float& v : A) v = u(rng);
            for (float& v : W) v = u(rng);
            for (float& v : C) v = u(rng);
            const std::vector<float> C0 = C;
            std::vector<float> P(cpu::packed_floats(K, N) + 16);
            float* p = P.data();
            while (reinterpret_cast<uintptr_t>(p) % 64) ++p;  // pack_b wants 64-byte alignment
            cpu::pack_b(W.data(), K, N, trans, p);
            if (trans_a) {  // the same A, laid out as A^T [K, M] with row stride M + 2
              std::vector<float> At(size_t(K * (M + 2)));
              for (int64_t i = 0; i < M; ++i)
                for (int64_t k = 0; k < K; ++k) At[size_t(k * (M + 2) + i)] = A[size_t(i * lda + k)];
              cpu::packed_gemm(M, N, K, At.data(), M + 2, p, beta, C.data(), ldc, true);
            } else {
              cpu::packed_gemm(M, N, K, A.data(), lda, p, beta, C.data(), ldc);
            }
            for (int64_t i = 0; i < M; ++i) {
              for (int64_t j = 0; j < ldc; ++j) {
                const float got = C[size_t(i * ldc + j)];
                if (j >= N) {  // past the product's columns: untouched
                  ASSERT_EQ(got, C0[size_t(i * ldc + j)]) << "M " << M << " N " << N << " K " << K << " column " << j;
                  continue;
                }
                double ref = beta * double(C0[size_t(i * ldc + j)]), mag = std::abs(ref);
                float chain = beta * C0[size_t(i * ldc + j)];
                for (int64_t k0 = 0, kb = cpu::packed_k_block(K); k0 < K; k0 += kb) {
                  float block = 0.0f;
                  for (int64_t k = k0; k < std::min(K, k0 + kb); ++k) {
                    const float b = trans ? W[size_t(j * K + k)] : W[size_t(k * N + j)];
                    block = std::fma(A[size_t(i * lda + k)], b, block);
                    ref += double(A[size_t(i * lda + k)]) * b;
                    mag += std::abs(double(A[size_t(i * lda + k)]) * b);
                  }
                  chain = k0 == 0 && beta == 0.0f ? block : block + chain;
                }
                const auto at = [&] {
                  return "M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) + (trans ? " W^T" : " W") +
                         (trans_a ? ", A^T" : "") + " beta " + std::to_string(int(beta)) + " at (" + std::to_string(i) + ", " +
                         std::to_string(j) + ")";
                };
                ASSERT_NEAR(got, ref, 1e-6 * mag + 1e-6) << at();
                ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(chain)) << at() << ": " << got << " against the chain's " << chain;
              }
            }
            ++checked;
          }
  EXPECT_EQ(checked, 9 * 7 * 5 * 8);
}

TEST(PackedGemm, TheKernelTheOptionsAskFor) {
  const std::string kernel = cpu::packed_kernel(), asked = kernels::option_text("packed");
  EXPECT_TRUE(kernel == "avx512" || kernel == "avx2" || kernel == "none") << kernel;
  EXPECT_EQ(cpu::packed_available(), kernel != "none");
  std::string expected;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  expected = asked == "avx2" ? (avx2 ? "avx2" : "none") : __builtin_cpu_supports("avx512f") ? "avx512" : avx2 ? "avx2" : "none";
#else
  expected = "none";
#endif
  if (asked == "off") expected = "none";
  EXPECT_EQ(kernel, expected) << "kernels::Options::packed " << asked;
  EXPECT_EQ(segtape::packed_kernel(), kernel) << "segtape/blas.h reports the same";
}

// The switch is read at each product: set inside a running program, it
// chooses the next one's kernel, and a Scope puts the one before back.
TEST(PackedGemm, TheOptionsChooseWhileTheProgramRuns) {
  const std::string before = cpu::packed_kernel();
  {
    kernels::Options o = kernels::options();
    o.packed = kernels::Packed::Off;
    const kernels::Scope off(o);
    EXPECT_STREQ(cpu::packed_kernel(), "none");
    EXPECT_FALSE(cpu::packed_worthwhile(32, 384, 128));
    kernels::set_option("packed", "avx2");
    EXPECT_EQ(kernels::options().packed, kernels::Packed::Avx2);
  }
  EXPECT_EQ(cpu::packed_kernel(), before);
  EXPECT_THROW(kernels::set_option("packed", "0"), Error);
  EXPECT_EQ(cpu::packed_kernel(), before) << "a refused value changes nothing";
}

TEST(PackedGemm, TakenWhereTheKernelRuns) {
  EXPECT_EQ(cpu::packed_worthwhile(1, 384, 128), cpu::packed_available());  // packed at the kPackAfter-th product of a pass
  EXPECT_EQ(cpu::packed_worthwhile(3, 384, 128), cpu::packed_available());
  EXPECT_FALSE(cpu::packed_worthwhile(32, 384, 0));  // an empty inner dimension: BLAS sets C = beta C
  EXPECT_EQ(cpu::packed_worthwhile(4, 384, 128), cpu::packed_available());
  EXPECT_EQ(cpu::packed_worthwhile(32, 384, 128), cpu::packed_available());
  if (packed_off()) {
    EXPECT_FALSE(cpu::packed_available());
  }
}

// A GRU cell's weights and T steps of inputs x_t and loss weights c_t (loss sum_t <h_t, c_t>).
struct Gru {
  Tensor w_ih, w_hh, b_ih, b_hh;
  std::vector<double> x, c;
  int64_t B, I, H, T;
  Gru(Tape& tape, DType dt, int64_t B_, int64_t I_, int64_t H_, int64_t T_) : B(B_), I(I_), H(H_), T(T_) {
    std::mt19937 rng(unsigned(B * 1000 + H));
    const double s = 1.0 / std::sqrt(double(H));  // PyTorch's scale: a well-conditioned recurrence
    w_ih = tape.parameter({3 * H, I}, dt), w_hh = tape.parameter({3 * H, H}, dt), b_ih = tape.parameter({3 * H}, dt),
    b_hh = tape.parameter({3 * H}, dt);
    for (Tensor* p : {&w_ih, &w_hh, &b_ih, &b_hh}) fill_uniform(*p, rng, -s, s);
    std::uniform_real_distribution<double> u(-1, 1);
    x.resize(size_t(T * B * I)), c.resize(size_t(T * B * H));
    for (double& v : x) v = u(rng);
    for (double& v : c) v = u(rng);
  }
  Tensor input(Tape& tape, const std::vector<double>& v, int64_t t, int64_t n, const Shape& s, DType dt) const {
    std::vector<double> d(v.begin() + t * n, v.begin() + (t + 1) * n);
    if (dt == DType::F64) return tape.from(std::span<const double>(d), s);
    std::vector<float> f(d.begin(), d.end());
    return tape.from(std::span<const float>(f), s);
  }
};

std::vector<double> grads(const Gru& g) {
  std::vector<double> out;
  for (const Tensor* p : {&g.w_ih, &g.w_hh, &g.b_ih, &g.b_hh}) {
    const std::vector<double> v = values(p->grad_tensor());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Float32 through the packed weights (where the kernel runs) against float64
// through OpenBLAS, on shapes that cover a partial panel (3H and H not
// multiples of 32), row blocks of every size, and the inner dimension cut
// into blocks (H = 800 forward, 3H > 768 backward).
TEST(PackedGru, Float32EqualsFloat64InValuesAndGradients) {
  // B = 1 and 3 over 3 steps take BLAS throughout; over 12 steps they pack
  // at the kPackAfter-th (forward and backward).
  static_assert(cpu::kPackAfter < 12);
  const int64_t shapes[][4] = {{1, 5, 70, 3},  {1, 5, 70, 12},   {3, 4, 33, 3}, {3, 4, 33, 12},
                               {5, 7, 13, 4}, {13, 3, 40, 4}, {24, 16, 300, 3}, {6, 4, 800, 2}};
  for (const auto& s : shapes) {
    const int64_t B = s[0], I = s[1], H = s[2], T = s[3];
    std::vector<double> h32, h64, g32, g64;
    for (DType dt : {DType::F32, DType::F64}) {
      Tape tape;
      Gru g(tape, dt, B, I, H, T);
      {
        Segment seg = tape.segment();
        std::vector<double>& hs = dt == DType::F32 ? h32 : h64;
        Tensor h = tape.zeros({B, H}, dt), loss;
        for (int64_t t = 0; t < T; ++t) {
          h = gru_cell(g.input(tape, g.x, t, B * I, {B, I}, dt), h, g.w_ih, g.w_hh, g.b_ih, g.b_hh);
          const std::vector<double> v = values(h);
          hs.insert(hs.end(), v.begin(), v.end());
          const Tensor term = sum(mul(h, g.input(tape, g.c, t, B * H, {B, H}, dt)));
          loss = t == 0 ? term : add(loss, term);
        }
        seg.backward(loss);
      }
      (dt == DType::F32 ? g32 : g64) = grads(g);
      if (dt == DType::F32 && cpu::packed_worthwhile(B, 3 * H, H) && (B >= cpu::kFewRows || T >= cpu::kPackAfter)) {
        EXPECT_GE(tape.stats().workspace_bytes, cpu::packed_floats(H, 3 * H) * sizeof(float))
            << "the packed W_hh is in the tape's workspace";
      }
    }
    const std::string at = "B " + std::to_string(B) + " I " + std::to_string(I) + " H " + std::to_string(H);
    EXPECT_LT(rel_error(h32, h64), 2e-6) << at;
    EXPECT_LT(rel_error(g32, g64), 1e-5) << at;
  }
}

// With fewer than kFewRows rows a weight is packed at its kPackAfter-th
// product of a pass, and the products before take BLAS: a short segment
// never pays for packing. Every step's state agrees with float64 either way.
TEST(PackedGru, FewRowsPackAtTheProductThatPays) {
  if (!cpu::packed_available()) GTEST_SKIP() << "no AVX-512F or AVX2 + FMA here (or kernels::Packed::Off): nothing is packed";
  constexpr int64_t I = 5, H = 40, T = cpu::kPackAfter + 3;
  for (int64_t B : {1, 3}) {
    Tape tape, tape64;
    Gru g(tape, DType::F32, B, I, H, T), g64(tape64, DType::F64, B, I, H, T);
    Segment seg = tape.segment(), seg64 = tape64.segment();
    NoGradGuard ng(tape), ng64(tape64);
    Tensor h = tape.zeros({B, H}), h64 = tape64.zeros({B, H}, DType::F64);
    size_t workspace = 0;  // the op scratch (from the first step) and the packed copies
    for (int64_t t = 0; t < T; ++t) {
      h = gru_cell(g.input(tape, g.x, t, B * I, {B, I}, DType::F32), h, g.w_ih, g.w_hh, g.b_ih, g.b_hh);
      h64 = gru_cell(g64.input(tape64, g64.x, t, B * I, {B, I}, DType::F64), h64, g64.w_ih, g64.w_hh, g64.b_ih, g64.b_hh);
      const size_t now = tape.stats().workspace_bytes;
      if (t > 0) {
        const size_t grown = now - workspace;
        if (t + 1 == cpu::kPackAfter)
          EXPECT_GE(grown, (cpu::packed_floats(H, 3 * H) + cpu::packed_floats(I, 3 * H)) * sizeof(float))
              << "B " << B << ": W_hh and W_ih are packed at product " << cpu::kPackAfter;
        else
          EXPECT_EQ(grown, 0u) << "B " << B << ", product " << t + 1 << ": packed only at product " << cpu::kPackAfter;
      }
      workspace = now;
      EXPECT_LT(rel_error(values(h), values(h64)), 2e-6) << "B " << B << " step " << t;
    }
  }
}

// With more than one OpenBLAS thread, a batch of weight gradients too small
// for the threads to pay (B = 1 and 3 over 12 steps) takes segtape's
// one-thread kernel, x and h packed into the batch's workspace; the
// gradients agree with float64 (OpenBLAS) either way.
TEST(PackedGru, SmallWeightGradientsTakeOneThreadWhereOpenBlasHasMore) {
  struct Restore {
    int n;
    ~Restore() { openblas_set_num_threads(n); }
  } restore{openblas_get_num_threads()};
  constexpr int64_t I = 5, H = 40, T = 12;
  for (int64_t B : {1, 3}) {
    // float32 on one and on two OpenBLAS threads, then float64 on one
    std::vector<double> g[3];
    size_t batch_peak[3] = {};  // the high-water of backward's GRU batch arena
    bool two_threads = false;
    for (int run = 0; run < 3; ++run) {
      openblas_set_num_threads(run == 1 ? 2 : 1);
      if (run == 1) {
        two_threads = openblas_get_num_threads() > 1;  // an OpenBLAS built for one thread stays at one
        EXPECT_EQ(cpu::threads_do_not_pay(3 * H, H, B * T), two_threads && cpu::packed_available());
      }
      const DType dt = run == 2 ? DType::F64 : DType::F32;
      Tape tape;
      Gru gru(tape, dt, B, I, H, T);
      {
        Segment seg = tape.segment();
        Tensor h = tape.zeros({B, H}, dt), loss;
        for (int64_t t = 0; t < T; ++t) {
          h = gru_cell(gru.input(tape, gru.x, t, B * I, {B, I}, dt), h, gru.w_ih, gru.w_hh, gru.b_ih, gru.b_hh);
          const Tensor term = sum(mul(h, gru.input(tape, gru.c, t, B * H, {B, H}, dt)));
          loss = t == 0 ? term : add(loss, term);
        }
        seg.backward(loss);
      }
      batch_peak[run] = detail::cpu_cells(tape)->batch.open[0].buffers.peak();
      g[run] = grads(gru);
    }
    EXPECT_LT(rel_error(g[0], g[2]), 1e-5) << "B " << B << ", one thread";
    EXPECT_LT(rel_error(g[1], g[2]), 1e-5) << "B " << B << ", two threads";
    if (two_threads && cpu::packed_available()) {
      // dgh^T and the packed h (and dgi^T and x) in the batch's arena, beside what one thread holds there
      EXPECT_GT(batch_peak[1], batch_peak[0]) << "B " << B << ": the weight gradients took segtape's kernel";
    }
  }
}

// A stack of L GRU layers meets its layers' cells in turn in backward (layer
// L-1 at step t, ..., layer 0, then step t - 1): each layer keeps a batch of
// its own (CellBatches), up to CellBatches::kOpen open at once; with more
// layers the next batch in turn is flushed and taken. Two and six layers
// (float64): the weight gradients equal per-step ones to rounding, and with
// two layers each layer opened a batch of its own (both batches' arenas
// used, each sized for several steps' rows of dgi, dgh, x and h; with one
// batch for all, the second was never opened).
TEST(PackedGru, EachLayerOfAStackKeepsItsOwnWeightGradientBatch) {
  constexpr int64_t B = 3, H = 6, T = 9;
  for (int64_t L : {2, 6}) {
    std::vector<double> g[2];
    for (int batched = 0; batched < 2; ++batched) {
      Tape tape(Device::cpu(), {.batch_weight_grads = batched == 1});
      std::mt19937 rng(11);
      std::vector<Tensor> w;
      for (int64_t l = 0; l < L; ++l)
        for (const Shape& s : {Shape{3 * H, H}, Shape{3 * H, H}, Shape{3 * H}, Shape{3 * H}}) {
          w.push_back(tape.parameter(s, DType::F64));
          fill_uniform(w.back(), rng);
        }
      Tensor x = tape.parameter({B, H}, DType::F64);
      fill_uniform(x, rng);
      {
        Segment seg = tape.segment();
        std::vector<Tensor> h(size_t(L), tape.zeros({B, H}, DType::F64));
        Tensor loss;
        for (int64_t t = 0; t < T; ++t) {
          Tensor in = scale(x, 1.0 + 0.1 * double(t));
          for (int64_t l = 0; l < L; ++l) {
            const auto k = size_t(4 * l);
            in = h[size_t(l)] = gru_cell(in, h[size_t(l)], w[k], w[k + 1], w[k + 2], w[k + 3]);
          }
          loss = t ? add(loss, mean(mul(in, in))) : mean(mul(in, in));
        }
        seg.backward(loss);
      }
      for (const Tensor& t : w)
        for (double v : values(t.grad_tensor())) g[batched].push_back(v);
      if (batched && L == 2) {
        const size_t step_rows = size_t(B * (3 * H + 3 * H + H + H)) * sizeof(double);
        for (int i = 0; i < 2; ++i)
          EXPECT_GT(detail::cpu_cells(tape)->batch.open[size_t(i)].buffers.peak(), 2 * step_rows) << "layer batch " << i;
      }
    }
    EXPECT_LE(rel_error(g[0], g[1]), 1e-13) << L << " layers";
  }
}

// An optimizer step between two products of one segment: the second product
// uses the new weights (the packed copy is made again), exactly as a fresh
// segment computes it.
TEST(PackedGru, AWeightAnOptimizerChangedInsideTheSegmentIsPackedAgain) {
  constexpr int64_t B = 8, I = 5, H = 48;
  Tape tape;
  Gru g(tape, DType::F32, B, I, H, 1);
  for (Tensor* p : {&g.w_ih, &g.w_hh, &g.b_ih, &g.b_hh})
    for (float& v : p->grad_tensor().span<float>()) v = 0.5f;  // a gradient to step on
  std::vector<double> before, after, fresh;
  {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    const Tensor x = g.input(tape, g.x, 0, B * I, {B, I}, DType::F32), h0 = tape.zeros({B, H});
    before = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
    for (Tensor* p : {&g.w_ih, &g.w_hh}) sgd_step(*p, Tensor{}, {.lr = 0.1}, true);
    after = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
  }
  {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    const Tensor x = g.input(tape, g.x, 0, B * I, {B, I}, DType::F32), h0 = tape.zeros({B, H});
    fresh = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
  }
  EXPECT_GT(rel_error(before, after), 1e-3) << "the step changed the weights";
  EXPECT_EQ(after, fresh);
}

// A write (or a data<T>() access) of another tensor inside a pass leaves
// every product on the path its place in the pass chose: at B = 1 the 8th
// product still packs, so a pass with such accesses gives the bits of one
// without them (a replay reproduces its first pass). Dropping every packed
// copy on any write, as b8abbf5 did, restarted the count.
TEST(PackedGru, AnotherTensorsWriteLeavesThePathOfEachProduct) {
  if (!cpu::packed_available()) GTEST_SKIP() << "no AVX-512F or AVX2 + FMA here (or kernels::Packed::Off): nothing is packed";
  constexpr int64_t B = 1, I = 5, H = 40, T = cpu::kPackAfter + 3;
  auto run = [&](bool touch) {
    Tape tape;
    Gru g(tape, DType::F32, B, I, H, T);
    const Tensor other = tape.persistent({4});
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    Tensor h = tape.zeros({B, H});
    std::vector<double> out;
    const size_t workspace = tape.stats().workspace_bytes;
    for (int64_t t = 0; t < T; ++t) {
      if (touch) other.data<float>()[0] = float(t), fill_value(other, 1.0);
      h = gru_cell(g.input(tape, g.x, t, B * I, {B, I}, DType::F32), h, g.w_ih, g.w_hh, g.b_ih, g.b_hh);
      for (double v : values(h)) out.push_back(v);
    }
    return std::pair{out, tape.stats().workspace_bytes - workspace};
  };
  const auto [plain, packed_plain] = run(false);
  const auto [touched, packed_touched] = run(true);
  EXPECT_GE(packed_plain, cpu::packed_floats(H, 3 * H) * sizeof(float)) << "W_hh packed at product " << cpu::kPackAfter;
  EXPECT_EQ(packed_plain, packed_touched) << "the touched pass packed as the plain one";
  EXPECT_EQ(plain, touched);
}

// Every other write into a weight inside a segment (copy_into, from_host,
// from_host_bytes, fill_value, add_scalar, through data<T>(), through a
// recorded view of it) marks its packed copy stale too: the next product
// reads the new values, as a fresh segment's does. (Each wrote into a weight
// whose stale copy the next product used, the view until 4273803.)
TEST(PackedGru, AWeightWrittenInsideTheSegmentIsPackedAgain) {
  if (!cpu::packed_available()) GTEST_SKIP() << "no AVX-512F or AVX2 + FMA here (or kernels::Packed::Off): nothing is packed";
  constexpr int64_t B = 8, I = 5, H = 48;
  const std::vector<const char*> writes = {"copy_into", "from_host", "from_host_bytes", "fill_value", "add_scalar", "data", "view"};
  for (const char* how : writes) {
    Tape tape;
    Gru g(tape, DType::F32, B, I, H, 1);
    const Tensor other = tape.parameter(g.w_hh.shape);
    std::vector<float> vals(size_t(g.w_hh.numel()));
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.01f * float(i % 17) - 0.08f;
    other.from_host(std::span<const float>(vals));
    auto write = [&](const Tensor& w) {
      const std::string s = how;
      if (s == "copy_into") copy_into(w, other);
      else if (s == "from_host") w.from_host(std::span<const float>(vals));
      else if (s == "from_host_bytes") w.from_host_bytes(std::as_bytes(std::span<const float>(vals)));
      else if (s == "fill_value") fill_value(w, 0.03);
      else if (s == "data") std::copy(vals.begin(), vals.end(), w.data<float>());
      else if (s == "view") {  // its bytes, another tensor: a recorded view lives in the segment
        const Tensor v = reshape(w, {w.numel()});
        EXPECT_EQ(v.space, Space::Segment);
        v.from_host(std::span<const float>(vals));
      }
      else add_scalar(w, 0.03);
    };
    const std::vector<float> hv(size_t(B * H), 0.5f);
    std::vector<double> before, after, fresh;
    {
      Segment seg = tape.segment();
      std::optional<NoGradGuard> ng;
      if (std::string(how) != "view") ng.emplace(tape);  // (a view of a weight is recorded, in the segment, with grad on)
      const Tensor x = g.input(tape, g.x, 0, B * I, {B, I}, DType::F32), h0 = tape.from(std::span<const float>(hv), {B, H});
      const size_t workspace = tape.stats().workspace_bytes;
      before = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
      EXPECT_GE(tape.stats().workspace_bytes - workspace, cpu::packed_floats(H, 3 * H) * sizeof(float)) << "W_hh was packed";
      write(g.w_hh);
      after = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
    }
    {
      Segment seg = tape.segment();
      NoGradGuard ng(tape);
      const Tensor x = g.input(tape, g.x, 0, B * I, {B, I}, DType::F32), h0 = tape.from(std::span<const float>(hv), {B, H});
      fresh = values(gru_cell(x, h0, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
    }
    EXPECT_GT(rel_error(before, after), 1e-3) << how << " changed W_hh";
    EXPECT_EQ(after, fresh) << how;
  }
}

}  // namespace
