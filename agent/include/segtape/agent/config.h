// A training run's configuration: what --history, --algo and the other
// flags of `segtape train` say, validated, and as checkpoint metadata.
//
// The histories and the algorithms are listed once each, below; each has one
// file (agent/history/, agent/algo/) that registers itself by its line here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "segtape/agent/env.h"

namespace segtape::agent {

// How a segment's steps are run and cut (--history), one file each in
// agent/history/: X(Kind, name), a line each.
#define SEGTAPE_HISTORIES(X)            \
  X(Tbptt, "tbptt")                     \
  X(Full, "full")                       \
  X(Window, "window")                   \
  X(NoGradHistory, "nograd-history")    \
  X(Exact, "exact")                     \
  X(Overlap, "overlap")                 \
  /* (the list ends here) */

// What is learned from the steps (--algo), one file each in agent/algo/:
// X(Kind, name), a line each.
#define SEGTAPE_ALGORITHMS(X)           \
  X(Supervised, "supervised")           \
  X(A2c, "a2c")                         \
  X(Ppo, "ppo")                         \
  X(Lm, "lm")                           \
  X(Series, "series")                   \
  /* (the list ends here) */

// --history, parsed: which history and its numbers. The text each history
// takes ("tbptt:K", "exact:K/T", ...) is its file's (agent/history/).
struct History {
#define SEGTAPE_KIND(K, N) K,
  enum class Kind : uint8_t { SEGTAPE_HISTORIES(SEGTAPE_KIND) };
#undef SEGTAPE_KIND
  Kind kind = Kind::Tbptt;
  int64_t k = 32;       // steps per segment (per update for full); detach is tbptt:1
  int64_t window = 0;   // window:N
  int64_t horizon = 0;  // exact:K/T: steps per window (the gradient's reach); default 8 K
  int64_t stride = 0;   // steps between updates where they differ from the window's (overlapping windows)
  // "tbptt:K", "detach", "full", "window:N", "nograd-history", "exact:K" or
  // "exact:K/T", ...: an Error naming --history and the choices otherwise.
  static History parse(const std::string& s);
  std::string str() const;
  // Steps one update runs: K, exact's T, or the stride of overlapping windows.
  int64_t span() const { return stride > 0 ? stride : horizon > 0 ? horizon : k; }
  // Steps between the states PPO's rollout stores for its replays: an
  // update's, or K where windows overlap (a window may start at any segment).
  int64_t stored_every() const { return stride > 0 ? k : span(); }
  // The histories' forms, for the messages that list them ("tbptt:K, detach, ..."):
  // every one, or those `which` says yes to (by their HistoryDef: agent/history/history.h).
  static std::string choices();
  // Every history's forms and what they do (segtape train --help).
  static std::string help();
  // Whether the history keeps its whole run in one growing segment (full:
  // the teaching policy; CPU only, no checkpoint mid-run).
  bool grows() const;
};

enum class Algo : uint8_t {
#define SEGTAPE_KIND(K, N) K,
  SEGTAPE_ALGORITHMS(SEGTAPE_KIND)
#undef SEGTAPE_KIND
};
// "a2c", "ppo": the names --algo takes; parse throws an Error naming --algo and the choices.
Algo parse_algo(const std::string& s);
const char* algo_name(Algo a);
// What each algorithm --algo takes does (segtape train --help).
std::string algo_help();

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
  // a2c / ppo: the value head reads the policy's GRU or LSTM ("shared") or a
  // cell of its own of the same kind over the same embeddings ("separate",
  // sb3-contrib's default: the value loss's gradient then never reaches the
  // policy's core; PolicyShape::separate_critic). Kept in checkpoints only
  // where separate.
  std::string critic = "shared";
  // > 0: a hidden layer of this many units with ReLU before the action head
  // ("pi") and another before the value head ("vf"): SB3's net_arch
  // dict(pi=[N], vf=[N]) (PolicyShape::head_hidden). 0: the heads read the
  // recurrent state directly. Kept in checkpoints only where > 0.
  int64_t head_hidden = 0;
  // SB3's ortho_init (PolicyShape::ortho_init): the linear layers outside
  // the recurrent core drawn orthogonal, their biases 0; not --task lm's.
  // Kept in checkpoints only where on.
  bool ortho_init = false;
  // How vector observations reach the recurrent cell: "linear" (Linear(obs,
  // embed) + tanh, the default) or "none" (as they are: SB3's recurrent
  // policies read the flattened observation; --embed is then unused; RL with
  // a recurrent history only). Kept in checkpoints only where "none".
  std::string encoder = "linear";
  // The model of --algo lm (PolicyShape's): the recurrent cell ("gru" or
  // "lstm"), its layers, the dropout of word_language_model (on the
  // embeddings, between the layers, on the last layer's output; 0: none), the
  // output layer tied to the embeddings (--hidden = --embed), and the
  // optimizer ("adam", "adamw" or "sgd"; sgd divides the learning rate by 4
  // each epoch whose validation loss does not improve, as the example does).
  // Other algorithms: a one-layer GRU, Adam.
  std::string cell = "gru";
  int64_t layers = 1;
  double dropout = 0;
  bool tied = false;
  std::string optim = "adam";
  double lr = 3e-3;
  // Adam's and AdamW's eps (PyTorch's 1e-8; SB3's and CleanRL's PPO use
  // 1e-5). Kept in checkpoints only where it differs from 1e-8.
  double adam_eps = 1e-8;
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
  // a2c: an update per segment from its n-step returns (the default; on a
  // supervised env, cross-entropy on its targets: supervised);
  // ppo: recurrent PPO (docs/agent.md): rollouts of `rollout` steps over the
  // B streams, GAE(lambda), `epochs` passes over `minibatches` minibatches of
  // whole streams, each minibatch's segments replayed from the state stored at
  // rollout time. On a supervised env PPO's reward is 1 for the target class.
  Algo algo = Algo::A2c;
  int64_t rollout = 128;
  int64_t epochs = 10;
  int64_t minibatches = 4;
  double clip_range = 0.2;
  double gae_lambda = 0.95;
  // ppo: "linear" anneals Adam's lr from `lr` to 0 over the run (CleanRL's
  // default), "constant" keeps it (SB3's)
  std::string lr_schedule = "linear";
  // ppo: "linear" anneals the clip range from `clip_range` to 0 over the run
  // as SB3's lin_ schedules do (RL Zoo's tuned recurrent entries); "constant"
  // keeps it (CleanRL's, and every run before the flag)
  std::string clip_schedule = "constant";
  // ppo: > 0 clips the value's move from its rollout value as PPO2 and
  // CleanRL do: the value loss is the larger of (v - R)^2 and
  // (v_old + clamp(v - v_old, -value_clip, value_clip) - R)^2, so an update
  // that pulls v further than value_clip from v_old gets no value gradient
  // from it; 0 (the default, SB3's) leaves the value loss unclipped
  double value_clip = 0;
  // The B streams as env_shards envs of B / env_shards streams, seeded as the
  // ranks of a data-parallel run seed theirs: one process with env_shards N
  // and batch N B runs the streams of N ranks of batch B (docs/distributed.md).
  int64_t env_shards = 1;
  // --precision: f32, or bf16 (TapeOptions::precision, docs/precision.md):
  // every matrix product on bfloat16 operands, accumulated in float32 and
  // rounded to bfloat16; the recurrent state, the losses, the gradients'
  // sums and the optimizer's master weights float32. What the run computes:
  // in the checkpoint (written when not f32), fixed on --resume. The CPU
  // (and the host-emulated device) only, for now.
  std::string precision = "f32";
  // --device cuda: run each training segment as a CUDA graph where the run
  // allows it (a supervised env whose spec is open_loop, --history tbptt:K
  // or detach, one process; docs/agent.md, "CUDA graphs"); false
  // runs every segment eagerly. How the run executes, not what it computes:
  // not in the checkpoint.
  bool graph_replay = true;
  // --algo ppo on a device env's host twin (--env device-recall or
  // device-tmaze): each rollout runs on the tape's device (agent/device/,
  // docs/device-loop.md): the env's streams, the sampled actions, the
  // resets, the rewards and GAE there, nothing read back until the rollout
  // has ended; the update as without it. The same run as the host loop's
  // (the twin's draws are the device's): how it executes, not what it
  // computes, so not in the checkpoint. A rollout shorter than --rollout
  // (the run's last) takes the host loop.
  bool device_loop = false;
  // An update whose gradient is not finite (its norm, computed for the clip,
  // is inf or NaN: a loss that overflowed, returns of huge rewards): "stop"
  // ends the run with an error naming the update, its steps and the first
  // parameter whose gradient is not finite, nothing updated (a run's last
  // checkpoint stays as it was); "skip" leaves the parameters and the
  // optimizer's state as they were, counts the update skipped (as PyTorch's
  // GradScaler skips such a step) and stops with that error after
  // max_skips skipped in a row. How the run meets an error, not what it
  // computes: not in the checkpoint (its count of skipped updates is).
  std::string nonfinite = "stop";
  int64_t max_skips = 10;
  // The memory check made before anything is allocated (Trainer::estimate
  // against the memory the process may reach and its ulimits; ranks on one
  // machine counted together): false runs without it, for a machine whose
  // free memory the check cannot see (swap, a reclaimable cache it does not
  // count). The budget's checks of a segment stay. How the run meets an
  // error: not in the checkpoint.
  bool size_check = true;
  // The recurrence of steps known before they run (a CUDA-graph segment's, a
  // PPO update window's) as one gru_sequence even where it does not fuse (a
  // test seam: the emulated device never fuses). How the run executes: not in
  // the checkpoint.
  bool force_sequence = false;
  // --task lm: each step's head on its own under every history (a test seam:
  // tbptt's chunk head, agent/algo/lm.cpp, against it). How the run
  // executes: not in the checkpoint.
  bool head_each_step = false;

  // The recurrent state's rows per stream: one per layer, two for an LSTM's
  // (its h and its c). The state is [state_rows() x B, hidden]: layer by
  // layer, an LSTM layer's h rows then its c rows ([B, hidden] for the
  // agent's one-layer GRU); a separate critic's rows after the policy's.
  int64_t state_rows() const { return (cell == "lstm" ? 2 : 1) * (layers + (critic == "separate" ? 1 : 0)); }
  // The algorithm that learns on an env of this spec: a2c on a supervised env is Supervised.
  Algo learner(const EnvSpec& spec) const;
  std::map<std::string, std::string> to_metadata() const;
  static TrainConfig from_metadata(const std::map<std::string, std::string>& m);
  // Throws with a one-line message naming the argument when impossible.
  void validate() const;
};

// Throws, naming the flag, when `--device` names a device this build cannot
// use ("cuda" in a build without the CUDA backend, or anything but cpu/cuda).
void check_device_flag(const std::string& device);

// A size such as 64MiB, 512KiB, 2GiB or a byte count, > 0 (the CLI's --budget,
// Python's segment_budget). Throws Error naming `flag` and the text.
size_t parse_bytes(const std::string& s, const char* flag = "--budget");

}  // namespace segtape::agent
