// Engine-internal: the backward dispatch and the CPU kernels it shares with forward.
#pragma once
#include <array>

#include "segtape/tape.h"

namespace segtape {

// Accumulates (+=) the gradients of node n's inputs into dst[j] (nullptr: input j needs none),
// given gout, the gradient of n's output.
void backward_node(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst);

}  // namespace segtape
