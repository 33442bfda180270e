// What a configuration needs before anything is allocated, and the tape it
// runs on (private to the agent library; Trainer::estimate is the public face).
#pragma once
#include <cstddef>
#include <string>

#include "segtape/agent/policy.h"
#include "segtape/agent/trainer.h"

namespace segtape::agent {

// The budget a configuration's tape applies: --budget, or its default (64 MiB;
// a growing history's growth limit: 1 GiB).
size_t applied_budget(const TrainConfig& c);
// The tape's options for a configuration (a growing history's arena grows).
TapeOptions tape_options(const TrainConfig& c);
PolicyShape policy_shape(const TrainConfig& c, const EnvSpec& spec);
// ranks: the data-parallel run's (its averager's buffers count where it has more than one).
SizeEstimate estimate_sizes(const TrainConfig& c, const EnvSpec& spec, int ranks = 1);
// The other ranks of a data-parallel run on this process's machine (one
// kernel, one memory) and the memory they will take beyond what they hold
// now (resident_total less process_bytes, each).
struct MachineShare {
  int ranks = 0;
  size_t bytes = 0;
};
// This machine's identity among a run's ranks: its kernel's boot id (one per
// kernel, so containers on one host share it), else its host name.
std::string machine_id();
// Refuses (BudgetError, Error) a configuration that cannot fit its budget or
// this machine's memory (with `others` beside it), with the numbers;
// c.size_check false leaves the machine's memory and the ulimits unchecked.
void check_sizes(const TrainConfig& c, const SizeEstimate& e, const MachineShare& others = {});
// The host inputs one graph segment stages (tape.from: observations,
// targets, reset masks; a sequence's keep [K, B]), at most: TapeOptions::graph_staging.
size_t graph_staging(const TrainConfig& c, const EnvSpec& spec);

}  // namespace segtape::agent
