// The program in README.md, verbatim between the markers (tests/readme_test.cmake
// fails when the two differ). It exits non-zero unless training divides the loss
// per step by 100 (left to accumulate, without opt.zero_grad(), it does not).
// README-BEGIN
#include <cstdio>
#include <vector>

#include "segtape/nn.h"
using namespace segtape;

struct Model : nn::Module {  // token -> embedding -> GRU state -> logits
  nn::Embedding embed; nn::GRUCell gru; nn::Linear head;
  Model(Tape& t, nn::Rng& r) : Module(t), embed(t, r, 4, 16), gru(t, r, 16, 32), head(t, r, 32, 4) {
    register_module("embed", embed), register_module("gru", gru), register_module("head", head);
  }
};

int main() {  // learn to repeat the token shown one step earlier
  Tape tape(Device::cpu(), {.segment_budget = 64 << 20});
  nn::Rng rng(1);
  Model model(tape, rng);
  nn::Adam opt(model, {.lr = 1e-2});
  const int B = 16, K = 8;                 // batch, steps per segment
  std::vector<int64_t> token(B), previous(B, 0);
  Tensor h;                                // the GRU state [B, 32]; undefined = zeros
  double first = 0, last = 0;
  for (int s = 0; s < 200; ++s) {
    Segment seg = tape.segment();          // boundary: the arena is reset
    Tensor loss = tape.zeros({});
    for (int k = 0; k < K; ++k) {          // K steps of the recurrent loop
      for (int64_t& t : token) t = int64_t(rng.uniform() * 4);
      h = model.gru(model.embed(tape.from(token, {B})), h);
      loss = loss + nn::cross_entropy(model.head(h), tape.from(previous, {B}));
      previous = token;
      tape.next_step();                    // labels the step (budget reports count steps)
    }
    seg.backward(loss);                    // gradients accumulate into the parameters
    opt.step();
    opt.zero_grad();                       // else the next segment adds to these gradients
    h = seg.carry(h);                      // value kept, history cut
    last = loss.item() / K;                // loss per step in this segment
    if (s == 0) first = last;
  }                                        // the segment's tensors expire
  std::printf("loss per step: %.3f in segment 1, %.3f in segment 200\n", first, last);
  return last < first / 100 ? 0 : 1;
}
// README-END
