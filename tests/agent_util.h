// Shared helpers for the agent's test suites.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "segtape/agent/trainer.h"

namespace segtape::test {

// Every parameter of the trainer's policy, in order, copied to the host (a
// device run's too): two runs agree bit for bit when these are equal.
inline std::vector<float> params_of(agent::Trainer& tr) {
  std::vector<float> all;
  for (const Tensor& p : tr.policy().parameters()) {
    const std::vector<float> v = p.to_host<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Runs c straight through, and again paused at step `pause` (checkpointed
// to `ck`, then a new trainer made from the checkpoint's configuration
// loads it and finishes): the parameters must agree bit for bit. Returns
// the configuration read back from the checkpoint.
inline agent::TrainConfig expect_resumes_bit_identically(const agent::TrainConfig& c, const std::filesystem::path& ck,
                                                         int64_t pause) {
  agent::Trainer straight(c);
  while (!straight.done()) straight.run_segment();
  agent::Trainer first(c);
  while (first.step() < pause) first.run_segment();
  first.save(ck);
  const agent::TrainConfig back = agent::Trainer::read_config(ck);
  agent::Trainer second(back);
  second.load(ck);
  while (!second.done()) second.run_segment();
  EXPECT_EQ(params_of(straight), params_of(second));
  return back;
}

}  // namespace segtape::test
