// The retention lab on segtape: the pitfalls (deliberately wrong loops, run
// under the teaching policy so the arena grows, then rerun under the strict
// policy to show the error) and the fixes (strict policy), measured after every
// step; exact-replay's gradients checked against pitfall 1's; plus the
// summaries and the csv / json / svg / table outputs.
#include "segtape/agent/retention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "segtape/agent/env.h"
#include "segtape/agent/plot.h"
#include "segtape/agent/policy.h"
#include "segtape/agent/trainer.h"
#include "segtape/explain.h"
#include "segtape/nn/optim.h"
#include "segtape/ops.h"

namespace segtape::agent::retention {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- cases, config

const std::vector<CaseInfo>& cases() {
  static const std::vector<CaseInfo> v = {
      {Case::HiddenNotDetached, "hidden-not-detached", true, true,
       "h never detached; backward every step with retain_graph", "end the segment every K steps and carry h (tbptt:K; PyTorch: h = h.detach())"},
      {Case::LossSum, "loss-sum", true, false, "loss = loss + step_loss over the episode, one backward at the end",
       "backward and cut every K steps (tbptt:K)"},
      {Case::LogitsBuffer, "logits-buffer", true, false,
       "every step's logits appended to a list with their graph; TBPTT every K steps otherwise correct",
       "keep values, not graphs: logits.detach() / .item() (segtape: read them before the segment ends)"},
      {Case::GrowingContext, "growing-context", true, false,
       "prompt-style history = cat(history, e_t), never detached; feature = tanh(Linear(mean(history)))",
       "a fixed-size history: window:N, nograd-history, or the GRU state (gru-state)"},
      {Case::DetachInputOnly, "detach-input-only", true, true, "the input embedding detached, h still carries the graph",
       "detach the state, not the input (tbptt:K, detach)"},
      {Case::ClipGrad, "clip-grad", true, true, "pitfall 1 plus clip_grad_norm after every backward",
       "clipping bounds gradients, not memory: tbptt:K"},
      {Case::Checkpoint, "checkpoint", true, true, "pitfall 1 with the GRU gates recomputed in backward (in-step checkpointing)",
       "checkpointing shrinks each step, not the number of steps kept: tbptt:K"},
      {Case::Tbptt, "tbptt", false, false, "segments of K steps, h carried across the boundary", "fixes 1, 2, 5, 6, 7"},
      {Case::Detach, "detach", false, false, "segments of one step (h carried every step)", "fixes 1, 2, 5, 6, 7 without gradient through time"},
      {Case::NogradHistory, "nograd-history", false, false, "h = gru(e, detach(h)): the current step's gradient only",
       "fixes 4 and 5 (history as a value)"},
      {Case::Window, "window", false, false, "the last N embeddings as detached values, no recurrence", "fixes 4 (bounded prompt)"},
      {Case::GruState, "gru-state", false, false, "the agent Trainer's loop (tbptt, Adam, clipping): history compressed in the fixed-size GRU state",
       "fixes 3 and 4 (what the agent program does)"},
      {Case::ExactReplay, "exact-replay", false, false,
       "pitfall 1's gradients (every step's loss through the whole history, one update): segments of K steps replayed in reverse from "
       "stored boundary states (replay::Driver)",
       "fixes 1, 5, 6, 7 without truncating the gradient: one segment's memory plus a state per K steps, each step computed twice"},
  };
  return v;
}

const CaseInfo& info(Case c) { return cases()[size_t(c)]; }

namespace {
std::string label(Case c, const LabConfig& cfg) {
  const CaseInfo& i = info(c);
  if (i.pitfall) return std::to_string(int(c) + 1) + " " + i.name;
  switch (c) {
    case Case::Tbptt: return "tbptt:" + std::to_string(cfg.k);
    case Case::Window: return "window:" + std::to_string(cfg.window);
    case Case::GruState: return "gru-state (tbptt:" + std::to_string(cfg.trainer_k) + ")";
    case Case::ExactReplay: return "exact-replay (exact:" + std::to_string(cfg.k) + "/" + std::to_string(cfg.steps) + ")";
    default: return i.name;
  }
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}
}  // namespace

std::string case_names(const LabConfig& cfg) {
  std::string names;
  for (const CaseInfo& c : cases()) names += (names.empty() ? "" : ", ") + label(c.id, cfg);
  return names;
}

Case parse_case(const std::string& name, const LabConfig& cfg) {
  const std::string n = trimmed(name);
  for (const CaseInfo& c : cases()) {
    const std::string number = std::to_string(int(c.id) + 1);
    if (n == c.name || n == label(c.id, cfg) || (c.pitfall && n == number)) return c.id;
  }
  // A fix's parameter that is not the lab's: say which one runs.
  // (exact-replay's and gru-state's labels carry --k and --steps: a name
  // copied from a table of other settings is named the same way)
  for (const CaseInfo& c : cases()) {
    if (c.pitfall || (n.rfind(c.name + ":", 0) != 0 && n.rfind(c.name + " (", 0) != 0)) continue;
    throw Error("retention case '" + n + "': with these settings the lab runs " + label(c.id, cfg) + " ('" + c.name +
                "' names it whatever they are; valid names: " + case_names(cfg) + ")");
  }
  throw Error("unknown retention case '" + n + "' (valid names: " + case_names(cfg) +
              "; a pitfall also by its name or number alone, a fix without its parameter)");
}

void LabConfig::validate() const {
  auto need = [](bool ok, const char* m) {
    if (!ok) throw Error(std::string("retention: ") + m);
  };
  need(steps >= 2 && steps <= 100000, "--steps must be in [2, 100000]");
  need(batch >= 1 && batch <= 4096, "--batch must be in [1, 4096]");
  need(hidden >= 1 && hidden <= 8192, "--hidden must be in [1, 8192]");
  need(embed >= 1 && embed <= 8192 && vocab >= 2 && vocab <= 100000, "embed in [1, 8192] and vocab in [2, 100000]");
  need(lag >= 0 && lag < steps, "--steps must be greater than the recall lag (the first target arrives at step lag)");
  need(k >= 1 && trainer_k >= 1, "K must be >= 1");
  need(window >= 1 && window <= 64, "window N must be in [1, 64]");
  need(std::isfinite(lr) && lr > 0, "lr must be a finite number > 0 (the lab loops' SGD step)");
  need(std::isfinite(clip) && clip > 0, "clip must be a finite number > 0 (pitfall 6's bound on the gradient norm)");
  need(budget >= 1024, "--budget must be at least 1 KiB");
  need(device == "cpu" || device == "cuda", "--device must be cpu or cuda");
  need(device != "cuda" || device_arena >= budget, "the CUDA teaching arena (device_arena) must be at least --budget");
}

// ---------------------------------------------------------------- data, model

bool Episode::has_target(int64_t t) const {
  for (int64_t b = 0; b < batch; ++b)
    if (targets[size_t(t * batch + b)] != kNoTarget) return true;
  return false;
}

Episode make_episode(const LabConfig& cfg) {
  EnvOptions eo;
  eo.lag = cfg.lag;
  eo.vocab = cfg.vocab;
  auto env = make_env("recall", cfg.batch, cfg.seed * 7919u + 3u, eo);
  Episode ep{cfg.steps, cfg.batch, std::vector<int64_t>(size_t(cfg.steps * cfg.batch)), std::vector<int64_t>(size_t(cfg.steps * cfg.batch))};
  const size_t B = size_t(cfg.batch);
  std::vector<int64_t> actions(B, 0);
  std::vector<float> reward(B);
  std::vector<uint8_t> done(B);
  for (int64_t t = 0; t < cfg.steps; ++t) {
    env->observe(std::span<int64_t>(ep.tokens).subspan(size_t(t) * B, B), {});
    env->targets(std::span<int64_t>(ep.targets).subspan(size_t(t) * B, B));
    env->step(actions, reward, done);  // recall's stream does not depend on the actions
  }
  return ep;
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

constexpr const char* kArenaSource = "segtape: segment arena bytes in use after the step (Tape::stats().live_bytes)";

// Every parameter's gradient, by name (on any device).
std::vector<NamedValues> gradients(const Model& m) {
  std::vector<NamedValues> out;
  for (const auto& [name, p] : m.named)
    out.push_back({name, std::vector<int64_t>(p.shape.dims.begin(), p.shape.dims.begin() + p.rank()), p.grad_tensor().to_host<float>()});
  return out;
}

// Interrupted when an interrupt check is set and says stop.
void stop_if_asked(const std::function<bool()>& interrupted) {
  if (interrupted && interrupted()) throw Interrupted{};
}
// RunOptions::interrupted, asked before every 64th step (outside its timing).
void poll(const RunOptions& o, int64_t t) {
  if (t % 64 == 0) stop_if_asked(o.interrupted);
}

// The pitfalls: one segment for the whole episode, as the wrong code keeps it.
void run_pitfall(Case c, const LabConfig& cfg, const RunOptions& o, Trace& tr) {
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
  Tape tape(lab_device(cfg), to);
  Model m(tape, cfg, false);
  const Episode ep = make_episode(cfg);
  const int64_t B = cfg.batch;
  const bool every_step = info(c).backward_every_step;
  Segment seg = tape.segment();
  try {
    Tensor h = tape.zeros({B, cfg.hidden});
    Tensor loss, history;
    std::vector<Tensor> kept_logits;  // pitfall 3's buffer
    for (int64_t t = 0; t < cfg.steps; ++t, tape.next_step()) {
      poll(o, t);
      const auto start = Clock::now();
      Tensor e = m.policy.encode(tape.from(row_of(ep.tokens, t, B), {B}));
      Tensor logits;
      if (c == Case::GrowingContext) {
        // The whole past, as a prompt: [t + 1, B, E], its graph kept.
        Tensor e1 = reshape(e, {1, B, cfg.embed});
        history = t ? concat({history, e1}, 0) : e1;
        logits = m.policy.logits(tanh(m.ctx(mean(history, 0))));
      } else {
        if (c == Case::DetachInputOnly) e = detach(e);  // cuts nothing that matters: h still links every step
        h = c == Case::Checkpoint ? gru_cell(e, h, m.w_ih, m.w_hh, m.b_ih, m.b_hh, /*recompute=*/true) : m.policy.recur(e, h);
        logits = m.policy.logits(h);
      }
      if (c == Case::LogitsBuffer) kept_logits.push_back(logits);
      if (ep.has_target(t)) {
        Tensor l = cross_entropy(logits, tape.from(row_of(ep.targets, t, B), {B}), Reduction::Mean, kNoTarget);
        if (every_step) {
          seg.backward(l, {.retain_graph = o.retain_graph});
          if (c == Case::ClipGrad) nn::clip_grad_norm(m.params, cfg.clip);
        } else {
          loss = loss.defined() ? add(loss, l) : l;
        }
      }
      if (c == Case::LogitsBuffer && (t + 1) % cfg.k == 0) {  // TBPTT, otherwise correct
        if (loss.defined()) seg.backward(loss), m.update();
        loss = {};
        h = detach(h);
      }
      const bool last = t + 1 == cfg.steps;
      if (last) {
        // Pitfalls 1, 5, 6, 7 update only now: an update between backwards
        // through the same history would change weights that earlier steps
        // saved (PyTorch refuses that with its in-place modification error).
        if (loss.defined()) seg.backward(loss);
        if (c == Case::HiddenNotDetached) tr.grads = gradients(m);  // what exact-replay must equal
        m.update();
        // Why the buffer exists: the episode's predictions, read at its end
        // (which in segtape needs the segment that made them to be open).
        std::vector<float> read;
        for (const Tensor& l : kept_logits) read.resize(size_t(l.numel())), l.to_host(std::span<float>(read));
      }
      const TapeStats st = tape.stats();
      add_row(tr, t, double(st.live_bytes), start, 1, double(st.grad_bytes));
      if (last) {
        const Explanation x = explain(tape, 0);
        tr.final_node_bytes = double(x.node_bytes);
        tr.final_grad_bytes = double(x.grad_bytes);
        tr.held_steps = double(x.by_step.empty() ? 0 : x.last_step - x.first_step + 1);
        inspect(o, tape, m.named);
      }
    }
  } catch (const Error& e) {
    // The teaching run must not fail on the CPU, where its arena grows; on a
    // device its one fixed arena can fill up, and that refusal is the result.
    if (!o.strict && o.retain_graph && cfg.device == "cpu") throw;
    record_error(tr, e, int64_t(tape.step()));
  }
}

// The fixes: segments of K steps under the strict policy. gru-state is the
// agent Trainer's supervised loop (agent/trainer.cpp), step by step: tbptt
// with K = trainer_k, the logits and the loss read on the host every step,
// clipping and Adam at the segment's end (its segment high-waters equal a
// Trainer's to the byte: tests/retention_test.cpp).
void run_fix(Case c, const LabConfig& cfg, const RunOptions& o, Trace& tr) {
  TapeOptions to;
  to.segment_budget = cfg.budget;
  to.budget_name = cfg.budget_name;
  to.anomaly = o.anomaly;
  Tape tape(lab_device(cfg), to);
  const bool window = c == Case::Window;
  const bool trainer = c == Case::GruState;
  Model m(tape, cfg, window);
  if (trainer) m.use_trainer_update();
  const Episode ep = make_episode(cfg);
  const int64_t B = cfg.batch, K = c == Case::Detach ? 1 : trainer ? cfg.trainer_k : cfg.k;
  std::vector<float> host_logits;
  Tensor h = tape.persistent({B, cfg.hidden});
  std::vector<Tensor> ring;  // window: the last N - 1 embeddings as values, oldest at `pos`
  for (int64_t i = 0; window && i + 1 < cfg.window; ++i) ring.push_back(tape.persistent({B, cfg.embed}));
  std::vector<Tensor> parts(size_t(cfg.window));
  size_t pos = 0;
  try {
    for (int64_t t0 = 0; t0 < cfg.steps; t0 += K) {
      Segment seg = tape.segment();
      Tensor loss;
      const int64_t n = std::min(K, cfg.steps - t0);
      for (int64_t i = 0; i < n; ++i, tape.next_step()) {
        const int64_t t = t0 + i;
        poll(o, t);
        const auto start = Clock::now();
        Tensor e = m.policy.encode(tape.from(row_of(ep.tokens, t, B), {B}));
        Tensor f;
        if (window) {
          for (size_t j = 0; j < ring.size(); ++j) parts[j] = ring[(pos + j) % ring.size()];
          parts[ring.size()] = e;
          f = m.policy.compress(parts);
          if (!ring.empty()) copy_into(ring[pos], detach(e)), pos = (pos + 1) % ring.size();
        } else {
          h = m.policy.recur(e, c == Case::NogradHistory ? detach(h) : h);
          f = h;
        }
        Tensor logits = m.policy.logits(f);
        if (ep.has_target(t)) {
          Tensor l = cross_entropy(logits, tape.from(row_of(ep.targets, t, B), {B}), Reduction::Mean, kNoTarget);
          if (trainer) (void)l.item();  // the Trainer sums the losses on the host
          loss = loss.defined() ? add(loss, l) : l;
        }
        if (trainer) host_logits.resize(size_t(logits.numel())), logits.to_host(std::span<float>(host_logits));  // its actions
        if (i + 1 == n && loss.defined()) seg.backward(loss), m.update();
        const TapeStats st = tape.stats();
        add_row(tr, t, double(st.live_bytes), start, 1, double(st.grad_bytes));
        if (t + 1 == cfg.steps) inspect(o, tape, m.named);
      }
      if (!window) h = seg.carry(h);  // the TBPTT boundary
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

// ---------------------------------------------------------------- summaries

Fit fit_line(const Trace& t) {
  // Every row but the last: pitfalls 2 and 4 run their one backward there.
  const size_t n = t.step.size() > 3 ? t.step.size() - 1 : t.step.size();
  if (n < 2) return {0, n ? t.bytes[0] : 0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = double(t.step[i]), y = t.bytes[i];
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double d = double(n) * sxx - sx * sx;
  if (d == 0) return {0, sy / double(n)};
  const double slope = (double(n) * sxy - sx * sy) / d;
  return {slope, (sy - slope * sx) / double(n)};
}

Summary summarise(const Trace& t, size_t budget) {
  Summary s;
  const size_t n = t.step.size();
  if (n == 0) return s;
  const Fit f = fit_line(t);
  s.bytes_per_step = f.slope;
  s.bytes_last = t.bytes.back();
  s.bytes_peak = *std::max_element(t.bytes.begin(), t.bytes.end());
  const size_t tail = std::max<size_t>(2, n / 10);
  const size_t a = n > tail ? n - tail : 0;
  if (n >= 2 && t.step[n - 1] > t.step[a]) s.growth_end = (t.bytes[n - 1] - t.bytes[a]) / double(t.step[n - 1] - t.step[a]);
  // Time per step over the first and the last 10% of rows.
  auto mean_ms = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += t.seconds[i];
    return to > from ? 1e3 * sum / double(to - from) : 0.0;
  };
  const size_t w = std::max<size_t>(1, n / 10);
  s.ms_start = mean_ms(0, std::min(n, w));
  s.ms_end = mean_ms(n - std::min(n, w), n);
  for (size_t i = 0; i < n; ++i)
    if (t.bytes[i] > double(budget)) {
      s.budget_step = double(t.step[i]);
      return s;
    }
  // Extrapolate only what really grows: a fix's sawtooth has a small slope
  // too, but the same high-water in its last quarter as in its third (the
  // first holds the steps before the first target).
  auto max_of = [&](size_t from, size_t to) { return *std::max_element(t.bytes.begin() + ptrdiff_t(from), t.bytes.begin() + ptrdiff_t(to)); };
  const size_t q = n / 4;
  const bool grows = q >= 1 && max_of(n - q, n) > 1.01 * max_of(n - 2 * q, n - q);
  if (grows && f.slope > 0) {
    s.budget_step = std::max((double(budget) - f.intercept) / f.slope, double(t.step.back() + 1));
    s.budget_extrapolated = true;
  }
  return s;
}

AnomalyCost anomaly_cost(const LabConfig& cfg, int64_t steps, const std::function<bool()>& interrupted) {
  TrainConfig tc;
  tc.env = "recall";
  tc.history = History::parse("tbptt:" + std::to_string(cfg.trainer_k));
  tc.steps = steps, tc.batch = cfg.batch, tc.hidden = cfg.hidden, tc.embed = cfg.embed, tc.seed = cfg.seed;
  tc.device = cfg.device;
  tc.env_options.lag = cfg.lag, tc.env_options.vocab = cfg.vocab;
  tc.graph_replay = false;  // anomaly mode reads every op's output on the host: eager segments, both alike
  // Two identical trainers, one with anomaly mode, run segment by segment in
  // turn: whatever else the machine does hits both alike, and the median
  // segment time ignores the bursts.
  Trainer off(tc), on(tc);
  on.tape().set_anomaly(true);
  std::vector<double> t_off, t_on;
  auto timed = [](Trainer& tr) {
    const auto start = Clock::now();
    const UpdateResult r = tr.run_segment();
    return 1e6 * std::chrono::duration<double>(Clock::now() - start).count() / double(std::max<int64_t>(r.steps, 1));
  };
  while (!off.done()) {
    stop_if_asked(interrupted);
    t_off.push_back(timed(off));
    t_on.push_back(timed(on));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  return {median(t_off), median(t_on)};
}

// ---------------------------------------------------------------- the lab

double grad_tolerance(int64_t steps) { return std::max(kGradTolerance, double(steps) * std::ldexp(1.0, -23)); }

GradCheck compare_gradients(const Trace& got, const Trace& want, double tolerance) {
  GradCheck g;
  g.tolerance = tolerance;
  for (const Trace* t : {&got, &want})
    if (t->grads.empty()) {
      g.problem = t->engine + " " + info(t->id).name + " has no gradients" +
                  (t->error.empty() ? "" : " (it stopped: " + t->error_type + ": " + t->error + ")");
      return g;
    }
  g.run = true;
  for (const NamedValues& w : want.grads) {
    const auto it = std::find_if(got.grads.begin(), got.grads.end(), [&](const NamedValues& v) { return v.name == w.name; });
    if (it == got.grads.end() || it->shape != w.shape) {
      g.problem = "parameter " + w.name + (it == got.grads.end() ? " is missing" : " has another shape");
      return g;
    }
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < w.values.size(); ++i) {
      const double a = it->values[i], b = w.values[i];
      d += (a - b) * (a - b), na += a * a, nb += b * b;
    }
    const double den = std::sqrt(std::max(na, nb));
    const double e = den == 0 ? std::sqrt(d) : std::sqrt(d) / den;
    if (!(e <= g.max_rel_error) || g.worst.empty()) g.max_rel_error = e, g.worst = w.name;  // NaN included
    ++g.parameters;
  }
  if (got.grads.size() != want.grads.size()) g.problem = "the two models have different parameters";
  return g;
}

std::string LabReport::check_failure() const {
  for (const CaseResult& r : results) {
    if (r.id != Case::ExactReplay) continue;
    const std::pair<const GradCheck*, const char*> checks[] = {
        {&r.grad_check, "segtape"}, {&r.libtorch_grad_check, "LibTorch"}, {&r.cross_engine_check, "segtape against LibTorch"}};
    for (const auto& [g, which] : checks) {
      if (g != &r.grad_check && !g->run) continue;  // (LibTorch's: where it ran)
      const std::string check = std::string("exact-replay's gradient check (") + which + ")";
      if (!g->run) return check + " could not be made: " + g->problem;
      if (!g->problem.empty()) return check + ": " + g->problem;
      if (!g->passed()) {
        char b[160];
        std::snprintf(b, sizeof b, "%.3g relative in %s, more than %.3g", g->max_rel_error, g->worst.c_str(), g->tolerance);
        return "exact-replay's gradients differ from pitfall 1's beyond the tolerance (" + std::string(which) + ": " + b + ")";
      }
    }
  }
  return "";
}

bool LabReport::checks_passed() const { return check_failure().empty(); }

// Refuses a lab whose least memory is more than the process may take, before
// anything is allocated (a bare std::bad_alloc named nothing): every case's
// episode (tokens and targets, int64 a step and stream), and where a pitfall
// runs on the CPU (exact-replay's check runs pitfall 1) its one segment,
// whose arena holds every step's observation, embedding, GRU output and
// logits at least (the gates too, but for pitfall 7's recomputation).
void check_lab_memory(const LabConfig& cfg, const std::vector<Case>& which) {
  const bool pitfall = std::any_of(which.begin(), which.end(), [](Case c) { return info(c).pitfall || c == Case::ExactReplay; });
  const double episode = 16.0 * double(cfg.steps) * double(cfg.batch);
  const double step = double(cfg.batch) * (8.0 + 4.0 * double(cfg.embed) + 4.0 * double(cfg.vocab) + 4.0 * double(cfg.hidden));
  const double segment = pitfall && cfg.device == "cpu" ? step * double(cfg.steps) : 0;
  std::string has;
  const size_t limit = memory_limit(&has);
  if (limit && episode + segment > double(limit))
    throw Error("retention: --steps " + std::to_string(cfg.steps) + ", --batch " + std::to_string(cfg.batch) + ", --hidden " +
                std::to_string(cfg.hidden) + " need at least " + format_bytes(size_t(episode + segment)) + " (the episode " +
                format_bytes(size_t(episode)) + (segment > 0 ? ", and a pitfall's segment, which keeps all " +
                std::to_string(cfg.steps) + " steps, " + format_bytes(size_t(segment)) : std::string()) + ") but " + has + " " +
                format_bytes(limit) + ": lower --steps, --batch or --hidden");
}

LabReport run_lab(const LabConfig& cfg, const std::vector<Case>& which, TorchRunner torch,
                  const LabHooks& hooks) {
  cfg.validate();
  check_lab_memory(cfg, which);
  LabReport rep;
  rep.config = cfg;
  rep.libtorch_built = torch != nullptr;
  auto say = [&](const std::string& s) {
    if (hooks.progress) hooks.progress(s);
  };
  for (Case c : which) {
    stop_if_asked(hooks.interrupted);
    CaseResult r;
    r.id = c;
    const std::string name = label(c, cfg);
    RunOptions o;
    o.interrupted = hooks.interrupted;
    if (hooks.inspect && info(c).pitfall) o.inspect = [&](const Tape& t) { hooks.inspect(c, t); };
    say("segtape  " + name);
    r.segtape = run_segtape(c, cfg, o);
    if (info(c).pitfall) {
      RunOptions strict;
      strict.strict = true;
      strict.interrupted = hooks.interrupted;
      r.strict = run_segtape(c, cfg, strict);
      strict.retain_graph = false;
      if (info(c).backward_every_step) r.no_retain = run_segtape(c, cfg, strict);
    }
    if (torch) {
      say("libtorch " + name);
      r.libtorch = torch(c, cfg);
      if (rep.libtorch_memory.empty()) rep.libtorch_memory = r.libtorch.memory_source;
    }
    rep.results.push_back(std::move(r));
  }
  // exact-replay's gradients against pitfall 1's, on each engine where both ran.
  const auto p1 = std::find_if(rep.results.begin(), rep.results.end(), [](const CaseResult& r) { return r.id == Case::HiddenNotDetached; });
  const double tol = grad_tolerance(cfg.steps);
  for (CaseResult& r : rep.results) {
    if (r.id != Case::ExactReplay) continue;
    if (p1 != rep.results.end()) {
      r.grad_check = compare_gradients(r.segtape, p1->segtape, tol);
      if (!p1->libtorch.engine.empty()) {
        r.cross_engine_check = compare_gradients(r.segtape, p1->libtorch, tol);
        if (!r.libtorch.engine.empty()) r.libtorch_grad_check = compare_gradients(r.libtorch, p1->libtorch, tol);
      }
    } else {
      say("segtape  " + label(Case::HiddenNotDetached, cfg) + " (the gradients exact-replay must equal)");
      RunOptions p1_run;
      p1_run.interrupted = hooks.interrupted;
      r.grad_check = compare_gradients(r.segtape, run_segtape(Case::HiddenNotDetached, cfg, p1_run), tol);
    }
  }
  if (hooks.measure_anomaly) {
    say("anomaly mode cost");
    rep.anomaly = anomaly_cost(cfg, 8192, hooks.interrupted);
  }
  return rep;
}

namespace {

std::string num(double v, const char* f = "%.0f") {
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A fit's slope may be slightly negative (a fix's sawtooth).
std::string signed_bytes(double b) { return (b < 0 ? "-" : "") + format_bytes(size_t(std::fabs(b))); }

nlohmann::json summary_json(const Trace& t, size_t budget, const std::string& absent) {
  nlohmann::json j;
  if (t.engine.empty()) return absent;
  const Summary s = summarise(t, budget);
  j["memory"] = t.memory_source;
  j["bytes_per_step"] = s.bytes_per_step;
  j["bytes_per_step_at_end"] = s.growth_end;
  j["bytes_last_step"] = s.bytes_last;
  j["bytes_peak"] = s.bytes_peak;
  if (t.held_steps > 0) {
    j["explained_at_last_step"] = {{"tape_node_bytes", t.final_node_bytes},
                                   {"tape_node_bytes_per_step", t.final_node_bytes / t.held_steps},
                                   {"backward_gradient_bytes", t.final_grad_bytes},
                                   {"steps_held", t.held_steps}};
  }
  j["ms_per_step_start"] = s.ms_start;
  j["ms_per_step_end"] = s.ms_end;
  j["budget_bytes"] = budget;
  if (s.budget_step < 0) j["budget_exceeded_at_step"] = nullptr;
  else j["budget_exceeded_at_step"] = std::round(s.budget_step);
  j["budget_step_extrapolated"] = s.budget_extrapolated;
  j["rows"] = t.step.size();
  if (!t.segment_peaks.empty()) {
    const auto [lo, hi] = std::minmax_element(t.segment_peaks.begin() + std::min<ptrdiff_t>(1, ptrdiff_t(t.segment_peaks.size()) - 1),
                                              t.segment_peaks.end());
    j["segment_peak_min_after_first"] = *lo;
    j["segment_peak_max_after_first"] = *hi;
    j["segments"] = t.segment_peaks.size();
  }
  if (!t.error.empty()) j["error"] = {{"type", t.error_type}, {"step", t.error_step}, {"message", t.error}};
  return j;
}

nlohmann::json error_json(const Trace& t) {
  if (t.error.empty()) return "no error";
  return {{"type", t.error_type}, {"step", t.error_step}, {"message", t.error}};
}

nlohmann::json check_json(const GradCheck& g) {
  nlohmann::json j = {{"run", g.run}, {"equal", g.passed()}};
  if (g.run) j["max_relative_error"] = g.max_rel_error, j["worst_parameter"] = g.worst, j["parameters"] = g.parameters;
  if (!g.problem.empty()) j["problem"] = g.problem;
  return j;
}

// "6.1e-06 (gru.bias_ih; tolerance 2.4e-05): equal", or "FAILED: ..." saying why.
std::string check_line(const GradCheck& g) {
  if (!g.run) return "FAILED: not checked: " + g.problem;
  std::string s = num(g.max_rel_error, "%.1e") + " (" + g.worst + "; tolerance " + num(g.tolerance, "%.1e") + "): ";
  if (!g.problem.empty()) return "FAILED: " + s + g.problem;
  return g.passed() ? s + "equal" : "FAILED: " + s + "the gradients differ";
}

}  // namespace

std::string to_csv(const LabReport& r) {
  std::string s = "engine,case,step,bytes\n";
  for (const CaseResult& c : r.results)
    for (const Trace* t : {&c.segtape, &c.libtorch})
      for (size_t i = 0; i < t->step.size(); ++i)
        s += t->engine + "," + info(c.id).name + "," + std::to_string(t->step[i]) + "," + num(t->bytes[i]) + "\n";
  return s;
}

std::string to_json(const LabReport& r) {
  const LabConfig& c = r.config;
  nlohmann::json j;
  j["config"] = {{"steps", c.steps}, {"batch", c.batch}, {"vocab", c.vocab}, {"embed", c.embed}, {"hidden", c.hidden},
                 {"lag", c.lag}, {"k", c.k}, {"window", c.window}, {"trainer_k", c.trainer_k}, {"lr", c.lr},
                 {"clip", c.clip}, {"budget", c.budget}, {"seed", c.seed}, {"device", c.device}};
  j["checks_passed"] = r.checks_passed();
  j["memory"] = {{"segtape", kArenaSource},
                 {"libtorch", r.libtorch_built ? r.libtorch_memory : r.libtorch_note}};
  if (r.anomaly.us_off > 0)
    j["anomaly_mode"] = {{"loop", "agent Trainer, recall, tbptt:" + std::to_string(c.trainer_k)},
                         {"us_per_step_off", r.anomaly.us_off},
                         {"us_per_step_on", r.anomaly.us_on},
                         {"cost_percent", r.anomaly.percent()}};
  else
    j["anomaly_mode"] = "not measured";
  nlohmann::json cs = nlohmann::json::array();
  for (const CaseResult& x : r.results) {
    const CaseInfo& i = info(x.id);
    nlohmann::json e = {{"case", i.name}, {"label", label(x.id, c)}, {"pitfall", i.pitfall}, {"summary", i.summary}, {"remedy", i.remedy}};
    e["segtape"] = summary_json(x.segtape, c.budget, "not run");
    e["segtape"]["policy"] = i.pitfall ? "teaching (TapeOptions{.grow = true})" : "strict (segment_budget = budget)";
    if (i.pitfall) e["segtape_strict_policy_error"] = error_json(x.strict);
    if (i.backward_every_step) e["segtape_without_retain_graph_error"] = error_json(x.no_retain);
    e["libtorch"] = summary_json(x.libtorch, c.budget, r.libtorch_note);
    if (x.id == Case::ExactReplay) {
      const replay::Report& rp = x.segtape.replay;
      if (!x.segtape.step.empty())
        e["segtape"]["replay"] = {{"window_steps", c.steps},
                                  {"k", c.k},
                                  {"segments", rp.segments},
                                  {"steps_run", rp.steps_run},
                                  {"recompute_factor", rp.recompute_factor},
                                  {"stored_states", rp.stored_states},
                                  {"state_bytes", rp.state_bytes},
                                  {"state_bytes_in_first_row", x.segtape.state_bytes.front()},
                                  {"input_bytes", rp.input_bytes},
                                  {"segment_peak", rp.segment_peak},
                                  {"rows", "arena bytes after the step in its replayed segment (a segment's last step: its "
                                           "high-water) + the boundary states needed then (state_bytes_in_first_row + one "
                                           "state per K steps; all of state_bytes at the last step)"}};
      const std::string not_run = "not checked (pitfall 1 did not run on LibTorch)";
      e["gradient_check"] = {
          {"against", label(Case::HiddenNotDetached, c)},
          {"relative_error", "per parameter ||got - want|| / max(||got||, ||want||), the largest"},
          {"tolerance", grad_tolerance(c.steps)},
          {"segtape", check_json(x.grad_check)},
          {"libtorch", x.libtorch_grad_check.run ? check_json(x.libtorch_grad_check) : nlohmann::json(not_run)},
          {"segtape_vs_libtorch_pitfall_1", x.cross_engine_check.run ? check_json(x.cross_engine_check) : nlohmann::json(not_run)}};
    }
    cs.push_back(e);
  }
  j["cases"] = cs;
  return j.dump(2) + "\n";
}

namespace {
// Case i (0-based) is drawn with kMarkers[i % 7]; pitfall i with kDashes[i], fixes solid.
const char* const kDashes[] = {"7 4", "2 3", "10 3 2 3", "5 2", "1 2", "12 5", "6 2 2 2"};
const Marker kMarkers[] = {Marker::Circle, Marker::Square, Marker::Triangle, Marker::Diamond,
                           Marker::Cross,  Marker::TriangleDown, Marker::Plus};
}  // namespace

std::string to_svg(const LabReport& r) {
  const LabConfig& c = r.config;
  const size_t n_cases = cases().size();
  // KiB on a plain log axis: decade ticks (100, 1000, 10000 KiB) read better
  // here than the byte axis's powers of 1024 over four decades.
  Panel st{"segtape: segment arena after each step (pitfalls: teaching policy; fixes: strict)", "step", "KiB", {}, true, false};
  Panel lt{"LibTorch: live CPU tensor bytes after each step (counting allocator), same model and data", "step", "KiB", {}, true, false};
  if (r.libtorch_built && r.libtorch_memory.rfind("RSS", 0) == 0) lt.title = "LibTorch: process RSS after each step (allocator not installed)";
  const std::string budget = format_bytes(c.budget);
  st.note = "dashed with markers: pitfalls; solid: fixes; horizontal line: the " + budget +
            " budget; open marker: a pitfall's first step over it (legend: that step, ~ extrapolated).\n"
            "A curve identical to an earlier one lies under it and says so in its legend (\"= 1\": the same as pitfall 1); its markers sit at other steps.";
  lt.note = "Same conventions; the budget applies to segtape only and is drawn for comparison.";
  double lo = double(c.budget) / 1024, hi = lo;
  for (const CaseResult& x : r.results) {
    const CaseInfo& ci = info(x.id);
    const size_t k = size_t(x.id);
    for (auto [t, p] : {std::pair{&x.segtape, &st}, std::pair{&x.libtorch, &lt}}) {
      if (t->engine.empty()) continue;
      Series s{label(x.id, c), {}, {}};
      for (size_t i = 0; i < t->step.size(); ++i) {
        s.x.push_back(double(t->step[i])), s.y.push_back(t->bytes[i] / 1024);
        if (s.y.back() > 0) lo = std::min(lo, s.y.back()), hi = std::max(hi, s.y.back());
      }
      s.color = series_color(k);
      // Markers every eighth of the run, each case at its own offset, so that
      // curves drawn on top of each other still show every case.
      s.marker = kMarkers[k % std::size(kMarkers)];
      s.marker_every = std::max<size_t>(1, t->step.size() / 8);
      s.marker_offset = k * s.marker_every / n_cases;
      std::string notes;
      if (ci.pitfall) {
        s.dash = kDashes[k % std::size(kDashes)];
        for (const CaseResult& y : r.results) {
          if (&y == &x) break;
          const Trace& u = t == &x.segtape ? y.segtape : y.libtorch;
          if (info(y.id).pitfall && u.step == t->step && u.bytes == t->bytes) {
            notes += "= " + std::to_string(int(y.id) + 1);
            break;
          }
        }
        const Summary m = summarise(*t, c.budget);
        if (m.budget_step >= 0) {
          notes += (notes.empty() ? "" : "; ") + std::string("over at ") + (m.budget_extrapolated ? "~" : "") + num(m.budget_step);
          for (size_t i = 0; i < t->step.size() && !m.budget_extrapolated; ++i)
            if (double(t->step[i]) == m.budget_step) s.marks.push_back({s.x[i], s.y[i], ""});
        }
      }
      if (!notes.empty()) s.label += " (" + notes + ")";
      p->series.push_back(std::move(s));
    }
  }
  for (Panel* p : {&st, &lt}) {
    p->hlines.push_back({double(c.budget) / 1024, "budget " + budget + " (strict policy)"});
    p->y_min = lo / 1.3, p->y_max = hi * 1.3;  // one scale for both engines
  }
  if (!r.libtorch_built) {
    st.note += "\n" + r.libtorch_note + ": only segtape's panel is drawn.";
    return render_svg({st}, 1100, 470);
  }
  return render_svg({st, lt}, 1100, 470);
}

std::string table(const LabReport& r) {
  const LabConfig& c = r.config;
  std::string s;
  char b[512];
  std::snprintf(b, sizeof b, "retention lab: B=%ld vocab=%ld embed=%ld H=%ld, %ld steps, lag %ld, K=%ld, budget %s, segtape on %s\n",
                c.batch, c.vocab, c.embed, c.hidden, c.steps, c.lag, c.k, format_bytes(c.budget).c_str(), c.device.c_str());
  s += b;
  s += "memory: segtape = segment arena bytes in use; libtorch = " +
       (r.libtorch_built ? r.libtorch_memory : r.libtorch_note) + "\n\n";
  std::snprintf(b, sizeof b, "%-26s | %-31s | %-31s | %-15s | %s\n", "case", "segtape: B/step  peak   ms/step", "libtorch: B/step  peak  ms/step",
                "over budget at", "strict policy (segtape)");
  s += b;
  s += std::string(26, '-') + "-+-" + std::string(31, '-') + "-+-" + std::string(31, '-') + "-+-" + std::string(15, '-') + "-+-" +
       std::string(30, '-') + "\n";
  auto cell = [&](const Trace& t) -> std::string {
    if (t.engine.empty()) return "not run";
    const Summary m = summarise(t, c.budget);
    char x[96];
    std::snprintf(x, sizeof x, "%9s %9s %4.2f>%-5.2f", signed_bytes(m.bytes_per_step).c_str(), format_bytes(size_t(m.bytes_peak)).c_str(),
                  m.ms_start, m.ms_end);
    return x;
  };
  auto over = [&](const Trace& t) -> std::string {
    if (t.engine.empty()) return "-";
    const Summary m = summarise(t, c.budget);
    if (m.budget_step < 0) return "never";
    return (m.budget_extrapolated ? "~" : "") + num(m.budget_step);
  };
  for (const CaseResult& x : r.results) {
    std::string strict = "-";
    if (info(x.id).pitfall)
      strict = x.strict.error.empty() ? "no error (fits the budget)"
                                      : x.strict.error_type + " at step " + std::to_string(x.strict.error_step);
    if (!info(x.id).pitfall && !x.segtape.error.empty()) strict = "FAILED: " + x.segtape.error_type;
    if (!info(x.id).pitfall && x.segtape.error.empty()) strict = "fits (peak " + format_bytes(size_t(*std::max_element(x.segtape.segment_peaks.begin(), x.segtape.segment_peaks.end()))) + ")";
    std::snprintf(b, sizeof b, "%-26s | %-31s | %-31s | %6s / %-6s | %s\n", label(x.id, c).c_str(), cell(x.segtape).c_str(),
                  cell(x.libtorch).c_str(), over(x.segtape).c_str(), over(x.libtorch).c_str(), strict.c_str());
    s += b;
  }
  s += "\nB/step: least-squares slope of bytes vs step; ms/step: first 10% > last 10% of steps; over budget at: step at which\n"
       "the budget is exceeded (segtape / libtorch; ~ extrapolated from the fit).\n";
  for (const CaseResult& x : r.results) {
    if (x.id != Case::ExactReplay) continue;
    const replay::Report& rp = x.segtape.replay;
    if (!x.segtape.step.empty()) {
      std::snprintf(b, sizeof b,
                    "%s: one window of %ld steps in %ld segments of %ld, %ld step evaluations (recompute factor %.2f); "
                    "%ld boundary states + dL/dh + the final state stored (%s), rows count those still needed (%s at the first step)\n",
                    label(x.id, c).c_str(), c.steps, rp.segments, c.k, rp.steps_run, rp.recompute_factor, rp.stored_states,
                    format_bytes(rp.state_bytes).c_str(), format_bytes(size_t(x.segtape.state_bytes.front())).c_str());
      s += b;
    }
    s += label(x.id, c) + ": parameter gradients vs " + label(Case::HiddenNotDetached, c) + "'s, max relative error: segtape " +
         check_line(x.grad_check);
    if (x.libtorch_grad_check.run) s += "; libtorch " + check_line(x.libtorch_grad_check);
    if (x.cross_engine_check.run) s += "; segtape's vs LibTorch's pitfall 1 " + check_line(x.cross_engine_check);
    s += "\n";
  }
  if (r.anomaly.us_off > 0) {
    std::snprintf(b, sizeof b, "anomaly mode on the agent loop (Trainer, tbptt:%ld): %.1f us/step off, %.1f us/step on (%+.1f%%)\n",
                  c.trainer_k, r.anomaly.us_off, r.anomaly.us_on, r.anomaly.percent());
    s += b;
  }
  return s;
}

}  // namespace segtape::agent::retention
