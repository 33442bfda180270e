#include "segtape/agent/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "algo/algorithm.h"
#include "context.h"
#include "device/device_loop.h"
#include "history/history.h"
#include "sizing.h"
#include "step.h"

namespace segtape::agent {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Why the ranks stop (Trainer::request_stop's reasons), summed over them in
// the gradient average's flag: reason 1 counts 1, reason 2 counts ranks + 1,
// so the sum says whether any rank gave reason 1 (exact below 2^24, float's
// integers: up to 4095 ranks).
constexpr int kStopReasons = 2;
float encode_stop_reason(int reason, int ranks) { return reason == 1 ? 1.0f : float(ranks + 1); }
int decode_stop_reasons(float sum, int ranks) { return std::lround(sum) % (ranks + 1) != 0 ? 1 : 2; }

// Whether the trainer runs its segments as CUDA graphs (TrainConfig::graph_replay):
// a segment's steps must be known before it runs (a supervised env that is
// open loop), repeat from segment to segment (a history whose K-step
// segments do), and read nothing on the host (one process; not under
// --nonfinite skip, which reads each update's gradient norm before its step).
bool graph_applies(const TrainConfig& c, const EnvSpec& spec, bool distributed) {
  return c.graph_replay && c.nonfinite != "skip" && c.device == "cuda" && c.learner(spec) == Algo::Supervised && spec.open_loop && !distributed &&
         history_def(c.history.kind).graphs;
}

// What the trainer keeps in its tape's persistent pool and the parts that
// work on it, made in one place: by the constructor on its tape, and on a
// throwaway CPU tape that measures a device's pool (size_device_pools).
struct Parts {
  std::unique_ptr<HistoryRunner> history;
  std::unique_ptr<Step> step;
  std::unique_ptr<Algorithm> algo;
};

Parts build(Context& c) {
  const TrainConfig& cf = c.config;
  const EnvSpec& spec = c.env->spec();
  c.policy = std::make_unique<Policy>(*c.tape, c.init_rng, spec, policy_shape(cf, spec));
  if (cf.optim == "sgd") c.optim = std::make_unique<nn::SGD>(*c.policy, nn::SGDOptions{.lr = cf.lr});
  else if (cf.optim == "adamw") c.optim = std::make_unique<nn::AdamW>(*c.policy, nn::AdamWOptions{.lr = cf.lr, .eps = cf.adam_eps, .capturable = c.graph});
  else c.optim = std::make_unique<nn::Adam>(*c.policy, nn::AdamOptions{.lr = cf.lr, .eps = cf.adam_eps, .capturable = c.graph});
  if (cf.dropout > 0) c.dropout = std::make_unique<nn::Dropout>(*c.tape, cf.dropout, Context::act_seed(cf.seed, c.rank()) ^ 0xd20u);
  c.h = c.h_home = c.tape->persistent({cf.state_rows() * cf.batch, cf.hidden});
  c.eval_h = c.tape->persistent({cf.state_rows() * cf.batch, cf.hidden});
  if (c.graph || cf.device_loop) c.clip_sq = c.tape->persistent({1}, DType::F64);  // the capturable clip's squared norm
  c.episode_return.assign(size_t(cf.batch), 0.0f);
  Parts p;
  p.history = history_def(cf.history.kind).make(c);
  p.step = std::make_unique<Step>(c, *p.history);
  p.algo = algorithm_def(cf.learner(spec)).make(c, *p.history, *p.step);
  return p;
}

// A device's pools are fixed when its tape is made, and a `segtape train`
// user cannot size them. The persistent pool is measured: the trainer's
// parts are made on a throwaway CPU tape by the code that makes the real
// ones (build), and the pool is the bytes that tape used (64-byte aligned
// blocks, as on the device). The carry buffer holds the carried state; its
// default is a floor.
void size_device_pools(TapeOptions& o, const Context& real) {
  Context count(real.config, real.rank());
  count.tape = std::make_unique<Tape>(Device::cpu(), TapeOptions{.segment_budget = 0, .node_capacity = 0});
  count.env = real.env;
  count.graph = real.graph;
  const Parts parts = build(count);  // (the values do not matter, only the sizes)
  o.device_persistent = count.tape->stats().persistent_bytes;
  const size_t state = align_up(size_t(real.config.state_rows() * real.config.batch * real.config.hidden) * sizeof(float));
  o.device_carry = std::max(o.device_carry, 2 * state + (size_t(1) << 20));
}

// save, load, run_segment and evaluate between segments only: from an env's
// callback inside run_segment or evaluate, the step, the state and the
// parameters are the segment's half-done ones (a load there was accepted and
// then overwritten; a nested evaluate wrote the outer segment's state).
// (busy: inside run_segment or evaluate, also between evaluate's segments,
// where its interrupt check runs Python's signal handlers)
struct Busy {
  int& n;
  explicit Busy(int& c) : n(c) { ++n; }
  ~Busy() { --n; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
};
}  // namespace

double Context::lr() const {
  if (const auto* sgd = dynamic_cast<const nn::SGD*>(optim.get())) return sgd->options().lr;
  return static_cast<const nn::Adam&>(*optim).options().lr;
}

void Context::set_lr(double lr) {
  if (auto* sgd = dynamic_cast<nn::SGD*>(optim.get())) sgd->options().lr = lr;
  else static_cast<nn::Adam&>(*optim).options().lr = lr;
}

uint64_t Context::act_seed(uint64_t seed, int rank) {
  return rank == 0 ? seed ^ 0xac7u : splitmix64((seed ^ 0xac7u) + uint64_t(rank));
}

std::unique_ptr<Env> Context::make_training_env() const {
  const TrainConfig& cf = config;
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < cf.env_shards; ++i) seeds.push_back(Trainer::shard_seed(cf.seed, int64_t(rank()) * cf.env_shards + i));
  EnvOptions streams = cf.env_options;  // (lm: the ranks and shards read their own streams of the text)
  streams.shards = int64_t(ranks()) * cf.env_shards, streams.shard = int64_t(rank()) * cf.env_shards;
  return make_env_shards(cf.env, cf.batch, seeds, streams);
}

void Context::update(bool has_loss) {
  if (avg) {  // every rank: the mean of the ranks' gradients
    const double with_loss = avg->average(has_loss ? 1.0f : 0.0f);
    if (avg->flag_seen() && !stop_agreed) stop_agreed = true, stop_reason = decode_stop_reasons(avg->flag_sum(), ranks());
    if (with_loss == 0) {  // no rank had a loss: no step, as in one process
      optim->zero_grad();
      return;
    }
  }
  if (graph || norm_on_device) {
    // The norm stays on the device: a graph segment's loss is checked after
    // it (Trainer::run_segment); norm_on_device's algorithm reads the norms
    // after the iteration, so they are computed with the clip off too.
    if (config.clip > 0) nn::clip_grad_norm(*policy, config.clip, clip_sq);
    else if (norm_on_device) nn::grad_squares(*policy, clip_sq);
  } else {
    // The clip's norm, computed once (with the clip off too), and checked
    // before anything is scaled or stepped: the gradients are averaged over
    // the ranks by now, so every rank decides alike.
    const double norm = nn::grad_norm(*policy);
    if (!std::isfinite(norm)) [[unlikely]] {
      refuse_non_finite(std::string("the gradient's norm is ") + (std::isnan(norm) ? "NaN" : "inf"));
      return;
    }
    skipped_in_a_row = 0;
    if (config.clip > 0) nn::clip_grads_with_norm(*policy, config.clip, norm);
  }
  optim->step();
  optim->zero_grad();
  if (avg && ++updates % Trainer::kReplicaCheckEvery == 0)
    dist::check_replicas(*comm, *policy, "after update " + std::to_string(updates) + " (step " + std::to_string(step) + ")");
}

namespace {
// What makes an update's gradient not finite (the errors of both checks).
constexpr const char* kNonFiniteCauses = "Rewards too large for float32 (returns that overflow), a learning rate too high or a loss "
                                         "that diverged make this. ";
}  // namespace

std::string Context::stop_at_update(int64_t update) {
  const std::string u = std::to_string(update), steps = std::to_string(segment_step0) + " to " + std::to_string(step);
  stopped_at_non_finite = "update " + u + " (steps " + steps + ")";
  return "update " + u + ", in the segment of steps " + steps + ": ";
}

void Context::refuse_non_finite(const std::string& what) {
  const bool skip = config.nonfinite == "skip" && skipped_in_a_row + 1 < config.max_skips;
  std::string first = nn::first_non_finite_grad(*policy);
  first = first.empty() ? "every gradient value is finite, but the sum of their squares overflows"
                        : "the first parameter whose gradient is not finite is " + first;
  optim->zero_grad();
  if (skip) {
    ++skipped, ++skipped_in_a_row;
    return;
  }
  throw NonFiniteError(stop_at_update(optim->step_count() + skipped + 1) + what + " (" + first + "). " + kNonFiniteCauses +
                       (config.nonfinite == "skip" ? std::to_string(config.max_skips) + " updates in a row had a gradient that is "
                                                     "not finite (--max-skips " + std::to_string(config.max_skips) + "). "
                                                   : std::string("")) +
                       "This update was not taken (in PPO, the iteration's earlier minibatches were); a run's checkpoint is "
                       "kept as it was written, and this trainer trains on only once one is loaded. --nonfinite skip skips "
                       "such updates (as PyTorch's GradScaler does) and stops after --max-skips in a row");
}

void Context::refuse_non_finite_after(int64_t update, double sq) {
  throw NonFiniteError(stop_at_update(update) + "the gradient's norm is " + (std::isnan(sq) ? "NaN" : "inf") +
                       ", found after the iteration (--device-loop on reads the update's norms once an iteration), so this "
                       "update and the iteration's later ones were taken. " + kNonFiniteCauses +
                       "A run's checkpoint is kept as it was written, and this trainer trains on only once one is loaded. "
                       "--device-loop off (or --nonfinite skip) checks each update's norm before its step");
}

uint64_t Trainer::shard_seed(uint64_t seed, int64_t shard) {
  const uint64_t base = seed * 1000003u + 17u;
  return shard == 0 ? base : splitmix64(base + uint64_t(shard));
}

Trainer::Trainer(const TrainConfig& config, dist::Communicator* comm)
    : c_(std::make_unique<Context>(config, comm ? comm->rank() : 0)) {
  Context& c = *c_;
  c.config.validate();
  const TrainConfig& cf = c.config;
  if (comm && comm->size() > 1) {
    c.comm = comm;
    auto settings = cf.to_metadata();
    settings["ranks"] = std::to_string(comm->size());
    dist::check_same(*comm, settings, "the training configuration");
  }
  env_ = c.make_training_env();
  c.env = env_.get();
  c.counter_draws = device::is_twin(cf.env);
  const EnvSpec& spec = c.env->spec();
  sizes_ = estimate_sizes(cf, spec, c.comm ? c.comm->size() : 1);
  if (!c.comm) check_sizes(cf, sizes_);
  else {  // a rank that cannot fit is every rank's error (the others would wait in the broadcast below)
    // Ranks on one machine share its memory: each counts what the others
    // will take (their estimates less what they hold already) with its own.
    const size_t more = sizes_.resident_total - std::min(sizes_.resident_total, sizes_.process_bytes);
    const std::string me = machine_id();
    const std::vector<std::string> all = c.comm->allgather(me + '\n' + std::to_string(more), "the exchange of the ranks' memory estimates");
    MachineShare others;
    for (size_t r = 0; r < all.size(); ++r)
      if (int(r) != c.comm->rank() && all[r].compare(0, me.size() + 1, me + '\n') == 0)
        ++others.ranks, others.bytes += size_t(std::strtoull(all[r].c_str() + me.size() + 1, nullptr, 10));
    std::string refused;
    try {
      check_sizes(cf, sizes_, others);
    } catch (const std::exception& e) {
      refused = e.what();
    }
    dist::raise_if_any(*c.comm, refused);
  }  // before anything is allocated
  TapeOptions options = tape_options(cf);
  c.graph = graph_applies(cf, spec, c.comm != nullptr);
  if (c.graph) {
    options.graph_replay = true;
    options.graph_staging = std::max(options.graph_staging, graph_staging(cf, spec));
  }
  // PPO's rollouts on the device (--device-loop on) as CUDA graphs, the
  // rest of the run's segments eager (TapeOptions::graph_explicit)
  if (cf.device_loop && cf.device == "cuda" && cf.graph_replay) options.graph_replay = options.graph_explicit = true;
  if (cf.device == "cuda") size_device_pools(options, c);
  // Data parallel on GPUs: one GPU per rank, the rank's place on its
  // machine; device 0 where CUDA_VISIBLE_DEVICES shows the rank one GPU (a
  // scheduler's --gpus-per-task=1).
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const bool one_visible = visible && *visible && !std::strchr(visible, ',');
  const int gpu = c.comm && !one_visible ? dist::local_rank() : 0;
  try {
    c.tape = std::make_unique<Tape>(cf.device == "cuda" ? Device::cuda(gpu) : Device::cpu(), options);
  } catch (const OutOfMemoryError& e) {
    // The segment arena is reserved whole, up front: a budget beyond the
    // machine's memory fails here, named by the flag that set it.
    if (cf.device != "cuda" && std::string_view(e.pool) == kSegmentArenaPool)
      throw OutOfMemoryError(format_bytes(applied_budget(cf)) + " " + cf.budget_name + ": the segment arena of that size "
                             "cannot be reserved (" + e.what() + "); lower " + cf.budget_name, e.pool);
    throw;
  } catch (const DeviceError& e) {
    // Ranks past the machine's GPUs (data parallel: the GPU of the local rank)
    if (e.gpu_present && c.comm)
      throw DeviceError(std::string(e.what()) + "; under mpirun each rank takes the GPU numbered by its rank on its machine: start "
                        "at most one rank per GPU on each machine, or show each rank one GPU (CUDA_VISIBLE_DEVICES)", true);
    if (e.gpu_present) throw;  // (a GPU is here, busy or not this one: no hint fits better than the message)
    // (a checkpoint of a GPU run, resumed or evaluated where there is none)
    throw DeviceError(std::string(e.what()) + "; this run's device is cuda: run it on the CPU with device \"cpu\" (segtape: --device cpu)");
  }
  Parts p = build(c);
  history_ = std::move(p.history);
  step_ = std::move(p.step);
  algo_ = std::move(p.algo);
  if (c.comm) c.avg = std::make_unique<dist::GradientAverager>(*c.comm, *c.policy);  // broadcasts rank 0's parameters
}

Trainer::~Trainer() {
  if (c_) c_->avg.reset();  // (its NCCL communicator before the tape's stream and pools)
}

int Trainer::rank() const { return c_->rank(); }
int Trainer::ranks() const { return c_->comm ? c_->comm->size() : 1; }
const dist::AverageStats* Trainer::dist_stats() const { return c_->avg ? &c_->avg->stats() : nullptr; }
std::string Trainer::dist_transport() const { return c_->avg ? c_->avg->transport() : "local"; }

void Trainer::request_stop(int reason) {
  if (reason < 1 || reason > kStopReasons) throw Error("Trainer::request_stop: reason " + std::to_string(reason) + " is not 1 or 2");
  if (stop_agreed()) return;  // (agreed already: its reason stays the one every rank has)
  if (!c_->stop_requested || reason < c_->stop_reason) c_->stop_reason = reason;
  c_->stop_requested = true;
  if (c_->avg) c_->avg->raise_flag(encode_stop_reason(c_->stop_reason, ranks()));
}

bool Trainer::stop_agreed() const { return c_->avg ? c_->stop_agreed : c_->stop_requested; }
int Trainer::stop_reason() const { return stop_agreed() ? c_->stop_reason : 0; }
bool Trainer::done() const { return c_->step >= c_->config.steps; }
int64_t Trainer::step() const { return c_->step; }
int64_t Trainer::skipped_updates() const { return c_->skipped; }
const SizeEstimate& Trainer::size_estimate() const { return sizes_; }
size_t Trainer::budget() const { return applied_budget(c_->config); }
double Trainer::lr() const { return c_->lr(); }
const Tensor& Trainer::state() const { return c_->h; }
Tape& Trainer::tape() { return *c_->tape; }
Policy& Trainer::policy() { return *c_->policy; }
Env& Trainer::env() { return *c_->env; }
const TrainConfig& Trainer::config() const { return c_->config; }
bool Trainer::graph_segments() const { return c_->graph; }
bool Trainer::graph_sequence() const { return c_->graph && algo_->sequence(); }
bool Trainer::ppo_sequence() const { return c_->config.algo == Algo::Ppo && algo_->sequence(); }
bool Trainer::grows() const { return history_def(c_->config.history.kind).grows; }

std::string Trainer::recurrence() const {
  const TrainConfig& cf = c_->config;
  const int64_t rows = cf.algo == Algo::Ppo ? cf.batch / cf.minibatches : cf.batch;  // (PPO's windows: a minibatch's streams)
  if (graph_sequence() || ppo_sequence()) return "one gru_sequence a segment: " + gru_sequence_path(*c_->tape, rows, cf.hidden, DType::F32);
  if (cf.device == "cuda" && cf.cell == "gru" && cf.state_rows() == 1 && !gru_sequence_fused(*c_->tape, rows, cf.hidden, DType::F32))
    return "cells, step by step: " + gru_sequence_path(*c_->tape, rows, cf.hidden, DType::F32);
  return "cells, step by step";
}

void refuse_inside_a_segment(bool busy, const char* what) {
  if (busy)
    throw Error(std::string(what) + ": called while a segment runs (from inside run_segment or evaluate, e.g. an env's "
                "callback or a signal handler); call it between segments");
}

void Trainer::refuse_while_running(const char* what) const { refuse_inside_a_segment(busy_ > 0, what); }

UpdateResult Trainer::stopped_figures() {
  refuse_while_running("stopped_figures");
  const Busy busy(busy_);
  return algo_->stopped();
}

void Trainer::refuse_after_non_finite(const char* what) const {
  if (!c_->stopped_at_non_finite.empty())
    throw NonFiniteError(std::string(what) + ": this trainer stopped at the non-finite " + c_->stopped_at_non_finite +
                         ", part-way through its segment (its env and samplers moved on); load a checkpoint first");
}

// The loss, read on the host for the report: one that is not finite though
// no update of the segment was skipped ends the run under either
// --nonfinite (the gradient was finite and its update taken; a CUDA-graph
// segment's gradient norm stays on the device, so there the update was
// taken unchecked). Under data parallelism each rank's loss is its own:
// the ranks agree on the averaged gradient's check, and this one is not made.
void Trainer::check_loss(const UpdateResult& r, int64_t step0, int64_t skipped0) {
  Context& c = *c_;
  if (std::isfinite(r.loss_sum) || c.skipped != skipped0 || c.avg) [[likely]]
    return;
  c.stopped_at_non_finite = "loss of steps " + std::to_string(step0) + " to " + std::to_string(c.step);
  throw NonFiniteError("the segment of steps " + std::to_string(step0) + " to " + std::to_string(c.step) + ": its loss is " +
                       (std::isnan(r.loss_sum) ? "NaN" : r.loss_sum > 0 ? "inf" : "-inf") +
                       (c.graph ? ", its update taken (a CUDA-graph segment: the gradient's norm is not checked on the host)"
                                : " though its gradient was finite (its update was taken)") +
                       ". Rewards too large for float32, a learning rate too high or a loss that diverged make this; a run's "
                       "checkpoint is kept as it was written, and this trainer trains on only once one is loaded");
}

UpdateResult Trainer::run_segment() {
  refuse_while_running("run_segment");  // (an env's callback: the outer segment's state, half-done)
  refuse_after_non_finite("run_segment");
  const Busy busy(busy_);
  Context& c = *c_;
  const int64_t remaining = c.config.steps - c.step;
  c.segment_step0 = c.step;
  if (grows()) {  // (its one segment holds the state)
    const int64_t step0 = c.step, skipped0 = c.skipped;
    const UpdateResult r = algo_->update(remaining);
    check_loss(r, step0, skipped0);
    return r;
  }
  // The state entering the update in its persistent home (a carried value
  // would expire with the segment an error abandons), to go back to on an error.
  if (c.h.ptr != c.h_home.ptr) copy_into(c.h_home, c.h);
  c.h = c.h_home;
  const int64_t step0 = c.step;
  c.committed = false;
  const int64_t skipped0 = c.skipped;
  UpdateResult r;
  try {
    r = algo_->update(remaining);
  } catch (...) {
    if (c.committed) {  // (a graph segment, after its update: the segment stands)
      copy_into(c.h_home, c.h);
      c.h = c.h_home;
      throw;
    }
    c.step = step0;
    c.h = c.h_home;
    c.optim->zero_grad();  // (a throw after backward, in the update, left them accumulated)
    throw;
  }
  check_loss(r, step0, skipped0);
  return r;
}

double Trainer::evaluate(int64_t steps, uint64_t seed) {
  refuse_while_running("evaluate");  // (before its env and state are swapped for the evaluation's)
  refuse_after_non_finite("evaluate");
  Context& c = *c_;
  // (the tape's own refusal, "segment 1 is still open; end it", gave advice no caller can follow)
  if (grows() && c.tape->segment_open())
    throw Error("evaluate: history '" + c.config.history.str() + "' keeps its whole run in one open segment; it evaluates only "
                "once the run has ended (done())");
  if (steps < 1) throw Error("evaluate: steps must be >= 1, got " + std::to_string(steps));
  const Busy busy(busy_);
  // A fresh env and fresh history, greedy actions, nothing recorded; the
  // training state (h, the history's carried tensors, env) is put back afterwards.
  std::unique_ptr<Env> keep_env = std::move(env_);
  EnvOptions o = c.config.env_options;
  o.part = EnvOptions::Part::Valid;  // (a corpus's validation part; the other envs have none and take a fresh seed)
  env_ = make_env(c.config.env, c.config.batch, seed, o);
  c.env = env_.get();
  // The training state may be a carried value, which would expire in the
  // segments below: keep it in its persistent home. The evaluation's own
  // state has a persistent home too (allocated once: evaluate may be called
  // any number of times without the pools growing).
  copy_into(c.h_home, c.h);
  const int64_t keep_pos = history_->position();
  std::vector<std::vector<float>> keep_carried;
  for (const Tensor& t : history_->carried()) keep_carried.push_back(t.to_host<float>());
  const Tensor h0 = c.eval_h;
  h0.from_host(std::span<const float>(std::vector<float>(size_t(h0.numel()), 0.0f)));
  c.h = h0;
  for (const Tensor& t : history_->carried()) t.from_host(std::span<const float>(std::vector<float>(size_t(t.numel()), 0.0f)));
  // Puts the training state back, also when the evaluation's env throws
  // (an env of Python's, say): the trainer stays usable.
  auto restore = [&] {
    env_ = std::move(keep_env);
    c.env = env_.get();
    c.h = c.h_home;
    history_->set_position(keep_pos);
    for (size_t i = 0; i < keep_carried.size(); ++i) history_->carried()[i].from_host(std::span<const float>(keep_carried[i]));
  };
  const int64_t K = std::max<int64_t>(c.config.history.k, 32);
  double score = 0;
  bool interrupted = false;
  try {
    for (int64_t done_steps = 0; done_steps < steps;) {
      if (interrupt_ && interrupt_()) {
        interrupted = true;
        break;
      }
      Segment seg = c.tape->eager_segment();  // (under graph replay: not captured, the graphs kept)
      NoGradGuard ng(*c.tape);
      Step& s = *step_;
      for (int64_t i = 0; i < K && done_steps < steps; ++i, ++done_steps) {
        const Recurred r = s.feature(s.observe(), c.h);
        c.h = r.state;
        s.greedy(s.logits(r.feature), s.actions);
        s.act(s.actions);
        c.h = s.reset(c.h, s.done);
      }
      copy_into(h0, c.h);
      c.h = h0;
    }
    score = !interrupted && c.env->score_counts().second > 0 ? c.env->score() : std::numeric_limits<double>::quiet_NaN();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return score;
}

}  // namespace segtape::agent
