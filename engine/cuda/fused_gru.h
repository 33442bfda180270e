// Engine-internal: the fused GRU sequence (gru_sequence on CUDA where the
// shapes fit): the recurrence of a whole segment in one persistent launch
// forward and one in reverse, W_hh held in shared memory across the steps.
//
// Layout. G thread-block clusters of C blocks each (C in 1, 2, 4, 8). The
// rows are independent until the weight gradients (GEMMs after the launch),
// so cluster g takes the Bg rows [g Bg, (g + 1) Bg) of the B, B = G Bg, with
// no exchange between clusters; within a cluster block c owns hidden units
// [c Hs, (c + 1) Hs), Hs = H / C. Each (row b, unit j) is one
// output, computed by a group of S lanes (S a power of two <= 32) that split
// the dot product's terms (lane l takes the terms l, l + S, ...) and sum them
// by a butterfly (lane l adds lane l ^ o's partial, o = S/2 .. 1).
//
//   forward, per step t:  gh = h W_hh^T for the block's 3 Hs rows (r, z, n of its units);
//                         the gates (gi = x W_ih^T from one GEMM over all T steps,
//                         made before the launch) -> h' for its units, saved gates;
//                         h' published in the block's shared memory; cluster barrier;
//                         every block gathers the whole h' from the cluster's blocks.
//   backward, per step t (reverse): dh = gout[t] + the carried dh; the gate
//                         gradients for its units (dgi, dgh to global memory for the
//                         weight GEMMs after the launch); dgh published; barrier;
//                         gathered; carried dh = dh z + dgh W_hh for its units
//                         (W_hh's columns of its units, held transposed).
//
// Per-stream resets (gru_sequence's `keep`, [T, B]): the state entering step
// t is keep[t, b] h_{t-1} (h0 at t = 0): 1 carries it, 0 starts an episode
// from zero, inside the launch and without cutting the segment. Forward
// scales each row of h as it is loaded (h0) or gathered (h_t, for step t + 1);
// backward takes that masked state as the step's h_{t-1} (its z term, and the
// rows of the dW_hh GEMM, written to `hk`), and scales the carried dL/dh by
// keep[t, b] as it leaves step t for step t - 1 (and dh0).
//
// The grid plan (Plan::grid), where W_hh and the state do not fit one
// cluster: C blocks of a cooperative launch (all resident at once, any
// compute capability with cooperative launches) each hold their units' rows
// of W_hh (forward) or columns (backward) in shared memory, as above, but
// the step's shared vector is not gathered into every block: it stays in
// global memory (L2), where the step's owners wrote it (y[t] forward, dgh[t]
// backward: each step's at addresses of its own, so no slot is reused), and
// each block streams it through a tile of `kt` elements per row. One
// grid-wide barrier per step (cooperative_groups' grid sync), no cluster;
// G groups of Bg rows as above, G C blocks in all.
//
//   forward, per step t:  for each tile of the state entering step t (h0 or
//                         y[t-1], scaled by keep): load, partial sums; lane 0
//                         finishes its output (y[t], the saved gates); grid barrier.
//   backward, per step t: lane 0's gate gradients (dgi, dgh[t]); grid barrier;
//                         for each tile of dgh[t]'s rows: load, partial sums of
//                         dgh W_hh; the carried dh.
//
// Precision::Bf16 (Args::bf16, float only): the products are the composed
// cells' bfloat16 GEMMs (gemm_bf16): W_hh rounded to bfloat16 as it is
// loaded, each operand of the step's product (the state forward, dgh
// backward) rounded as it is read, the float sum rounded to bfloat16 before
// it is used; the state, the gates and every sum stay float.
//
// The per-thread work below is written once, for the host (a host simulation
// of the whole cluster or grid, tests/fused_gru_test.cpp, in every build) and
// for the kernels (fused_gru.cu). Compiled by g++ (C++20) and nvcc (C++17).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "hd.h"
#include "ops/device_math.h"

namespace segtape::cuda::fused {

// Where the fused kernels run, and why not elsewhere.
struct Plan {
  bool use = false;
  int C = 0;              // blocks in a cluster
  int64_t Hs = 0;         // hidden units per block
  int S = 0;              // lanes per output
  int threads = 0;        // per block: Bg Hs S
  size_t fwd_smem = 0;    // dynamic shared memory per block (bytes)
  size_t bwd_smem = 0;
  int G = 1;              // clusters, one per group of rows
  int64_t Bg = 0;         // rows per cluster (B = G Bg)
  int resident = 0;       // device_plan: how many such clusters the device holds at once (0: not asked)
  std::string why_not;    // when !use: the first limit that failed
  bool grid = false;      // the grid plan: G C blocks of one cooperative launch, no clusters
  int64_t kt = 0;         // grid: the tile (elements of a row) of the shared vector streamed per load
};

// Limits of the device: `smem` the opt-in shared memory per block, `cluster`
// the largest cluster (8 is portable), `sm90`: compute capability >= 9.0,
// `sms` its multiprocessors (G C blocks at most, one wave; 1: one cluster),
// `coop`: cooperative launches (the grid plan; its G C blocks, one per
// multiprocessor, all resident).
struct Limits {
  size_t smem = 0;
  int cluster = 8;
  bool sm90 = false;
  int sms = 1;
  bool coop = false;
};

// Padded row lengths: with S < 32 lanes per output, the rows of one warp's
// outputs start S banks apart, so their lanes do not collide.
SEGTAPE_HD int64_t pad(int64_t n, int S) { return n + (S < 32 ? S : 0); }

// Shared memory of one block, in elements.
struct FwdSmem {  // W [3 Hs][Hp] (rows r, z, n of its units), h [B][Hp], published h' [2][B][Hs], keep [B]
  int64_t Hp, w, h, pub, kp, total;
  SEGTAPE_HD FwdSmem(int64_t B, int64_t H, int64_t Hs, int S)
      : Hp(pad(H, S)), w(0), h(3 * Hs * Hp), pub(h + B * Hp), kp(pub + 2 * B * Hs), total(kp + B) {}
};
struct BwdSmem {  // W^T [Hs][Rp] (W_hh's columns of its units), dgh [B][Rp], published dgh [2][B][3][Hs]
  int64_t Rp, w, dg, pub, total;
  SEGTAPE_HD BwdSmem(int64_t B, int64_t H, int64_t Hs, int S)
      : Rp(pad(3 * H, S)), w(0), dg(Hs * Rp), pub(dg + B * Rp), total(pub + 2 * B * 3 * Hs) {}
};
// The grid plan's: W (forward's rows or backward's columns, as above, at the
// same place) and one tile of the shared vector, [B][Kp].
struct GridSmem {
  int64_t Kp, w, tile, total;
  SEGTAPE_HD GridSmem(bool backward, int64_t B, int64_t H, int64_t Hs, int S, int64_t kt)
      : Kp(pad(kt, S)), w(0), tile(backward ? Hs * pad(3 * H, S) : 3 * Hs * pad(H, S)), total(tile + B * Kp) {}
};

// The plan gru_sequence takes on the current CUDA device: best_plan() with its
// limits, refused (with the reason) where this build's kernels cannot run it
// there (no sm_90 code; the cluster cannot be resident). Not used in a build
// without the CUDA backend, or where the device cannot be queried.
Plan device_plan(int64_t B, int64_t H, size_t elem);

// A block's step below which the plan splits the units over no more blocks:
// Bg Hs outputs of 3H terms each, every term two reads of shared memory.
// Rows split over clusters for free (they never meet), units over the
// blocks of a cluster at a barrier and a gather per step. 32 outputs of 384
// terms, the (1, 128) plan on the H200 (9.8 us a training step there); a
// choice, not a measured crossover.
constexpr int64_t kBlockTerms = 32 * 384;

// The clusters, their size, lanes and shared memory for [B, H] in elements
// of `elem` bytes: as many clusters as there are rows, G C <= sms blocks
// allowing (Bg the smallest divisor of B that does); then the smallest C
// (dividing H) that brings a block's step to kBlockTerms, or the one with
// the fewest terms; its lanes the most that Bg Hs S <= 1024 threads allow.
inline Plan plan(int64_t B, int64_t H, size_t elem, const Limits& lim) {
  Plan best;
  best.why_not = "no CUDA device of compute capability 9.0 or later (thread-block clusters)";
  if (!lim.sm90) return best;
  best.why_not = "B H = " + std::to_string(B * H) + " rows x units do not fit 8 blocks of 1024 threads";
  bool smem_failed = false;
  for (int C = 1; C <= 8 && C <= lim.cluster; C *= 2) {
    if (H % C) continue;
    const int64_t Hs = H / C;
    for (int64_t Bg = 1; Bg <= B; ++Bg) {  // the fewest rows per cluster the device's blocks allow
      const int64_t G = B / Bg;
      if (B % Bg || (G > 1 && G * C > lim.sms)) continue;
      if (Bg * Hs > 1024) break;
      int S = 32;
      while (S > 1 && Bg * Hs * S > 1024) S /= 2;
      const size_t f = size_t(FwdSmem(Bg, H, Hs, S).total) * elem, b = size_t(BwdSmem(Bg, H, Hs, S).total) * elem;
      if (f > lim.smem || b > lim.smem) {
        smem_failed = true;
        break;
      }
      const auto terms = [&](int64_t bg, int64_t hs) { return std::max(bg * hs * 3 * H, kBlockTerms); };
      if (!best.use || terms(Bg, Hs) < terms(best.Bg, best.Hs)) best = Plan{true, C, Hs, S, int(Bg * Hs * S), f, b, int(G), Bg, 0, {}};
      break;
    }
  }
  if (!best.use && smem_failed)
    best.why_not = "W_hh (" + std::to_string(3 * H * H * int64_t(elem)) + " bytes) with the state does not fit the shared memory of " +
                   std::to_string(lim.cluster < 8 ? lim.cluster : 8) + " blocks (" + std::to_string(lim.smem) + " bytes each)";
  return best;
}

// The grid plan, where no cluster plan fits: G groups of Bg rows times C
// blocks of Hs units, G C <= sms (one block per multiprocessor, all resident),
// a block's Bg Hs outputs at most 1024 threads, its W (3 Hs H elements) and
// a tile of kt (the largest of 256, 128, 64, 32 that fits; a multiple of
// every S) per row in its shared memory. The fewest terms per block (the
// most blocks), then the fewest blocks per group of rows (each block reads
// its rows' whole vector each step: C B H elements from L2 a step); its
// lanes the most that 1024 threads allow.
inline Plan grid_plan(int64_t B, int64_t H, size_t elem, const Limits& lim) {
  Plan best;
  best.why_not = "the device has no cooperative launch (the grid plan)";
  if (!lim.coop) return best;
  for (int64_t C = 1; C <= H && C <= lim.sms; ++C) {
    if (H % C) continue;
    const int64_t Hs = H / C;
    for (int64_t Bg = 1; Bg <= B; ++Bg) {  // the fewest rows per block the multiprocessors allow
      const int64_t G = B / Bg;
      if (B % Bg || G * C > lim.sms) continue;
      if (Bg * Hs > 1024) break;
      int S = 32;
      while (S > 1 && Bg * Hs * S > 1024) S /= 2;
      int64_t kt = 256;
      const auto bytes = [&](bool bwd) { return size_t(GridSmem(bwd, Bg, H, Hs, S, kt).total) * elem; };
      while (kt > 32 && std::max(bytes(false), bytes(true)) > lim.smem) kt /= 2;
      if (std::max(bytes(false), bytes(true)) > lim.smem) break;
      const auto terms = [&](int64_t bg, int64_t hs) { return bg * hs * 3 * H; };
      const bool better = !best.use || terms(Bg, Hs) < terms(best.Bg, best.Hs) ||
                          (terms(Bg, Hs) == terms(best.Bg, best.Hs) && C < best.C);
      if (better) {
        best = Plan{true, int(C), Hs, S, int(Bg * Hs * S), bytes(false), bytes(true), int(G), Bg, 0, {}};
        best.grid = true, best.kt = kt;
      }
      break;
    }
  }
  if (!best.use)
    best.why_not = "W_hh (" + std::to_string(3 * H * H * int64_t(elem)) + " bytes) with a tile of the state does not fit the shared memory of " +
                   std::to_string(lim.sms) + " blocks (" + std::to_string(lim.smem) + " bytes each) with B H = " + std::to_string(B * H) +
                   " rows x units in 1024 threads a block";
  return best;
}

// What gru_sequence runs: the cluster plan where it fits, else the grid
// plan, else neither (cuDNN), with both reasons.
inline Plan best_plan(int64_t B, int64_t H, size_t elem, const Limits& lim) {
  Plan p = plan(B, H, elem, lim);
  if (p.use) return p;
  Plan g = grid_plan(B, H, elem, lim);
  if (!g.use) g.why_not = p.why_not + "; " + g.why_not;
  return g;
}

// What the kernels read and write. Device pointers (host pointers in the
// simulation). Row-major: x-side tensors [T, B, *]. One cluster's: B its
// rows (the plan's Bg), ld the rows of each step in the tensors (the whole
// batch), the pointers at its first row (group_args).
template <class T>
struct Args {
  int64_t steps, B, H;
  int64_t ld;
  int64_t Hs;
  int S;
  const T* gi;    // [T, B, 3H] x W_ih^T (no bias)
  const T* w_hh;  // [3H, H]
  const T* b_ih;  // [3H]
  const T* b_hh;  // [3H]
  const T* h0;    // [B, H]
  T* y;           // [T, B, H]: forward's output; backward reads it (h_{t-1})
  T* saved;       // [T, B, 4H]: r, z, n, W_hn h + b_hn per step (nullptr: inference)
  // backward
  const T* gout;  // [T, B, H]
  T* dgi;         // [T, B, 3H] pre-activation gradients of x W_ih^T + b_ih
  T* dgh;         // [T, B, 3H] ... of h W_hh^T + b_hh
  T* dh0;         // [B, H] dL/dh0 (written)
  // resets (nullptr: none)
  const T* keep;  // [T, B]: the state entering step t is keep[t, b] h_{t-1}
  T* hk;          // [T, B, H] backward, with keep: the masked state entering each step (dW_hh's rows)
  bool bf16;      // Precision::Bf16's products (float only; above)
};

// x rounded to the nearest bfloat16 (ties to even; a NaN stays a NaN): the
// engine's bf16_round (segtape/precision.h), for the device too. float64
// has no bfloat16 products: unchanged.
SEGTAPE_HD float bf16_value(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
  memcpy(&x, &u, sizeof x);
  return x;
}
SEGTAPE_HD double bf16_value(double x) { return x; }
// A value of a product: rounded where Args::bf16 asks.
template <class T>
SEGTAPE_HD T product_value(const Args<T>& a, T x) {
  return a.bf16 ? bf16_value(x) : x;
}
// The dot product of n terms w[k] v[k] (k = lane, lane + S, ...), added to s;
// under bf16 each v[k] rounded as it is read (w is rounded already).
template <class T>
SEGTAPE_HD T dot_terms(const Args<T>& a, const T* w, const T* v, int lane, int n, T s) {
  if (a.bf16) {
    for (int k = lane; k < n; k += a.S) s += w[k] * bf16_value(v[k]);
  } else {
    for (int k = lane; k < n; k += a.S) s += w[k] * v[k];
  }
  return s;
}

// Cluster g's arguments: the whole batch's (B = the rows of one cluster,
// ld = all of them) moved to its first row, g B.
template <class T>
SEGTAPE_HD Args<T> group_args(Args<T> a, int64_t g) {
  const int64_t b0 = g * a.B, H = a.H;
  a.gi += b0 * 3 * H, a.h0 += b0 * H, a.y += b0 * H;
  if (a.saved) a.saved += b0 * 4 * H;
  if (a.gout) a.gout += b0 * H;
  if (a.dgi) a.dgi += b0 * 3 * H;
  if (a.dgh) a.dgh += b0 * 3 * H;
  if (a.dh0) a.dh0 += b0 * H;
  if (a.keep) a.keep += b0;
  if (a.hk) a.hk += b0 * H;
  return a;
}

// The factor on row b of the state entering step t.
template <class T>
SEGTAPE_HD T keep_at(const Args<T>& a, int64_t t, int64_t b) {
  return a.keep ? a.keep[t * a.ld + b] : T(1);
}

// Thread tid of block c: its output o = tid / S -> (row b, unit j), lane tid % S.
struct Who {
  int64_t b, jl, j;
  int lane;
};
template <class T>
SEGTAPE_HD Who who(const Args<T>& a, int c, int tid) {
  const int64_t o = tid / a.S;
  return {o / a.Hs, o % a.Hs, int64_t(c) * a.Hs + o % a.Hs, tid % a.S};
}

template <class T>
SEGTAPE_HD T sigmoid(T x) {
  return ops::DeviceMath::sigmoid(x);
}

// ---- forward
//
// Per step, each thread's work is on the critical path of the recurrence,
// so what does not depend on the step's h is read ahead: lane 0 reads step
// t + 1's inputs (fwd_inputs) while step t's barrier and gather run, the
// biases b_hh once (fwd_bias), and the keep factors of the next step's rows
// are staged in shared memory before the barrier (fwd_stage_keep). Index
// arithmetic inside the step loop is 32-bit (a block's sizes are small).

// Loads block c's rows of W_hh (r, z, n of its units) into its shared
// memory at 0, rows of pad(H, S) (thread tid of n): the cluster's layout
// (FwdSmem::w) and the grid plan's (GridSmem::w).
template <class T>
SEGTAPE_HD void fwd_load_w(const Args<T>& a, T* sm, int c, int tid, int n) {
  const int64_t Hp = pad(a.H, a.S);
  for (int64_t i = tid; i < 3 * a.Hs * a.H; i += n) {
    const int64_t row = i / a.H, k = i % a.H;   // row = g Hs + jl
    const int64_t g = row / a.Hs, jl = row % a.Hs;
    sm[row * Hp + k] = product_value(a, a.w_hh[(g * a.H + int64_t(c) * a.Hs + jl) * a.H + k]);
  }
}
// ... and, for a cluster, h0 too.
template <class T>
SEGTAPE_HD void fwd_load(const Args<T>& a, T* sm, int c, int tid, int n) {
  const FwdSmem L(a.B, a.H, a.Hs, a.S);
  fwd_load_w(a, sm + L.w, c, tid, n);
  for (int64_t i = tid; i < a.B * a.H; i += n) sm[L.h + (i / a.H) * L.Hp + i % a.H] = a.h0[i] * keep_at(a, 0, i / a.H);
}

// Lane 0's inputs of step t: x W_ih^T + b_ih of its (b, j) per gate r, z, n.
template <class T>
struct FwdIn {
  T r, z, n;
};
template <class T>
SEGTAPE_HD FwdIn<T> fwd_inputs(const Args<T>& a, const Who& w, int64_t t) {
  const int64_t H = a.H, j = w.j;
  const T* gir = a.gi + (t * a.ld + w.b) * 3 * H;
  return {gir[j] + a.b_ih[j], gir[H + j] + a.b_ih[H + j], gir[2 * H + j] + a.b_ih[2 * H + j]};
}
// ... and b_hh of its unit per gate (the same every step).
template <class T>
SEGTAPE_HD FwdIn<T> fwd_bias(const Args<T>& a, const Who& w) {
  return {a.b_hh[w.j], a.b_hh[a.H + w.j], a.b_hh[2 * a.H + w.j]};
}

// Lane's partial sums of gate g's row of its unit against its row's h.
template <class T>
SEGTAPE_HD void fwd_partial(const Args<T>& a, const T* sm, const Who& w, T acc[3]) {
  const FwdSmem L(a.B, a.H, a.Hs, a.S);
  const T* h = sm + L.h + w.b * L.Hp;
  for (int g = 0; g < 3; ++g) acc[g] = dot_terms(a, sm + L.w + (g * a.Hs + w.jl) * L.Hp, h, w.lane, int(a.H), T(0));
}

// The gates and h' of (b, j) at step t from the summed gh (no bias), its
// inputs and hp, its state entering the step: writes y and the gates saved
// for backward, returns h'. (The sums in the order of x W_ih^T + b_ih +
// h W_hh^T + b_hh.)
template <class T>
SEGTAPE_HD T fwd_gates(const Args<T>& a, const Who& w, int64_t t, const T gh[3], T hp, const FwdIn<T>& in, const FwdIn<T>& bias) {
  const int64_t H = a.H, j = w.j, row = t * a.ld + w.b;
  const T r = sigmoid<T>(in.r + product_value(a, gh[0]) + bias.r);
  const T z = sigmoid<T>(in.z + product_value(a, gh[1]) + bias.z);
  const T hn = product_value(a, gh[2]) + bias.n;
  const T n = ops::DeviceMath::tanh(in.n + r * hn);
  const T h1 = (T(1) - z) * n + z * hp;
  if (a.saved) {
    T* S = a.saved + row * 4 * H;
    S[j] = r, S[H + j] = z, S[2 * H + j] = n, S[3 * H + j] = hn;
  }
  a.y[row * H + j] = h1;
  return h1;
}
// Lane 0 in a cluster: the gates, h' to y and to the block's published slot `buf`.
template <class T>
SEGTAPE_HD void fwd_finish(const Args<T>& a, T* sm, const Who& w, int64_t t, const T gh[3], int buf, const FwdIn<T>& in,
                           const FwdIn<T>& bias) {
  const FwdSmem L(a.B, a.H, a.Hs, a.S);
  const T h1 = fwd_gates(a, w, t, gh, sm[L.h + w.b * L.Hp + w.j], in, bias);
  sm[L.pub + (buf * a.B + w.b) * a.Hs + w.jl] = h1;
}

// Before step t's barrier: the factors of the state entering step t + 1,
// row by row, into the block's shared memory for its gather (1 after the last step).
template <class T>
SEGTAPE_HD void fwd_stage_keep(const Args<T>& a, T* sm, int64_t t, int tid, int n) {
  const FwdSmem L(a.B, a.H, a.Hs, a.S);
  for (int b = tid; b < int(a.B); b += n) sm[L.kp + b] = t + 1 < a.steps ? keep_at(a, t + 1, b) : T(1);
}

// After step t's cluster barrier: block c gathers h' of every unit, masked as
// it enters step t + 1 (the staged factors); remote(rank) is block rank's
// shared memory (the cluster's distributed shared memory).
template <class T, class Remote>
SEGTAPE_HD void fwd_gather(const Args<T>& a, T* sm, int tid, int n, int buf, Remote remote) {
  const FwdSmem L(a.B, a.H, a.Hs, a.S);
  const int H = int(a.H), Hs = int(a.Hs), BH = int(a.B) * H;
  for (int i = tid; i < BH; i += n) {
    const int b = i / H, k = i - b * H, c = k / Hs;
    const T* src = remote(c);
    sm[L.h + b * L.Hp + k] = src[L.pub + (buf * a.B + b) * Hs + (k - c * Hs)] * sm[L.kp + b];
  }
}

// ---- backward
//
// Lane 0 reads step t - 1's inputs (bwd_inputs: the saved gates, the state
// entering the step with its keep factor, the output's gradient) while step
// t's barrier, gather and sums run.

// Block c's columns of W_hh, transposed: row jl holds W_hh[r][c Hs + jl] for r < 3H.
template <class T>
SEGTAPE_HD void bwd_load(const Args<T>& a, T* sm, int c, int tid, int n) {
  const BwdSmem L(a.B, a.H, a.Hs, a.S);
  for (int64_t i = tid; i < 3 * a.H * a.Hs; i += n) {
    const int64_t r = i / a.Hs, jl = i % a.Hs;
    sm[L.w + jl * L.Rp + r] = product_value(a, a.w_hh[r * a.H + int64_t(c) * a.Hs + jl]);
  }
}

// Lane 0's inputs of step t for its (b, j): the gates r, z, n and W_hn h + b_hn
// saved by forward, the state entering the step (masked by keep, the factor
// k), and dL/dy of the step.
template <class T>
struct BwdIn {
  T r, z, n, hn, hp, k, gout;
};
template <class T>
SEGTAPE_HD BwdIn<T> bwd_inputs(const Args<T>& a, const Who& w, int64_t t) {
  const int64_t H = a.H, j = w.j, row = t * a.ld + w.b;
  const T* S = a.saved + row * 4 * H;
  const T k = keep_at(a, t, w.b);
  const T h = t > 0 ? a.y[(row - a.ld) * H + j] : a.h0[w.b * H + j];
  return {S[j], S[H + j], S[2 * H + j], S[3 * H + j], h * k, k, a.gout[row * H + j]};
}

// Lane 0 at step t with the carried dh of its (b, j) and its inputs: the gate
// gradients to global memory (dgi; dgh, also into d: the grid plan's
// exchange is dgh itself); returns the direct term of dL/dh_{t-1}, g z.
template <class T>
SEGTAPE_HD T bwd_gate_grads(const Args<T>& a, const Who& w, int64_t t, T carry, const BwdIn<T>& in, T d[3]) {
  const int64_t H = a.H, j = w.j, row = t * a.ld + w.b;
  const T r = in.r, z = in.z, n = in.n, hn = in.hn, hp = in.hp;
  if (a.hk) a.hk[row * H + j] = hp;
  const T g = in.gout + carry;
  const T dn = g * (T(1) - z) * (T(1) - n * n);
  const T dz = g * (hp - n) * z * (T(1) - z);
  const T dr = dn * hn * r * (T(1) - r);
  T* dgi = a.dgi + row * 3 * H;
  T* dgh = a.dgh + row * 3 * H;
  dgi[j] = dr, dgi[H + j] = dz, dgi[2 * H + j] = dn;
  d[0] = dr, d[1] = dz, d[2] = dn * r;
  dgh[j] = d[0], dgh[H + j] = d[1], dgh[2 * H + j] = d[2];
  return g * z;
}
// ... in a cluster, dgh to the published slot `buf` too.
template <class T>
SEGTAPE_HD T bwd_gates(const Args<T>& a, T* sm, const Who& w, int64_t t, T carry, int buf, const BwdIn<T>& in) {
  const BwdSmem L(a.B, a.H, a.Hs, a.S);
  T d[3];
  const T direct = bwd_gate_grads(a, w, t, carry, in, d);
  T* pub = sm + L.pub + (buf * a.B + w.b) * 3 * a.Hs;
  pub[w.jl] = d[0], pub[a.Hs + w.jl] = d[1], pub[2 * a.Hs + w.jl] = d[2];
  return direct;
}

template <class T, class Remote>
SEGTAPE_HD void bwd_gather(const Args<T>& a, T* sm, int tid, int n, int buf, Remote remote) {
  const BwdSmem L(a.B, a.H, a.Hs, a.S);
  const int H = int(a.H), Hs = int(a.Hs), R = 3 * H, BR = int(a.B) * R;
  for (int i = tid; i < BR; i += n) {
    const int b = i / R, r = i - b * R;  // r = g H + k
    const int g = r / H, k = r - g * H, c = k / Hs;
    const T* src = remote(c);
    sm[L.dg + b * L.Rp + r] = src[L.pub + ((buf * a.B + b) * 3 + g) * Hs + (k - c * Hs)];
  }
}

// dL/dh_{t-1} of (b, j) as it leaves step t: the direct term g z and the
// summed dgh W_hh, scaled by the factor k the state entered step t with.
template <class T>
SEGTAPE_HD T bwd_carry(const Args<T>& a, T direct, T partial, T k) {
  return (direct + product_value(a, partial)) * k;
}

// Lane's partial of dgh W_hh for its (b, j).
template <class T>
SEGTAPE_HD T bwd_partial(const Args<T>& a, const T* sm, const Who& w) {
  const BwdSmem L(a.B, a.H, a.Hs, a.S);
  return dot_terms(a, sm + L.w + w.jl * L.Rp, sm + L.dg + w.b * L.Rp, w.lane, 3 * int(a.H), T(0));
}

// ---- the grid plan (grid_plan)
//
// What other blocks wrote in this launch (y, dgh) is read past the L1 cache
// (__ldcg): each address is written once, before the grid barrier, and read
// after it.
template <class T>
SEGTAPE_HD T load_exchanged(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}

// (Block c's W: fwd_load_w forward, bwd_load backward, at the same place.)

// The length of the tile at k0 of a row of n elements.
SEGTAPE_HD int64_t tile_len(int64_t n, int64_t k0, int64_t kt) { return n - k0 < kt ? n - k0 : kt; }

// Row b of the state entering step t, before its keep factor: h0 or y[t - 1].
template <class T>
SEGTAPE_HD const T* grid_state(const Args<T>& a, int64_t t, int64_t b) {
  return t == 0 ? a.h0 + b * a.H : a.y + ((t - 1) * a.ld + b) * a.H;
}

// The tile [k0, k0 + kt) of every row's state entering step t, masked, into
// the block's shared memory (columns past H are not loaded, nor read).
template <class T>
SEGTAPE_HD void grid_fwd_tile(const Args<T>& a, T* sm, int64_t kt, int64_t t, int64_t k0, int tid, int n) {
  const GridSmem L(false, a.B, a.H, a.Hs, a.S, kt);
  const int64_t len = tile_len(a.H, k0, kt);
  for (int64_t i = tid; i < a.B * len; i += n) {
    const int64_t b = i / len, kk = i % len;
    sm[L.tile + b * L.Kp + kk] = load_exchanged(grid_state(a, t, b) + k0 + kk) * keep_at(a, t, b);
  }
}

// The lane's terms of the tile at k0 added to its partial sums, gates r, z, n.
template <class T>
SEGTAPE_HD void grid_fwd_partial(const Args<T>& a, const T* sm, int64_t kt, const Who& w, int64_t k0, T acc[3]) {
  const GridSmem L(false, a.B, a.H, a.Hs, a.S, kt);
  const int64_t Hp = pad(a.H, a.S);
  const T* h = sm + L.tile + w.b * L.Kp;
  const int len = int(tile_len(a.H, k0, kt));
  for (int g = 0; g < 3; ++g) acc[g] = dot_terms(a, sm + L.w + (g * a.Hs + w.jl) * Hp + k0, h, w.lane, len, acc[g]);
}

// Lane 0 at step t with the summed gh: the gates, y[t] and the saved gates.
template <class T>
SEGTAPE_HD void grid_fwd_finish(const Args<T>& a, const Who& w, int64_t t, const T gh[3], const FwdIn<T>& in, const FwdIn<T>& bias) {
  const T hp = load_exchanged(grid_state(a, t, w.b) + w.j) * keep_at(a, t, w.b);
  fwd_gates(a, w, t, gh, hp, in, bias);
}

// Backward: lane 0's gate gradients at step t (dgh[t] is the exchange);
// returns the direct term g z.
template <class T>
SEGTAPE_HD T grid_bwd_gates(const Args<T>& a, const Who& w, int64_t t, T carry, const BwdIn<T>& in) {
  T d[3];
  return bwd_gate_grads(a, w, t, carry, in, d);
}

// The tile [r0, r0 + kt) of every row's dgh[t] (r over 3H) into shared memory.
template <class T>
SEGTAPE_HD void grid_bwd_tile(const Args<T>& a, T* sm, int64_t kt, int64_t t, int64_t r0, int tid, int n) {
  const GridSmem L(true, a.B, a.H, a.Hs, a.S, kt);
  const int64_t R = 3 * a.H, len = tile_len(R, r0, kt);
  for (int64_t i = tid; i < a.B * len; i += n) {
    const int64_t b = i / len, rr = i % len;
    sm[L.tile + b * L.Kp + rr] = load_exchanged(a.dgh + (t * a.ld + b) * R + r0 + rr);
  }
}

// The lane's terms of dgh W_hh in the tile at r0, added to its partial.
template <class T>
SEGTAPE_HD T grid_bwd_partial(const Args<T>& a, const T* sm, int64_t kt, const Who& w, int64_t r0, T acc) {
  const GridSmem L(true, a.B, a.H, a.Hs, a.S, kt);
  const int64_t R = 3 * a.H;
  return dot_terms(a, sm + L.w + w.jl * pad(R, a.S) + r0, sm + L.tile + w.b * L.Kp, w.lane, int(tile_len(R, r0, kt)), acc);
}

}  // namespace segtape::cuda::fused
