// The CUDA backend's op dispatch: every OpKind to its family's CUDA code,
// which sits in the family's file beside its CPU code (engine/ops/<family>.cpp,
// under SEGTAPE_HAVE_CUDA); GruSequence goes to cuDNN (gru_sequence.cpp)
// before it gets here. Both switches list every OpKind, with no default
// (-Wswitch-enum). (An op call's graph-replay signature: engine/graph_schedule.h.)
#include "cuda_backend.h"
#include "ops/op.h"
#include "segtape/ops.h"

namespace segtape::cuda {

void forward_op(CudaBackend& be, Tape&, Node& n) {
  switch (n.op) {
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::unary_forward_cuda<ops::Kind>(be, n);
    SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
#define SEGTAPE_BINARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::binary_forward_cuda<ops::Kind>(be, n);
    SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
    case OpKind::MatMul: return ops::matmul_forward_cuda(be, n);
    case OpKind::Sum:
    case OpKind::Mean: return ops::reduce_forward_cuda(be, n);
    case OpKind::Softmax:
    case OpKind::LogSoftmax: return ops::softmax_forward_cuda(be, n);
    case OpKind::CrossEntropy: return ops::cross_entropy_forward_cuda(be, n);
    case OpKind::MseLoss: return ops::mse_forward_cuda(be, n);
    case OpKind::Concat: return ops::concat_forward_cuda(be, n);
    case OpKind::Slice: return ops::slice_forward_cuda(be, n);
    case OpKind::Transpose: return ops::transpose_forward_cuda(be, n);
    case OpKind::Embedding: return ops::embedding_forward_cuda(be, n);
    case OpKind::GruCell: return ops::gru_cell_forward_cuda(be, n);
    case OpKind::LstmCell: return ops::lstm_cell_forward_cuda(be, n);
    case OpKind::Reshape:      // a view: nothing to compute
    case OpKind::Input:        // seg.input() leaves: not computed
    case OpKind::GruSequence:  // CudaBackend::forward sends it to gru_sequence.cpp
    case OpKind::Count: break;
  }
  throw TapeError(std::string("CUDA backend: no forward for op ") + op_name(n.op));
}

void backward_op(CudaBackend& be, Tape&, const Node& n, const void* g, const std::array<void*, Node::kMaxInputs>& d) {
  switch (n.op) {
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::unary_backward_cuda<ops::Kind>(be, n, g, d);
    SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
#define SEGTAPE_BINARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::binary_backward_cuda<ops::Kind>(be, n, g, d);
    SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
    case OpKind::MatMul: return ops::matmul_backward_cuda(be, n, g, d);
    case OpKind::Sum:
    case OpKind::Mean: return ops::reduce_backward_cuda(be, n, g, d);
    case OpKind::Softmax:
    case OpKind::LogSoftmax: return ops::softmax_backward_cuda(be, n, g, d);
    case OpKind::CrossEntropy: return ops::cross_entropy_backward_cuda(be, n, g, d);
    case OpKind::MseLoss: return ops::mse_backward_cuda(be, n, g, d);
    case OpKind::Concat: return ops::concat_backward_cuda(be, n, g, d);
    case OpKind::Slice: return ops::slice_backward_cuda(be, n, g, d);
    case OpKind::Reshape: return ops::reshape_backward_cuda(be, n, g, d);
    case OpKind::Transpose: return ops::transpose_backward_cuda(be, n, g, d);
    case OpKind::Embedding: return ops::embedding_backward_cuda(be, n, g, d);
    case OpKind::GruCell: return ops::gru_cell_backward_cuda(be, n, g, d);
    case OpKind::LstmCell: return ops::lstm_cell_backward_cuda(be, n, g, d);
    case OpKind::Input:
    case OpKind::GruSequence:  // CudaBackend::backward sends it to gru_sequence.cpp
    case OpKind::Count: break;
  }
  throw TapeError(std::string("CUDA backend: no backward rule for op ") + op_name(n.op));
}

}  // namespace segtape::cuda
