#include "history.h"

namespace segtape::agent {

#define SEGTAPE_DECLARE(K, N) extern const HistoryDef K##History;
SEGTAPE_HISTORIES(SEGTAPE_DECLARE)
#undef SEGTAPE_DECLARE

const HistoryDef& history_def(History::Kind kind) {
  switch (kind) {
#define SEGTAPE_CASE(K, N) \
  case History::Kind::K: return K##History;
    SEGTAPE_HISTORIES(SEGTAPE_CASE)
#undef SEGTAPE_CASE
  }
  throw Error("history_def: no history of kind " + std::to_string(int(kind)));
}

Recurred HistoryRunner::recur(const Tensor& e, const Tensor& h, bool, std::span<const Tensor> between) {
  const Tensor h1 = c_.policy->recur(e, h, between);
  return {c_.policy->output(h1), h1};
}

Tensor HistoryRunner::run_steps(Steps& s, Tensor& h, int64_t first, int64_t n, Ran& r, bool read) {
  Tensor loss;
  for (int64_t i = 0; i < n; ++i, c_.tape->next_step()) {
    const replay::StepResult sr = s.step(*c_.tape, first + i, h, live_);
    if (sr.loss.defined()) {
      if (read) r.loss += sr.loss.item();
      loss = loss.defined() ? add(loss, sr.loss) : sr.loss;
    }
    h = sr.state;
  }
  return loss;
}

Ran HistoryRunner::learn(Steps& s, int64_t n, Segment& seg, const BackwardOptions& o) {
  Ran r;
  Tensor loss = run_steps(s, c_.h, c_.step, n, r);
  if (s.after_forward) {
    const Tensor more = s.after_forward(c_.h, c_.step, n);
    if (more.defined()) loss = loss.defined() ? add(loss, more) : more;
  }
  if (loss.defined()) seg.backward(loss, o);
  c_.step += n;
  if (s.update) s.update();
  return r;
}

Ran HistoryRunner::replay(Steps& s, int64_t first, int64_t n) {
  Ran r;
  {
    Segment seg = s.graph_windows ? c_.tape->graph_segment(1) : c_.tape->segment();
    Tensor h = stored_state(s, first);
    const bool at_once = s.sequence && sequence(h.dim(0));
    const Tensor loss = at_once ? s.sequence(h, first, n) : run_steps(s, h, first, n, r, false);
    if (loss.defined()) seg.backward(loss);
    if (at_once) c_.tape->next_step();
  }
  r.segment_peak = c_.tape->stats().last_segment_peak;
  return r;
}

Tensor HistoryRunner::stored_state(Steps& s, int64_t t, Tensor dst) const {
  if (s.state_on_tape) {
    const Tensor src = s.state_on_tape(t);
    if (!dst.defined()) dst = c_.tape->empty(src.shape);
    copy_into(dst, src);
    return dst;
  }
  const std::span<const float> h0 = s.state_at(t);
  if (!dst.defined()) return c_.tape->from(h0, {int64_t(h0.size()) / c_.config.hidden, c_.config.hidden});
  dst.from_host(h0);
  return dst;
}

void ReplayingHistory::make_driver(const Tensor& state, int64_t stride) {
  const History& h = c_.config.history;
  home_ = state;
  replay::Options o{.horizon = h.horizon, .k = h.k, .stride = stride};
  // --device-loop (PPO, whose figures are its own): the replays checked where the state lives, no loss read per segment
  o.verify_on_device = c_.config.device_loop, o.read_loss = !c_.config.device_loop;
  // The window's losses that need its forward pass (A2C's returns), in a
  // segment of their own (none is open there); the losses are the replays'.
  o.on_forward = [this](const Tensor& final_state) {
    if (!steps_ || !steps_->after_forward) return;
    const Segment seg = c_.tape->segment();
    (void)steps_->after_forward(final_state, first_, n_);
  };
  driver_ = std::make_unique<replay::Driver>(*c_.tape, state, o);
}

Ran ReplayingHistory::learned(Steps& s, const replay::Report& rep, int64_t n) {
  steps_ = nullptr;
  if (s.update) s.update();
  copy_into(c_.h_home, driver_->final_state());
  c_.h = c_.h_home;
  c_.step += n;
  return ran_of(rep);
}

Ran ReplayingHistory::ran_of(const replay::Report& rep) {
  Ran r;
  r.loss = rep.loss, r.steps_run = rep.steps_run, r.segment_peak = rep.segment_peak, r.stored_bytes = rep.state_bytes;
  return r;
}

}  // namespace segtape::agent
