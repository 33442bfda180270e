// The layers, with PyTorch's names, shapes, equations and default
// initialisation (see docs/nn.md for the correspondence table).
#pragma once
#include <cstdint>
#include <vector>

#include "segtape/nn/module.h"
#include "segtape/nn/random.h"
#include "segtape/ops.h"

namespace segtape::nn {

// y = x W^T + b. weight [out, in], bias [out]; both U(-1/sqrt(in), 1/sqrt(in))
// (PyTorch's kaiming_uniform_(a=sqrt(5)) on the weight is exactly that bound).
class Linear : public Module {
 public:
  Linear(Tape& tape, Rng& rng, int64_t in_features, int64_t out_features, bool bias = true,
         DType dtype = DType::F32);
  // x [..., in] -> [..., out]
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }

  const int64_t in_features, out_features;
  const Tensor weight;  // [out, in]
  const Tensor bias;    // [out]; undefined without bias
};

// A lookup table: weight [num, dim] ~ N(0, 1).
class Embedding : public Module {
 public:
  Embedding(Tape& tape, Rng& rng, int64_t num_embeddings, int64_t embedding_dim, DType dtype = DType::F32);
  // int64 indices of any shape (rank <= 3) -> indices.shape + [dim]
  Tensor forward(const Tensor& indices) const;
  Tensor operator()(const Tensor& indices) const { return forward(indices); }

  const int64_t num_embeddings, embedding_dim;
  const Tensor weight;  // [num, dim]
};

// PyTorch's GRUCell on the engine's fused gru_cell. Gate order r, z, n:
//   r = s(W_ir x + b_ir + W_hr h + b_hr)    z = s(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn))    h' = (1 - z) * n + z * h
// Every parameter U(-1/sqrt(H), 1/sqrt(H)).
class GRUCell : public Module {
 public:
  GRUCell(Tape& tape, Rng& rng, int64_t input_size, int64_t hidden_size, bool bias = true,
          DType dtype = DType::F32);
  // x [B, I], h [B, H] (undefined: zeros) -> h' [B, H]
  Tensor forward(const Tensor& x, const Tensor& h = {}) const;
  Tensor operator()(const Tensor& x, const Tensor& h = {}) const { return forward(x, h); }

  const int64_t input_size, hidden_size;
  const Tensor weight_ih;  // [3H, I]
  const Tensor weight_hh;  // [3H, H]
  // [3H]. Without bias: persistent zeros that are not parameters (the fused
  // op always takes biases; zeros add nothing and receive no gradient).
  const Tensor bias_ih, bias_hh;
};

// PyTorch's GRU (sequence-first, unidirectional, no dropout): a stack of
// num_layers GRU cells, layer l reading layer l-1's outputs. Parameters
// weight_ih_l{k} [3H, I or H], weight_hh_l{k} [3H, H], bias_ih_l{k},
// bias_hh_l{k} [3H], U(-1/sqrt(H), 1/sqrt(H)).
class GRU : public Module {
 public:
  GRU(Tape& tape, Rng& rng, int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
      DType dtype = DType::F32);

  struct Output {
    Tensor output;  // [T, B, H]: the last layer's state at every step
    Tensor h_n;     // [num_layers, B, H]: every layer's last state
  };
  // x [T, B, I]; h0 [num_layers, B, H] or undefined (zeros); keep [T, B]
  // or undefined: per-stream resets, every layer's state entering step t
  // multiplied by keep[t, b] (gru_sequence's keep; 0 starts an episode).
  // Not const: reuses a member buffer of step handles, so after the first
  // call a forward makes no heap allocation.
  Output forward(const Tensor& x, const Tensor& h0 = {}, const Tensor& keep = {});
  Output operator()(const Tensor& x, const Tensor& h0 = {}, const Tensor& keep = {}) { return forward(x, h0, keep); }

  struct Layer {
    Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  };
  const std::vector<Layer>& layers() const { return layers_; }

  const int64_t input_size, hidden_size, num_layers;

 private:
  std::vector<Layer> layers_;
  std::vector<Tensor> last_;   // [num_layers] final states
};

}  // namespace segtape::nn
