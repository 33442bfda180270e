// Engine-internal: the backward dispatch and the CPU kernels it shares with forward.
#pragma once
#include <array>

#include "segtape/tape.h"

namespace segtape {

namespace detail {
// Backward's deferred GRU weight gradients: the rows of d(x W_ih^T) and
// d(h W_hh^T) of consecutive steps that share weights are stacked, with the
// steps' x and h, and flushed as one GEMM per weight (see TapeOptions).
struct GruBatch {
  Arena buffers{size_t(64) << 10, true};
  const Node* first = nullptr;  // the group's weights and shapes come from this node
  int64_t count = 0, capacity = 0, remaining = 0;
  void* dgi = nullptr;  // [capacity * B, 3H]
  void* dgh = nullptr;  // [capacity * B, 3H]
  void* x = nullptr;    // [capacity * B, I]
  void* h = nullptr;    // [capacity * B, H]
  void* dw[4] = {};     // gradient buffers of w_ih, w_hh, b_ih, b_hh
};
bool same_gru_group(const Node& a, const Node& b, const std::array<void*, Node::kMaxInputs>& dst);
void start_gru_batch(Tape& tape, const Node& n, const std::array<void*, Node::kMaxInputs>& dst);
// Accumulates what the batch holds into the weight gradients and empties it.
void flush_gru_batch(Tape& tape);
// Counts the GRU nodes of this backward that may be batched (sets `remaining`).
void prepare_gru_batch(Tape& tape, int64_t last_node);
}  // namespace detail

// Accumulates (+=) the gradients of node n's inputs into dst[j] (nullptr: input j needs none),
// given gout, the gradient of n's output.
void backward_node(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst);

}  // namespace segtape
