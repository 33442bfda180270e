// Environments that need memory. Batched: B independent episode streams,
// seeded and deterministic; an episode that ends restarts by itself.
//
// Each step an env shows one observation per stream — a token (recall,
// tmaze) or a frozen embedding vector (dialogue) — and then takes one action
// per stream. Supervised envs also give a target class per stream (or
// kNoTarget); reinforcement-learning envs give rewards.
//
// Your own env: derive from Env, keep the contract below, and register a
// factory under a name (register_env); make_env, env_names() and
// `segtape train --env` then know it. A shared library that defines
// `extern "C" void segtape_register_envs()` is an env plug-in, loaded by
// load_env_plugin (`segtape train --env-plugin lib.so`). docs/agent.md,
// "Your own environment", and examples/custom_env/ show the whole route.
//
// The Env contract, checked by make_env's envs on every call (a violation
// throws EnvContractError naming the env and the step):
//   spec()     vocab > 0 (token observations) or obs_dim > 0 (vectors), not
//              both; num_actions >= 1; measure not empty, without a comma,
//              quote or line break (a metrics.csv column); the same for the
//              env's whole life. batch() is the B it was made with. With
//              open_loop, the observations, targets and done flags must not
//              depend on the actions.
//   observe()  fills tokens[0, B) with values in [0, vocab) (token envs) or
//              vectors[0, B * obs_dim) with finite values, row b = stream b
//              (vector envs); writes nothing else, changes nothing.
//   targets()  fills y[0, B) with a class in [0, num_actions) or kNoTarget.
//   target_values()  (regression envs, e.g. series) fills y[0, B) with
//              finite real targets; an env without them leaves it alone
//              (the base throws).
//   step()     gets actions in [0, num_actions); fills reward[0, B) with
//              finite values and done[0, B) with 0 or 1 (1: the stream's
//              episode ended with this step; the env restarts it by itself,
//              and the trainer resets that stream's recurrent state).
//   truncations()  (optional; after step()) truncated[0, B) 0 or 1, 1 only
//              where that step's done is 1; for each truncated stream its
//              row of tokens / vectors written, as observe() writes one.
//   state      deterministic given the seed: everything that decides future
//              observations lives in rng_ and state_ints(), so save_state /
//              load_state continue bit-identically; valid_state() refuses
//              saved integers this env cannot be in.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "segtape/error.h"
#include "segtape/nn/random.h"

namespace segtape::agent {

inline constexpr int64_t kNoTarget = -100;  // matches cross_entropy's ignore index

// An env broke the contract above (an observation out of range, a reward that
// is not finite, done not 0 or 1, ...). The message names the env and the step.
struct EnvContractError : Error {
  using Error::Error;
};

struct EnvSpec {
  std::string name;
  int64_t vocab = 0;        // token observations: number of distinct tokens (0 if vector obs)
  int64_t obs_dim = 0;      // vector observations: dimension (0 if token obs)
  int64_t num_actions = 0;  // classes (supervised) or actions (RL)
  bool supervised = true;
  std::string measure;      // what score() means, e.g. "accuracy" or "success"
  // Open loop: the observations, targets and done flags do not depend on the
  // actions (the actions are only scored), so the env's next K steps can be
  // taken ahead of the model, from a copy of its state. A supervised env that
  // says so lets the trainer run each segment as a CUDA graph on a GPU
  // (docs/agent.md, "CUDA graphs"). The trainer checks it: the real env,
  // stepped with the model's actions afterwards, must show what the copy showed.
  bool open_loop = false;
};

struct EnvOptions {
  int64_t lag = 8;        // recall: target at t is the token shown at t - lag
  int64_t vocab = 4;      // recall: tokens
  int64_t corridor = 10;  // tmaze: corridor length N
  int64_t turns = 10;     // dialogue: turns per conversation
  int64_t cities = 4;     // dialogue: cities a user can name
  int64_t embed_dim = 32; // dialogue: message embedding size
  bool sparse = false;    // recall: a token only every lag steps (a blank, token `vocab`, between), targets only there
  // lm (a text corpus, agent/task/lm.cpp): the training text, the validation
  // and test texts ("": the last `split` of the training text's tokens is the
  // validation part, and there is no test part), how text is cut into tokens
  // ("bytes", "chars": UTF-8 code points, "words"), and the part an env reads.
  std::string data, valid, test;
  std::string tokens = "chars";
  double split = 0.1;
  // series (a CSV file's columns, agent/task/series.cpp; data, valid, test
  // and split as lm's): the column to predict the next value of, and the
  // columns observed, comma-separated ("": the target alone).
  std::string target, features;
  enum class Part : uint8_t { Train, Valid, Test } part = Part::Train;
  // The env's streams are share `shard` of `shards` equal shares (a
  // data-parallel run's ranks, or --env-shards): lm batchifies its text
  // into shards x B streams and reads its own B of them; the other envs
  // take a seed of their own instead. Not in the checkpoint (the trainer's).
  int64_t shard = 0, shards = 1;
};

class Env {
 public:
  Env(int64_t batch, uint64_t seed) : batch_(batch), rng_(seed) {}
  virtual ~Env() = default;
  virtual const EnvSpec& spec() const = 0;
  int64_t batch() const { return batch_; }

  // The current observation: tokens [B] (token envs) or vectors [B, obs_dim].
  virtual void observe(std::span<int64_t> tokens, std::span<float> vectors) const = 0;
  // Supervised: the target class of the current step per stream, or kNoTarget.
  virtual void targets(std::span<int64_t> y) const;
  // Regression: the real target of the current step per stream (the series
  // task's next value). A second channel beside targets() rather than a
  // change of it: every classification env, plug-in and wrapper keeps its
  // integer targets as they are, and only an algorithm that regresses (the
  // series algorithm) calls this. The base throws an Error naming the env.
  virtual void target_values(std::span<float> y) const;
  // Applies one action per stream and moves to the next step. Fills the reward
  // and whether the stream's episode ended (it restarts by itself).
  virtual void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) = 0;
  // After step(): of the streams it ended (done), those whose episode was
  // cut by a limit (a time limit) rather than ended by the task —
  // Gymnasium's `truncated` — into truncated[0, B) (0 or 1), and for each of
  // them the observation it was cut at (the episode's last, before the
  // stream restarted: observe() shows the next episode's first) into its
  // row of tokens [B] or vectors [B, obs_dim]; other rows are left as they
  // are. Returns whether any stream was truncated. A truncated episode's
  // last reward is bootstrapped from the value of that observation (A2C's
  // returns, PPO's advantages); a terminated one's is not. The base: none
  // truncated (every ended episode terminated, as for every env written
  // before this call existed).
  virtual bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float> vectors) const;

  // Score since the last reset_score(): accuracy on targets (supervised) or
  // the fraction of finished episodes that succeeded (RL). An env counts into
  // score_num_ / score_den_; these read them (virtual so that make_env's
  // checking wrapper can hand them through to the env it wraps).
  virtual double score() const { return score_den_ ? double(score_num_) / double(score_den_) : 0.0; }
  virtual void reset_score() { score_num_ = score_den_ = 0; }
  // What score() divides: {numerator, denominator} (an env made of several,
  // make_env_shards', adds these up: an env that overrides score() overrides
  // this too).
  virtual std::pair<int64_t, int64_t> score_counts() const { return {score_num_, score_den_}; }

  // Everything needed to continue bit-identically (for checkpoints).
  virtual std::vector<int64_t> save_state() const;
  virtual void load_state(std::span<const int64_t> s);
  // The number of state_ints() now: it must stay the one the env was made
  // with (a checkpoint saves them and a fresh env of the same configuration
  // reads them back); make_env's wrapper refuses a step that changes it.
  size_t state_size() const { return const_cast<Env*>(this)->state_ints().size(); }

 protected:
  int64_t draw(int64_t n) { return int64_t(rng_.next_u64() % uint64_t(n)); }
  // Per-stream integers that make up the env's state (besides the rng).
  virtual std::vector<int64_t>& state_ints() = 0;
  // Whether saved per-stream integers are a state this env can be in
  // (counters >= 0, indices in range): load_state refuses anything else, so a
  // damaged checkpoint never becomes an out-of-range index.
  virtual bool valid_state(std::span<const int64_t> ints) const = 0;

  int64_t batch_;
  nn::Rng rng_;
  int64_t score_num_ = 0, score_den_ = 0;
};

// ---- The registry: every env make_env can build, by name.

// Makes an env of B streams from a seed and the options (EnvOptions: an env
// of your own may read any field it has a use for, e.g. lag as a length).
using EnvFactory = std::function<std::unique_ptr<Env>(int64_t batch, uint64_t seed, const EnvOptions& options)>;

// Adds an env for make_env, env_names() and `segtape train --env`. Throws
// Error for an empty name, a name with other characters than letters,
// digits, '-', '_' and '.', a name already registered (the built-ins
// "recall", "tmaze" and "dialogue" are), or an empty factory. The registry
// is synchronised: any thread may register while others make envs.
void register_env(const std::string& name, EnvFactory factory);

// The env registered under `name`, wrapped in the contract checks (the
// returned env forwards every call and refuses a broken contract with
// EnvContractError). An unknown name throws Error listing the registered ones.
std::unique_ptr<Env> make_env(const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o);
// The B streams as seeds.size() envs of B / seeds.size() streams each, env i
// seeded seeds[i] (streams [i B/n, (i+1) B/n)), behind one Env: what one
// process runs to reproduce the streams of n data-parallel ranks
// (TrainConfig::env_shards). One seed: make_env itself. Throws Error when B
// is not a multiple of the number of seeds.
std::unique_ptr<Env> make_env_shards(const std::string& name, int64_t batch, std::span<const uint64_t> seeds, const EnvOptions& o);
// Registered names, in registration order: the built-ins first (a copy).
std::vector<std::string> env_names();
// Whether an env is registered under `name`.
bool env_registered(const std::string& name);

// ---- Plug-ins: envs from a shared library.
//
// A plug-in is a shared library (CMake: add_library(x MODULE ...) linked to
// segtape::plugin) that defines
//     extern "C" void segtape_register_envs();
// which calls register_env for each of its envs. It does not link segtape's
// libraries: it uses the ones of the program that loads it, which exports
// them (the segtape program does; a program of your own links with
// ENABLE_EXPORTS, i.e. -rdynamic). It must be built with the compiler and
// the segtape headers of that program.
//
// load_env_plugin opens `file` (dlopen), calls its segtape_register_envs()
// and returns the names it registered. Loading the same file again returns
// the same names and registers nothing. Throws Error, message starting with
// the file's name: no such file; not loadable (dlerror's reason: not a
// shared library, an undefined symbol); not a plug-in (no
// segtape_register_envs); registration failed (a name taken); registered
// nothing.
std::vector<std::string> load_env_plugin(const std::filesystem::path& file);

}  // namespace segtape::agent
