// Where the steps' data comes from (private to the agent library): the
// built-in envs, one file each in this folder, and the contract checks
// make_env wraps every env in (checked.cpp).
//
// A new built-in task: a file here that defines its factory, and one line in
// SEGTAPE_TASKS. (An env of your own needs neither: register_env, or a
// plug-in; env.h.)
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "segtape/agent/env.h"

namespace segtape::agent {

// X(name, factory): `segtape train --env name`.
#define SEGTAPE_TASKS(X)                \
  X("recall", recall_task)              \
  X("tmaze", tmaze_task)                \
  X("dialogue", dialogue_task)          \
  X("lm", lm_task)                      \
  X("series", series_task)              \
  X("device-recall", device_recall_task) \
  X("device-tmaze", device_tmaze_task)   \
  X("device-dialogue", device_dialogue_task) \
  /* (the list ends here) */

#define SEGTAPE_DECLARE(N, F) std::unique_ptr<Env> F(int64_t batch, uint64_t seed, const EnvOptions& o);
SEGTAPE_TASKS(SEGTAPE_DECLARE)
#undef SEGTAPE_DECLARE

// The env `make` builds for env `name` of `batch` streams, wrapped in the
// contract checks (an EnvContractError names the env and the step).
std::unique_ptr<Env> checked_env(const std::string& name, int64_t batch, const std::function<std::unique_ptr<Env>()>& make);

}  // namespace segtape::agent
