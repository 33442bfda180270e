#include "algorithm.h"

#include <algorithm>

#include "segtape/ops.h"

namespace segtape::agent {

#define SEGTAPE_DECLARE(K, N) extern const AlgorithmDef K##Algorithm;
SEGTAPE_ALGORITHMS(SEGTAPE_DECLARE)
#undef SEGTAPE_DECLARE

replay::StepResult cross_entropy_step(Context& c, Step& step, Tape& t, const Tensor& h, replay::Inputs& in, double scale,
                                      int64_t& loss_steps) {
  const int64_t B = step.batch();
  const Recurred r = step.feature(t, step.observe(t, in), h, in);
  const Tensor logits = step.logits(r.feature);
  auto y = in.take<int64_t>(size_t(B), [&](std::span<int64_t> v) { c.env->targets(v); });
  Tensor loss;
  if (std::any_of(y.begin(), y.end(), [](int64_t v) { return v != kNoTarget; })) {
    if (in.loss_wanted()) {
      loss = cross_entropy(logits, t.from(y, {B}), Reduction::Mean, kNoTarget);
      if (scale != 1) loss = segtape::scale(loss, scale);
    }
    if (!in.replaying()) ++loss_steps;
  }
  // Greedy actions step the env the first time only; the streams whose
  // episode ended then start the next from zero (their done flags recorded).
  (void)in.take<int64_t>(size_t(B), [&](std::span<int64_t> a) {
    step.greedy(logits, a);
    step.act(a);
  });
  return {step.reset(r.state, step.done_flags(in)), loss};
}

const AlgorithmDef& algorithm_def(Algo kind) {
  switch (kind) {
#define SEGTAPE_CASE(K, N) \
  case Algo::K: return K##Algorithm;
    SEGTAPE_ALGORITHMS(SEGTAPE_CASE)
#undef SEGTAPE_CASE
  }
  throw Error("algorithm_def: no algorithm of kind " + std::to_string(int(kind)));
}

}  // namespace segtape::agent
