// The agent loop on the device (issue 51, item 3; docs/agent.md "The device
// loop"), private to the agent library: device envs whose B streams live
// on a tape, and PPO's rollout run step after step with no host read —
// observations, the policy's step, sampled actions, the envs' steps,
// episode resets, rewards and GAE all where the tape lives. On a GPU each
// piece is a kernel on the tape's stream; on the CPU and the host-emulated
// device the same rules (rules.h) run as host loops, which is how CI runs
// the device loop's logic.
//
// Built: the device envs recall, tmaze and dialogue, their host twins (the
// envs "device-recall", "device-tmaze", "device-dialogue",
// task/device_twins.cpp), the rollout and GAE, and PPO's update terms
// (--device-loop on: agent/algo/ppo.cpp takes its rollouts here and runs its
// minibatches on the rollout's tensors where they are). Not yet: the
// update's segments as CUDA graphs.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rules.h"
#include "segtape/agent/env.h"
#include "segtape/agent/policy.h"
#include "segtape/tape.h"

namespace segtape::agent::device {

// Whether `name` is an env built for the device ("recall", "tmaze",
// "dialogue"), and whether it is a host twin's ("device-recall",
// "device-tmaze", "device-dialogue": the envs
// whose sampler draws as the device's, Step::sample, and whose runs may
// take their rollouts on the device, TrainConfig::device_loop).
bool device_env_built(const std::string& name);
bool is_twin(const std::string& env_name);
// dialogue's message table [messages, dim] (task/device_twins.cpp): fixed, as `dialogue`'s.
std::vector<float> dialogue_table(int64_t cities, int64_t dim);

// B streams of a device env on a tape: their state one persistent int64
// tensor [B, width], made from the seed as the host twin
// (make_env("device-" + name, B, seed, o)) makes its state.
class DeviceEnv {
 public:
  // Throws Error naming the env when it has no device form (device_env_built).
  DeviceEnv(Tape& tape, const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o);
  // The device form of a host twin (an env made as "device-recall" or
  // "device-tmaze" with options o), in the twin's state now.
  DeviceEnv(Tape& tape, const Env& twin, const EnvOptions& o);
  const EnvSpec& spec() const { return spec_; }
  int64_t batch() const { return B_; }
  // The streams' observations into obs (int64 [B]; a vector env's float
  // [B, obs_dim]) and, where buffer is defined, into its row *cursor
  // (int64 [T, B] or float [T, B, obs_dim]; cursor int64 [1]).
  void observe(const Tensor& obs, const Tensor& buffer, const Tensor& cursor) const;
  // actions (int64 [B]) applied: rewards and done flags (0 or 1) into row
  // *cursor of rewards and done (float [T, B]), 1 - done into keep (float
  // [B]), each stream's episode return into stats (float64 [B, 3]: the
  // return so far, the finished episodes' returns summed, their count).
  void step(const Tensor& actions, const Tensor& cursor, const Tensor& rewards, const Tensor& done, const Tensor& keep,
            const Tensor& stats) const;
  // The state [B, width] (its rows are the host twin's state_ints).
  const Tensor& state() const { return state_; }
  // Sets the state to rows [B x width] of a host twin's state_ints (its
  // save_state() after the rng's and score's 4), as the twin's load_state
  // checks them: throws Error, the state left as it was, where they are
  // not a state of this env.
  void load_rows(std::span<const int64_t> rows);
  // Score so far: the rows' numerators and denominators summed (reads the device).
  std::pair<int64_t, int64_t> score_counts() const;
  // The device's state into the twin it was made from (after a rollout),
  // the score it counted since the last sync added to the twin's: the twin
  // then continues where the device left off. Reads the device.
  void sync_to(Env& twin) const;

 private:
  enum class Kind : uint8_t { Recall, TMaze, Dialogue } kind_;
  int64_t B_, width_;
  EnvSpec spec_;
  std::array<int64_t, 5> ints_{};  // the rules' integers (device_loop.cpp's order)
  std::unique_ptr<Env> twin_;      // load_rows' checks
  Tensor state_, table_;           // table_: dialogue's messages [messages x dim] (a placeholder element for the others)
};

// PPO's rollout of T steps over a device env's B streams, in segments of K
// steps (no gradient), into [T, B] tensors on the tape; the actions drawn
// from each stream's own counter of rules::draw(seed, b, ...) (the host
// twin's sampler draws the same). run() reads nothing back to the host:
// every call of a rollout repeats the previous rollout's (CUDA-graph
// segments replay them).
class DeviceRollout {
 public:
  // W > 0: the state entering every W-th step is stored (starts, PPO's
  // windows); segments end every K steps and where a window starts.
  DeviceRollout(Tape& tape, const Policy& policy, DeviceEnv& env, int64_t T, int64_t K, uint64_t sample_seed, int64_t W = 0,
                int64_t state_rows = 1);
  // T steps from the state in h_home (persistent [state_rows B, hidden]),
  // which holds the state after them; then the value after the last step
  // into bootstrap.
  void run(const Tensor& h_home);
  // Where each stream's draws and episode returns stand before a run: the
  // sampler's counters all `step` (a stream draws once a step: draw k is
  // the run's step k, as the host Step::sample draws for a twin env), the
  // returns so far `returns` [B], the finished ones' sums and counts zero.
  void start_at(int64_t step, std::span<const float> returns);
  // GAE(lambda) over the rollout into advantages and returns.
  void advantages(double gamma, double lambda);

  int64_t T, K, B, A, D;  // D: a vector env's obs_dim (0: tokens)
  // What the streams saw and did: tokens (or a vector env's vectors [T, B, D]), actions (int64), log-probabilities
  // of the actions, values, rewards, done flags (0 or 1), advantages and
  // returns (float), all [T, B]; the value after the rollout [B]; each
  // stream's episode returns (float64 [B, 3], DeviceEnv::step); the
  // sampler's counters [B] and the row now written [1] (int64).
  Tensor tokens, vectors, actions, logp, values, rewards, done, advantages_, returns, bootstrap, stats, counters, cursor;
  // The largest arena high-water of the last run()'s K-step segments (the tape's bookkeeping: no device read).
  size_t segment_peak = 0;
  // The stored states (W > 0): [T / W (rounded up), state_rows B, hidden].
  Tensor starts;
  int64_t W;
  // Whether the K-step segments are graph_segment()s (CUDA graphs under
  // TapeOptions::graph_replay): where they all have the same steps.
  bool graphs = false;

 private:
  int64_t segment_end(int64_t t0) const;
  Tape& tape_;
  const Policy& policy_;
  DeviceEnv& env_;
  uint64_t seed_;
  Tensor keep_;  // [B]: the step's 1 - done
  std::vector<int64_t> counters_host_;
  std::vector<double> stats_host_;
};

// ---- PPO's update on the device (agent/algo/ppo.cpp, --device-loop on):
// a minibatch's rows of a rollout's [T, B] tensors, as device calls, so
// that its steps read nothing back to the host. Each throws ShapeError
// naming the call where the shapes do not fit, before it runs.

// An update window: the minibatch's streams mb (int64 [Bm]) and the
// window's first step, where the tensors live (row, int64 [1]) and on the
// host (first). The calls take a step t as row + (t - first), so that every
// window issues the same calls (its segment may be a CUDA graph).
struct UpdateWindow {
  Tensor mb, row;
  int64_t first = 0;
  void at(int64_t t);  // the window starts at step t (row's value copied to the device)
};

// Row t of a rollout buffer (tokens int64 [T, B] or vectors [T, B, D]) at
// the minibatch's streams into out ([Bm] or [Bm, D]).
void gather_rows(const Tensor& buffer, const UpdateWindow& w, int64_t t, const Tensor& out);
// The episode resets from the rollout's done flags [T, B]: a step's (the
// state [R Bm, H] leaving step t times out, 0 for a stream whose episode
// ended there) or, window, a window's keep [len, Bm] from step t (the
// state entering its step i > 0, after step t + i - 1), as
// reset_finished's masks and PPO's host keep.
void reset_factors(const Tensor& done, const UpdateWindow& w, int64_t t, const Tensor& out, bool window);
// The minibatch's rows of the state stored for the window's first step
// (stored every W steps: starts [S, R B, H]) into out [R Bm, H].
void gather_state(const Tensor& starts, const UpdateWindow& w, int64_t W, const Tensor& out);
// The minibatch's advantages over n steps: norm (float64 [5]) = {mean,
// standard deviation, 1 / count, normalised} (rules::advantage_stats), then
// the iteration's clip range. gathered (float [n Bm]): the minibatch's
// advantages in order, which the one thread of the sums then reads.
void advantage_stats(const Tensor& advantages, const Tensor& mb, int64_t n, double clip_range, const Tensor& gathered, const Tensor& norm);
// The loss terms of the steps [t0, t0 + len) (lp [len Bm, A] and v [len Bm,
// 1] now, len Bm rows, each step's Bm): the surrogate's weights [len Bm, A]
// and the value targets [len Bm, 1] (constants of the loss), and each
// step's figures into its row of stats (float64 [T, 3]: the reported loss,
// the KL estimate, the clip fraction), through parts (float64, at least
// len Bm (4 + A)): rules::ppo_row and ppo_add_row, as PPO's host update.
void ppo_terms(const DeviceRollout& r, const UpdateWindow& w, const Tensor& norm, int64_t t0, const Tensor& lp, const Tensor& v,
               const rules::PpoConstants& k, const Tensor& weights, const Tensor& target, const Tensor& parts, const Tensor& stats);
// Steps [0, n)'s figures added to totals' first three (float64), step by step.
void ppo_totals(const Tensor& stats, int64_t n, const Tensor& totals);
// An update's squared gradient norm (sq, float64 [1]: Context::clip_sq)
// copied to into[at] (float64), where the iteration's are read at once.
void keep_square(const Tensor& sq, const Tensor& into, int64_t at);

}  // namespace segtape::agent::device
