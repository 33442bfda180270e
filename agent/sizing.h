// What a configuration needs before anything is allocated, and the tape it
// runs on (private to the agent library; Trainer::estimate is the public face).
#pragma once
#include <cstddef>

#include "segtape/agent/policy.h"
#include "segtape/agent/trainer.h"

namespace segtape::agent {

// The budget a configuration's tape applies: --budget, or its default (64 MiB;
// a growing history's growth limit: 1 GiB).
size_t applied_budget(const TrainConfig& c);
// The tape's options for a configuration (a growing history's arena grows).
TapeOptions tape_options(const TrainConfig& c);
PolicyShape policy_shape(const TrainConfig& c, const EnvSpec& spec);
SizeEstimate estimate_sizes(const TrainConfig& c, const EnvSpec& spec);
// Refuses (BudgetError, Error) a configuration that cannot fit its budget or this machine's memory, with the numbers.
void check_sizes(const TrainConfig& c, const SizeEstimate& e);
// The host inputs one graph segment stages (tape.from: observations,
// targets, reset masks; a sequence's keep [K, B]), at most: TapeOptions::graph_staging.
size_t graph_staging(const TrainConfig& c, const EnvSpec& spec);

}  // namespace segtape::agent
