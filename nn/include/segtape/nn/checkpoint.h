// Checkpoints on safetensors files (format: docs/checkpoint-format.md; names:
// docs/nn.md). Writes are atomic (safetensors::save_atomic) and store a
// CRC-32 of every tensor's bytes, which every load verifies (a damaged file
// is a CheckpointError naming the tensor). Loads validate the whole file
// against the model first and copy only when everything matches, so a failed
// load leaves the model untouched; one CheckpointError lists every problem
// and names the file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "segtape/nn/module.h"
#include "segtape/nn/optim.h"
#include "segtape/nn/random.h"

namespace segtape::nn {

using Metadata = std::map<std::string, std::string>;

// ---- state_dict: the module's parameters under their dotted names.

void save(const Module& m, const std::filesystem::path& path, const Metadata& metadata = {});

struct LoadReport {
  std::vector<std::string> missing_keys;     // in the module, not in the file (non-strict only)
  std::vector<std::string> unexpected_keys;  // in the file, not in the module (non-strict only)
  Metadata metadata;                          // the file's __metadata__
};
// strict: every name must match both ways (PyTorch's load_state_dict).
// Non-strict ignores missing and unexpected names but still refuses a wrong
// shape or dtype on a name both sides have.
LoadReport load(Module& m, const std::filesystem::path& path, bool strict = true);

// ---- training state: parameters, optimizer state, step, rng, user metadata.
// Tensor names: "<param>", "optim.<state>.<param>", "optim.step", "train.step",
// "rng.state"; several optimizers use prefixes "optim", "optim1", "optim2", ...
// Metadata keys starting with "segtape." are reserved.

struct TrainingState {
  int64_t step = 0;
  Metadata metadata;  // the user's, without the reserved keys
};

void save_training_state(const std::filesystem::path& path, const Module& m,
                         std::span<const Optimizer* const> optimizers, const Rng& rng, int64_t step,
                         const Metadata& metadata = {});
void save_training_state(const std::filesystem::path& path, const Module& m, const Optimizer& optimizer,
                         const Rng& rng, int64_t step, const Metadata& metadata = {});

// Always strict: the file must hold exactly what save_training_state would
// write for this module and these optimizers (same kinds, same names).
TrainingState load_training_state(const std::filesystem::path& path, Module& m,
                                  std::span<Optimizer* const> optimizers, Rng& rng);
TrainingState load_training_state(const std::filesystem::path& path, Module& m, Optimizer& optimizer, Rng& rng);

}  // namespace segtape::nn
