#include "segtape/agent/trainer.h"

#include "ppo.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "segtape/emulation.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/safetensors.h"
#include "segtape/ops.h"

namespace segtape::agent {

// ---------------------------------------------------------------- config

History History::parse(const std::string& s) {
  auto number = [&](const std::string& v, const char* what) {
    int64_t n = 0;  // digits only: no sign, no spaces ("tbptt: 32" was read as 32)
    const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || v[0] == '-' || r.ec != std::errc() || r.ptr != v.data() + v.size() || n < 1 || n > 1'000'000)
      throw Error("--history " + s + ": " + what + " must be an integer in [1, 1000000]");
    return int64_t(n);
  };
  History h;
  if (s.rfind("tbptt:", 0) == 0) h.kind = Kind::Tbptt, h.k = number(s.substr(6), "K");
  else if (s == "tbptt") h.kind = Kind::Tbptt;
  else if (s == "detach") h.kind = Kind::Detach, h.k = 1;
  else if (s == "full") h.kind = Kind::Full;
  else if (s.rfind("window:", 0) == 0) h.kind = Kind::Window, h.window = number(s.substr(7), "N");
  else if (s == "nograd-history") h.kind = Kind::NoGradHistory;
  else if (s.rfind("exact:", 0) == 0) {
    const std::string spec = s.substr(6);
    const size_t slash = spec.find('/');
    h.kind = Kind::Exact;
    h.k = number(spec.substr(0, slash), "K");
    h.horizon = slash == std::string::npos ? 8 * h.k : number(spec.substr(slash + 1), "T");
    // (the default T = 8K within T's range too: a checkpoint's exact:K/8K is read back through it)
    if (h.horizon > 1'000'000)
      throw Error("--history " + s + ": its window T = 8K = " + std::to_string(h.horizon) +
                  " is more than 1000000 steps; give T in [1, 1000000] as exact:K/T");
  } else
    throw Error("unknown --history '" + s + "' (choose tbptt:K, detach, full, window:N, nograd-history, exact:K or exact:K/T)");
  return h;
}

std::string History::str() const {
  switch (kind) {
    case Kind::Tbptt: return "tbptt:" + std::to_string(k);
    case Kind::Detach: return "detach";
    case Kind::Full: return "full";
    case Kind::Window: return "window:" + std::to_string(window);
    case Kind::NoGradHistory: return "nograd-history";
    case Kind::Exact: return "exact:" + std::to_string(k) + "/" + std::to_string(horizon);
  }
  return "?";
}

std::map<std::string, std::string> TrainConfig::to_metadata() const {
  auto d = [](double v) {  // the shortest text that reads back to v, in no locale
    char b[40];
    return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
  };
  return {{"env", env},
          {"history", history.str()},
          {"steps", std::to_string(steps)},
          {"batch", std::to_string(batch)},
          {"hidden", std::to_string(hidden)},
          {"embed", std::to_string(embed)},
          {"update_bias", d(update_bias)},
          {"lr", d(lr)},
          {"clip", d(clip)},
          {"seed", std::to_string(seed)},
          {"device", device},
          {"budget", std::to_string(budget)},
          {"lag", std::to_string(env_options.lag)},
          {"sparse", env_options.sparse ? "1" : "0"},
          {"vocab", std::to_string(env_options.vocab)},
          {"corridor", std::to_string(env_options.corridor)},
          {"turns", std::to_string(env_options.turns)},
          {"cities", std::to_string(env_options.cities)},
          {"embed_dim", std::to_string(env_options.embed_dim)},
          {"gamma", d(gamma)},
          {"entropy", d(entropy)},
          {"value_coef", d(value_coef)},
          {"algo", algo},
          {"rollout", std::to_string(rollout)},
          {"epochs", std::to_string(epochs)},
          {"minibatches", std::to_string(minibatches)},
          {"clip_range", d(clip_range)},
          {"gae_lambda", d(gae_lambda)},
          {"lr_schedule", lr_schedule},
          {"env_shards", std::to_string(env_shards)}};
}

TrainConfig TrainConfig::from_metadata(const std::map<std::string, std::string>& m) {
  // Key k's value; `before`: what a checkpoint written before k existed means (none: k is required).
  auto get = [&](const char* k, std::optional<std::string> before = std::nullopt) {
    auto it = m.find(k);
    if (it != m.end()) return it->second;
    if (before) return *before;
    throw CheckpointError(std::string("checkpoint metadata lacks '") + k + "': not a segtape training checkpoint");
  };
  // A number, all of the value, named by its key: std::from_chars reads no
  // sign on unsigned values (std::stoull took "-1" as 2^64 - 1), no spaces,
  // and no locale (std::stod read "3,5" as 3, and a decimal comma under some
  // locales).
  auto whole = [](const char* k, const std::string& v, auto x) {
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size())
      throw CheckpointError(std::string("checkpoint metadata '") + k + "' is '" + v + "', not a number");
    return x;
  };
  auto i64 = [&](const char* k, const char* before = nullptr) {
    return whole(k, before ? get(k, std::string(before)) : get(k), int64_t{});
  };
  auto u64 = [&](const char* k) { return whole(k, get(k), uint64_t{}); };
  auto f64 = [&](const char* k, const char* before = nullptr) {
    return whole(k, before ? get(k, std::string(before)) : get(k), double{});
  };
  TrainConfig c;
  c.env = get("env");
  c.history = History::parse(get("history"));
  c.steps = i64("steps");
  c.batch = i64("batch");
  c.hidden = i64("hidden");
  c.embed = i64("embed");
  c.lr = f64("lr");
  c.clip = f64("clip");
  c.seed = u64("seed");
  c.device = get("device");
  c.budget = u64("budget");
  c.env_options = {.lag = i64("lag"),
                   .vocab = i64("vocab"),
                   .corridor = i64("corridor"),
                   .turns = i64("turns"),
                   .cities = i64("cities"),
                   .embed_dim = i64("embed_dim")};
  c.gamma = f64("gamma");
  c.entropy = f64("entropy");
  c.value_coef = f64("value_coef");
  // PPO's keys (checkpoints written before PPO existed are A2C's)
  c.algo = get("algo", c.algo);
  c.rollout = i64("rollout", std::to_string(c.rollout).c_str());
  c.epochs = i64("epochs", std::to_string(c.epochs).c_str());
  c.minibatches = i64("minibatches", std::to_string(c.minibatches).c_str());
  c.clip_range = f64("clip_range", "0.2");
  c.gae_lambda = f64("gae_lambda", "0.95");
  c.lr_schedule = get("lr_schedule", "constant");
  c.env_shards = i64("env_shards", "1");
  // (before these existed: PyTorch's init, dense recall)
  c.update_bias = f64("update_bias", "0");
  if (!(std::abs(c.update_bias) <= 20))
    throw CheckpointError("checkpoint metadata 'update_bias' is '" + get("update_bias") + "', not a number in [-20, 20]");
  if (c.env_options.embed_dim < 1 || c.env_options.embed_dim > 16384)  // (no flag sets it: validate's message would name none)
    throw CheckpointError("checkpoint metadata 'embed_dim' is '" + get("embed_dim") + "', not a number in [1, 16384]");
  const std::string sparse = get("sparse", "0");
  if (sparse != "0" && sparse != "1") throw CheckpointError("checkpoint metadata 'sparse' is '" + sparse + "', not 0 or 1");
  c.env_options.sparse = sparse == "1";
  return c;
}

void TrainConfig::validate() const {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw Error(m);
  };
  if (!env_registered(env)) {
    std::string names;
    for (const std::string& n : env_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("unknown --env '" + env + "' (registered: " + names + ")");
  }
  need(steps >= 1 && steps <= kMaxSteps, "--steps must be in [1, 1e9]");
  need(batch >= 1 && batch <= 65536, "--batch must be in [1, 65536]");
  need(hidden >= 1 && hidden <= 16384, "--hidden must be in [1, 16384]");
  need(embed >= 1 && embed <= 16384, "--embed must be in [1, 16384]");
  need(std::isfinite(update_bias) && std::abs(update_bias) <= 20, "--update-bias must be a number in [-20, 20]");
  need(update_bias == 0 || history.kind != History::Kind::Window,
       "--update-bias sets the GRU's update gate; --history window:N has no GRU");
  need(env_shards >= 1 && env_shards <= batch && batch % env_shards == 0,
       "--env-shards " + std::to_string(env_shards) + ": must be >= 1 and divide --batch " + std::to_string(batch));
  need(std::isfinite(lr) && lr > 0 && lr < 10, "--lr must be a positive number below 10");
  need(std::isfinite(clip) && clip >= 0, "--clip must be >= 0 (0 turns clipping off)");
  need(device != "cuda" || history.kind != History::Kind::Full,
       "--history full keeps its run in one growing arena (the teaching policy), which is CPU-only: use --device cpu "
       "or a bounded history (tbptt:K, detach, window:N, nograd-history)");
  check_device_flag(device);
  need(env_options.lag >= 1 && env_options.lag <= 100000, "--lag must be in [1, 100000]");
  need(!env_options.sparse || (env != "tmaze" && env != "dialogue"),
       "--sparse is recall's (a token every lag steps); --env " + env + " has no sparse form");
  need(env_options.vocab >= 2 && env_options.vocab <= 1'000'000, "--vocab must be in [2, 1e6]");
  need(env_options.corridor >= 1 && env_options.corridor <= 100000, "--corridor must be in [1, 100000]");
  need(env_options.turns >= 2 && env_options.turns <= 100000, "--turns must be in [2, 100000]");
  need(env_options.cities >= 1 && env_options.cities <= 10000, "--cities must be in [1, 10000]");
  need(env_options.embed_dim >= 1 && env_options.embed_dim <= 16384, "dialogue's message embedding size must be in [1, 16384]");
  need(gamma >= 0 && gamma <= 1, "--gamma must be in [0, 1]");
  need(std::isfinite(entropy) && entropy >= 0, "--entropy must be a finite number >= 0");
  need(std::isfinite(value_coef) && value_coef >= 0, "value_coef must be a finite number >= 0");
  need(history.kind != History::Kind::Window || history.window <= 64, "--history window:N needs N <= 64");
  need(algo == "a2c" || algo == "ppo", "--algo '" + algo + "': choose a2c or ppo");
  if (algo == "ppo") {
    need(history.kind == History::Kind::Tbptt || history.kind == History::Kind::Detach || history.kind == History::Kind::Exact,
         "--algo ppo replays each minibatch's windows from the states stored at rollout time, with --history tbptt:K "
         "(or detach, K = 1) or exact:K/T; --history " + history.str() + " is not built for it");
    need(rollout >= 1 && rollout <= 1'000'000, "--rollout must be in [1, 1000000]");
    need(epochs >= 1 && epochs <= 1000, "--epochs must be in [1, 1000]");
    need(minibatches >= 1 && minibatches <= batch && batch % minibatches == 0,
         "--minibatches " + std::to_string(minibatches) + ": must divide --batch " + std::to_string(batch) +
             " (each minibatch holds whole streams)");
    need(std::isfinite(clip_range) && clip_range > 0 && clip_range < 1, "--clip-range must be in (0, 1)");
    need(gae_lambda >= 0 && gae_lambda <= 1, "--gae-lambda must be in [0, 1]");
    need(lr_schedule == "linear" || lr_schedule == "constant", "--lr-schedule '" + lr_schedule + "': choose linear or constant");
  }
  need(history.kind != History::Kind::Exact || history.horizon >= history.k,
       "--history " + history.str() + ": exact:K/T needs T >= K (a window holds at least one segment)");
}

void check_device_flag(const std::string& device) {
  if (device != "cpu" && device != "cuda") throw Error("--device " + device + ": must be cpu or cuda");
  if (device == "cuda" && !Device::cuda_built() && !emulation::emulating_cuda_on_host())
    throw DeviceError("--device cuda: this build of segtape has no CUDA backend (nvcc was not found when it was configured); "
                "use --device cpu, or rebuild where the CUDA toolkit is installed (docs/cuda.md)");
}

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

// ---------------------------------------------------------------- trainer

namespace {
constexpr size_t kDefaultBudget = size_t(64) << 20;
constexpr size_t kDefaultFullLimit = size_t(1) << 30;

size_t applied_budget(const TrainConfig& c) {
  if (c.history.kind == History::Kind::Full) return c.budget ? c.budget : kDefaultFullLimit;
  return c.budget ? c.budget : kDefaultBudget;
}

TapeOptions tape_options(const TrainConfig& c) {
  TapeOptions o;
  o.budget_name = c.budget_name;
  if (c.history.kind == History::Kind::Full) {
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
  return {c.embed, c.hidden, c.history.kind == History::Kind::Window ? c.history.window : 0, !spec.supervised || c.algo == "ppo",
          c.update_bias};
}

// A lower bound of what one step keeps in the arena: its observation (the
// tokens, or the vectors: B x obs_dim floats) and the forward outputs the
// step's ops allocate (encoder, recurrence or window, head), each aligned;
// backward's buffers and the loss come on top.
SizeEstimate estimate_sizes(const TrainConfig& c, const EnvSpec& spec) {
  const PolicyShape shape = policy_shape(c, spec);
  const size_t B = size_t(c.batch), E = size_t(c.embed), H = size_t(c.hidden), A = size_t(spec.num_actions);
  auto f32 = [](size_t n) { return align_up(n * sizeof(float)); };
  SizeEstimate e;
  e.parameter_bytes = 4 * size_t(Policy::parameters_for(spec, shape)) * sizeof(float);
  e.observation_bytes = spec.obs_dim > 0 ? f32(B * size_t(spec.obs_dim)) : align_up(B * sizeof(int64_t));
  e.step_bytes = e.observation_bytes + f32(B * E) + f32(B * A);             // observation, embedding, logits
  if (shape.window > 0) e.step_bytes += f32(B * size_t(shape.window) * E) + 2 * f32(B * H);  // concat, linear, tanh
  else e.step_bytes += f32(B * H) + f32(4 * B * H);                                          // GRU output + saved gates
  if (shape.value_head) e.step_bytes += f32(B);
  const size_t steps = c.history.kind == History::Kind::Full ? 1 : size_t(c.history.k);
  e.segment_bytes = e.step_bytes * steps;
  if (c.algo == "ppo") {  // per step and stream: action and token (int64), 5 floats, done, the observation vector
    const size_t T = size_t(c.rollout), W = size_t(ppo_window(c)), S = (T + W - 1) / W;
    e.rollout_bytes = T * B * (2 * 8 + 5 * 4 + 1 + size_t(spec.obs_dim) * 4) + S * B * H * 4;
  }
  e.budget = applied_budget(c);
  return e;
}

void check_sizes(const TrainConfig& c, const SizeEstimate& e) {
  const bool full = c.history.kind == History::Kind::Full;
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
  const size_t need = e.parameter_bytes + std::min(e.segment_bytes, e.budget) + e.rollout_bytes;
  if (machine && need > machine)
    throw Error("the model needs at least " + format_bytes(need) + " (parameters, gradients and Adam's moments " +
                format_bytes(e.parameter_bytes) + ", plus a segment of " + format_bytes(std::min(e.segment_bytes, e.budget)) +
                (e.rollout_bytes ? ", plus PPO's rollout of " + format_bytes(e.rollout_bytes) : std::string()) +
                ") but " + has + " " + format_bytes(machine) + " of memory: make the model smaller (--hidden, --embed)" +
                (e.rollout_bytes ? " or the rollout shorter (--rollout, --batch)" : ""));
}

// Whether the trainer runs its segments as CUDA graphs (TrainConfig::graph_replay):
// a segment's steps must be known before it runs (an open-loop supervised env),
// repeat from segment to segment (K steps), and read nothing on the host.
bool graph_applies(const TrainConfig& c, const EnvSpec& spec, bool distributed) {
  return c.graph_replay && c.device == "cuda" && spec.supervised && spec.open_loop && c.algo == "a2c" && !distributed &&
         (c.history.kind == History::Kind::Tbptt || c.history.kind == History::Kind::Detach);
}

// What the trainer keeps in its tape's persistent pool, made in one place:
// by the constructor on its own tape, and on a throwaway CPU tape that
// measures a device's pool (size_device_pools).
struct Persistent {
  std::unique_ptr<Policy> policy;    // parameters and their gradients
  std::unique_ptr<nn::Adam> optim;   // Adam's two moments (and, capturable, its device step count)
  Tensor h_home, eval_h;             // the state's home [B, hidden] and evaluate's
  std::vector<Tensor> window;        // window mode: the ring of the last N - 1 embeddings [B, embed]
  // graph segments: each step's logits [B, A] and loss, the clip's squared norm (float64 [1]);
  // in one gru_sequence, the segment's logits [K B, A] from one head
  std::vector<Tensor> logits, losses;
  Tensor clip_sq, all_logits;
};

Persistent make_persistent(Tape& tape, nn::Rng& rng, const TrainConfig& c, const EnvSpec& spec, bool graph) {
  const PolicyShape shape = policy_shape(c, spec);
  Persistent p;
  p.policy = std::make_unique<Policy>(tape, rng, spec, shape);
  p.optim = std::make_unique<nn::Adam>(*p.policy, nn::AdamOptions{.lr = c.lr, .capturable = graph});
  p.h_home = tape.persistent({c.batch, c.hidden});
  p.eval_h = tape.persistent({c.batch, c.hidden});
  for (int64_t i = 0; i + 1 < shape.window; ++i) p.window.push_back(tape.persistent({c.batch, c.embed}));
  if (graph) {
    for (int64_t i = 0; i < c.history.k; ++i) {
      p.logits.push_back(tape.persistent({c.batch, spec.num_actions}));
      p.losses.push_back(tape.persistent(Shape{}));
    }
    p.clip_sq = tape.persistent({1}, DType::F64);
    p.all_logits = tape.persistent({c.history.k * c.batch, spec.num_actions});
  }
  return p;
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

// exact's driver over windows of `horizon` steps (it stores the window's boundary states in the persistent pool).
replay::Options driver_options(const TrainConfig& c) { return {.horizon = c.history.horizon, .k = c.history.k}; }

// A device's pools are fixed when its tape is made, and a `segtape train`
// user cannot size them. The persistent pool is measured: what the trainer
// keeps there is made on a throwaway CPU tape by the code that makes the real
// thing (make_persistent; for exact, the driver of the windows, which runs a
// shorter last window on the same states), and the pool is the bytes
// that tape used (64-byte aligned blocks, as on the device). The carry buffer
// holds the carried state; its default is a floor.
void size_device_pools(TapeOptions& o, const TrainConfig& c, const EnvSpec& spec, bool graph) {
  Tape count(Device::cpu(), {.segment_budget = 0, .node_capacity = 0});
  nn::Rng rng(c.seed);  // the values do not matter, only the sizes
  const Persistent p = make_persistent(count, rng, c, spec, graph);
  if (c.history.kind == History::Kind::Exact) {
    // PPO's driver runs a minibatch's windows from a state of its own (agent/ppo.cpp)
    const Tensor h0 = c.algo == "ppo" ? count.persistent({c.batch / c.minibatches, c.hidden}) : p.h_home;
    const replay::Driver driver(count, h0, driver_options(c));  // (its states, on the counting tape)
  }
  o.device_persistent = count.stats().persistent_bytes;
  const size_t state = align_up(size_t(c.batch * c.hidden) * sizeof(float));
  o.device_carry = std::max(o.device_carry, 2 * state + (size_t(1) << 20));
}

int64_t argmax_row(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;
  return best;
}
}  // namespace

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Rank r's sampling seed (rank 0's: what one process has always used).
uint64_t act_seed(uint64_t seed, int rank) { return rank == 0 ? seed ^ 0xac7u : splitmix64((seed ^ 0xac7u) + uint64_t(rank)); }
}  // namespace

uint64_t Trainer::shard_seed(uint64_t seed, int64_t shard) {
  const uint64_t base = seed * 1000003u + 17u;
  return shard == 0 ? base : splitmix64(base + uint64_t(shard));
}

Trainer::Trainer(const TrainConfig& c, dist::Communicator* comm)
    : config_(c), init_rng_(c.seed), act_rng_(act_seed(c.seed, comm ? comm->rank() : 0)) {
  config_.validate();
  if (comm && comm->size() > 1) {
    comm_ = comm;
    auto settings = config_.to_metadata();
    settings["ranks"] = std::to_string(comm->size());
    dist::check_same(*comm_, settings, "the training configuration");
  }
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < c.env_shards; ++i) seeds.push_back(shard_seed(c.seed, int64_t(rank()) * c.env_shards + i));
  env_ = make_env_shards(c.env, c.batch, seeds, c.env_options);
  const EnvSpec& spec = env_->spec();
  check_sizes(config_, estimate_sizes(config_, spec));  // before anything is allocated
  TapeOptions options = tape_options(config_);
  graph_ = graph_applies(config_, spec, comm_ != nullptr);
  if (graph_) {
    options.graph_replay = true;
    options.graph_staging = std::max(options.graph_staging, graph_staging(config_, spec));
  }
  if (config_.device == "cuda") size_device_pools(options, config_, spec, graph_);
  // Data parallel on GPUs: one GPU per rank, the rank's place on its
  // machine; device 0 where CUDA_VISIBLE_DEVICES shows the rank one GPU (a
  // scheduler's --gpus-per-task=1).
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const bool one_visible = visible && *visible && !std::strchr(visible, ',');
  const int gpu = comm_ && !one_visible ? dist::local_rank() : 0;
  try {
    tape_ = std::make_unique<Tape>(config_.device == "cuda" ? Device::cuda(gpu) : Device::cpu(), options);
  } catch (const OutOfMemoryError& e) {
    // The segment arena is reserved whole, up front: a budget beyond the
    // machine's memory fails here, named by the flag that set it.
    if (config_.device != "cuda" && std::string_view(e.pool) == kSegmentArenaPool)
      throw OutOfMemoryError(format_bytes(applied_budget(config_)) + " " + config_.budget_name + ": the segment arena of that size "
                             "cannot be reserved (" + e.what() + "); lower " + config_.budget_name, e.pool);
    throw;
  } catch (const DeviceError& e) {
    // Ranks past the machine's GPUs (data parallel: the GPU of the local rank)
    if (e.gpu_present && comm_)
      throw DeviceError(std::string(e.what()) + "; under mpirun each rank takes the GPU numbered by its rank on its machine: start "
                        "at most one rank per GPU on each machine, or show each rank one GPU (CUDA_VISIBLE_DEVICES)", true);
    if (e.gpu_present) throw;  // (a GPU is here, busy or not this one: no hint fits better than the message)
    // (a checkpoint of a GPU run, resumed or evaluated where there is none)
    throw DeviceError(std::string(e.what()) + "; this run's device is cuda: run it on the CPU with device \"cpu\" (segtape: --device cpu)");
  }
  Persistent p = make_persistent(*tape_, init_rng_, config_, spec, graph_);
  policy_ = std::move(p.policy);
  optim_ = std::move(p.optim);
  h_ = h_home_ = p.h_home;
  eval_h_ = p.eval_h;
  window_ = std::move(p.window);
  graph_logits_ = std::move(p.logits);
  graph_losses_ = std::move(p.losses);
  graph_all_logits_ = p.all_logits;
  clip_sq_ = p.clip_sq;
  if (graph_) {  // the env's copy, stepped ahead of the model (its state is loaded from env_ each segment)
    ahead_ = make_env_shards(c.env, c.batch, seeds, c.env_options);
    const size_t KB = size_t(c.history.k * c.batch);
    ahead_tokens_.assign(KB, 0);
    ahead_targets_.assign(KB, kNoTarget);
    ahead_vectors_.assign(KB * size_t(std::max<int64_t>(spec.obs_dim, 1)), 0.0f);
    ahead_done_.assign(KB, 0);
    ahead_keep_.assign(KB, 1.0f);
    ahead_encoded_.resize(size_t(c.history.k));
    host_all_.assign(KB * size_t(spec.num_actions), 0.0f);
    graph_sequence_ = recurrence_as_sequence(*tape_, c, c.batch);  // (ppo.h)
  }
  const size_t B = size_t(c.batch);
  tokens_.assign(B, 0);
  targets_.assign(B, kNoTarget);
  actions_.assign(B, 0);
  vectors_.assign(B * size_t(std::max<int64_t>(spec.obs_dim, 1)), 0.0f);
  rewards_.assign(B, 0.0f);
  done_.assign(B, 0);
  weights_.assign(B * size_t(spec.num_actions), 0.0f);
  const size_t K = size_t(c.history.k);
  logp_.reserve(K);
  values_.reserve(K);
  seg_rewards_.assign(K * B, 0.0f);
  seg_done_.assign(K * B, 0);
  seg_actions_.assign(K * B, 0);
  returns_.assign(B, 0.0f);
  seg_returns_.assign(K * B, 0.0f);
  window_keep_.assign(B * size_t(c.embed), 0.0f);
  host_rows_.assign(B * size_t(spec.num_actions), 0.0f);
  host_values_.assign(B, 0.0f);
  episode_return_.assign(B, 0.0f);
  reset_mask_.assign(B * size_t(c.hidden), 0.0f);
  if (c.history.kind == History::Kind::Exact && c.algo != "ppo") {  // (PPO's drivers are its own: agent/ppo.cpp)
    if (!spec.supervised) {  // the window's rewards, dones, actions and values, step by step
      const size_t T = size_t(c.history.horizon);
      seg_rewards_.assign(T * B, 0.0f);
      seg_done_.assign(T * B, 0);
      seg_actions_.assign(T * B, 0);
      seg_returns_.assign(T * B, 0.0f);
    }
    exact_ = make_driver();
  }
  if (config_.algo == "ppo") ppo_ = make_ppo_buffers();
  if (comm_) avg_ = std::make_unique<dist::GradientAverager>(*comm_, *policy_);  // broadcasts rank 0's parameters
}

int Trainer::rank() const { return comm_ ? comm_->rank() : 0; }
int Trainer::ranks() const { return comm_ ? comm_->size() : 1; }
const dist::AverageStats* Trainer::dist_stats() const { return avg_ ? &avg_->stats() : nullptr; }

void Trainer::request_stop() {
  stop_requested_ = true;
  if (avg_) avg_->raise_flag();
}

bool Trainer::stop_agreed() const { return avg_ ? stop_agreed_ : stop_requested_; }

std::string Trainer::dist_transport() const { return avg_ ? avg_->transport() : "local"; }

std::unique_ptr<replay::Driver> Trainer::make_driver() {
  replay::Options o = driver_options(config_);
  // Actor-critic: a step's loss needs the window's later rewards and the
  // value of the state it ends in, known once the forward pass is done.
  if (!env_->spec().supervised) o.on_forward = [this](const Tensor& final_state) { window_returns(final_state); };
  return std::make_unique<replay::Driver>(*tape_, h_home_, o);
}

Trainer::~Trainer() {
  avg_.reset();  // (its NCCL communicator before the tape's stream and pools)
}

SizeEstimate Trainer::estimate(const TrainConfig& c) {
  c.validate();
  return estimate_sizes(c, make_env(c.env, c.batch, 0, c.env_options)->spec());
}

size_t Trainer::budget() const { return applied_budget(config_); }

double Trainer::lr() const { return optim_->options().lr; }

Tensor Trainer::observation(std::span<const int64_t> tokens, std::span<const float> vectors) {
  const EnvSpec& spec = env_->spec();
  if (spec.vocab > 0) return tape_->from(tokens, {config_.batch});
  return tape_->from(vectors, {config_.batch, spec.obs_dim});
}

Tensor Trainer::observe_tensor() {
  env_->observe(tokens_, vectors_);
  return observation(tokens_, vectors_);
}

Tensor Trainer::feature(const Tensor& e) {
  switch (config_.history.kind) {
    case History::Kind::Window: {
      // The last N - 1 embeddings (detached values) and this step's, oldest first.
      std::array<Tensor, 64> parts;
      const size_t n = window_.size();
      for (size_t i = 0; i < n; ++i) parts[i] = window_[(size_t(window_pos_) + i) % n];
      parts[n] = e;
      Tensor f = policy_->compress(std::span<const Tensor>(parts.data(), n + 1));
      if (n) {
        copy_into(window_[size_t(window_pos_)], detach(e));
        window_pos_ = (window_pos_ + 1) % int64_t(n);
      }
      return f;
    }
    case History::Kind::NoGradHistory:
      // Only this step is differentiated: the history arrives as a value.
      h_ = policy_->recur(e, detach(h_));
      return h_;
    default:
      h_ = policy_->recur(e, h_);
      return h_;
  }
}

// After env_->step: the streams whose episode ended start the next one from
// the zero state (h · (1 − done), policy.h), inside the segment. Window mode
// carries no state (its ring of embeddings is history by construction).
void Trainer::reset_finished_streams() {
  if (config_.history.kind != History::Kind::Window) h_ = reset_finished(h_, done_, reset_mask_);
}

void Trainer::update(bool has_loss) {
  if (avg_) {  // every rank: the mean of the ranks' gradients
    const double with_loss = avg_->average(has_loss ? 1.0f : 0.0f);
    if (avg_->flag_seen()) stop_agreed_ = true;
    if (with_loss == 0) {  // no rank had a loss: no step, as in one process
      optim_->zero_grad();
      return;
    }
  }
  if (config_.clip > 0) {
    if (graph_) nn::clip_grad_norm(*policy_, config_.clip, clip_sq_);  // (the norm stays on the device)
    else nn::clip_grad_norm(*policy_, config_.clip);
  }
  optim_->step();
  optim_->zero_grad();
  if (avg_ && ++updates_ % kReplicaCheckEvery == 0)
    dist::check_replicas(*comm_, *policy_, "after update " + std::to_string(updates_) + " (step " + std::to_string(step_) + ")");
}

namespace {
// save, load, run_segment and evaluate between segments only: from an env's
// callback inside run_segment or evaluate, the step, the state and the
// parameters are the segment's half-done ones (a load there was accepted and
// then overwritten; a nested evaluate wrote the outer segment's state).
// (busy: inside run_segment or evaluate, also between evaluate's segments,
// where its interrupt check runs Python's signal handlers)
void refuse_inside_a_segment(bool busy, const char* what) {
  if (busy)
    throw Error(std::string(what) + ": called while a segment runs (from inside run_segment or evaluate, e.g. an env's "
                "callback or a signal handler); call it between segments");
}

// Marks the trainer busy for a scope.
struct Busy {
  int& n;
  explicit Busy(int& c) : n(c) { ++n; }
  ~Busy() { --n; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
};
}  // namespace

void Trainer::refuse_while_running(const char* what) const { refuse_inside_a_segment(busy_ > 0, what); }

SegmentResult Trainer::run_segment() {
  refuse_while_running("run_segment");  // (an env's callback: the outer segment's state, half-done)
  const Busy busy(busy_);
  if (config_.history.kind == History::Kind::Full) return segment_of_history();
  // The state entering the segment in its persistent home (a carried value
  // would expire with the segment an error abandons), to go back to on an error.
  if (h_.ptr != h_home_.ptr) copy_into(h_home_, h_);
  h_ = h_home_;
  const int64_t step0 = step_;
  committed_ = false;
  try {
    return segment_of_history();
  } catch (...) {
    if (committed_) {  // (graph_segment, after its update: the segment stands)
      copy_into(h_home_, h_);
      h_ = h_home_;
      throw;
    }
    step_ = step0;
    h_ = h_home_;
    optim_->zero_grad();  // (a throw after backward, in the update, left them accumulated)
    throw;
  }
}

SegmentResult Trainer::segment_of_history() {
  if (config_.algo == "ppo") return ppo_iteration(std::min(config_.rollout, config_.steps - step_));
  if (config_.history.kind == History::Kind::Exact) return exact_window(std::min(config_.history.horizon, config_.steps - step_));
  const int64_t n = std::min(config_.history.k, config_.steps - step_);
  if (n <= 0) return {};
  if (config_.history.kind == History::Kind::Full) {
    // One segment for the whole run: the arena keeps every step (teaching).
    if (!full_) full_.emplace(tape_->segment());
    SegmentResult r = env_->spec().supervised ? supervised_segment(*full_, n) : actor_critic_segment(*full_, n);
    if (done()) {  // keep the final state, then end the one segment
      h_ = full_->carry(h_);
      full_.reset();
    }
    return r;
  }
  if (graph_) return graph_segment(n);
  Segment seg = tape_->segment();
  SegmentResult r = env_->spec().supervised ? supervised_segment(seg, n) : actor_critic_segment(seg, n);
  if (config_.history.kind != History::Kind::Window) h_ = seg.carry(h_);  // the TBPTT boundary
  return r;
}

namespace {
BackwardOptions backward_options(const TrainConfig& c) {
  // `full` backpropagates each update's losses through the whole retained
  // history, whose early steps read weights the updates since have changed
  // (PyTorch refuses that; docs/agent.md, "Note on full").
  const bool full = c.history.kind == History::Kind::Full;
  return {.retain_graph = full, .allow_overwritten = full};
}
}  // namespace

SegmentResult Trainer::supervised_segment(Segment& seg, int64_t n) {
  SegmentResult r;
  Tensor loss;
  const int64_t B = config_.batch, A = env_->spec().num_actions;
  for (int64_t i = 0; i < n; ++i, ++step_, tape_->next_step()) {
    Tensor x = observe_tensor();
    env_->targets(targets_);
    Tensor logits = policy_->logits(feature(policy_->encode(x)));
    const bool has_target = std::any_of(targets_.begin(), targets_.end(), [](int64_t y) { return y != kNoTarget; });
    if (has_target) {
      Tensor l = cross_entropy(logits, tape_->from(std::span<const int64_t>(targets_), {B}), Reduction::Mean, kNoTarget);
      r.loss_sum += l.item();
      ++r.loss_steps;
      loss = loss.defined() ? add(loss, l) : l;
    }
    logits.to_host(std::span<float>(host_rows_));
    for (int64_t b = 0; b < B; ++b) actions_[size_t(b)] = argmax_row(host_rows_.data() + b * A, A);
    env_->step(actions_, rewards_, done_);
    reset_finished_streams();
  }
  r.steps = n;
  if (loss.defined()) seg.backward(loss, backward_options(config_));
  // Data parallel: every rank joins the update's all-reduce, also one whose
  // streams had no target this segment (its gradients are zero).
  if (loss.defined() || avg_) update(loss.defined());
  return r;
}

// supervised_segment's work as one CUDA graph (graph_, TrainConfig::graph_replay).
// A graph segment reads nothing on the host, so the inputs come first: the
// env's copy (ahead_), given env_'s state, takes the segment's n steps with
// placeholder actions (an open-loop env's observations, targets and done
// flags do not depend on them). The segment records the same ops as
// supervised_segment, copies each step's logits and loss into persistent
// tensors (in one gru_sequence: the recurrence, then the head and the loss
// over all the steps' rows at once, their logits in one tensor), and
// updates (the capturable clip and Adam). After it has run,
// env_ takes the n steps with the model's greedy actions (its score counts
// them), and must show what its copy showed.
SegmentResult Trainer::graph_segment(int64_t n) {
  SegmentResult r;
  if (n <= 0) return r;
  const EnvSpec& spec = env_->spec();
  const int64_t B = config_.batch, A = spec.num_actions, D = std::max<int64_t>(spec.obs_dim, 1);
  const auto row = [](auto& v, int64_t i, int64_t len) { return std::span(v.data() + i * len, size_t(len)); };
  const auto has_target = [&](int64_t i) {
    const auto tg = row(ahead_targets_, i, B);
    return std::any_of(tg.begin(), tg.end(), [](int64_t y) { return y != kNoTarget; });
  };
  std::fill(actions_.begin(), actions_.end(), 0);
  ahead_->load_state(env_->save_state());
  // The steps' pattern: which have a target (a loss), which reset a stream.
  // In one gru_sequence the resets before the last step are keep's values,
  // not ops; and where every step with a target has the same count c of
  // them (recall: all B), the loss is one cross-entropy summed over the
  // segment's rows, scaled by 1/c (the sum over the steps of their means,
  // as step by step), so only c, not which steps have targets, is an op.
  uint64_t key = 0xcbf29ce484222325ull ^ uint64_t(n);
  int64_t target_steps = 0, count = -1;  // count: c, or 0 where the steps' counts differ
  bool reset = false;                    // (the step's: after the loop, the last step's)
  for (int64_t i = 0; i < n; ++i) {
    ahead_->observe(row(ahead_tokens_, i, B), row(ahead_vectors_, i, B * D));
    ahead_->targets(row(ahead_targets_, i, B));
    ahead_->step(actions_, rewards_, row(ahead_done_, i, B));
    const auto dn = row(ahead_done_, i, B);
    for (int64_t b = 0; b < B && i + 1 < n; ++b) ahead_keep_[size_t((i + 1) * B + b)] = dn[size_t(b)] ? 0.0f : 1.0f;
    const bool target = has_target(i);
    if (target) {
      const auto tg = row(ahead_targets_, i, B);
      const int64_t c = std::count_if(tg.begin(), tg.end(), [](int64_t y) { return y != kNoTarget; });
      count = count < 0 || count == c ? c : 0;
      ++target_steps;
    }
    reset = (!graph_sequence_ || i == n - 1) && std::any_of(dn.begin(), dn.end(), [](uint8_t d) { return d != 0; });
    key = (key ^ (uint64_t(target) | uint64_t(reset) << 1)) * 0x100000001b3ull;
  }
  const bool one_loss = graph_sequence_ && count > 0;  // (the loss as one cross-entropy)
  if (one_loss)  // the pattern without the target steps: n, c and whether the last step resets
    key = (0xcbf29ce484222325ull ^ uint64_t(n) ^ uint64_t(count) << 32 ^ uint64_t(reset) << 31) * 0x100000001b3ull;
  key |= 1;  // (0: none)
  // A pattern the graphs do not hold runs eagerly; one that repeats (the
  // same as the last segment's) replaces them.
  if (key != graph_key_ && key == last_key_) {
    if (graph_key_) tape_->discard_graph();
    graph_key_ = key;
  }
  last_key_ = key;
  const bool graph = key == graph_key_ && n == config_.history.k;  // (a shorter segment is the run's last)
  // A graph segment whose graph does not run (a replay whose calls differ
  // from its capture: an error inside the segment, or one raised by the
  // synchronize below) changed nothing on the device, but Adam's host count
  // moved: put it back, and forget the graphs (the next segments capture anew).
  const int64_t count0 = optim_->step_count();
  const TapeStats before = tape_->stats();
  const auto forget = [&] {
    if (!graph) return;
    tape_->discard_graph();
    graph_key_ = last_key_ = 0;
    optim_->set_step_count(count0);
  };
  try {
    Segment seg = graph ? tape_->segment() : tape_->eager_segment();
    const auto encoded = [&](int64_t i) { return policy_->encode(observation(row(ahead_tokens_, i, B), row(ahead_vectors_, i, B * D))); };
    // graph_sequence_: the recurrence of the n steps as one gru_sequence (the
    // fused kernel), the resets inside it (keep), the encoder step by step,
    // and the head over all n steps at once: one product of [n B, hidden]
    // rows, whose logits reach the host in one copy; the loss, the sum of
    // the steps' mean cross-entropies, one cross-entropy over the rows where
    // the target steps' counts agree (one_loss), else each step's on its rows.
    // Otherwise the eager segment's ops, step by step.
    Tensor loss;
    if (graph_sequence_) {
      // (tape steps label the encoders step by step, the sequence and what follows it the last step)
      for (int64_t i = 0; i < n; ++i) {
        ahead_encoded_[size_t(i)] = encoded(i);
        if (i + 1 < n) tape_->next_step();
      }
      const Tensor e = concat(std::span<const Tensor>(ahead_encoded_.data(), size_t(n)), 0);
      const Tensor states = policy_->recur_sequence(reshape(e, {n, B, e.dim(1)}), h_,
                                                    tape_->from(std::span<const float>(row(ahead_keep_, 0, n * B)), {n, B}));
      const Tensor logits = policy_->logits(reshape(states, {n * B, config_.hidden}));  // [n B, A]
      if (one_loss) {
        loss = scale(cross_entropy(logits, tape_->from(std::span<const int64_t>(row(ahead_targets_, 0, n * B)), {n * B}), Reduction::Sum,
                                   kNoTarget),
                     1.0 / double(count));
      } else {  // the counts differ: each step's mean on its rows
        for (int64_t i = 0; i < n; ++i) {
          if (!has_target(i)) continue;
          const Tensor l = cross_entropy(slice(logits, 0, i * B, B), tape_->from(std::span<const int64_t>(row(ahead_targets_, i, B)), {B}),
                                         Reduction::Mean, kNoTarget);
          loss = loss.defined() ? add(loss, l) : l;
        }
      }
      r.loss_steps = target_steps;
      if (graph) copy_into(graph_all_logits_, logits);
      else logits.to_host(std::span<float>(host_all_).first(size_t(n * B * A)));  // (an eager segment may read)
      h_ = reset_finished(reshape(slice(states, 0, n - 1, 1), {B, config_.hidden}), row(ahead_done_, n - 1, B), reset_mask_);
      step_ += n;
      tape_->next_step();
    }
    for (int64_t i = 0; i < n && !graph_sequence_; ++i, ++step_, tape_->next_step()) {
      h_ = feature(encoded(i));
      const Tensor logits = policy_->logits(h_);
      if (has_target(i)) {
        Tensor l = cross_entropy(logits, tape_->from(std::span<const int64_t>(row(ahead_targets_, i, B)), {B}), Reduction::Mean, kNoTarget);
        copy_into(graph_losses_[size_t(i)], l);
        ++r.loss_steps;
        loss = loss.defined() ? add(loss, l) : l;
      }
      copy_into(graph_logits_[size_t(i)], logits);
      h_ = reset_finished(h_, row(ahead_done_, i, B), reset_mask_);
    }
    r.steps = n;
    if (loss.defined()) seg.backward(loss, backward_options(config_));
    if (loss.defined()) update(true);
    h_ = seg.carry(h_);  // the TBPTT boundary
    seg.end();  // (the graph runs here)
    const TapeStats after = tape_->stats();
    if (graph && after.graph_captures + after.graph_replays == before.graph_captures + before.graph_replays)
      tape_->synchronize();  // (its graph did not run: raises why, a replay that issued fewer calls than its capture)
  } catch (...) {
    forget();
    throw;
  }
  committed_ = true;  // (the segment ran: errors from here on, the device's at the first to_host included, leave its update in place)
  // The env takes the steps with the model's actions; what it shows must be what its copy showed.
  if (graph_sequence_ && graph) graph_all_logits_.to_host(std::span<float>(host_all_));
  for (int64_t i = 0; i < n; ++i) {
    env_->observe(tokens_, vectors_);
    env_->targets(targets_);
    const float* rows = host_rows_.data();
    if (graph_sequence_) rows = host_all_.data() + i * B * A;
    else graph_logits_[size_t(i)].to_host(std::span<float>(host_rows_));
    for (int64_t b = 0; b < B; ++b) actions_[size_t(b)] = argmax_row(rows + b * A, A);
    env_->step(actions_, rewards_, done_);
    const bool same = (spec.vocab > 0 ? std::ranges::equal(tokens_, row(ahead_tokens_, i, B))
                                      : std::ranges::equal(std::span(vectors_.data(), size_t(B * D)), row(ahead_vectors_, i, B * D))) &&
                      std::ranges::equal(targets_, row(ahead_targets_, i, B)) && std::ranges::equal(done_, row(ahead_done_, i, B));
    if (!same)
      throw EnvContractError("env '" + spec.name + "' says its spec is open_loop, but at step " + std::to_string(step_ - n + i + 1) +
                             " (step " + std::to_string(i + 1) + " of the segment) it showed other observations, targets or done "
                             "flags after the model's actions than after the placeholder actions its copy took (the Env contract: "
                             "segtape/agent/env.h); the segment's update, which used its copy's, stands; set open_loop = false");
    if (!has_target(i)) continue;
    if (!graph_sequence_) {
      r.loss_sum += graph_losses_[size_t(i)].item();
      continue;
    }
    // The step's mean cross-entropy, from its logits on the host (the loss was one sum over the steps)
    double step_loss = 0;
    int64_t targets = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t y = targets_[size_t(b)];
      if (y == kNoTarget) continue;
      const float* l = rows + b * A;
      const double top = *std::max_element(l, l + A);
      double z = 0;
      for (int64_t a = 0; a < A; ++a) z += std::exp(double(l[a]) - top);
      step_loss += top + std::log(z) - double(l[y]);
      ++targets;
    }
    r.loss_sum += step_loss / double(targets);
  }
  return r;
}

// Exact BPTT over a window of n steps (segtape/replay.h): the gradient of the
// whole window, in the memory of one K-step segment and the window's
// boundary states. The env moves on the first pass only: observations,
// targets and the actions that step the env are inputs the replays get back.
SegmentResult Trainer::exact_window(int64_t n) {
  SegmentResult r;
  if (n <= 0) return r;
  replay::Driver* drv = exact_.get();  // (a run's last, shorter window too: its first segments)
  const EnvSpec& spec = env_->spec();
  const int64_t B = config_.batch, A = spec.num_actions;
  // This step's observation: taken from the env the first time, from the record on replays.
  const auto observed = [&](Tape& t, replay::Inputs& in) {
    if (spec.vocab > 0) {
      auto tok = in.take<int64_t>(size_t(B), [&](std::span<int64_t> v) { env_->observe(v, vectors_); });
      return t.from(tok, {B});
    }
    auto vec = in.take<float>(vectors_.size(), [&](std::span<float> v) { env_->observe(tokens_, v); });
    return t.from(vec, {B, spec.obs_dim});
  };
  // The streams whose episode ended at this step start the next from zero:
  // their done flags are an input, recorded the first time (env_->step above).
  const auto reset_recorded = [&](const Tensor& h, replay::Inputs& in) {
    auto d = in.take<uint8_t>(size_t(B), [&](std::span<uint8_t> v) { std::copy(done_.begin(), done_.end(), v.begin()); });
    return reset_finished(h, d, reset_mask_);
  };
  replay::StepFn step;
  if (spec.supervised) step = [&](Tape& t, int64_t, const Tensor& h, replay::Inputs& in) {
    Tensor h1 = policy_->recur(policy_->encode(observed(t, in)), h);
    Tensor logits = policy_->logits(h1);
    auto y = in.take<int64_t>(size_t(B), [&](std::span<int64_t> v) { env_->targets(v); });
    Tensor loss;
    if (std::any_of(y.begin(), y.end(), [](int64_t v) { return v != kNoTarget; })) {
      // The driver ignores the forward pass's losses: the loss is computed while replaying only.
      if (in.replaying()) loss = cross_entropy(logits, t.from(y, {B}), Reduction::Mean, kNoTarget);
      else ++r.loss_steps;
    }
    // Greedy actions step the env the first time only.
    (void)in.take<int64_t>(size_t(B), [&](std::span<int64_t> a) {
      logits.to_host(std::span<float>(host_rows_));
      for (int64_t b = 0; b < B; ++b) a[size_t(b)] = argmax_row(host_rows_.data() + b * A, A);
      env_->step(a, rewards_, done_);
    });
    return replay::StepResult{reset_recorded(h1, in), loss};
  };
  else step = [&](Tape&, int64_t i, const Tensor& h, replay::Inputs& in) {
    Tensor f = policy_->recur(policy_->encode(observed(*tape_, in)), h);
    Tensor lp = log_softmax(policy_->logits(f));  // [B, A]
    Tensor v = policy_->value(f);                 // [B, 1]
    // Sampled actions step the env the first time only; the step's reward
    // and done are kept for the window's returns (window_returns).
    (void)in.take<int64_t>(size_t(B), [&](std::span<int64_t> a) {
      sample_actions(lp, a);
      env_->step(a, rewards_, done_);
      note_rewards(r);
      const size_t at = size_t(i * B);
      std::copy(a.begin(), a.end(), seg_actions_.begin() + at);
      std::copy(rewards_.begin(), rewards_.end(), seg_rewards_.begin() + at);
      std::copy(done_.begin(), done_.end(), seg_done_.begin() + at);
    });
    const Tensor next = reset_recorded(f, in);
    // The forward pass has no returns yet (and records no gradient): the loss is the replays'.
    if (!in.replaying()) return replay::StepResult{next, Tensor{}};
    return replay::StepResult{next, actor_critic_loss(i, lp, v, seg_returns_.data() + i * B)};
  };
  exact_window_steps_ = n;
  const replay::Report rep = drv->run(step, h_, n);
  if (!spec.supervised) r.loss_steps = n;
  // As a tbptt segment: a window without a target takes no step (its
  // gradients are zero, but Adam would still move by its momentum); under
  // data parallelism every rank joins the update's all-reduce.
  if (r.loss_steps > 0 || avg_) update(r.loss_steps > 0);
  copy_into(h_home_, drv->final_state());
  h_ = h_home_;
  step_ += n;
  r.steps = n;
  r.loss_sum = rep.loss;
  r.steps_run = rep.steps_run;
  r.segment_peak = rep.segment_peak;
  r.stored_bytes = rep.state_bytes;
  return r;
}

// a ~ softmax(lp) per stream, from act_rng_ (one uniform per stream).
void Trainer::sample_actions(const Tensor& lp, std::span<int64_t> a) {
  const int64_t B = config_.batch, A = env_->spec().num_actions;
  lp.to_host(std::span<float>(host_rows_));
  const float* p = host_rows_.data();
  for (int64_t b = 0; b < B; ++b) {
    double u = act_rng_.uniform(), acc = 0;
    int64_t pick = A - 1;
    for (int64_t k = 0; k < A; ++k) {
      acc += std::exp(double(p[b * A + k]));
      if (u < acc) {
        pick = k;
        break;
      }
    }
    a[size_t(b)] = pick;
  }
}

// Episode returns of the step just taken (rewards_, done_).
void Trainer::note_rewards(SegmentResult& r) {
  for (size_t b = 0; b < episode_return_.size(); ++b) {
    float& g = episode_return_[b];
    g += rewards_[b];
    if (done_[b]) r.return_sum += double(g), ++r.episodes, g = 0.0f;
  }
}

// Runs the n-step returns back from the bootstrap `ret` (in: the value after
// the last step; out: step 0's return) over n steps of seg_rewards_ /
// seg_done_, writing each step's return to returns[i * B + b].
void Trainer::returns_over(int64_t n, std::span<float> ret, float* returns) const {
  const size_t B = size_t(config_.batch);
  for (int64_t i = n - 1; i >= 0; --i)
    for (size_t b = 0; b < B; ++b) {
      const size_t k = size_t(i) * B + b;
      ret[b] = seg_rewards_[k] + float(config_.gamma) * ret[b] * (seg_done_[k] ? 0.0f : 1.0f);
      returns[k] = ret[b];
    }
}

// The value of the state after the segment or window, bootstrapped from the
// next observation without gradient and without committing the state (the
// next segment recomputes that step). `h` is the state after the last step.
void Trainer::bootstrap_value(const Tensor& h, std::span<float> out) {
  NoGradGuard ng(*tape_);
  const Tensor keep_h = h_;
  const int64_t keep_pos = window_pos_;
  // feature() overwrites the oldest ring slot: keep it
  if (!window_.empty()) window_[size_t(window_pos_)].to_host(std::span<float>(window_keep_));
  h_ = h;
  Tensor v = policy_->value(feature(policy_->encode(observe_tensor())));
  v.to_host(out);
  h_ = keep_h;
  window_pos_ = keep_pos;
  if (!window_.empty()) window_[size_t(window_pos_)].from_host(std::span<const float>(window_keep_));
}

// exact: the window's returns, once its forward pass is done (replay::Options::on_forward).
void Trainer::window_returns(const Tensor& final_state) {
  {
    Segment seg = tape_->segment();
    bootstrap_value(final_state, std::span<float>(returns_));
  }
  returns_over(exact_window_steps_, std::span<float>(returns_), seg_returns_.data());
}

// A2C's loss of step i: policy gradient -adv * log pi(a), value regression
// to the return, entropy bonus; adv = return - value (a constant), each
// averaged over the B streams. lp [B, A] log-probabilities, v [B, 1] values,
// returns[b] the step's return per stream, actions from seg_actions_.
Tensor Trainer::actor_critic_loss(int64_t i, const Tensor& lp, const Tensor& v, const float* returns) {
  const int64_t B = config_.batch, A = env_->spec().num_actions;
  v.to_host(std::span<float>(host_values_));
  std::fill(weights_.begin(), weights_.end(), 0.0f);
  const float inv_b = 1.0f / float(B);
  for (int64_t b = 0; b < B; ++b) {
    const float adv = returns[b] - host_values_[size_t(b)];
    weights_[size_t(b * A + seg_actions_[size_t(i * B + b)])] = -adv * inv_b;  // policy gradient: -adv * log pi(a)
  }
  Tensor pg = sum(mul(lp, tape_->from(std::span<const float>(weights_), {B, A})));
  Tensor vl = scale(mse_loss(v, tape_->from(std::span<const float>(returns, size_t(B)), {B, 1}), Reduction::Sum),
                    0.5 * config_.value_coef / double(B));
  Tensor neg_entropy = scale(sum(mul(exp(lp), lp)), config_.entropy / double(B));
  return add(add(pg, vl), neg_entropy);
}

SegmentResult Trainer::actor_critic_segment(Segment& seg, int64_t n) {
  SegmentResult r;
  const int64_t B = config_.batch;
  logp_.clear();
  values_.clear();
  for (int64_t i = 0; i < n; ++i, ++step_, tape_->next_step()) {
    Tensor f = feature(policy_->encode(observe_tensor()));
    Tensor lp = log_softmax(policy_->logits(f));  // [B, A]
    logp_.push_back(lp);
    values_.push_back(policy_->value(f));        // [B, 1]
    sample_actions(lp, actions_);
    env_->step(actions_, rewards_, done_);
    reset_finished_streams();
    note_rewards(r);
    std::copy(actions_.begin(), actions_.end(), seg_actions_.begin() + i * B);
    std::copy(rewards_.begin(), rewards_.end(), seg_rewards_.begin() + i * B);
    std::copy(done_.begin(), done_.end(), seg_done_.begin() + i * B);
  }
  bootstrap_value(h_, std::span<float>(returns_));
  returns_over(n, std::span<float>(returns_), seg_returns_.data());
  Tensor loss;
  for (int64_t i = n - 1; i >= 0; --i) {
    Tensor l = actor_critic_loss(i, logp_[size_t(i)], values_[size_t(i)], seg_returns_.data() + i * B);
    r.loss_sum += l.item();
    ++r.loss_steps;
    loss = loss.defined() ? add(loss, l) : l;
  }
  r.steps = n;
  seg.backward(loss, backward_options(config_));
  update();
  return r;
}

double Trainer::evaluate(int64_t steps, uint64_t seed) {
  refuse_while_running("evaluate");  // (before its env and state are swapped for the evaluation's)
  // (the tape's own refusal, "segment 1 is still open; end it", gave advice no caller can follow)
  if (full_)
    throw Error("evaluate: history 'full' keeps its whole run in one open segment; it evaluates only once the run has "
                "ended (done())");
  if (steps < 1) throw Error("evaluate: steps must be >= 1, got " + std::to_string(steps));
  const Busy busy(busy_);
  // A fresh env and fresh history, greedy actions, nothing recorded; the
  // training state (h, window ring, env) is put back afterwards.
  std::unique_ptr<Env> keep_env = std::move(env_);
  env_ = make_env(config_.env, config_.batch, seed, config_.env_options);
  // The training state may be a carried value, which would expire in the
  // segments below: keep it in its persistent home. The evaluation's own
  // state has a persistent home too (allocated once: evaluate may be called
  // any number of times without the pools growing).
  copy_into(h_home_, h_);
  const int64_t keep_pos = window_pos_;
  std::vector<std::vector<float>> keep_window;
  for (const Tensor& w : window_) keep_window.push_back(w.to_host<float>());
  Tensor h0 = eval_h_;
  h0.from_host(std::span<const float>(std::vector<float>(size_t(h0.numel()), 0.0f)));
  h_ = h0;
  const std::vector<float> zeros(window_keep_.size(), 0.0f);
  for (const Tensor& w : window_) w.from_host(std::span<const float>(zeros));
  // Puts the training state back, also when the evaluation's env throws
  // (an env of Python's, say): the trainer stays usable.
  auto restore = [&] {
    env_ = std::move(keep_env);
    h_ = h_home_;
    window_pos_ = keep_pos;
    for (size_t i = 0; i < window_.size(); ++i) window_[i].from_host(std::span<const float>(keep_window[i]));
  };
  const int64_t B = config_.batch, A = env_->spec().num_actions;
  const int64_t K = std::max<int64_t>(config_.history.k, 32);
  double score = 0;
  bool interrupted = false;
  try {
    for (int64_t done_steps = 0; done_steps < steps;) {
      if (interrupt_ && interrupt_()) {
        interrupted = true;
        break;
      }
      Segment seg = tape_->eager_segment();  // (under graph replay: not captured, the graphs kept)
      NoGradGuard ng(*tape_);
      for (int64_t i = 0; i < K && done_steps < steps; ++i, ++done_steps) {
        Tensor logits = policy_->logits(feature(policy_->encode(observe_tensor())));
        logits.to_host(std::span<float>(host_rows_));
        for (int64_t b = 0; b < B; ++b) actions_[size_t(b)] = argmax_row(host_rows_.data() + b * A, A);
        env_->step(actions_, rewards_, done_);
        reset_finished_streams();
      }
      copy_into(h0, h_);
      h_ = h0;
    }
    score = !interrupted && env_->score_counts().second > 0 ? env_->score() : std::numeric_limits<double>::quiet_NaN();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return score;
}

// ---------------------------------------------------------------- checkpoints

// The checkpoint (metadata format "segtape-train-1"): the trainer's tensors
// by name, and its host values in these buffers. One list of entries for
// save and load (nn::save_entries / nn::load_entries).
struct Trainer::Checkpoint {
  int64_t counters[3];                // step, optimizer steps, window position
  int64_t rngs[4];                    // init_rng_'s and act_rng_'s (seed, counter), u64 stored bit for bit in I64
  std::vector<int64_t> env_state;     // Env::save_state()
  std::vector<float> episode_return;  // RL: each stream's return so far in its episode
  std::vector<nn::Entry> entries;
};

// The buffers hold the trainer's values (what save() writes).
void Trainer::checkpoint_entries(Checkpoint& c, const Tensor& state) const {
  c.counters[0] = step_, c.counters[1] = optim_->step_count(), c.counters[2] = window_pos_;
  const nn::Rng::State ir = init_rng_.state(), ar = act_rng_.state();
  const uint64_t rngs[4] = {ir.seed, ir.counter, ar.seed, ar.counter};
  std::memcpy(c.rngs, rngs, sizeof rngs);
  c.env_state = env_->save_state();
  c.episode_return = episode_return_;
  const auto n = [](const auto& v) { return std::vector<int64_t>{int64_t(std::size(v))}; };
  for (const auto& [name, t] : policy_->named_parameters()) c.entries.push_back(nn::entry("policy." + name, t));
  for (const auto& [name, t] : optim_->state()) c.entries.push_back(nn::entry("optim." + name, t));
  c.entries.push_back(nn::entry("train.counters", std::span<int64_t>(c.counters), n(c.counters)));
  c.entries.push_back(nn::entry("train.rngs", std::span<int64_t>(c.rngs), n(c.rngs)));
  c.entries.push_back(nn::entry("env.state", std::span<int64_t>(c.env_state), n(c.env_state)));
  c.entries.push_back(nn::entry("state.h", state));
  c.entries.push_back(nn::entry("train.episode_return", std::span<float>(c.episode_return), n(c.episode_return)));
  c.entries.back().optional = true;
  for (size_t i = 0; i < window_.size(); ++i) c.entries.push_back(nn::entry("state.window." + std::to_string(i), window_[i]));
}

namespace {
// A rank's streams: its integers (env state, sampling rng) and floats
// (carried state, episode returns, window ring), as bytes: [n][ints][m][floats].
std::string encode_streams(const std::vector<int64_t>& ints, const std::vector<float>& floats) {
  std::string b;
  auto put = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  const uint64_t n = ints.size(), m = floats.size();
  put(&n, 8), put(ints.data(), n * 8), put(&m, 8), put(floats.data(), m * 4);
  return b;
}
void decode_streams(const std::string& b, std::vector<int64_t>& ints, std::vector<float>& floats, const std::string& whose) {
  uint64_t n = 0, m = 0;
  const auto bad = [&] { return Error("dist: " + whose + ": malformed stream state (" + std::to_string(b.size()) + " bytes)"); };
  if (b.size() < 16) throw bad();
  std::memcpy(&n, b.data(), 8);
  if (n > (b.size() - 16) / 8) throw bad();
  std::memcpy(&m, b.data() + 8 + n * 8, 8);
  if (b.size() != 16 + n * 8 + m * 4) throw bad();
  ints.resize(n), floats.resize(m);
  std::memcpy(ints.data(), b.data() + 8, n * 8);
  std::memcpy(floats.data(), b.data() + 16 + n * 8, m * 4);
}
}  // namespace

std::string Trainer::stream_state() const {
  std::vector<int64_t> ints = env_->save_state();
  const nn::Rng::State ar = act_rng_.state();
  ints.push_back(int64_t(ar.seed)), ints.push_back(int64_t(ar.counter));
  std::vector<float> floats = h_.to_host<float>();
  floats.insert(floats.end(), episode_return_.begin(), episode_return_.end());
  for (const Tensor& w : window_) {
    const std::vector<float> v = w.to_host<float>();
    floats.insert(floats.end(), v.begin(), v.end());
  }
  return encode_streams(ints, floats);
}

void Trainer::set_stream_state(const std::string& bytes) {
  std::vector<int64_t> ints;
  std::vector<float> floats;
  const std::string whose = "rank " + std::to_string(rank()) + "'s streams in the checkpoint";
  decode_streams(bytes, ints, floats, whose);
  std::vector<int64_t> want_ints;
  std::vector<float> want_floats;
  decode_streams(stream_state(), want_ints, want_floats, whose);
  if (ints.size() != want_ints.size() || floats.size() != want_floats.size())
    throw CheckpointError("dist: " + whose + " have " + std::to_string(ints.size()) + " integers and " + std::to_string(floats.size()) +
                          " floats; this configuration needs " + std::to_string(want_ints.size()) + " and " +
                          std::to_string(want_floats.size()));
  const size_t ni = ints.size() - 2;
  env_->load_state(std::span<const int64_t>(ints).first(ni));
  act_rng_.set_state({uint64_t(ints[ni]), uint64_t(ints[ni + 1])});
  std::span<const float> f(floats);
  const size_t BH = size_t(h_home_.numel()), B = episode_return_.size();
  h_home_.from_host(f.subspan(0, BH));
  h_ = h_home_;
  std::copy_n(f.begin() + BH, B, episode_return_.begin());
  size_t at = BH + B;
  for (const Tensor& w : window_) w.from_host(f.subspan(at, size_t(w.numel()))), at += size_t(w.numel());
}

void Trainer::save(const std::filesystem::path& file, const std::map<std::string, std::string>& extra) const {
  if (full_) throw Error("save: history 'full' keeps its whole run in one open segment; it checkpoints only at the end");
  refuse_inside_a_segment(busy_ > 0 || tape_->segment_open(), "save");
  // Data parallel: every rank's streams to rank 0, which writes the one file.
  std::vector<std::string> streams;
  if (comm_) streams = comm_->gather(stream_state(), 0, "the gather of the ranks' streams for a checkpoint");
  if (rank() != 0) return;
  Checkpoint c;
  checkpoint_entries(c, h_);
  auto meta = config_.to_metadata();
  meta["format"] = "segtape-train-1";
  for (const auto& [k, v] : extra) meta[k] = v;
  std::vector<std::vector<int64_t>> ints(streams.size());
  std::vector<std::vector<float>> floats(streams.size());
  if (comm_) {
    meta["dist.ranks"] = std::to_string(ranks());
    for (size_t r = 1; r < streams.size(); ++r) {
      decode_streams(streams[r], ints[r], floats[r], "rank " + std::to_string(r) + "'s streams");
      const std::string p = "dist.rank" + std::to_string(r);
      c.entries.push_back(nn::entry(p + ".ints", std::span<int64_t>(ints[r]), {int64_t(ints[r].size())}));
      c.entries.push_back(nn::entry(p + ".floats", std::span<float>(floats[r]), {int64_t(floats[r].size())}));
    }
  }
  nn::save_entries(file, c.entries, meta);
}

TrainConfig Trainer::read_config(const std::filesystem::path& file) {
  const safetensors::File f = safetensors::load(file);
  auto it = f.metadata.find("format");
  if (it == f.metadata.end() || it->second != "segtape-train-1")
    throw CheckpointError(file.string() + ": not a segtape training checkpoint (no format 'segtape-train-1' in its metadata)");
  return TrainConfig::from_metadata(f.metadata);
}

void Trainer::load(const std::filesystem::path& file) {
  // (history full's segment stays open between segments: load_file refuses that run)
  refuse_inside_a_segment(busy_ > 0 || (!full_ && tape_->segment_open()), "load");
  if (comm_) return load_dist(file);
  load_file(file, {}, true);
}

void Trainer::load_rank0(const std::filesystem::path& file) {
  if (comm_) throw Error("load_rank0: for one process (segtape eval), not for a rank of a data-parallel run");
  int64_t n = 1;
  const safetensors::File f = safetensors::load(file);
  if (auto it = f.metadata.find("dist.ranks"); it != f.metadata.end()) {
    try {
      n = std::stoll(it->second);
    } catch (const std::logic_error&) {
      n = 0;
    }
    const bool has_last = n >= 1 && n <= 1'000'000 &&
                          (n == 1 || std::any_of(f.tensors.begin(), f.tensors.end(), [&](const safetensors::TensorInfo& t) {
                            return t.name == "dist.rank" + std::to_string(n - 1) + ".ints";
                          }));
    if (!has_last)
      throw CheckpointError(file.string() + ": metadata dist.ranks is '" + it->second + "', which the file's entries do not match (a damaged checkpoint?)");
  }
  load_as_rank0_of(file, n, false);  // the other ranks' streams are read and dropped
}

std::vector<std::string> Trainer::load_as_rank0_of(
    const std::filesystem::path& file, int64_t n, bool check_ranks,
    const std::function<void(const std::vector<std::string>&, std::vector<std::string>&)>& check) {
  std::vector<int64_t> my_ints;
  std::vector<float> my_floats;
  decode_streams(stream_state(), my_ints, my_floats, "rank 0's streams");
  std::vector<std::vector<int64_t>> ints(size_t(n), my_ints);
  std::vector<std::vector<float>> floats(size_t(n), my_floats);
  std::vector<nn::Entry> extra;
  for (int64_t r = 1; r < n; ++r) {
    const std::string p = "dist.rank" + std::to_string(r);
    extra.push_back(nn::entry(p + ".ints", std::span<int64_t>(ints[size_t(r)]), {int64_t(my_ints.size())}));
    extra.push_back(nn::entry(p + ".floats", std::span<float>(floats[size_t(r)]), {int64_t(my_floats.size())}));
  }
  std::vector<std::string> parts(static_cast<size_t>(n));
  const auto encode = [&] {
    for (int64_t r = 1; r < n; ++r) parts[size_t(r)] = encode_streams(ints[size_t(r)], floats[size_t(r)]);
  };
  std::function<void(std::vector<std::string>&)> others;
  if (check) others = [&](std::vector<std::string>& problems) { encode(), check(parts, problems); };
  load_file(file, std::move(extra), check_ranks, others);
  if (!check) encode();  // (with a check, a load that succeeded encoded them for it)
  return parts;
}

// Data parallel: rank 0 reads the file (its own streams, and every other
// rank's), then sends the parameters, the optimizer state, the counters and
// each rank's streams to the ranks; the other ranks read nothing, so the file
// need only be on rank 0's machine. A file rank 0 refuses is refused on
// every rank alike (CollectiveError).
void Trainer::load_dist(const std::filesystem::path& file) {
  const int n = ranks();
  // Every rank's streams are checked by its own env before any rank takes
  // anything: rank 0, inside its load (the file read and checked, nothing
  // taken yet), sends them out; each rank takes its own and puts back what it
  // had; a refusal fails rank 0's load (nothing loaded), whose outcome every
  // rank then gets. (Checked after the broadcast, a refusal left rank 0 with
  // the file, the others with its parameters and half their counters.)
  bool exchanged = false;
  const auto exchange = [&](const std::vector<std::string>& parts) {  // collective
    exchanged = true;
    const std::string pending = comm_->scatter(parts, 0, "the scatter of the ranks' streams for their check");
    std::string refused;
    if (rank() != 0 && !pending.empty()) {
      const std::string own = stream_state();
      try {
        set_stream_state(pending);
      } catch (const std::exception& e) {
        refused = e.what();
      }
      set_stream_state(own);
    }
    return comm_->allgather(refused, "the ranks' check of their streams");
  };
  std::vector<std::string> parts(static_cast<size_t>(n));
  std::string error;
  if (rank() == 0) {
    try {
      parts = load_as_rank0_of(file, n, true, [&](const std::vector<std::string>& p, std::vector<std::string>& problems) {
        const std::vector<std::string> refused = exchange(p);
        for (size_t r = 1; r < refused.size(); ++r)
          if (!refused[r].empty()) problems.push_back("rank " + std::to_string(r) + "'s streams: " + refused[r]);
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!exchanged) exchange(std::vector<std::string>(static_cast<size_t>(n)));  // (refused before the check: the ranks still meet)
  } else {
    exchange({});
  }
  const std::vector<std::string> errors = comm_->allgather(error, "the outcome of rank 0's checkpoint load");
  if (!errors[0].empty()) throw dist::CollectiveError(errors[0]);
  std::vector<Tensor> state = policy_->parameters();
  for (const auto& [name, t] : optim_->state()) state.push_back(t);
  avg_->broadcast(state, "the broadcast of the checkpoint's parameters and optimizer state");
  int64_t counters[3] = {step_, optim_->step_count(), window_pos_};
  comm_->broadcast(counters, sizeof counters, 0, "the broadcast of the checkpoint's counters");
  const std::string mine = comm_->scatter(parts, 0, "the scatter of the ranks' streams from the checkpoint");
  if (rank() != 0) {  // (checked above)
    step_ = counters[0];
    optim_->set_step_count(counters[1]);
    window_pos_ = counters[2];
    set_stream_state(mine);
  }
}

void Trainer::load_file(const std::filesystem::path& file, std::vector<nn::Entry> extra, bool check_ranks,
                        const std::function<void(std::vector<std::string>&)>& check_others) {
  if (config_.history.kind == History::Kind::Full)
    throw CheckpointError(file.string() + ": a --history full run's checkpoint cannot be resumed or evaluated: its history lives "
                          "in one segment, which no checkpoint holds");
  Checkpoint c;
  checkpoint_entries(c, h_home_);
  for (nn::Entry& e : extra) c.entries.push_back(std::move(e));
  std::fill(c.episode_return.begin(), c.episode_return.end(), 0.0f);  // what a checkpoint without them means
  // Is it a checkpoint of this configuration?
  const auto about_file = [&](const nn::Metadata& metadata, std::vector<std::string>& problems) {
    TrainConfig saved;
    try {
      saved = TrainConfig::from_metadata(metadata);
    } catch (const CheckpointError& e) {
      problems.push_back(e.what());
      return;
    }
    auto same = [&](bool ok, const char* what) {
      if (!ok) problems.push_back(std::string("checkpoint was written with another ") + what + " than this run's");
    };
    same(saved.env == config_.env, "--env");
    same(saved.history.str() == config_.history.str(), "--history");
    same(saved.algo == config_.algo && saved.rollout == config_.rollout && saved.epochs == config_.epochs &&
             saved.minibatches == config_.minibatches && saved.lr_schedule == config_.lr_schedule,
         "--algo/--rollout/--epochs/--minibatches/--lr-schedule");
    same(saved.batch == config_.batch && saved.hidden == config_.hidden && saved.embed == config_.embed,
         "--batch/--hidden/--embed");
    same(saved.env_shards == config_.env_shards, "--env-shards");
    const EnvOptions &so = saved.env_options, &o = config_.env_options;
    same(so.lag == o.lag && so.vocab == o.vocab && so.sparse == o.sparse && so.corridor == o.corridor && so.turns == o.turns &&
             so.cities == o.cities,
         "--lag/--vocab/--sparse/--corridor/--turns/--cities");
    auto it = metadata.find("dist.ranks");
    const std::string written = it == metadata.end() ? "1" : it->second;
    if (check_ranks && written != std::to_string(ranks()))
      problems.push_back("checkpoint was written by a run of " + written + " rank(s) (mpirun -np " + written + "); this run has " +
                         std::to_string(ranks()) + ": resume it with the same number of ranks");
  };
  // The counters and the env's state are in range (a damaged checkpoint must
  // not become an out-of-range index); the env takes its state last, when
  // nothing else can be refused.
  const auto about_values = [&](const nn::Metadata&, std::vector<std::string>& problems) {
    const int64_t ring = std::max<int64_t>(int64_t(window_.size()), 1);
    const int64_t* n = c.counters;
    // (steps: --steps' bound; optimizer steps: where Adam's bias correction,
    // a power of the step count in double, still sees every step)
    if (n[0] < 0 || n[0] > TrainConfig::kMaxSteps || n[1] < 0 || n[1] > nn::Optimizer::kMaxSteps || n[2] < 0 || n[2] >= ring) {
      problems.push_back("train.counters out of range (step " + std::to_string(n[0]) + ", optimizer steps " +
                         std::to_string(n[1]) + ", window position " + std::to_string(n[2]) + " of " +
                         std::to_string(ring) + "): a damaged checkpoint?");
      return;
    }
    if (check_others) {  // (data parallel: the other ranks' streams, each checked by its rank's env)
      check_others(problems);
      if (!problems.empty()) return;
    }
    try {
      env_->load_state(c.env_state);
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  };
  nn::load_entries(file, c.entries, "the training checkpoint", about_file, about_values);
  episode_return_ = c.episode_return;
  h_ = h_home_;
  step_ = c.counters[0];
  optim_->set_step_count(c.counters[1]);
  if (graph_) {  // (the count reaches the device at the next step, a call no graph holds: capture anew)
    tape_->discard_graph();
    graph_key_ = last_key_ = 0;
  }
  window_pos_ = c.counters[2];
  init_rng_.set_state({uint64_t(c.rngs[0]), uint64_t(c.rngs[1])});
  act_rng_.set_state({uint64_t(c.rngs[2]), uint64_t(c.rngs[3])});
}

size_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

size_t parse_bytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  double mul = unit.empty() || unit == "B" ? 1
               : unit == "KiB" || unit == "K" ? 1024.0
               : unit == "MiB" || unit == "M" ? 1048576.0
               : unit == "GiB" || unit == "G" ? 1073741824.0
                                              : -1;
  if (used == 0 || mul < 0 || !(v >= 0))
    throw Error(std::string(flag) + " '" + s + "': expected a size such as 64MiB, 512KiB, 2GiB or a byte count (units B, "
                "KiB, MiB, GiB; K, M, G alike)");
  if (v * mul > 1e13) throw Error(std::string(flag) + " '" + s + "': at most 1e13 bytes (9.09 TiB)");
  if (v * mul < 1) throw Error(std::string(flag) + " '" + s + "': must be a positive size, such as 64MiB");
  return size_t(v * mul);
}

}  // namespace segtape::agent
