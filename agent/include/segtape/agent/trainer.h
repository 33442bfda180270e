// The agent loop: segments of K steps over a batched env, a history strategy
// deciding how history reaches the gradient, supervised or actor-critic
// training, and exact resumable checkpoints.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "segtape/agent/env.h"
#include "segtape/agent/policy.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/optim.h"
#include "segtape/replay.h"

namespace segtape::agent {

struct History {
  enum class Kind { Tbptt, Detach, Full, Window, NoGradHistory, Exact };
  Kind kind = Kind::Tbptt;
  int64_t k = 32;       // steps per segment (per update for full)
  int64_t window = 0;   // window:N
  int64_t horizon = 0;  // exact:K/T: steps per window (the gradient's reach); default 8 K
  // "tbptt:K", "detach", "full", "window:N", "nograd-history", "exact:K" or "exact:K/T"
  static History parse(const std::string& s);
  std::string str() const;
};

struct TrainConfig {
  // The most steps any step count takes (--steps, and the cadences and
  // evaluations the command line takes): sums of them stay far from int64's end.
  static constexpr int64_t kMaxSteps = 1'000'000'000;
  std::string env = "recall";
  History history;
  int64_t steps = 24000;   // env steps (each over the whole batch)
  int64_t batch = 32;
  int64_t hidden = 128;
  int64_t embed = 32;
  double update_bias = 0;  // added to the GRU's update-gate bias at init (PolicyShape::update_bias)
  double lr = 3e-3;
  double clip = 1.0;       // gradient norm clip (0 = off)
  uint64_t seed = 1;
  std::string device = "cpu";
  size_t budget = 0;       // segment arena bytes; 0 = 64 MiB (for `full`: the growth limit, 0 = 1 GiB)
  // How budget errors name the budget (the segtape command: "--budget").
  const char* budget_name = "TrainConfig::budget";
  EnvOptions env_options;
  // reinforcement learning (tmaze, your own env; any env with --algo ppo)
  double gamma = 0.9;
  double entropy = 0.01;
  double value_coef = 0.5;
  // "a2c": an update per segment from its n-step returns (the default);
  // "ppo": recurrent PPO (docs/agent.md): rollouts of `rollout` steps over the
  // B streams, GAE(lambda), `epochs` passes over `minibatches` minibatches of
  // whole streams, each minibatch's segments replayed from the state stored at
  // rollout time. On a supervised env PPO's reward is 1 for the target class.
  std::string algo = "a2c";
  int64_t rollout = 128;
  int64_t epochs = 10;
  int64_t minibatches = 4;
  double clip_range = 0.2;
  double gae_lambda = 0.95;
  // ppo: "linear" anneals Adam's lr from `lr` to 0 over the run (CleanRL's
  // default), "constant" keeps it (SB3's)
  std::string lr_schedule = "linear";
  // The B streams as env_shards envs of B / env_shards streams, seeded as the
  // ranks of a data-parallel run seed theirs: one process with env_shards N
  // and batch N B runs the streams of N ranks of batch B (docs/distributed.md).
  int64_t env_shards = 1;
  // --device cuda: run each training segment as a CUDA graph where the run
  // allows it (a supervised env whose spec is open_loop, --history tbptt:K
  // or detach, --algo a2c, one process; docs/agent.md, "CUDA graphs"); false
  // runs every segment eagerly. How the run executes, not what it computes:
  // not in the checkpoint.
  bool graph_replay = true;

  std::map<std::string, std::string> to_metadata() const;
  static TrainConfig from_metadata(const std::map<std::string, std::string>& m);
  // Throws with a one-line message naming the argument when impossible.
  void validate() const;
};

struct SegmentResult {
  int64_t steps = 0;        // env steps this segment ran
  double loss_sum = 0;      // sum of per-step losses
  int64_t loss_steps = 0;   // steps that had a loss
  int64_t steps_run = 0;    // exact: step evaluations (forward pass and replays)
  size_t segment_peak = 0;  // exact, ppo: the largest arena high-water of the window's (iteration's) segments
  size_t stored_bytes = 0;  // exact: the boundary states it keeps
  double return_sum = 0;    // RL: sum of the (undiscounted) returns of episodes that ended
  int64_t episodes = 0;     // RL: episodes that ended in this segment
  // ppo, means over the iteration's minibatch updates: E[(ratio - 1) - log ratio]
  // (the KL estimate SB3 and CleanRL log), and the fraction of terms whose
  // ratio left [1 - clip_range, 1 + clip_range]
  double approx_kl = 0, clip_fraction = 0;
};

// What a configuration will need, known before anything is allocated.
struct SizeEstimate {
  size_t parameter_bytes = 0;  // parameters, gradients and Adam's two moments (4 floats each)
  size_t step_bytes = 0;       // a lower bound of the arena bytes one step keeps (its input and forward outputs)
  size_t observation_bytes = 0;  // of which the step's observation (tokens, or B x obs_dim floats)
  size_t segment_bytes = 0;    // step_bytes x the steps a segment keeps (K; 1 for `full`, which grows)
  size_t budget = 0;           // the budget that applies (segment budget, or `full`'s growth limit)
  size_t rollout_bytes = 0;    // ppo: the rollout kept on the host (agent/ppo.h)
};

// The memory this process may take, to refuse a size that cannot fit before
// anything is allocated: the machine's physical memory, or less where the
// process's address-space or data limit (ulimit -v, -d) is lower. `what`,
// when given, says which ("this machine has", "ulimit -v allows"). 0: unknown.
size_t memory_limit(std::string* what = nullptr);

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

  // Runs one segment (K steps, fewer at the end), updates the parameters.
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
  SegmentResult run_segment();
  bool done() const { return step_ >= config_.steps; }
  // Data parallelism: this rank's stop request travels with the next update's
  // gradients, and every rank sees any rank's after it (stop_agreed), so all
  // stop at the same step. Without a communicator the request is agreed at once.
  void request_stop();
  bool stop_agreed() const;
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
  int64_t step() const { return step_; }

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
  // The budget this trainer's tape applies (TrainConfig::budget, or its default).
  size_t budget() const;

  // The carried GRU state [B, hidden] after the last step (zero rows for
  // streams whose episode just ended).
  const Tensor& state() const { return h_; }
  Tape& tape() { return *tape_; }
  Policy& policy() { return *policy_; }
  Env& env() { return *env_; }
  const TrainConfig& config() const { return config_; }
  // Whether this trainer runs its segments as CUDA graphs (TrainConfig::graph_replay
  // and the run allows it); TapeStats counts the captured and replayed ones.
  bool graph_segments() const { return graph_; }
  // Whether those segments run their recurrence as one gru_sequence (docs/agent.md).
  bool graph_sequence() const { return graph_sequence_; }
  // Whether PPO's update windows run their recurrence as one gru_sequence
  // (docs/agent.md, "Recurrent PPO"); false for other algorithms.
  bool ppo_sequence() const;

 private:
  Tensor observe_tensor();  // the env's observation now, on the tape (observation())
  // A step's observation on the tape from host rows: tokens [B] (token envs) or vectors [B, obs_dim].
  Tensor observation(std::span<const int64_t> tokens, std::span<const float> vectors);
  Tensor feature(const Tensor& e);  // history strategy: the [B, hidden] feature of this step
  void update(bool has_loss = true);
  void reset_finished_streams();
  SegmentResult segment_of_history();  // run_segment's work, by --algo and --history
  SegmentResult supervised_segment(Segment& seg, int64_t n);
  // graph_: the env's n steps taken ahead on a copy, the segment (a CUDA graph
  // where its steps repeat the graphs' pattern), then the env stepped with the
  // model's actions.
  SegmentResult graph_segment(int64_t n);
  SegmentResult actor_critic_segment(Segment& seg, int64_t n);
  SegmentResult exact_window(int64_t n);
  SegmentResult ppo_iteration(int64_t n);
  struct PpoBuffers;
  std::unique_ptr<PpoBuffers> make_ppo_buffers() const;
  void ppo_rollout(int64_t n, SegmentResult& r);
  void ppo_advantages(int64_t n);
  void ppo_minibatch(int64_t n, std::span<const int64_t> streams, SegmentResult& r);
  std::unique_ptr<replay::Driver> make_driver();
  // actor-critic
  void sample_actions(const Tensor& lp, std::span<int64_t> a);
  void note_rewards(SegmentResult& r);
  void returns_over(int64_t n, std::span<float> ret, float* returns) const;
  void bootstrap_value(const Tensor& h, std::span<float> out);
  void window_returns(const Tensor& final_state);
  Tensor actor_critic_loss(int64_t i, const Tensor& lp, const Tensor& v, const float* returns);
  // checkpoints: the entries of save() and load(); the GRU state's entry is `state`
  struct Checkpoint;
  void checkpoint_entries(Checkpoint& c, const Tensor& state) const;
  // This rank's streams (env state, sampling rng, carried state, episode
  // returns, window ring) as bytes, and back: what a data-parallel
  // checkpoint keeps of each rank besides rank 0.
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
  // Busy in run_segment or evaluate (run_segment, evaluate, save and load are
  // refused there, also from a signal handler evaluate's interrupt check runs
  // between segments).
  int busy_ = 0;

  dist::Communicator* comm_ = nullptr;
  std::unique_ptr<dist::GradientAverager> avg_;
  int64_t updates_ = 0;
  bool stop_requested_ = false, stop_agreed_ = false;
  std::function<bool()> interrupt_;

  TrainConfig config_;
  std::unique_ptr<Tape> tape_;
  nn::Rng init_rng_, act_rng_;
  std::unique_ptr<Env> env_;
  std::unique_ptr<Policy> policy_;
  std::unique_ptr<nn::Adam> optim_;
  int64_t step_ = 0;
  Tensor h_;                         // the GRU state [B, hidden]: carried between segments, or h_home_
  Tensor h_home_, eval_h_;           // persistent homes of the training state (evaluate, load) and of evaluate's
  std::vector<Tensor> window_;       // window mode: last N embeddings (persistent), ring
  int64_t window_pos_ = 0;
  std::optional<Segment> full_;      // history `full`: the one segment of the whole run
  std::unique_ptr<replay::Driver> exact_;  // history `exact`: windows of T steps (and a shorter last one)
  // per-step host buffers, sized once
  std::vector<int64_t> tokens_, targets_, actions_;
  std::vector<float> vectors_, rewards_, weights_;
  std::vector<uint8_t> done_;
  std::vector<Tensor> logp_, values_;  // actor-critic: per step of the segment
  std::vector<float> seg_rewards_;
  std::vector<uint8_t> seg_done_;
  std::vector<int64_t> seg_actions_;
  std::vector<float> returns_, window_keep_;
  std::vector<float> seg_returns_;              // actor-critic: each step's return [steps of the segment or window, B]
  int64_t exact_window_steps_ = 0;              // exact: steps of the window being run
  std::vector<float> reset_mask_;               // episode resets: the [B, hidden] mask (reset_finished)
  std::vector<float> host_rows_, host_values_;  // device -> host copies of [B, A] rows and [B] values
  std::vector<float> episode_return_;           // RL: each stream's return so far in its episode
  // graph_segment: the env copy stepped ahead; its observations, targets and
  // done flags [K, B] (vectors [K, B, obs_dim]), the keep factors of the
  // segment's gru_sequence and its encoded steps; each step's logits [B, A] and
  // loss in persistent tensors, read once the segment's graph has run; the
  // capturable clip's squared norm; the steps' pattern (which have targets,
  // which reset) the graphs hold (graph_key_) and the last segment's.
  bool graph_ = false;
  bool graph_sequence_ = false;  // graph_segment's recurrence as one gru_sequence (where it fuses)
  std::unique_ptr<Env> ahead_;
  std::vector<int64_t> ahead_tokens_, ahead_targets_;
  std::vector<float> ahead_vectors_;
  std::vector<uint8_t> ahead_done_;
  std::vector<float> ahead_keep_;      // [K, B]: 0 where the stream's episode ended the step before
  std::vector<Tensor> ahead_encoded_;  // a segment's encoded observations, [B, embed] each
  std::vector<Tensor> graph_logits_, graph_losses_;
  // in one gru_sequence: the head over all the segment's steps at once, its
  // logits [K B, A] (persistent) and their host copy
  Tensor graph_all_logits_;
  std::vector<float> host_all_;
  Tensor clip_sq_;
  uint64_t graph_key_ = 0, last_key_ = 0;
  bool committed_ = false;  // graph_segment: its update is done, a throw after it keeps it (run_segment)
  // PPO: the rollout [steps, B] (the observation, action, its log-probability
  // and value, reward, done, advantage, return), the state at each window's
  // start [windows, B, hidden], and a minibatch's gathered rows (agent/ppo.h)
  std::unique_ptr<PpoBuffers> ppo_;
};

// Throws, naming the flag, when `--device` names a device this build cannot
// use ("cuda" in a build without the CUDA backend, or anything but cpu/cuda).
void check_device_flag(const std::string& device);

// Resident set size of this process, bytes (from /proc/self/statm).
size_t resident_bytes();

// A size such as 64MiB, 512KiB, 2GiB or a byte count, > 0 (the CLI's --budget,
// Python's segment_budget). Throws Error naming `flag` and the text.
size_t parse_bytes(const std::string& s, const char* flag = "--budget");

}  // namespace segtape::agent
