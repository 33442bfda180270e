// segtape's exception types. Every failure of user input is one of these:
// a message that names the op / shapes / file / argument, never an abort.
#pragma once
#include <stdexcept>
#include <string>

namespace segtape {

// Base of every error segtape raises on bad input or misuse.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An op got inputs of incompatible shapes or dtypes.
struct ShapeError : Error { using Error::Error; };
// A tensor made inside a segment was used after that segment ended.
struct ExpiredTensorError : Error { using Error::Error; };
// The segment arena would exceed its budget (the message says what filled
// it), or a device's fixed pool its size (TapeOptions::device_*).
struct BudgetError : Error { using Error::Error; };
// The tape was misused: second backward without retain, op with no open segment, ...
struct TapeError : Error { using Error::Error; };
// An index (embedding row, class target) outside its range.
struct IndexError : Error { using Error::Error; };
// A checkpoint file is missing, corrupt, hostile, or does not match the model.
struct CheckpointError : Error { using Error::Error; };
// A NaN or Inf produced under anomaly mode.
struct AnomalyError : Error { using Error::Error; };
// A training update whose gradient or loss is not finite (the agent's
// TrainConfig::nonfinite): the message names the update, its steps and the
// first parameter whose gradient is not finite.
struct NonFiniteError : Error { using Error::Error; };
// The machine (host or device) has no memory for one of a tape's pools or
// workspaces: the message names it and the bytes. `pool` is its name (a
// string literal, kSegmentArenaPool for the segment arena): callers tell the
// pools apart by it, not by the message's wording. A segment that outgrows
// its budget, or a fixed device pool its size, is a BudgetError, not this.
struct OutOfMemoryError : Error {
  OutOfMemoryError(const std::string& message, const char* pool_name) : Error(message), pool(pool_name) {}
  const char* pool;  // (not a std::string: copying the exception cannot throw)
};
// The device asked for is not here: no CUDA GPU, no driver, a build without
// the CUDA backend, or (gpu_present: the machine has GPUs) an ordinal past
// their count or a GPU that cannot be used (busy in exclusive-process mode).
struct DeviceError : Error {
  explicit DeviceError(const std::string& message, bool gpus_here = false) : Error(message), gpu_present(gpus_here) {}
  bool gpu_present;
};

}  // namespace segtape
