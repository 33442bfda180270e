// Engine-internal: the host side of CUDA-graph replay
// (TapeOptions::graph_replay, docs/cuda.md), shared by the CUDA backend,
// which captures and launches real graphs around it, and the host-emulated
// device, which runs every call eagerly but keeps the same schedule, the same
// signatures of device calls and the same refusals, so that CI (no GPU) runs
// them: a replayed segment that issues a different call, host reads inside a
// graph segment, an optimizer step whose scalars change.
//
// Schedule: with graph replay the first segment runs eagerly (warm-up); the
// next two are captured, one per parity (carried values alternate between
// two buffers, so segment s repeats the addresses of segment s - 2); every
// later segment replays the graph of its parity. In a replayed segment each
// device call must match the captured one, in order (issue()). A program
// with two patterns of graph segments gives each a slot
// (tape.graph_segment(slot)): each slot has its own two graphs, captured the
// first time a segment of that slot and parity runs after the warm-up.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/op.h"
#include "segtape/device_call.h"
#include "segtape/tape.h"
#include "segtape/update.h"

namespace segtape::detail {

// The signature of a device call: what it is, its addresses, sizes and scalars.
uint64_t mix4(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
uint64_t bits_of(double v);
inline uint64_t ptr_bits(const void* p) { return reinterpret_cast<uintptr_t>(p); }
// An op's forward (dst == nullptr) or backward call: kind, addresses, shapes, attributes.
uint64_t op_signature(const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>* dst);
// The backend's other device calls (engine/backend.h), one formula each for both backends.
namespace call {
uint64_t host_to_device(const void* dst, size_t staged_at, size_t bytes);  // tape.from() from the staging
uint64_t device_copy(const void* dst, const void* src, size_t bytes);
uint64_t zero(const void* dst, size_t bytes);
uint64_t fill(const void* dst, int64_t n, DType d, double value);
uint64_t sgd(const void* p, const void* g, const void* buf, int64_t n, DType d, const SgdOptions& s, bool first);
// step_at: the capturable form's device step count (its address is signed, not its value)
uint64_t adam(const void* p, const void* g, const void* m, const void* v, int64_t n, DType d, const AdamOptions& s,
              bool decoupled, int64_t step, const double* step_at);
uint64_t scale(const void* x, int64_t n, DType d, double factor);
uint64_t add_scalar(const void* x, int64_t n, DType d, double value);
uint64_t add_sum_squares(const void* x, int64_t n, DType d, const double* acc, bool first);
uint64_t clip_scale(const void* x, int64_t n, DType d, const double* sum_sq, double max_norm);
// segtape/device_call.h's: the function, its tensors' addresses and sizes, its scalars
uint64_t device_function(const DeviceFunction& fn, const CallArgs& a);
}  // namespace call

// What graph replay cannot have, refused by both backends at setup: anomaly
// mode (it reads every op's output on the host).
void check_graph_options(const Device& device, const TapeOptions& options);

class GraphSchedule {
 public:
  enum class Mode : uint8_t { Eager, Capturing, Replaying };
  // What segment_end must do with the device's graph.
  enum class End : uint8_t {
    Nothing,      // an eager segment, or a replay that failed (its error is reported)
    DropCapture,  // an exception left a captured segment half issued: keep nothing
    Instantiate,  // a captured segment ended: instantiate its graph and launch it (then captured())
    Launch,       // a replayed segment matched: launch its parity's graph
  };

  // on: TapeOptions::graph_replay; staging: the bytes of tape.from() one graph segment may stage.
  GraphSchedule(bool on, size_t staging) : on_(on), staging_cap_(staging) {}
  bool on() const { return on_; }
  Mode mode() const { return mode_; }
  bool in_graph_segment() const { return mode_ != Mode::Eager; }

  static constexpr unsigned kSlots = 2;
  // Segment `index` opens: the mode it runs in (Capturing: the device starts
  // capturing). graph = false (tape.eager_segment()): Eager, and the segment
  // leaves the graphs and the warm-up as they are. slot < kSlots: whose graphs.
  Mode begin(uint32_t index, bool graph = true, unsigned slot = 0);
  // The graph being captured or replayed: its index in [0, 2 kSlots) (the device's graph of it).
  size_t graph_index() const { return size_t(graph_ - graphs_.data()); }
  // Before a device call (after its arena allocations): true = issue the work
  // (eager, or being captured); false = the replayed graph holds it (the call
  // matched the capture). A call that does not match raises TapeError.
  bool issue(uint64_t signature, const char* what);
  // The segment ends. A replay that issued fewer calls than its capture sets
  // `pending` (the error segment_end cannot throw) and returns Nothing.
  End end(bool abandoned, std::string& pending);
  // The device made the graph of the segment just captured.
  void captured();
  // Forget both graphs (after a device failure, or tape.discard_graph(): then
  // the next segment runs eagerly and the two after it are captured again).
  void forget();
  void discard();
  // Segments captured (their graph made) and replayed (their graph launched) so far (TapeStats).
  uint64_t captures() const { return captures_; }
  uint64_t replays() const { return replays_; }
  // The begin of a capture failed on the device: the segment runs eagerly.
  void cancel_capture();

  // tape.from() in a graph segment: where its `bytes` go in the staging
  // (TapeOptions::graph_staging; Error when the segment's inputs exceed it).
  size_t stage(size_t bytes);
  // TapeError inside a graph segment, naming what cannot be done there.
  void check_host_read() const;    // item(), to_host(), anomaly mode's scan
  void check_synchronize() const;  // tape.synchronize()
  void check_norm() const;         // grad_squared_norm (clip_grad_norm)

 private:
  struct Graph {
    std::vector<uint64_t> signatures;  // one per device call of the captured segment
    uint32_t captured = 0;             // the segment it was captured from
    bool ready = false;                // captured, and the device made its graph
  };
  bool on_;
  Mode mode_ = Mode::Eager;
  bool warm_ = false;  // an eager segment has run: lazy initialisations are done
  bool eager_asked_ = false;  // this segment is an eager_segment(): it does not warm the schedule
  uint64_t captures_ = 0, replays_ = 0;
  std::array<Graph, 2 * kSlots> graphs_;  // slot s, parity p: [2 s + p]
  Graph* graph_ = nullptr;  // the one being captured or replayed
  uint32_t segment_ = 0;
  size_t replay_pos_ = 0;
  bool replay_failed_ = false;
  size_t staging_cap_, staging_used_ = 0;
};

}  // namespace segtape::detail
