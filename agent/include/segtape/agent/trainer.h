// The agent loop: a history (how a segment's steps are run and cut,
// agent/history/) and an algorithm (supervised, A2C, PPO: agent/algo/) over a
// batched env, one update per run_segment(), evaluation, and exact resumable
// checkpoints. docs/design.md, "The agent layer".
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "segtape/agent/config.h"
#include "segtape/agent/env.h"
#include "segtape/agent/policy.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/optim.h"
#include "segtape/replay.h"

namespace segtape::agent {

// What one update did. The common figures; the algorithm's own are its
// metrics (PPO: approx_kl, clip_fraction).
struct Metric {
  const char* name;  // e.g. "approx_kl" (TensorBoard: "<algo>/<name>")
  double value;
};
struct UpdateResult {
  int64_t steps = 0;        // env steps this update ran
  double loss_sum = 0;      // sum of per-step losses
  int64_t loss_steps = 0;   // steps that had a loss
  double return_sum = 0;    // RL: sum of the (undiscounted) returns of episodes that ended
  int64_t episodes = 0;     // RL: episodes that ended in this update
  int64_t steps_run = 0;    // exact: step evaluations (forward pass and replays)
  size_t segment_peak = 0;  // exact, ppo: the largest arena high-water of the window's (iteration's) segments
  size_t stored_bytes = 0;  // exact: the boundary states it keeps
  std::span<const Metric> metrics;  // the algorithm's own, valid until its next update
  // The algorithm's figure `name` (0 where it reports none).
  double metric(std::string_view name) const {
    for (const Metric& m : metrics)
      if (name == m.name) return m.value;
    return 0;
  }
};

// What a configuration will need, known before anything is allocated.
struct SizeEstimate {
  size_t parameter_bytes = 0;  // parameters, gradients and Adam's two moments (4 floats each)
  size_t step_bytes = 0;       // a lower bound of the arena bytes one step keeps (its input and forward outputs)
  size_t observation_bytes = 0;  // of which the step's observation (tokens, or B x obs_dim floats)
  size_t segment_bytes = 0;    // step_bytes x the steps a segment keeps (K; 1 for `full`, which grows)
  size_t budget = 0;           // the budget that applies (segment budget, or `full`'s growth limit)
  size_t rollout_bytes = 0;    // the algorithm's host buffers (PPO's rollout: agent/algo/rollout_buffer.h)
  // What writing a checkpoint holds while it writes: the file in memory
  // (the parameters and the optimizer's moments; nn::save_entries), and
  // with --device cuda their copy on the host too.
  size_t checkpoint_bytes = 0;
  // The whole process (docs/hardening.md, "The size check"), what the
  // kernel counts, each an upper bound:
  size_t arena_bytes = 0;     // the segment arena's pages its segments touch (at most the budget)
  size_t packed_bytes = 0;    // the CPU's packed copies of the recurrent weights (segtape::packs_weight)
  size_t process_bytes = 0;   // this process's resident memory when the estimate was made (libraries, the env, Python)
  size_t other_bytes = 0;     // the carry buffers, the persistent pool's chunk ends, the weight-gradient workspace,
                              // BLAS's buffers, the env's and the allocator's working memory
  // Data parallel over MPI, host tensors: the gradient averager's packing
  // buffer and MPI's scratch for the all-reduce of its largest bucket.
  size_t dist_bytes = 0;
  // process + parameters (on the host) + packed + arena + rollout + checkpoint
  // + other + dist: the peak resident set size the run reaches, at most.
  size_t resident_total = 0;
  size_t address_total = 0;   // the address space it reserves (the arena whole): what ulimit -v limits
  size_t data_total = 0;      // of which its data segment (VmData, no files mapped): what ulimit -d limits
};

// The memory this process may take, to refuse a size that cannot fit before
// anything is allocated: the machine's physical memory, or less where the
// process's address-space or data limit (ulimit -v, -d) is lower. `what`,
// when given, says which ("this machine has", "ulimit -v allows"). 0: unknown.
size_t memory_limit(std::string* what = nullptr);

struct Context;
class HistoryRunner;
class Algorithm;
class Step;

// A trainer is a history (how a segment's steps are run and cut,
// agent/history/) and an algorithm (what is learned from them, agent/algo/)
// over an env's B streams, on one tape. This class puts them together and
// keeps what a run needs between updates: checkpoints, evaluation, data
// parallelism.
class Trainer {
 public:
  // With a communicator of several ranks (dist::mpi() under mpirun), the
  // trainer is one rank of a data-parallel run: its streams are seeded by
  // its rank, rank 0's parameters are broadcast, the configurations are
  // compared (dist::CollectiveError naming what differs), every update
  // averages the gradients over the ranks before clipping, the replicas'
  // parameters are compared every kReplicaCheckEvery updates, and save/load
  // are collective (every rank calls them; rank 0 reads and writes the one
  // file, which holds every rank's streams). The communicator must outlive
  // the trainer.
  explicit Trainer(const TrainConfig& c, dist::Communicator* comm = nullptr);
  ~Trainer();
  static constexpr int64_t kReplicaCheckEvery = 100;

  // Runs one update: a segment (K steps, fewer at the end), an exact window
  // (T steps) or a PPO iteration (a rollout and its epochs), and updates the
  // parameters.
  // When it throws (an env of Python's raising, say), the trainer stays
  // usable (it can run, evaluate or save again): its step is as before, its
  // parameters unchanged (they change only at the segment's end) and their
  // gradients zeroed; the env keeps the steps it took. The recurrent state
  // is as before with --history tbptt, detach and exact; window:N's ring
  // keeps the embeddings the failed steps wrote, and --algo ppo the state
  // of the rollout's last K-step boundary before the throw. With CUDA-graph
  // segments (graph_segments()) the env is stepped with the model's actions
  // after the segment's update: a throw there (the env, or its open_loop
  // check, or an error the device reports) leaves the update in place, the
  // step at the segment's end and the state the segment carried, while the
  // env has taken only the steps before the throw; a graph segment whose
  // graph did not run (a replay that did not match) changes nothing on a
  // GPU (on the emulated device, whose calls run as they are issued, the
  // calls before the difference have run) and forgets the graphs. (Not for
  // --history full, whose one segment spans the run.)
  UpdateResult run_segment();
  // A run that stops before its end (a signal): the algorithm's figures at
  // that point, as metrics (a language model evaluates its validation part
  // where the last update did not); none for the others.
  UpdateResult stopped_figures();
  bool done() const;
  // Data parallelism: this rank's stop request travels with the next update's
  // gradients, and every rank sees any rank's after it (stop_agreed), so all
  // stop at the same step. Without a communicator the request is agreed at once.
  // `reason` travels too (1 or 2, the caller's code for why: the program's
  // 1 SIGINT, 2 SIGTERM): stop_reason() is 1 where any rank gave 1, else 2
  // (0 before a stop is agreed), the same on every rank.
  void request_stop(int reason = 1);
  bool stop_agreed() const;
  int stop_reason() const;
  // The gradient averaging's counts and times (nullptr with one rank), and
  // how it moves the gradients ("mpi", "nccl"; "local" with one rank).
  const dist::AverageStats* dist_stats() const;
  std::string dist_transport() const;
  int rank() const;
  int ranks() const;
  // The seed of the env of stream shard `shard` (rank r of a run with
  // env_shards S makes shards r S .. r S + S - 1); shard 0's is the seed a
  // run of one process has always used.
  static uint64_t shard_seed(uint64_t seed, int64_t shard);
  // Adam's learning rate now (--lr, or where --lr-schedule has taken it).
  double lr() const;
  int64_t step() const;
  // Updates skipped because their gradient was not finite (--nonfinite
  // skip), in the whole run (kept in checkpoints).
  int64_t skipped_updates() const;

  // Greedy evaluation over `steps` fresh steps of a new env seeded `seed` (no
  // gradients): the env's score over them, or NaN where they scored nothing
  // (no target asked, no episode finished: recall asks its first question at
  // step --lag), not a 0 that reads as a wrong answer.
  // Refused unless steps >= 1. With an interrupt check set (set_interrupt),
  // it stops at the next segment boundary once the check returns true and
  // returns NaN (the training state is put back either way).
  double evaluate(int64_t steps, uint64_t seed);
  // Asked by evaluate before each of its segments: true stops it. The segtape
  // program reads the flag its SIGINT / SIGTERM handler sets; Python's binding
  // runs Python's signal handlers (Ctrl-C raises KeyboardInterrupt). Empty: none.
  void set_interrupt(std::function<bool()> check) { interrupt_ = std::move(check); }
  // Refuses (segtape::Error naming `what`) a call made while a segment runs:
  // from inside run_segment or evaluate (an env's callback, or a signal
  // handler evaluate's interrupt check runs), before the call changes
  // anything. run_segment and evaluate begin with it (save and load with
  // the same refusal), and so does a binding that changes the trainer before
  // it calls one of them (Python's evaluate sets the interrupt check first).
  void refuse_while_running(const char* what) const;
  // After a NonFiniteError ended a segment part-way: NonFiniteError naming
  // `what` until a checkpoint is loaded (its env and samplers moved on).
  void refuse_after_non_finite(const char* what) const;

  // Everything to continue bit-identically: parameters, optimizer moments,
  // step, env state, carried history, rngs, config. Atomic write.
  void save(const std::filesystem::path& file, const std::map<std::string, std::string>& extra = {}) const;
  // Restores a checkpoint written by save() for the same configuration.
  void load(const std::filesystem::path& file);
  // A checkpoint of any number of ranks, as rank 0 of its run (its
  // parameters are every rank's; segtape eval). Not for a rank of a
  // data-parallel run.
  void load_rank0(const std::filesystem::path& file);
  // Parameters only, for evaluation of a checkpoint.
  static TrainConfig read_config(const std::filesystem::path& file);
  // The sizes a configuration needs. The constructor refuses, with these
  // numbers, a configuration whose segment cannot fit its budget or whose
  // parameters and segment cannot fit this machine's memory.
  static SizeEstimate estimate(const TrainConfig& c);
  // The estimate this trainer's constructor checked (its process_bytes measured then).
  const SizeEstimate& size_estimate() const;
  // The budget this trainer's tape applies (TrainConfig::budget, or its default).
  size_t budget() const;

  // The carried GRU state [B, hidden] after the last step (zero rows for
  // streams whose episode just ended).
  const Tensor& state() const;
  Tape& tape();
  Policy& policy();
  Env& env();
  const TrainConfig& config() const;
  // Whether this trainer runs its segments as CUDA graphs (TrainConfig::graph_replay
  // and the run allows it); TapeStats counts the captured and replayed ones.
  bool graph_segments() const;
  // Whether those segments run their recurrence as one gru_sequence (docs/agent.md).
  bool graph_sequence() const;
  // Whether PPO's update windows run their recurrence as one gru_sequence
  // (docs/agent.md, "Recurrent PPO"); false for other algorithms.
  bool ppo_sequence() const;
  // How the recurrence runs, in words, for the summary: one gru_sequence a
  // segment (and its path: the fused kernels' plan, or gru_cell steps and
  // why), or cells step by step (on a CUDA tape with a one-layer GRU, why
  // the fused kernels do not run).
  std::string recurrence() const;

 private:
  // A segment's loss that is not finite: NonFiniteError (run_segment).
  void check_loss(const UpdateResult& r, int64_t step0, int64_t skipped0);
  // This rank's streams (env state, sampling rng, carried state, episode
  // returns, the history's carried tensors) as bytes, and back: what a
  // data-parallel checkpoint keeps of each rank besides rank 0.
  std::string stream_state() const;
  void set_stream_state(const std::string& bytes);
  void load_dist(const std::filesystem::path& file);
  // check_others: called once the file is read and checked, before this
  // trainer takes any of it; the problems it adds refuse the load.
  void load_file(const std::filesystem::path& file, std::vector<nn::Entry> extra, bool check_ranks,
                 const std::function<void(std::vector<std::string>&)>& check_others = {});
  // Loads the file as rank 0 of a run of n ranks; returns the other ranks'
  // streams (stream_state()'s bytes; element 0 empty). check: given those
  // streams before this trainer takes anything (load_file's check_others).
  std::vector<std::string> load_as_rank0_of(
      const std::filesystem::path& file, int64_t n, bool check_ranks,
      const std::function<void(const std::vector<std::string>&, std::vector<std::string>&)>& check = {});
  bool grows() const;  // the history keeps the run in one segment (full)
  // Busy in run_segment or evaluate (run_segment, evaluate, save and load are
  // refused there, also from a signal handler evaluate's interrupt check runs
  // between segments).
  int busy_ = 0;
  std::function<bool()> interrupt_;
  std::unique_ptr<Context> c_;
  std::unique_ptr<Env> env_;  // the B streams (Context::env)
  std::unique_ptr<HistoryRunner> history_;
  std::unique_ptr<Step> step_;
  std::unique_ptr<Algorithm> algo_;
  SizeEstimate sizes_;  // what the constructor checked
};

// Resident set size of this process, bytes (from /proc/self/statm), its
// peak so far (VmHWM in /proc/self/status) and its address space (VmSize).
size_t resident_bytes();
size_t peak_resident_bytes();
size_t address_space_bytes();
size_t data_segment_bytes();  // (VmData)

}  // namespace segtape::agent
