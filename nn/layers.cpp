#include "segtape/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace segtape::nn {
namespace {

// A size argument must fit Shape's int32 dims; zero-sized layers have no use
// here and would make the 1/sqrt(fan) bounds infinite.
int64_t positive(int64_t n, const char* layer, const char* what) {
  if (n <= 0 || n > std::numeric_limits<int32_t>::max())
    throw ShapeError(std::string(layer) + ": " + what + " must be in [1, 2^31 - 1], got " + std::to_string(n));
  return n;
}

// Values drawn on the host in element order, then copied to the tensor
// wherever it lives (one code path for the CPU and a device).
template <class Draw>
void fill_from(const Tensor& t, Draw&& draw) {
  if (t.dtype == DType::F64) {
    std::vector<double> v(size_t(t.numel()));
    for (double& x : v) x = draw();
    t.from_host(std::span<const double>(v));
  } else {
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = float(draw());
    t.from_host(std::span<const float>(v));
  }
}

void fill_uniform(const Tensor& t, Rng& rng, double bound) {
  fill_from(t, [&] { return rng.uniform(-bound, bound); });
}

void fill_normal(const Tensor& t, Rng& rng) {
  fill_from(t, [&] { return rng.normal(); });
}

std::string dims(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

}  // namespace

// ---- Linear

Linear::Linear(Tape& tape, Rng& rng, int64_t in, int64_t out, bool with_bias, DType dtype)
    : Module(tape, dtype),
      in_features(positive(in, "nn::Linear", "in_features")),
      out_features(positive(out, "nn::Linear", "out_features")),
      weight(register_parameter("weight", {out, in})),
      bias(with_bias ? register_parameter("bias", {out}) : Tensor{}) {
  const double bound = 1.0 / std::sqrt(double(in));
  fill_uniform(weight, rng, bound);
  if (with_bias) fill_uniform(bias, rng, bound);
}

Tensor Linear::forward(const Tensor& x) const {
  if (x.rank() < 1 || x.shape.last() != in_features)
    throw ShapeError("nn::Linear" + dims(in_features, out_features) + ": input " + x.describe() +
                     " must have last dimension " + std::to_string(in_features));
  if (x.rank() == 2) return bias.defined() ? add(matmul(x, weight, false, true), bias) : matmul(x, weight, false, true);
  // [..., in] as [rows, in] and back: reshape is a view, no copy.
  Tensor y = matmul(reshape(x, {x.shape.rows(), in_features}), weight, false, true);
  if (bias.defined()) y = add(y, bias);
  Shape s = x.shape;
  s.dims[s.rank - 1] = int32_t(out_features);
  return reshape(y, s);
}

// ---- Embedding

Embedding::Embedding(Tape& tape, Rng& rng, int64_t num, int64_t dim, DType dtype)
    : Module(tape, dtype),
      num_embeddings(positive(num, "nn::Embedding", "num_embeddings")),
      embedding_dim(positive(dim, "nn::Embedding", "embedding_dim")),
      weight(register_parameter("weight", {num, dim})) {
  fill_normal(weight, rng);
}

Tensor Embedding::forward(const Tensor& indices) const { return embedding(weight, indices); }

// ---- GRUCell

GRUCell::GRUCell(Tape& tape, Rng& rng, int64_t input, int64_t hidden, bool bias, DType dtype)
    : Module(tape, dtype),
      input_size(positive(input, "nn::GRUCell", "input_size")),
      hidden_size(positive(hidden, "nn::GRUCell", "hidden_size")),
      weight_ih(register_parameter("weight_ih", {3 * hidden, input})),
      weight_hh(register_parameter("weight_hh", {3 * hidden, hidden})),
      bias_ih(bias ? register_parameter("bias_ih", {3 * hidden}) : tape.persistent({3 * hidden}, dtype)),
      bias_hh(bias ? register_parameter("bias_hh", {3 * hidden}) : tape.persistent({3 * hidden}, dtype)) {
  const double bound = 1.0 / std::sqrt(double(hidden));
  for (const auto& [name, p] : own_parameters()) fill_uniform(p, rng, bound);
}

Tensor GRUCell::forward(const Tensor& x, const Tensor& h) const {
  if (x.rank() != 2 || x.dim(1) != input_size)
    throw ShapeError("nn::GRUCell" + dims(input_size, hidden_size) + ": input " + x.describe() + " must be [B, " +
                     std::to_string(input_size) + "]");
  if (h.defined()) return gru_cell(x, h, weight_ih, weight_hh, bias_ih, bias_hh);
  return gru_cell(x, x.tape->zeros({x.dim(0), hidden_size}, dtype()), weight_ih, weight_hh, bias_ih, bias_hh);
}

// ---- GRU

GRU::GRU(Tape& tape, Rng& rng, int64_t input, int64_t hidden, int64_t layers, bool bias, DType dtype)
    : Module(tape, dtype),
      input_size(positive(input, "nn::GRU", "input_size")),
      hidden_size(positive(hidden, "nn::GRU", "hidden_size")),
      num_layers(positive(layers, "nn::GRU", "num_layers")) {
  // PyTorch registers layer by layer: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, weight_ih_l1, ...
  for (int64_t l = 0; l < layers; ++l) {
    const std::string s = "_l" + std::to_string(l);
    Layer L;
    L.weight_ih = register_parameter("weight_ih" + s, {3 * hidden, l == 0 ? input : hidden});
    L.weight_hh = register_parameter("weight_hh" + s, {3 * hidden, hidden});
    L.bias_ih = bias ? register_parameter("bias_ih" + s, {3 * hidden}) : tape.persistent({3 * hidden}, dtype);
    L.bias_hh = bias ? register_parameter("bias_hh" + s, {3 * hidden}) : tape.persistent({3 * hidden}, dtype);
    layers_.push_back(L);
  }
  const double bound = 1.0 / std::sqrt(double(hidden));
  for (const auto& [name, p] : own_parameters()) fill_uniform(p, rng, bound);
  last_.resize(size_t(layers));
}

GRU::Output GRU::forward(const Tensor& x, const Tensor& h0, const Tensor& keep) {
  // Built only on the error path: a forward allocates nothing.
  auto me = [&] {
    return "nn::GRU(" + std::to_string(input_size) + ", " + std::to_string(hidden_size) + ", " +
           std::to_string(num_layers) + ")";
  };
  if (x.rank() != 3 || x.dim(2) != input_size || x.dim(0) < 1)
    throw ShapeError(me() + ": input " + x.describe() + " must be [T, B, " + std::to_string(input_size) + "] with T >= 1");
  const int64_t T = x.dim(0), B = x.dim(1), H = hidden_size;
  if (h0.defined() && (h0.rank() != 3 || h0.dim(0) != num_layers || h0.dim(1) != B || h0.dim(2) != H))
    throw ShapeError(me() + ": h0 " + h0.describe() + " must be [" + std::to_string(num_layers) + ", " +
                     std::to_string(B) + ", " + std::to_string(H) + "] for input " + x.describe());
  // Each layer is one gru_sequence over the whole sequence (cuDNN's GRU on
  // CUDA, fused cells on the CPU); layer l's outputs are layer l+1's input.
  Tensor seq = x, zeros = h0.defined() ? Tensor{} : x.tape->zeros({B, H}, dtype());
  for (int64_t l = 0; l < num_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    const Tensor h = h0.defined() ? reshape(slice(h0, 0, l, 1), {B, H}) : zeros;
    seq = gru_sequence(seq, h, L.weight_ih, L.weight_hh, L.bias_ih, L.bias_hh, keep);  // [T, B, H]
    last_[size_t(l)] = reshape(slice(seq, 0, T - 1, 1), {B, H});
  }
  return {seq, reshape(concat(std::span<const Tensor>(last_.data(), size_t(num_layers)), 0), {num_layers, B, H})};
}

}  // namespace segtape::nn
