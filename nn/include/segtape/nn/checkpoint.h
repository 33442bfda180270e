// Checkpoints on safetensors files (format: docs/checkpoint-format.md; names:
// docs/nn.md). Writes are atomic (safetensors::save_atomic) and store a
// CRC-32 of every tensor's bytes, which every load verifies (a damaged file
// is a CheckpointError naming the tensor). Loads validate the whole file
// against the model first and copy only when everything matches, so a failed
// load leaves the model untouched; one CheckpointError lists every problem
// and names the file. Every save and load below goes through one pair,
// save_entries / load_entries, which a caller with state of its own uses too
// (agent::Trainer's checkpoint).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
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
// shape or dtype on a name both sides have. prefix: the module's names stand
// in the file after it (a module of a larger checkpoint: "policy." in a
// segtape train checkpoint), as PyTorch's state_dict prefixes.
LoadReport load(Module& m, const std::filesystem::path& path, bool strict = true, const std::string& prefix = "");

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

// ---- named entries: the path every function above takes.

// One tensor of a checkpoint file: a tape's tensor (it may live on a device:
// copied through to_host_bytes / from_host_bytes) or a host buffer of the
// caller's (counters, rng words). A save reads it, a load writes it.
struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  Tensor tensor;          // defined: the entry is this tensor (dtype and shape are its own)
  void* host = nullptr;   // otherwise: shape's element count of dtype at host
  bool optional = false;  // a load leaves it as it is when the file lacks it (an entry older files lack)
};
Entry entry(std::string name, const Tensor& t);
// values.size() must be the element count of shape ({} is a scalar).
Entry entry(std::string name, std::span<int64_t> values, std::vector<int64_t> shape);
Entry entry(std::string name, std::span<float> values, std::vector<int64_t> shape);
// An Rng's state (seed, counter) as an I64 [2] entry, bit for bit (as a
// training state's "rng.state"), read from and written into the Rng in place:
// e.g. a Dropout's mask generator, entry("dropout.rng", dropout.rng()). A
// load writes it once the file matched the entries (before about_values).
Entry entry(std::string name, Rng& rng);

// Writes the entries and the metadata atomically (safetensors::save_atomic).
void save_entries(const std::filesystem::path& path, std::span<const Entry> entries, const Metadata& metadata);

// A check of a load: it appends one line per problem it finds.
using LoadCheck = std::function<void(const Metadata& metadata, std::vector<std::string>& problems)>;

// Loads a file written with these entries, strictly: each entry must be in
// the file (an optional one may be absent), with its dtype and shape, and the
// file must hold no other tensor. In order: `about_file` sees the file's
// metadata (is it a file for this caller at all?); only if it found nothing
// are the entries compared with the file (a file of another configuration is
// named as that alone, not with the tensors it then lacks or has extra);
// only if nothing was found, the host entries are filled in
// and `about_values` checks them. It is the last check: when it finds
// nothing, only the tensors' copy follows, so it may also hand the host
// values on to the caller's own state. Any problem: one CheckpointError that
// names the file and `what` and lists them all, and no tensor was written.
// Returns the file's metadata.
Metadata load_entries(const std::filesystem::path& path, std::span<const Entry> entries, const std::string& what,
                      const LoadCheck& about_file = {}, const LoadCheck& about_values = {});

}  // namespace segtape::nn
