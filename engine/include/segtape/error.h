// segtape's exception types. Every failure of user input is one of these:
// a message that names the op / shapes / file / argument, never an abort.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace segtape {

// Base of every error segtape raises on bad input or misuse.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An op got inputs of incompatible shapes or dtypes.
struct ShapeError : Error { using Error::Error; };
// A tensor made inside a segment was used after that segment ended.
struct ExpiredTensorError : Error { using Error::Error; };
// The segment arena would exceed its budget (the message says what filled it).
struct BudgetError : Error { using Error::Error; };
// The tape was misused: second backward without retain, op with no open segment, ...
struct TapeError : Error { using Error::Error; };
// An index (embedding row, class target) outside its range.
struct IndexError : Error { using Error::Error; };
// A checkpoint file is missing, corrupt, hostile, or does not match the model.
struct CheckpointError : Error { using Error::Error; };
// A NaN or Inf produced under anomaly mode.
struct AnomalyError : Error { using Error::Error; };
// Host or device memory could not be reserved for one of a tape's pools (or
// a workspace). `pool` names it as the message does ("segment arena
// (TapeOptions::segment_budget)", ...): callers tell the pools apart by it,
// not by the message's wording. A segment that outgrows its budget is a
// BudgetError, not this.
struct OutOfMemoryError : Error {
  OutOfMemoryError(const std::string& message, std::string pool_name) : Error(message), pool(std::move(pool_name)) {}
  std::string pool;
};
// The device asked for is not here: no CUDA GPU, an ordinal past the
// machine's count, or a build without the CUDA backend.
struct DeviceError : Error { using Error::Error; };

}  // namespace segtape
