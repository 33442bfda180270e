// Uses segtape as an installed library: one segment of a GRU cell and a loss,
// backward. Prints the package version, the loss and a gradient norm.
#include <cmath>
#include <cstdio>
#include <vector>

#include "segtape/agent/trainer.h"
#include "segtape/nn/layers.h"
#include "segtape/ops.h"

using namespace segtape;

int main() {
  Tape tape(Device::cpu(), {.segment_budget = size_t(1) << 20});
  nn::Rng rng(7);
  nn::GRUCell cell(tape, rng, 3, 4);
  nn::Linear head(tape, rng, 4, 2);
  Tensor h = tape.persistent({2, 4});
  double loss_value = 0;
  {
    Segment seg = tape.segment();
    const std::vector<float> x = {0.5f, -1.0f, 0.25f, 1.0f, 0.0f, -0.5f};  // [2, 3]
    const std::vector<int64_t> y = {1, 0};
    Tensor next = cell(tape.from(std::span<const float>(x), {2, 3}), h);
    Tensor loss = cross_entropy(head(next), tape.from(std::span<const int64_t>(y), {2}));
    loss_value = loss.item();
    seg.backward(loss);
    copy_into(h, seg.carry(next));
  }
  double g2 = 0;
  for (const Tensor& p : cell.parameters())
    for (float g : p.grad_tensor().span<float>()) g2 += double(g) * g;
  // The agent layer links too.
  const agent::History hist = agent::History::parse("tbptt:8");
  std::printf("segtape %s: loss %.6f grad-norm %.6f history %s\n", SEGTAPE_PACKAGE_VERSION, loss_value, std::sqrt(g2),
              hist.str().c_str());
  return std::isfinite(loss_value) && g2 > 0 ? 0 : 1;
}
