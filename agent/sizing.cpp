#include "sizing.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "algo/algorithm.h"
#include "history/history.h"

namespace segtape::agent {

size_t memory_limit(std::string* what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t limit = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
  if (what) *what = "this machine has";
  for (const auto& [resource, name] : {std::pair{RLIMIT_AS, "ulimit -v allows"}, std::pair{RLIMIT_DATA, "ulimit -d allows"}}) {
    rlimit r{};
    if (::getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) continue;
    if (limit == 0 || size_t(r.rlim_cur) < limit) {
      limit = size_t(r.rlim_cur);
      if (what) *what = name;
    }
  }
  return limit;
}

namespace {
constexpr size_t kDefaultBudget = size_t(64) << 20;
constexpr size_t kDefaultLmBudget = size_t(256) << 20;  // --task lm: a stack of layers over long chunks (docs/agent.md)
constexpr size_t kDefaultFullLimit = size_t(1) << 30;
}  // namespace

size_t applied_budget(const TrainConfig& c) {
  if (history_def(c.history.kind).grows) return c.budget ? c.budget : kDefaultFullLimit;
  if (c.budget) return c.budget;
  return c.algo == Algo::Lm ? kDefaultLmBudget : kDefaultBudget;
}

TapeOptions tape_options(const TrainConfig& c) {
  TapeOptions o;
  o.budget_name = c.budget_name;
  if (history_def(c.history.kind).grows) {
    // Teaching policy: one segment for the whole run, the arena grows; the budget stops it.
    o.grow = true;
    o.segment_budget = size_t(4) << 20;
    o.grow_limit = applied_budget(c);
  } else {
    o.segment_budget = applied_budget(c);
  }
  return o;
}

PolicyShape policy_shape(const TrainConfig& c, const EnvSpec& spec) {
  PolicyShape s{c.embed, c.hidden, history_def(c.history.kind).recurrent ? 0 : c.history.window, algorithm_def(c.learner(spec)).value_head,
                c.update_bias};
  s.lstm = c.cell == "lstm", s.layers = c.layers, s.tied = c.tied, s.lm_init = c.algo == Algo::Lm;
  s.separate_critic = c.critic == "separate";
  s.head_hidden = c.head_hidden;
  if (c.encoder == "none") {
    if (spec.vocab > 0)
      throw Error("--encoder none feeds vector observations to the recurrent cell as they are; the env '" + spec.name +
                  "' observes tokens, which need their embedding (--encoder linear)");
    s.raw_obs = true, s.embed = spec.obs_dim;
  }
  if (s.separate_critic && !s.value_head)
    throw Error("--critic separate gives the value head a GRU of its own; --algo " + std::string(algo_name(c.algo)) + " on the env '" +
                spec.name + "' learns from its targets by cross-entropy and has no value head");
  // A language model without dropout whose vocabulary is smaller than a
  // segment's tokens reads layer 0's input gates from a table (PolicyShape::input_table).
  s.input_table = c.algo == Algo::Lm && s.stacked() && spec.vocab > 0 && c.dropout == 0 && spec.vocab <= c.batch * c.history.span();
  return s;
}

// A lower bound of what one step keeps in the arena: its observation (the
// tokens, or the vectors: B x obs_dim floats) and the forward outputs the
// step's ops allocate (encoder, recurrence or window, head), each aligned;
// backward's buffers and the loss come on top.
SizeEstimate estimate_sizes(const TrainConfig& c, const EnvSpec& spec) {
  const PolicyShape shape = policy_shape(c, spec);
  const size_t B = size_t(c.batch), E = size_t(c.embed), H = size_t(c.hidden), A = size_t(spec.num_actions);
  const size_t G = (shape.lstm ? 4 : 3) * H;  // a recurrent layer's gate columns
  auto f32 = [](size_t n) { return align_up(n * sizeof(float)); };
  SizeEstimate e;
  const size_t params = size_t(Policy::parameters_for(spec, shape));
  e.parameter_bytes = 4 * params * sizeof(float);
  e.checkpoint_bytes = (c.device == "cuda" ? 2 : 1) * (c.optim == "sgd" ? 1 : 3) * params * sizeof(float);
  e.observation_bytes = spec.obs_dim > 0 ? f32(B * size_t(spec.obs_dim)) : align_up(B * sizeof(int64_t));
  e.step_bytes = e.observation_bytes + (shape.raw_obs ? 0 : f32(B * E)) + f32(B * A);  // observation, embedding, logits
  if (shape.window > 0) e.step_bytes += f32(B * size_t(shape.window) * E) + 2 * f32(B * H);  // concat, linear, tanh
  else if (!shape.stacked()) e.step_bytes += f32(B * H) + f32(4 * B * H);                   // GRU output + saved gates
  else {  // a stack (Policy::recur_stack): each layer's state, a slice of it, saved gates, an LSTM's h; the new state, the output
    const size_t P = shape.lstm ? 2 : 1, L = size_t(shape.layers);
    e.step_bytes += L * (f32(P * B * H) + f32(4 * B * H) + (L > 1 ? f32(P * B * H) : 0) + (shape.lstm ? f32(B * H) : 0));
    if (L > 1) e.step_bytes += f32(P * L * B * H) + f32(B * H);
    if (c.dropout > 0) e.step_bytes += f32(B * (E + L * H)) + 2 * f32(B * E) + 2 * L * f32(B * H);  // the masks, on the tape and applied
    if (shape.input_table) e.step_bytes += f32(B * G) - f32(B * E);  // layer 0's input gates, not the embedding
  }
  if (shape.separate_critic)  // the critic's GRU too; the state's two halves sliced, joined, and each head's rows sliced
    e.step_bytes += f32(B * H) + f32(4 * B * H) + 2 * f32(B * H) + f32(2 * B * H) + 2 * f32(B * H);
  if (shape.value_head) e.step_bytes += f32(B);
  if (shape.head_hidden > 0)  // each head's hidden layer: its product and its ReLU
    e.step_bytes += (shape.value_head ? 2 : 1) * 2 * f32(B * size_t(shape.head_hidden));
  const size_t steps = history_def(c.history.kind).grows ? 1 : size_t(c.history.k);
  e.segment_bytes = e.step_bytes * steps;
  if (shape.input_table) e.segment_bytes += 2 * f32(size_t(spec.vocab) * G);  // the table: the product, its bias added
  if (const AlgorithmDef& a = algorithm_def(c.learner(spec)); a.host_bytes) e.rollout_bytes = a.host_bytes(c, spec);
  e.budget = applied_budget(c);
  return e;
}

void check_sizes(const TrainConfig& c, const SizeEstimate& e) {
  const bool full = history_def(c.history.kind).grows;
  const std::string sizes = "at batch " + std::to_string(c.batch) + ", hidden " + std::to_string(c.hidden) + ", embed " +
                            std::to_string(c.embed) + "; the observations alone " + format_bytes(e.observation_bytes) + " per step";
  const std::string budget = format_bytes(e.budget) + " " + c.budget_name + (full ? " (the growth limit)" : "");
  if (e.step_bytes > e.budget)  // no segment length helps
    throw BudgetError("one step keeps at least " + format_bytes(e.step_bytes) + " (" + sizes + "), more than the " + budget +
                      ": make the step smaller (batch, hidden size, the env's observation) or raise " + c.budget_name);
  if (e.segment_bytes > e.budget)
    throw BudgetError("a segment of " + std::to_string(c.history.k) + " steps keeps at least " + format_bytes(e.segment_bytes) +
                      " (" + format_bytes(e.step_bytes) + " per step " + sizes + "), more than the " + budget +
                      ": shorten the segment (--history tbptt:K with a smaller K), make the step smaller (batch, hidden "
                      "size, the env's observation) or raise " + c.budget_name);
  std::string has;
  const size_t machine = memory_limit(&has);
  const size_t need = e.parameter_bytes + std::min(e.segment_bytes, e.budget) + e.rollout_bytes + e.checkpoint_bytes;
  if (machine && need > machine)
    throw Error("the model needs at least " + format_bytes(need) + " (parameters, gradients and Adam's moments " +
                format_bytes(e.parameter_bytes) + ", plus a segment of " + format_bytes(std::min(e.segment_bytes, e.budget)) +
                (e.rollout_bytes ? ", plus PPO's rollout of " + format_bytes(e.rollout_bytes) : std::string()) +
                ", plus " + format_bytes(e.checkpoint_bytes) + " while it writes a checkpoint) but " + has + " " +
                format_bytes(machine) + " of memory: make the model smaller (--hidden, --embed)" +
                (e.rollout_bytes ? " or the rollout shorter (--rollout, --batch)" : ""));
}

// The host inputs one graph segment stages (tape.from: observations,
// targets, reset masks; a sequence's keep [K, B]), at most: TapeOptions::graph_staging.
// (A sequence's targets of all K steps at once [K B] take at most the K steps' places.)
size_t graph_staging(const TrainConfig& c, const EnvSpec& spec) {
  const size_t B = size_t(c.batch), K = size_t(c.history.k);
  const size_t obs = spec.obs_dim > 0 ? B * size_t(spec.obs_dim) * sizeof(float) : B * sizeof(int64_t);
  return K * (align_up(obs) + align_up(B * sizeof(int64_t)) + align_up(B * size_t(c.hidden) * sizeof(float))) +
         align_up(K * B * sizeof(float));
}

SizeEstimate Trainer::estimate(const TrainConfig& c) {
  c.validate();
  return estimate_sizes(c, make_env(c.env, c.batch, 0, c.env_options)->spec());
}

size_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace segtape::agent
