// segtape train, resolved before it trains: the run's configuration from the
// command line or from the checkpoint it resumes, checked on every rank of a
// data-parallel job alike (cli/train_plan.cpp), for the loop in cli/train.cpp.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli.h"
#include "metrics_csv.h"

namespace segtape_cli {

struct Plan {
  segtape::agent::TrainConfig c;
  fs::path out;
  bool resume = false;
  // Started by mpirun: one rank of a data-parallel run (docs/distributed.md),
  // whose job has several ranks (nullptr: one process). Rank 0 alone reads
  // and writes files and prints (root); every rank trains.
  segtape::dist::Communicator* comm = nullptr;
  bool root = true;
  std::string plugin;        // the file of the --env-plugin that defines c.env ("" for a built-in env)
  bool header_only = false;  // a new run in a folder whose metrics.csv holds a header alone (lock_run_dir)
  // --log-every, --checkpoint-every and --eval-steps as the run was given them
  // (checkpoint metadata run.flags.*): a resumed run keeps its cadence unless
  // the flag is given again.
  std::map<std::string, std::string> stored_flags;
  std::map<std::string, std::string> ck_meta;  // rank 0: the resumed checkpoint's metadata
  std::vector<Row> rows;       // rank 0: metrics.csv of a resumed run
  std::string resumed_header;  // and its line 1
  bool eval_given = false;     // --eval-steps given, now or by the run's first command line
};

// Everything before the Trainer is made: the flags' checks, --resume's
// checkpoint read (rank 0) and shared with every rank, the run's stored
// flags applied to `a`, and the configuration validated.
Plan plan_run(TrainArgs& a, const Given& given);

// The run's own checkpoint metadata besides the Trainer's: its env's plug-in
// and the cadence flags it was given (read back by plan_run on --resume).
std::map<std::string, std::string> run_metadata(const Plan& p, const TrainArgs& a);

}  // namespace segtape_cli
