// What the segtape command's files share: each command's arguments and its
// entry point (cli/train.cpp, cli/eval.cpp, cli/retention.cpp; main.cpp
// defines the options and wires them), the evaluation's wording, and how an
// error is reported.
//
// The command line's code lives in namespace segtape_cli, outside segtape::
// on purpose: the program exports segtape::* to the env plug-ins it loads
// (agent/CMakeLists.txt), and these functions are not theirs to call.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "segtape/agent/retention.h"
#include "segtape/agent/sample.h"
#include "segtape/agent/trainer.h"

#ifndef SEGTAPE_VERSION
#define SEGTAPE_VERSION "unknown"
#endif

namespace segtape::dist {
class Communicator;
}

namespace segtape_cli {

// Whether an option was on the command line (CLI11's count, for the commands' files).
using Given = std::function<bool(const std::string& option)>;

// ---- segtape train (cli/train.cpp)
struct TrainArgs {
  segtape::agent::TrainConfig c;
  std::string history = "tbptt:32", budget, out, resume, log_dir;
  std::string graphs = "auto";  // --cuda-graphs (TrainConfig::graph_replay; not in the checkpoint)
  std::string device_loop = "off";  // --device-loop (TrainConfig::device_loop; not in the checkpoint)
  std::string task;             // --task lm: --env lm --algo lm
  std::vector<std::string> env_plugins;  // loaded before parsing (plugin_args); here for CLI11
  int64_t log_every = 0, checkpoint_every = 0, eval_steps = 500;
  double dist_timeout = 300;
  bool force = false;
};
int train(TrainArgs& a, const Given& given);

// What the command line needs to know of a run's algorithm and history, asked
// in this one place.
struct RunKind {
  bool ppo = false;   // --algo ppo: its flags
  bool full = false;  // a growing history (--history full): one segment, stopped by its budget; a checkpoint only at its end
  const char* algo = "";  // --algo's name: the prefix of its own figures (TensorBoard's ppo/approx_kl)
  static RunKind of(const segtape::agent::TrainConfig& c) {
    return {c.algo == segtape::agent::Algo::Ppo, c.history.grows(), segtape::agent::algo_name(c.algo)};
  }
};

// ---- segtape eval (cli/eval.cpp)
struct EvalArgs {
  std::string checkpoint;
  int64_t steps = 1000;
  uint64_t seed = 12345;
  std::string device;                    // "": the device the checkpoint was trained on
  std::vector<std::string> env_plugins;  // loaded before parsing (plugin_args)
};
// steps_given: --steps was on the command line (else recall evaluates at least 2 x --lag steps).
int eval(const EvalArgs& a, bool steps_given);

// ---- segtape sample (cli/sample.cpp)
struct SampleArgs {
  std::string checkpoint;
  segtape::agent::SampleOptions o;
};
int sample(const SampleArgs& a);

// What the banner, the summary and eval say of the env's settings beside its
// name: recall's lag, vocabulary and sparse, a non-zero update-gate bias
// ("" when none applies).
std::string env_settings(const segtape::agent::TrainConfig& c);
// The steps an evaluation runs (`flag`: --eval-steps or eval's --steps; `given`:
// it was on the command line). recall asks its first question at step --lag,
// dense and sparse alike: without the flag it runs at least 2 x --lag steps,
// and a count of no more than --lag, which would score nothing, is refused
// before any work.
int64_t eval_steps_for(const segtape::agent::TrainConfig& c, int64_t steps, bool given, const char* flag);
// An evaluation's score as printed: "87.50%", or "nothing scored" for Trainer::evaluate's NaN.
std::string score_text(double score);
// A checkpoint whose parameters hold NaN or inf (a run that diverged, or a
// hand edit) still loads (a diverged run stays resumable), with a warning:
// what it then scores is meaningless.
void warn_non_finite(segtape::agent::Trainer& tr, const std::string& file);

// ---- segtape retention (cli/retention.cpp; agent/retention.h, docs/retention.md)
struct RetentionArgs {
  segtape::agent::retention::LabConfig c;
  std::string budget = "1MiB", out, cases, dot;
  bool explain = false, no_libtorch = false, anomaly_only = false, force = false;
};
int retention_lab(RetentionArgs& a);

// ---- errors (cli/errors.cpp)
// Data parallel (mpirun -np N segtape train): the job's communicator, once
// train has one of several ranks (nullptr before and without).
void set_job_communicator(segtape::dist::Communicator* comm);
segtape::dist::Communicator* job_communicator();
// An error is one line on stderr: a checkpoint's list of problems
// ("<file>: cannot load ...: 2 problems (nothing was loaded):\n  a\n  b")
// becomes "...: 2 problems (nothing was loaded): a; b".
std::string one_line(std::string m);
// "segtape: error", with "(rank R of N)" for a rank mpirun started when MPI
// is not running yet (a flag that does not parse, a plug-in that does not
// load, a check before the communicator): that rank alone exits 2, mpirun
// ends the job, and the line says which rank's command line it was (from
// Open MPI's or PMI's environment). Once MPI runs, rank_error says it.
std::string error_head();
// An error on a rank of a data-parallel job: one every rank raised alike
// (dist::CollectiveError) is printed by rank 0 and ends each rank normally;
// any other error on one rank of several ends the whole job (MPI_Abort), so
// that no rank is left waiting for it. Returns the exit status, 2.
int rank_error(const std::exception& e);
// A command's error, reported: rank_error under a job's communicator, else
// one line after error_head(). Returns the exit status, 2.
int report_error(const std::exception& e);

}  // namespace segtape_cli
