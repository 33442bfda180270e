// The benchmark workload, identical in both engines: GRUCell(I=32, H) ->
// Linear(H, 16) -> cross-entropy, float32; one training step = forward +
// backward + Adam (lr 1e-3) amortised over segments of K = 32 steps, state
// carried across boundaries. Inference: the same forward under no-grad.
#pragma once
#include <cstdint>
#include <vector>

#include "segtape/nn.h"
#include "workload_data.h"  // kI, kC, kK, Data

namespace segtape::bench {

// The least a segment must keep for backward, per the workload's math: per
// step x_t (B x I), h_t (B x H, the next step's input), the GRU gates r, z, n
// and W_hn h + b_hn (4 B x H), the logits (B x C), a log-sum-exp per row (B)
// and the int64 targets (B).
inline size_t analytic_saved_bytes(int64_t B, int64_t H) {
  return size_t(kK) * size_t(B) * (size_t(kI + H + 4 * H + kC + 1) * sizeof(float) + sizeof(int64_t));
}

struct SegtapeModel {
  Tape tape;
  nn::Rng rng{1};
  nn::GRUCell cell;
  nn::Linear head;
  nn::Adam opt;
  Tensor h;
  const Data& data;
  size_t saved_bytes = 0;  // arena bytes the forward kept for backward (live just before backward)
  SegtapeModel(int64_t B, int64_t H, const Data& d)
      : tape(Device::cpu(), {.segment_budget = size_t(256) << 20}),
        cell(tape, rng, kI, H),
        head(tape, rng, H, kC),
        opt(nn::numbered(std::vector<Tensor>{cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh, head.weight, head.bias}),
            nn::AdamOptions{.lr = 1e-3}),
        h(tape.persistent({B, H})),
        data(d) {}
  // One segment of K training steps.
  void train_segment() {
    Segment seg = tape.segment();
    Tensor loss;
    for (int64_t t = 0; t < kK; ++t) {
      h = cell(tape.from(data.xt(t), {data.B, kI}), h);
      Tensor l = cross_entropy(head(h), tape.from(data.yt(t), {data.B}));
      loss = t ? add(loss, l) : l;
    }
    saved_bytes = tape.stats().live_bytes;
    seg.backward(loss);
    opt.step();
    opt.zero_grad();
    h = seg.carry(h);
  }
  // One segment of K inference steps (no gradients recorded).
  void infer_segment() {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    for (int64_t t = 0; t < kK; ++t) {
      h = cell(tape.from(data.xt(t), {data.B, kI}), h);
      (void)head(h);
    }
    h = seg.carry(h);
  }
};

}  // namespace segtape::bench
