// The retention lab's runs on segtape: the pitfalls (deliberately wrong
// loops, run under the teaching policy so the arena grows, then rerun under
// the strict policy to show the error), the fixes (strict policy) and
// exact-replay, measured after every step; the DOT export of a small run's
// tape and the model's initial weights for LibTorch's side.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "common.h"
#include "segtape/agent/env.h"
#include "segtape/agent/policy.h"
#include "segtape/agent/trainer.h"
#include "segtape/explain.h"
#include "segtape/nn/optim.h"
#include "segtape/ops.h"

namespace segtape::agent::retention {

void stop_if_asked(const std::function<bool()>& interrupted) {
  if (interrupted && interrupted()) throw Interrupted{};
}

namespace {

EnvSpec recall_spec(const LabConfig& c) { return {"recall", c.vocab, 0, c.vocab, true, "accuracy"}; }

// The lab's model: the agent's Policy (encoder -> GRUCell -> head, or window
// mode's compress layer) and ctx, the prompt-style feature layer of pitfall 4.
struct Model {
  nn::Rng rng;
  Policy policy;
  nn::Linear ctx;  // [E] -> [H]
  std::vector<nn::NamedTensor> named;
  std::vector<Tensor> params;
  Tensor w_ih, w_hh, b_ih, b_hh;  // the GRU's, for gru_cell(..., recompute = true)
  std::optional<nn::SGD> sgd;
  std::optional<nn::Adam> adam;  // gru-state: the agent Trainer's optimizer, with its clipping
  double clip = 0;

  Model(Tape& t, const LabConfig& c, bool window)
      : rng(c.seed), policy(t, rng, recall_spec(c), {c.embed, c.hidden, window ? c.window : 0, false}), ctx(t, rng, c.embed, c.hidden) {
    named = policy.named_parameters();
    for (auto& [n, p] : ctx.named_parameters()) named.push_back({"ctx." + n, p});
    for (auto& [n, p] : named) {
      params.push_back(p);
      if (n == "gru.weight_ih") w_ih = p;
      if (n == "gru.weight_hh") w_hh = p;
      if (n == "gru.bias_ih") b_ih = p;
      if (n == "gru.bias_hh") b_hh = p;
    }
    sgd.emplace(named, nn::SGDOptions{.lr = c.lr});
  }
  // The agent Trainer's update (TrainConfig's defaults): clip_grad_norm, then Adam.
  void use_trainer_update() {
    const TrainConfig tc;
    adam.emplace(policy, nn::AdamOptions{.lr = tc.lr});
    clip = tc.clip;
  }
  void update() {
    if (adam) {
      if (clip > 0) nn::clip_grad_norm(policy, clip);
      adam->step();
      adam->zero_grad();
      return;
    }
    sgd->step();
    sgd->zero_grad();
  }
};

std::span<const int64_t> row_of(const std::vector<int64_t>& v, int64_t t, int64_t B) {
  return std::span<const int64_t>(v).subspan(size_t(t * B), size_t(B));
}

void add_row(Trace& tr, int64_t step, double bytes, Clock::time_point start, int64_t steps = 1, double grads = 0) {
  tr.step.push_back(step);
  tr.bytes.push_back(bytes);
  tr.grad_bytes.push_back(grads);
  tr.seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count() / double(steps));
}

void record_error(Trace& tr, const Error& e, int64_t step) {
  tr.error_type = dynamic_cast<const BudgetError*>(&e)          ? "BudgetError"
                  : dynamic_cast<const ExpiredTensorError*>(&e) ? "ExpiredTensorError"
                  : dynamic_cast<const AnomalyError*>(&e)       ? "AnomalyError"
                  : dynamic_cast<const TapeError*>(&e)          ? "TapeError"
                  : dynamic_cast<const OutOfMemoryError*>(&e)   ? "OutOfMemoryError"
                  : dynamic_cast<const DeviceError*>(&e)        ? "DeviceError"
                                                                : "Error";
  tr.error = e.what();
  tr.error_step = step;
}

Device lab_device(const LabConfig& c) { return c.device == "cuda" ? Device::cuda() : Device::cpu(); }

void inspect(const RunOptions& o, const Tape& tape, const std::vector<nn::NamedTensor>& params) {
  if (o.inspect) o.inspect(tape);
  if (o.inspect_named) o.inspect_named(tape, params);
}

// Every parameter's gradient, by name (on any device).
std::vector<NamedValues> gradients(const Model& m) {
  std::vector<NamedValues> out;
  for (const auto& [name, p] : m.named)
    out.push_back({name, std::vector<int64_t>(p.shape.dims.begin(), p.shape.dims.begin() + p.rank()), p.grad_tensor().to_host<float>()});
  return out;
}

// RunOptions::interrupted, asked before every 64th step (outside its timing).
void poll(const RunOptions& o, int64_t t) {
  if (t % 64 == 0) stop_if_asked(o.interrupted);
}


// ---- the pitfalls: one segment for the whole episode, as the wrong code keeps it

TapeOptions pitfall_options(const LabConfig& cfg, const RunOptions& o) {
  TapeOptions to;
  to.budget_name = cfg.budget_name;
  if (o.strict) {
    to.segment_budget = cfg.budget;
  } else if (cfg.device == "cuda") {  // a device arena cannot grow: one large fixed one
    to.segment_budget = cfg.device_arena;
  } else {  // teaching policy: 1 MiB chunks, no limit
    to.segment_budget = size_t(1) << 20;
    to.grow = true;
  }
  to.anomaly = o.anomaly;
  to.node_capacity = size_t(cfg.steps) * 8 + 64;
  return to;
}

// What a pitfall's loop keeps from step to step.
struct PitfallLoop {
  Case c;
  const LabConfig& cfg;
  const RunOptions& o;
  Tape& tape;
  Model& m;
  const Episode& ep;
  Segment& seg;
  Tensor h, loss, history;           // the state, the summed loss, pitfall 4's prompt
  std::vector<Tensor> kept_logits;  // pitfall 3's buffer

  // Step t's logits.
  Tensor logits(int64_t t) {
    const int64_t B = cfg.batch;
    Tensor e = m.policy.encode(tape.from(row_of(ep.tokens, t, B), {B}));
    if (c == Case::GrowingContext) {
      // The whole past, as a prompt: [t + 1, B, E], its graph kept.
      Tensor e1 = reshape(e, {1, B, cfg.embed});
      history = t ? concat({history, e1}, 0) : e1;
      return m.policy.logits(tanh(m.ctx(mean(history, 0))));
    }
    if (c == Case::DetachInputOnly) e = detach(e);  // cuts nothing that matters: h still links every step
    h = c == Case::Checkpoint ? gru_cell(e, h, m.w_ih, m.w_hh, m.b_ih, m.b_hh, /*recompute=*/true) : m.policy.recur(e, h);
    return m.policy.logits(h);
  }

  // Step t's loss: a backward now (pitfalls 1, 5, 6, 7), or added to the sum.
  void take_loss(int64_t t, const Tensor& lg) {
    if (!ep.has_target(t)) return;
    const int64_t B = cfg.batch;
    Tensor l = cross_entropy(lg, tape.from(row_of(ep.targets, t, B), {B}), Reduction::Mean, kNoTarget);
    if (!info(c).backward_every_step) {
      loss = loss.defined() ? add(loss, l) : l;
      return;
    }
    seg.backward(l, {.retain_graph = o.retain_graph});
    if (c == Case::ClipGrad) nn::clip_grad_norm(m.params, cfg.clip);
  }

  // Pitfall 3's TBPTT, otherwise correct: every K steps a backward, an update and h detached.
  void cut_every_k(int64_t t) {
    if (c != Case::LogitsBuffer || (t + 1) % cfg.k != 0) return;
    if (loss.defined()) seg.backward(loss), m.update();
    loss = {};
    h = detach(h);
  }

  // The episode's end. Pitfalls 1, 5, 6, 7 update only now: an update between
  // backwards through the same history would change weights that earlier
  // steps saved (PyTorch refuses that with its in-place modification error).
  void end(Trace& tr) {
    if (loss.defined()) seg.backward(loss);
    if (c == Case::HiddenNotDetached) tr.grads = gradients(m);  // what exact-replay must equal
    m.update();
    // Why the buffer exists: the episode's predictions, read at its end
    // (which in segtape needs the segment that made them to be open).
    std::vector<float> read;
    for (const Tensor& l : kept_logits) read.resize(size_t(l.numel())), l.to_host(std::span<float>(read));
  }

  // What holds the memory at the last step (the explainer), and the caller's look at the tape.
  void explain_end(Trace& tr) {
    const Explanation x = explain(tape, 0);
    tr.final_node_bytes = double(x.node_bytes);
    tr.final_grad_bytes = double(x.grad_bytes);
    tr.held_steps = double(x.by_step.empty() ? 0 : x.last_step - x.first_step + 1);
    inspect(o, tape, m.named);
  }
};

void run_pitfall(Case c, const LabConfig& cfg, const RunOptions& o, Trace& tr) {
  Tape tape(lab_device(cfg), pitfall_options(cfg, o));
  Model m(tape, cfg, false);
  const Episode ep = make_episode(cfg);
  Segment seg = tape.segment();
  try {
    PitfallLoop run{c, cfg, o, tape, m, ep, seg, tape.zeros({cfg.batch, cfg.hidden}), {}, {}, {}};
    for (int64_t t = 0; t < cfg.steps; ++t, tape.next_step()) {
      poll(o, t);
      const auto start = Clock::now();
      Tensor logits = run.logits(t);
      if (c == Case::LogitsBuffer) run.kept_logits.push_back(logits);
      run.take_loss(t, logits);
      run.cut_every_k(t);
      const bool last = t + 1 == cfg.steps;
      if (last) run.end(tr);
      const TapeStats st = tape.stats();
      add_row(tr, t, double(st.live_bytes), start, 1, double(st.grad_bytes));
      if (last) run.explain_end(tr);
    }
  } catch (const Error& e) {
    // The teaching run must not fail on the CPU, where its arena grows; on a
    // device its one fixed arena can fill up, and that refusal is the result.
    if (!o.strict && o.retain_graph && cfg.device == "cpu") throw;
    record_error(tr, e, int64_t(tape.step()));
  }
}

// ---- the fixes: segments of K steps under the strict policy

// What a fix's loop keeps: the carried state, window:N's ring of the last
// N - 1 embeddings as values (oldest at `pos`), gru-state's host copy of
// the logits.
struct FixLoop {
  Case c;
  const LabConfig& cfg;
  Tape& tape;
  Model& m;
  const Episode& ep;
  Tensor h;
  std::vector<Tensor> ring, parts;
  size_t pos = 0;
  std::vector<float> host_logits;

  bool window() const { return c == Case::Window; }
  bool trainer() const { return c == Case::GruState; }

  // Step t's feature: window:N's compressed window, or the GRU's state.
  Tensor feature(const Tensor& e) {
    if (window()) {
      for (size_t j = 0; j < ring.size(); ++j) parts[j] = ring[(pos + j) % ring.size()];
      parts[ring.size()] = e;
      Tensor f = m.policy.compress(parts);
      if (!ring.empty()) copy_into(ring[pos], detach(e)), pos = (pos + 1) % ring.size();
      return f;
    }
    h = m.policy.recur(e, c == Case::NogradHistory ? detach(h) : h);
    return h;
  }

  // Step t: its loss added to the segment's (gru-state: read on the host, as
  // the Trainer sums its losses, and its logits read for its actions).
  void step(int64_t t, Tensor& loss) {
    const int64_t B = cfg.batch;
    Tensor e = m.policy.encode(tape.from(row_of(ep.tokens, t, B), {B}));
    Tensor logits = m.policy.logits(feature(e));
    if (ep.has_target(t)) {
      Tensor l = cross_entropy(logits, tape.from(row_of(ep.targets, t, B), {B}), Reduction::Mean, kNoTarget);
      if (trainer()) (void)l.item();
      loss = loss.defined() ? add(loss, l) : l;
    }
    if (trainer()) host_logits.resize(size_t(logits.numel())), logits.to_host(std::span<float>(host_logits));
  }
};

// gru-state is the agent Trainer's supervised loop (agent/trainer.cpp), step
// by step: tbptt with K = trainer_k, the logits and the loss read on the host
// every step, clipping and Adam at the segment's end (its segment high-waters
// equal a Trainer's to the byte: tests/retention_test.cpp).
void run_fix(Case c, const LabConfig& cfg, const RunOptions& o, Trace& tr) {
  TapeOptions to;
  to.segment_budget = cfg.budget;
  to.budget_name = cfg.budget_name;
  to.anomaly = o.anomaly;
  Tape tape(lab_device(cfg), to);
  Model m(tape, cfg, c == Case::Window);
  if (c == Case::GruState) m.use_trainer_update();
  const Episode ep = make_episode(cfg);
  const int64_t K = c == Case::Detach ? 1 : c == Case::GruState ? cfg.trainer_k : cfg.k;
  FixLoop run{c, cfg, tape, m, ep, tape.persistent({cfg.batch, cfg.hidden}), {}, std::vector<Tensor>(size_t(cfg.window)), 0, {}};
  for (int64_t i = 0; run.window() && i + 1 < cfg.window; ++i) run.ring.push_back(tape.persistent({cfg.batch, cfg.embed}));
  try {
    for (int64_t t0 = 0; t0 < cfg.steps; t0 += K) {
      Segment seg = tape.segment();
      Tensor loss;
      const int64_t n = std::min(K, cfg.steps - t0);
      for (int64_t i = 0; i < n; ++i, tape.next_step()) {
        const int64_t t = t0 + i;
        poll(o, t);
        const auto start = Clock::now();
        run.step(t, loss);
        if (i + 1 == n && loss.defined()) seg.backward(loss), m.update();
        const TapeStats st = tape.stats();
        add_row(tr, t, double(st.live_bytes), start, 1, double(st.grad_bytes));
        if (t + 1 == cfg.steps) inspect(o, tape, m.named);
      }
      if (!run.window()) run.h = seg.carry(run.h);  // the TBPTT boundary
      seg.end();
      tr.segment_peaks.push_back(double(tape.stats().last_segment_peak));
    }
  } catch (const Error& e) {
    record_error(tr, e, int64_t(tape.step()));
  }
}

// exact-replay: pitfall 1's gradients in the memory of one K-step segment.
// Pitfall 1 backpropagates every step's loss through the whole history since
// step 0 and updates once, at the end of the episode; its gradient there is
// the gradient of the sum of every step's loss, which is what one
// replay::Driver window over the whole episode computes (T = steps, uniform
// schedule). The step reads its tokens and targets as recorded inputs, as an
// env would be read. Rows: see run_segtape in retention.h.
void run_exact(const LabConfig& cfg, const RunOptions& o, Trace& tr) {
  TapeOptions to;
  to.segment_budget = cfg.budget;
  to.budget_name = cfg.budget_name;
  to.anomaly = o.anomaly;
  Tape tape(lab_device(cfg), to);
  Model m(tape, cfg, false);
  const Episode ep = make_episode(cfg);
  const int64_t B = cfg.batch, T = cfg.steps, K = cfg.k, S = (T + K - 1) / K;
  const Tensor h0 = tape.persistent({B, cfg.hidden});              // zeros, as pitfall 1's h
  const size_t state = align_up(size_t(B * cfg.hidden) * sizeof(float));  // one stored state [B, H]
  std::vector<double> arena(size_t(T), 0), grads(size_t(T), 0), seconds(size_t(T), 0), peaks(size_t(S), 0);
  // Every interval of the window is charged to a step: the time up to the end
  // of a step (and the driver's work before it) to that step; a segment's
  // backward and its boundary check to its last step.
  Clock::time_point mark = Clock::now();
  auto charge = [&](int64_t t) {
    const Clock::time_point now = Clock::now();
    seconds[size_t(t)] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  replay::Options ro;
  ro.horizon = T, ro.k = K;
  ro.on_segment = [&](int64_t u, bool replayed, const TapeStats& st) {
    const int64_t last = std::min(T, (u + 1) * K) - 1;
    charge(last);
    if (o.interrupted) {  // between segments, its time charged to no step
      stop_if_asked(o.interrupted);
      mark = Clock::now();
    }
    if (!replayed) return;
    // The segment has ended: its high-water is the row of its last step (the
    // arena only grows within a segment: these are its bytes after the
    // backward and the hand-over of dL/dh). bytes_by_op is still the ended
    // segment's: the tape clears it when the next one begins.
    arena[size_t(last)] = double(st.last_segment_peak);
    grads[size_t(last)] = double(st.grad_bytes);
    peaks[size_t(u)] = double(st.last_segment_peak);
  };
  const replay::StepFn step = [&](Tape& tp, int64_t t, const Tensor& h, replay::Inputs& in) {
    auto row = [&](const std::vector<int64_t>& v) {
      return tp.from(in.take<int64_t>(size_t(B), [&](std::span<int64_t> out) { std::ranges::copy(row_of(v, t, B), out.begin()); }), {B});
    };
    replay::StepResult r{m.policy.recur(m.policy.encode(row(ep.tokens)), h), {}};
    Tensor logits = m.policy.logits(r.state);
    if (ep.has_target(t)) r.loss = cross_entropy(logits, row(ep.targets), Reduction::Mean, kNoTarget);
    if (in.replaying()) {  // the pass that records the graph
      const TapeStats st = tp.stats();
      arena[size_t(t)] = double(st.live_bytes);
      grads[size_t(t)] = double(st.grad_bytes);
      if (t + 1 == T) inspect(o, tp, m.named);
    }
    charge(t);
    return r;
  };
  try {
    replay::Driver bptt(tape, h0, ro);
    mark = Clock::now();
    tr.replay = bptt.run(step, h0);
    tr.grads = gradients(m);  // before the update, as pitfall 1's
    const Clock::time_point update = Clock::now();
    m.update();
    seconds[size_t(T - 1)] += std::chrono::duration<double>(Clock::now() - update).count();
  } catch (const Error& e) {
    record_error(tr, e, int64_t(tape.step()));
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    // The states needed while step t is replayed: the start of every segment
    // up to t's (the earlier segments are still to be replayed), dL/dh and the
    // final state; at the last step all S + 2, the driver's Report::state_bytes.
    const double states = double(size_t(t / K + 3) * state);
    tr.step.push_back(t);
    tr.bytes.push_back(arena[size_t(t)] + states);
    tr.state_bytes.push_back(states);
    tr.grad_bytes.push_back(grads[size_t(t)]);
    tr.seconds.push_back(seconds[size_t(t)]);
  }
  tr.segment_peaks = peaks;
}

}  // namespace

Trace run_segtape(Case c, const LabConfig& cfg, const RunOptions& o) {
  cfg.validate();
  Trace tr;
  tr.engine = "segtape";
  tr.id = c;
  tr.memory_source = kArenaSource;
  if (info(c).pitfall) run_pitfall(c, cfg, o, tr);
  else if (c == Case::ExactReplay) run_exact(cfg, o, tr);
  else run_fix(c, cfg, o, tr);
  return tr;
}

std::string tape_dot(Case c, const LabConfig& cfg) {
  LabConfig small = cfg;
  small.lag = 1;  // every step but the first has a target
  if (info(c).pitfall) {
    small.steps = 3;
  } else {
    small.k = small.trainer_k = 2;
    small.steps = c == Case::Detach ? 2 : 4;  // two segments; the second is drawn
  }
  std::string dot;
  RunOptions o;
  o.inspect_named = [&](const Tape& t, const std::vector<nn::NamedTensor>& params) {
    std::unordered_map<const void*, std::string> names;
    for (const auto& [name, p] : params) names.emplace(p.ptr, name);
    DotOptions d;
    d.name_of = [&](const void* p) {
      const auto it = names.find(p);
      return it == names.end() ? std::string() : it->second;
    };
    dot = to_dot(t, d);
  };
  const Trace tr = run_segtape(c, small, o);
  if (!tr.error.empty()) throw Error("retention: the DOT run of " + info(c).name + " failed: " + tr.error);
  return dot;
}

std::vector<NamedValues> initial_weights(const LabConfig& cfg, bool window_mode) {
  TapeOptions to;
  to.segment_budget = 64 << 10;
  Tape tape(Device::cpu(), to);
  Model m(tape, cfg, window_mode);
  std::vector<NamedValues> out;
  for (const auto& [name, p] : m.named) {
    const auto v = p.span<float>();
    out.push_back({name, std::vector<int64_t>(p.shape.dims.begin(), p.shape.dims.begin() + p.rank()), {v.begin(), v.end()}});
  }
  return out;
}

}  // namespace segtape::agent::retention
