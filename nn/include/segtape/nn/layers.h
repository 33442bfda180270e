// The layers, with PyTorch's names, shapes, equations and default
// initialisation (see docs/nn.md for the correspondence table).
#pragma once
#include <cstdint>
#include <span>
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

// PyTorch's Dropout: in training mode each element of x is zeroed with
// probability p and the others are scaled by 1 / (1 - p) (inverted
// dropout: x * mask, the mask's kept elements T(1) / T(1 - p) as PyTorch's);
// in evaluation mode (eval()) x passes unchanged. p in [0, 1).
//
// The mask is a step's input, drawn on the host into a caller's buffer and
// made a tape tensor, so that a step run again (exact replay) takes the same
// mask from its record rather than drawing a new one:
//   auto m = in.take<float>(size_t(B * H), [&](std::span<float> v) { drop.mask(v); });
//   Tensor y = drop.apply(x, tape.from(m, {B, H}));
// forward(x) draws and applies at once, for a step that is never run again.
// The masks come from the module's own Rng (rng(): its state is what a
// training checkpoint saves to continue the same masks; nn::entry(name, rng)).
class Dropout : public Module {
 public:
  Dropout(Tape& tape, double p = 0.5, uint64_t seed = 0);
  // A mask for out.size() elements into `out`: in training mode with p > 0,
  // each element 1 / (1 - p) with probability 1 - p and 0 otherwise, one draw
  // of rng() per element; otherwise all ones and no draw (an evaluation leaves
  // the masks of training as they would have been).
  void mask(std::span<float> out);
  void mask(std::span<double> out);
  // x * mask (mask: x's shape and dtype, from mask()'s values; it gets no
  // gradient); x itself in evaluation mode or with p == 0.
  Tensor apply(const Tensor& x, const Tensor& mask) const;
  // A mask drawn now (into a host buffer the module keeps: no heap allocation
  // once it has grown to x's size) and applied.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  double p() const { return p_; }
  Rng& rng() { return rng_; }
  const Rng& rng() const { return rng_; }

 private:
  double p_;
  Rng rng_;
  std::vector<float> host32_;
  std::vector<double> host64_;
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

// PyTorch's GRU (sequence-first, unidirectional): a stack of num_layers GRU
// cells, layer l reading layer l-1's outputs. Parameters weight_ih_l{k}
// [3H, I or H], weight_hh_l{k} [3H, H], bias_ih_l{k}, bias_hh_l{k} [3H],
// U(-1/sqrt(H), 1/sqrt(H)). dropout: PyTorch's dropout= between layers (on
// every layer's output but the last, in training mode only), its masks drawn
// from an Rng of dropout_seed (dropout_rng()) or given to forward.
class GRU : public Module {
 public:
  GRU(Tape& tape, Rng& rng, int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
      DType dtype = DType::F32, double dropout = 0, uint64_t dropout_seed = 0);

  struct Output {
    Tensor output;  // [T, B, H]: the last layer's state at every step
    Tensor h_n;     // [num_layers, B, H]: every layer's last state
  };
  // x [T, B, I]; h0 [num_layers, B, H] or undefined (zeros); keep [T, B]
  // or undefined: per-stream resets, every layer's state entering step t
  // multiplied by keep[t, b] (gru_sequence's keep; 0 starts an episode).
  // dropout_masks [num_layers - 1, T, B, H] or undefined: the masks of the
  // dropout between layers (dropout_masks(span) draws them; a step that is
  // run again takes them as inputs); undefined: drawn now. Used in training
  // mode with dropout > 0 only.
  // Not const: reuses member buffers (step handles, the masks' host values),
  // so after the first call a forward makes no heap allocation.
  Output forward(const Tensor& x, const Tensor& h0 = {}, const Tensor& keep = {}, const Tensor& dropout_masks = {});
  Output operator()(const Tensor& x, const Tensor& h0 = {}, const Tensor& keep = {}, const Tensor& dropout_masks = {}) {
    return forward(x, h0, keep, dropout_masks);
  }
  // The masks of one forward into out ((num_layers - 1) T B H values), as
  // Dropout::mask: ones (no draw) in evaluation mode or with dropout 0.
  void dropout_masks(std::span<float> out);
  void dropout_masks(std::span<double> out);
  Rng& dropout_rng() { return between_.rng(); }

  struct Layer {
    Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  };
  const std::vector<Layer>& layers() const { return layers_; }

  const int64_t input_size, hidden_size, num_layers;
  const double dropout;

 private:
  std::vector<Layer> layers_;
  std::vector<Tensor> last_;   // [num_layers] final states
  Dropout between_;            // the dropout between layers (not a child: no parameters, the GRU's mode)
};

// PyTorch's LSTMCell on the engine's fused lstm_cell. Gate order i, f, g, o:
//   i = s(W_ii x + b_ii + W_hi h + b_hi)    f = s(W_if x + b_if + W_hf h + b_hf)
//   g = tanh(W_ig x + b_ig + W_hg h + b_hg) o = s(W_io x + b_io + W_ho h + b_ho)
//   c' = f * c + i * g    h' = o * tanh(c')
// Every parameter U(-1/sqrt(H), 1/sqrt(H)). The state (h, c) is one tensor
// [2, B, H] (lstm_state(h, c); lstm_h(state) is h): what the fused op takes
// and returns, and what a segment carries.
class LSTMCell : public Module {
 public:
  LSTMCell(Tape& tape, Rng& rng, int64_t input_size, int64_t hidden_size, bool bias = true, DType dtype = DType::F32);
  // x [B, I], state [2, B, H] (undefined: zeros) -> the new state [2, B, H]
  Tensor forward(const Tensor& x, const Tensor& state = {}) const;
  Tensor operator()(const Tensor& x, const Tensor& state = {}) const { return forward(x, state); }
  // PyTorch's form: (h, c) [B, H] each -> (h', c'); two copies in and two out
  // that carrying the state [2, B, H] avoids.
  LstmPair forward(const Tensor& x, const Tensor& h, const Tensor& c) const;
  LstmPair operator()(const Tensor& x, const Tensor& h, const Tensor& c) const { return forward(x, h, c); }

  const int64_t input_size, hidden_size;
  const Tensor weight_ih;  // [4H, I]
  const Tensor weight_hh;  // [4H, H]
  // [4H]. Without bias: persistent zeros that are not parameters (as GRUCell's).
  const Tensor bias_ih, bias_hh;
};

// PyTorch's LSTM (sequence-first, unidirectional, no projections): a stack of
// num_layers LSTM cells, layer l reading layer l-1's outputs, with dropout=
// between layers as GRU's. Parameters weight_ih_l{k} [4H, I or H],
// weight_hh_l{k} [4H, H], bias_ih_l{k}, bias_hh_l{k} [4H], U(-1/sqrt(H), 1/sqrt(H)).
class LSTM : public Module {
 public:
  LSTM(Tape& tape, Rng& rng, int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
       DType dtype = DType::F32, double dropout = 0, uint64_t dropout_seed = 0);

  struct Output {
    Tensor output;  // [T, B, H]: the last layer's h at every step
    Tensor h_n;     // [num_layers, B, H]: every layer's last h
    Tensor c_n;     // [num_layers, B, H]: every layer's last c
  };
  // x [T, B, I]; h0 and c0 [num_layers, B, H], both or neither (zeros);
  // dropout_masks as GRU::forward's. Each layer's steps are fused lstm_cell
  // nodes on the state [2, B, H]. Not const: reuses member buffers (no heap
  // allocation after the first call).
  Output forward(const Tensor& x, const Tensor& h0 = {}, const Tensor& c0 = {}, const Tensor& dropout_masks = {});
  Output operator()(const Tensor& x, const Tensor& h0 = {}, const Tensor& c0 = {}, const Tensor& dropout_masks = {}) {
    return forward(x, h0, c0, dropout_masks);
  }
  void dropout_masks(std::span<float> out);
  void dropout_masks(std::span<double> out);
  Rng& dropout_rng() { return between_.rng(); }

  struct Layer {
    Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  };
  const std::vector<Layer>& layers() const { return layers_; }

  const int64_t input_size, hidden_size, num_layers;
  const double dropout;

 private:
  std::vector<Layer> layers_;
  std::vector<Tensor> last_h_, last_c_;  // [num_layers] final h and c, [1, B, H] each
  Dropout between_;
};

}  // namespace segtape::nn
