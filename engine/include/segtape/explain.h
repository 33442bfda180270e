// Who holds the memory? An explainer over the live tape of the open segment:
// the arena bytes each tape node holds (its output and what backward saved),
// summed by op kind, by step and by node, the span of steps the segment
// covers, the largest contributors, and a plain-text report. Also a Graphviz
// DOT export of a segment's tape with each saved tensor's size.
//
//   std::puts(segtape::explain(tape).report().c_str());
//   std::ofstream("tape.dot") << segtape::to_dot(tape);
//
// Both are O(nodes) (plus a sort of the largest) and allocate only their result.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "segtape/tape.h"

namespace segtape {

// The arena bytes node n holds: its output and its saved buffer, each rounded
// up to the arena's 64-byte alignment, as the arena handed them out.
size_t node_arena_bytes(const Node& n);

struct NodeBytes {
  uint32_t index = 0;  // position on the tape
  OpKind op = OpKind::Input;
  uint32_t step = 0;
  size_t bytes = 0;        // node_arena_bytes
  size_t saved_bytes = 0;  // of which backward's saved buffer (GRU gates, log-sum-exp)
  Shape shape;             // the output's
  DType dtype = DType::F32;
};

struct StepBytes {
  uint32_t step = 0;
  size_t bytes = 0;  // held by the nodes recorded at this step
  size_t nodes = 0;
};

struct Explanation {
  uint64_t segment = 0;          // segment index (0: no segment was ever opened)
  bool open = false;             // whether that segment is still open
  size_t arena_bytes = 0;        // segment arena bytes in use, all allocations
  size_t node_bytes = 0;         // of which held by tape nodes (sum of node_arena_bytes)
  size_t node_count = 0;
  uint32_t first_step = 0, last_step = 0;  // steps the tape's nodes span (when node_count > 0)
  // Arena bytes of every allocation by op kind: tape nodes, inputs (tape.from /
  // zeros, kind Input) and outputs made without history; backward's gradient
  // buffers apart (grad_bytes). From the tape's own counters.
  std::array<size_t, kOpKinds> arena_by_op{};
  size_t grad_bytes = 0;
  std::array<size_t, kOpKinds> node_bytes_by_op{};  // held by tape nodes, by op kind
  std::array<size_t, kOpKinds> nodes_by_op{};
  std::vector<StepBytes> by_step;  // ascending step, steps with nodes only
  std::vector<NodeBytes> largest;  // the largest nodes, largest first (ties: earliest first)

  // Least-squares bytes per step over by_step: how fast the segment grows with
  // the steps it keeps (0 with fewer than two steps).
  double bytes_per_step() const;
  // A plain-text report: totals, op kinds, steps, the largest nodes, and what
  // the shape of it suggests (history retained across steps, or not).
  std::string report(size_t max_rows = 8) const;
};

// Explains the open segment's tape (or an empty explanation when none is open).
// top: how many of the largest nodes to keep.
Explanation explain(const Tape& tape, size_t top = 10);

struct DotOptions {
  // Only nodes recorded at steps in [first_step, last_step] are drawn; edges
  // from earlier nodes arrive from a "from step < first" stub.
  uint32_t first_step = 0;
  uint32_t last_step = UINT32_MAX;
  size_t max_nodes = 2000;  // refuse to draw more (a DOT of a huge tape helps nobody)
  // The name of a leaf tensor (a parameter, an input) by its memory
  // (Tensor::ptr), or "" when unknown; the engine knows no names, a module
  // does: fill it from nn::Module::named_parameters(). Unset: no names.
  std::function<std::string(const void* ptr)> name_of;
};

// Graphviz DOT of the open segment's tape: one box per node (op, step, output
// shape, arena bytes, saved bytes), parameters and inputs as ellipses (named
// by name_of when it knows them), edges from each input to its consumer,
// nodes clustered by step. The carried state (a leaf in Space::Carry, made by
// Segment::carry) is drawn red, its edges bold and labelled "carried state".
// Throws TapeError when no segment is open or more than max_nodes nodes would
// be drawn.
std::string to_dot(const Tape& tape, const DotOptions& options = {});

}  // namespace segtape
