#include "sizing.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "algo/algorithm.h"
#include "segtape/blas.h"
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
constexpr size_t kOtherBytes = size_t(16) << 20;

// A "Name:   N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in bytes (0 where absent).
size_t proc_kb(const char* file, const char* name) {
  FILE* f = std::fopen(file, "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  const size_t n = std::strlen(name);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, name, n) == 0 && line[n] == ':') {
      kb = size_t(std::strtoull(line + n + 1, nullptr, 10));
      break;
    }
  std::fclose(f);
  return kb * 1024;
}
}  // namespace

size_t applied_budget(const TrainConfig& c) {
  if (history_def(c.history.kind).grows) return c.budget ? c.budget : kDefaultFullLimit;
  if (c.budget) return c.budget;
  return c.algo == Algo::Lm ? kDefaultLmBudget : kDefaultBudget;
}

TapeOptions tape_options(const TrainConfig& c) {
  TapeOptions o;
  o.budget_name = c.budget_name;
  o.precision = parse_precision(c.precision).value_or(Precision::F32);  // (validate() refuses any other name)
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
  s.ortho_init = c.ortho_init;
  if (c.encoder == "none") {
    if (spec.vocab > 0)
      throw Error("--encoder none feeds vector observations to the recurrent cell as they are; the env '" + spec.name +
                  "' observes tokens, which need their embedding (--encoder linear)");
    s.raw_obs = true, s.embed = spec.obs_dim;
  }
  if (s.separate_critic && !s.value_head)
    throw Error("--critic separate gives the value head a cell of its own; --algo " + std::string(algo_name(c.algo)) + " on the env '" +
                spec.name + "' learns from its targets by cross-entropy and has no value head");
  // A language model without dropout whose vocabulary is smaller than a
  // segment's tokens reads layer 0's input gates from a table (PolicyShape::input_table).
  s.input_table = c.algo == Algo::Lm && s.stacked() && spec.vocab > 0 && c.dropout == 0 && spec.vocab <= c.batch * c.history.span();
  return s;
}

namespace {
// The whole process's resident memory and address space, upper bounds
// (SizeEstimate::resident_total, address_total; docs/hardening.md, "The size check").
void whole_process(const TrainConfig& c, const EnvSpec& spec, const PolicyShape& shape, int ranks, SizeEstimate& e) {
  const bool cuda = c.device == "cuda";
  const size_t B = size_t(c.batch), H = size_t(shape.hidden), G = (shape.lstm ? 4 : 3) * H;
  const bool grows = history_def(c.history.kind).grows;
  const size_t steps = grows ? size_t(c.steps) : size_t(c.history.k);
  // The segment arena: the pages its segments touch. The forward's bytes
  // (segment_bytes) and half as much again for what backward adds (its
  // gradients of the steps' outputs; measured: 1.01x to 1.4x the forward's
  // over the built-in tasks, Sizes tests), at most the budget; beside it the
  // tape's node array (a step records tens of nodes; it counts against the
  // budget too, and a vector doubles as it grows).
  const size_t per_step = e.step_bytes + e.step_bytes / 2;
  const size_t nodes = std::max<size_t>(TapeOptions{}.node_capacity, 64 * steps) * sizeof(Node);
  const size_t segment = (grows ? steps * per_step : e.segment_bytes + e.segment_bytes / 2) + nodes;
  e.arena_bytes = cuda ? 0 : std::min(e.budget + std::min(nodes, e.budget), segment);  // (a CUDA tape's pools are on the GPU)
  // The CPU's packed copies of the recurrent cells' weights (one float per
  // weight, its gate columns rounded up to a panel; engine/ops/gru.cpp
  // packed_weight); where a size is not a multiple of 32, backward's copy
  // may not fit the chunk forward's used, and takes one of its own.
  size_t packed = 0;
  const size_t in0 = shape.raw_obs ? size_t(std::max<int64_t>(spec.obs_dim, 1)) : size_t(shape.embed);
  const auto weight = [&](size_t in) {  // a product of B rows by [in, G]
    if (!packs_weight(int64_t(B), int64_t(G), int64_t(in))) return size_t(0);
    return (in % 32 || H % 32 ? 2 : 1) * (G + 64) * in * sizeof(float);
  };
  for (int64_t l = 0; l < shape.layers; ++l) packed += weight(l == 0 ? in0 : H) + weight(H);
  if (shape.separate_critic) packed += weight(in0) + weight(H);
  const bool bf16 = c.precision == "bf16";  // (no packed weights, no batched weight gradients: below)
  e.packed_bytes = cuda || bf16 ? 0 : packed;
  // Backward's weight-gradient workspace: the rows of d(x W_ih^T) and
  // d(h W_hh^T) of up to max(128, H) steps' rows at once, per layer (kept).
  // Under --precision bf16, the rounded copies of a product's two operands
  // and of a product added into a gradient instead (cpu/blas.h's
  // Bf16Scratch, kept at the largest): at most three matrices, each at most a segment's rows (a language model's head
  // takes its chunk's at once) by the widest of the layers' and the head's
  // columns, or the largest weight.
  const size_t rows = std::min(steps * B, std::max<size_t>(128, H));
  const size_t widest = std::max({size_t(std::max<int64_t>(spec.num_actions, 1)), G, in0, H});
  const size_t bf16_copies = 3 * std::max(steps * B * widest, widest * std::max(in0, H)) * sizeof(float);
  const size_t workspace = cuda ? 0
                           : bf16 ? bf16_copies
                                  : size_t(shape.layers + (shape.separate_critic ? 1 : 0)) * rows * (2 * G + H + std::max(in0, H)) * sizeof(float);
  // OpenBLAS's packing buffers: each thread touches at most its 32 MiB
  // buffer, and no more than a product's weight ([in, G] at most).
  const size_t largest = G * std::max(in0, H) * sizeof(float);
  const size_t blas = cuda ? 0 : size_t(std::max(1, blas_threads())) * std::min(largest, size_t(32) << 20);
  // The carry buffers (the state between segments, twice), the trainer's
  // homes of it, and the persistent pool's chunk ends (a chunk's unused end
  // at most per tensor: 4 MiB).
  const size_t state = 2 * B * H * size_t(shape.layers) * (shape.lstm ? 2 : 1) * (shape.separate_critic ? 2 : 1) * sizeof(float);
  const size_t carry = cuda ? 0 : 2 * std::max(TapeOptions{}.carry_chunk, state) + 2 * state + (size_t(4) << 20);
  // The process so far: its peak, not only what it holds now (what it freed,
  // e.g. a corpus read twice, is still counted by the kernel's peak).
  e.process_bytes = std::max(resident_bytes(), peak_resident_bytes());
  e.other_bytes = kOtherBytes + carry + blas + workspace;
  // Data parallel over MPI (host tensors; NCCL reduces a CUDA tape's in
  // place): the averager's packing buffer, as large as its largest bucket
  // (4 MiB, or a gradient larger than that, reduced whole), and as much
  // again for MPI's scratch while it all-reduces it (dist::GradientAverager).
  if (ranks > 1 && !cuda) {
    const size_t largest = size_t(Policy::largest_parameter_for(spec, shape)) * sizeof(float);
    e.dist_bytes = 2 * (std::max(largest, size_t(4) << 20) + 2 * sizeof(float));
  }
  const size_t host_parameters = cuda ? 0 : e.parameter_bytes;  // (a CUDA tape's are on the GPU)
  e.resident_total = e.process_bytes + host_parameters + e.packed_bytes + e.arena_bytes + e.rollout_bytes + e.checkpoint_bytes +
                     e.other_bytes + e.dist_bytes;
  const size_t rest = host_parameters + e.packed_bytes + (cuda ? 0 : e.budget + nodes) + e.rollout_bytes + e.checkpoint_bytes +
                      e.other_bytes + e.dist_bytes;
  e.address_total = address_space_bytes() + rest;
  e.data_total = data_segment_bytes() + rest;
}
}  // namespace

// A lower bound of what one step keeps in the arena: its observation (the
// tokens, or the vectors: B x obs_dim floats) and the forward outputs the
// step's ops allocate (encoder, recurrence or window, head), each aligned;
// backward's buffers and the loss come on top.
SizeEstimate estimate_sizes(const TrainConfig& c, const EnvSpec& spec, int ranks) {
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
  // the critic's cell too (an LSTM's state, gates and h); the state's two halves sliced, joined (an LSTM's
  // output: its two h rows sliced and joined), and each head's rows sliced
  if (shape.separate_critic && shape.lstm)
    e.step_bytes += f32(2 * B * H) + f32(4 * B * H) + f32(B * H) + 2 * f32(2 * B * H) + f32(4 * B * H) + 2 * f32(B * H) + f32(2 * B * H) +
                    2 * f32(B * H);
  else if (shape.separate_critic)
    e.step_bytes += f32(B * H) + f32(4 * B * H) + 2 * f32(B * H) + f32(2 * B * H) + 2 * f32(B * H);
  if (shape.value_head) e.step_bytes += f32(B);
  if (shape.head_hidden > 0)  // each head's hidden layer: its product and its ReLU
    e.step_bytes += (shape.value_head ? 2 : 1) * 2 * f32(B * size_t(shape.head_hidden));
  const size_t steps = history_def(c.history.kind).grows ? 1 : size_t(c.history.k);
  e.segment_bytes = e.step_bytes * steps;
  if (shape.input_table) e.segment_bytes += 2 * f32(size_t(spec.vocab) * G);  // the table: the product, its bias added
  if (const AlgorithmDef& a = algorithm_def(c.learner(spec)); a.host_bytes) e.rollout_bytes = a.host_bytes(c, spec);
  e.budget = applied_budget(c);
  whole_process(c, spec, shape, ranks, e);
  return e;
}

namespace {
// A number in a cgroup file (0 where absent, or "max"), or the value of
// `key` in a "key value" file (memory.stat).
size_t cgroup_number(const std::string& file, const char* key = nullptr) {
  FILE* f = std::fopen(file.c_str(), "r");
  if (!f) return 0;
  char line[256];
  size_t v = 0;
  const size_t n = key ? std::strlen(key) : 0;
  while (std::fgets(line, sizeof line, f)) {
    if (!key) {
      v = std::strncmp(line, "max", 3) == 0 ? 0 : size_t(std::strtoull(line, nullptr, 10));
      break;
    }
    if (std::strncmp(line, key, n) == 0 && line[n] == ' ') {
      v = size_t(std::strtoull(line + n + 1, nullptr, 10));
      break;
    }
  }
  std::fclose(f);
  return v;
}

// What this process's memory cgroup and its parents leave (their limit less
// their usage, the reclaimable page cache not counted as used), the least of
// them; 0 where no limit applies. cgroup v2 (memory.max) or v1
// (memory.limit_in_bytes), from the path /proc/self/cgroup names.
size_t cgroup_room() {
  FILE* f = std::fopen("/proc/self/cgroup", "r");
  if (!f) return 0;
  char line[1024];
  std::string v2, v1;
  while (std::fgets(line, sizeof line, f)) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    const size_t a = l.find(':'), b = a == std::string::npos ? a : l.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = l.substr(a + 1, b - a - 1), path = l.substr(b + 1);
    if (l.compare(0, a, "0") == 0 && controllers.empty()) v2 = "/sys/fs/cgroup" + path;
    else if (("," + controllers + ",").find(",memory,") != std::string::npos) v1 = "/sys/fs/cgroup/memory" + path;
  }
  std::fclose(f);
  size_t room = 0;
  const auto walk = [&](std::string dir, const std::string& top, const char* limit, const char* usage, const char* inactive) {
    for (;;) {
      const size_t max = cgroup_number(dir + "/" + limit);
      if (max && max < (size_t(1) << 60)) {  // (v1 writes "no limit" as about 2^63)
        const size_t used = cgroup_number(dir + "/" + usage), cache = cgroup_number(dir + "/memory.stat", inactive);
        const size_t busy = used - std::min(used, cache), left = max - std::min(max, busy);
        room = room ? std::min(room, left) : std::max<size_t>(left, 1);
      }
      if (dir.size() <= top.size()) break;
      dir = dir.substr(0, dir.find_last_of('/'));
      if (dir.size() < top.size()) dir = top;
    }
  };
  if (!v2.empty()) walk(v2, "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file");
  if (!v1.empty()) walk(v1, "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file");
  return room;
}

// The memory a new run may still take: the machine's available memory
// (MemAvailable), or less where this process's cgroup leaves less. 0: unknown.
size_t memory_available(std::string* what) {
  size_t avail = proc_kb("/proc/meminfo", "MemAvailable");
  *what = "this process may reach (this machine's available memory and its own)";
  if (const size_t room = cgroup_room(); room && (avail == 0 || room < avail))
    avail = room, *what = "this process may reach (what its cgroup's memory limit leaves, and its own)";
  return avail;
}

// The estimate's terms, for messages.
// resident: the resident estimate's (else the address space's, less the process and the arena named apart).
std::string parts(const TrainConfig& c, const SizeEstimate& e, bool resident) {
  std::string m = (e.parameter_bytes && c.device == "cuda" ? "on the host: " : "") + std::string("parameters, gradients and the optimizer's state ") +
                  format_bytes(c.device == "cuda" ? 0 : e.parameter_bytes) + (e.packed_bytes ? ", their packed copies " + format_bytes(e.packed_bytes) : "");
  if (resident) m += ", the segment arena " + format_bytes(e.arena_bytes);
  if (e.rollout_bytes) m += ", PPO's rollout " + format_bytes(e.rollout_bytes);
  if (e.dist_bytes) m += ", the all-reduce's buffers " + format_bytes(e.dist_bytes);
  m += ", a checkpoint's write " + format_bytes(e.checkpoint_bytes) +
       (resident ? ", the process so far " + format_bytes(e.process_bytes) : std::string()) + " and " + format_bytes(e.other_bytes) +
       " of working memory";
  return m;
}

// The flags that size the largest term.
// arena: the arena's share (its touched pages, or for the address space its whole budget).
std::string advice(const TrainConfig& c, const SizeEstimate& e, size_t arena) {
  if (e.rollout_bytes > e.parameter_bytes && e.rollout_bytes > arena) return "make the rollout shorter (--rollout, --batch)";
  if (arena > e.parameter_bytes) return "lower " + std::string(c.budget_name) + ", or make the segment smaller (--history tbptt:K, --batch)";
  return "make the model smaller (--hidden, --embed)";
}
}  // namespace

void check_sizes(const TrainConfig& c, const SizeEstimate& e, const MachineShare& others) {
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
  if (!c.size_check) return;
  // The whole process against what it may take: its resident memory
  // against the memory available (this machine's, or its cgroup's), its
  // address space against ulimit -v / -d.
  std::string has;
  const size_t available = memory_available(&has);
  // (the process's present pages are its already: what it may reach is those and what is available)
  // Ranks on this machine share its memory: what the others will take
  // beyond what they hold now is counted with this process's need.
  const std::string beside =
      others.ranks ? ", and the " + std::to_string(others.ranks) + " other rank" + (others.ranks > 1 ? "s" : "") +
                         " of this run on this machine " + format_bytes(others.bytes) + " beyond what they hold now"
                   : std::string();
  const auto refuse = [&](size_t need, size_t limit, const std::string& what) {
    throw Error("this run needs up to " + format_bytes(need) + " (" + parts(c, e, true) + ")" + beside + ", but " + what + " " +
                format_bytes(limit) + ": " + advice(c, e, e.arena_bytes) + (others.ranks ? ", or fewer ranks on this machine" : "") +
                "; or --size-check off to run without this check (Trainer::estimate, docs/hardening.md)");
  };
  if (available && e.resident_total + others.bytes > available + e.process_bytes) refuse(e.resident_total, available + e.process_bytes, has);
  const bool cuda = c.device == "cuda";
  const auto address = [&](size_t need, size_t so_far, size_t limit, const std::string& what) {
    throw Error("this run reserves up to " + format_bytes(need) + " of " + what + " (the process's so far " + format_bytes(so_far) +
                (cuda ? "" : ", the segment arena's whole budget " + format_bytes(e.budget)) + ", and " + parts(c, e, false) +
                ") but ulimit -" + (what == "address space" ? "v" : "d") + " allows " + format_bytes(limit) + ": " +
                advice(c, e, cuda ? 0 : e.budget) + "; or --size-check off to run without this check (Trainer::estimate, docs/hardening.md)");
  };
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY && e.address_total > size_t(r.rlim_cur))
    address(e.address_total, address_space_bytes(), size_t(r.rlim_cur), "address space");
  if (::getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY && e.data_total > size_t(r.rlim_cur))
    address(e.data_total, data_segment_bytes(), size_t(r.rlim_cur), "data segment");
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

std::string machine_id() {
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char line[128];
    if (std::fgets(line, sizeof line, f)) id = std::string("boot ") + std::string(line, std::strcspn(line, "\n"));
    std::fclose(f);
  }
  if (!id.empty()) return id;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string("host ") + host;
}

size_t peak_resident_bytes() { return proc_kb("/proc/self/status", "VmHWM"); }
size_t address_space_bytes() { return proc_kb("/proc/self/status", "VmSize"); }
size_t data_segment_bytes() { return proc_kb("/proc/self/status", "VmData"); }

size_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace segtape::agent
