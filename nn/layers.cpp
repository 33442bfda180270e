#include "segtape/nn/layers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
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

// p as C's %g writes it (0.5, 0.25, 1e-07), for messages.
std::string number(double p) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", p);
  return b;
}

// A dropout probability: in [0, 1) (1 would zero everything and scale by infinity).
double dropout_p(double p, const std::string& who) {
  if (!(p >= 0 && p < 1)) throw Error(who + ": the dropout probability must be in [0, 1), got " + number(p));
  return p;
}

// Inverted dropout's mask: each element T(1) / T(1 - p) with probability
// 1 - p, else 0 (PyTorch's bernoulli(1 - p) divided by 1 - p), one draw each.
template <class T>
void draw_mask(Rng& rng, double p, std::span<T> out) {
  const T keep = T(1) / T(1 - p);
  for (T& v : out) v = rng.uniform() < p ? T(0) : keep;
}

// The layer boundaries' masks given to GRU / LSTM forward: [L - 1, T, B, H]
// of x's dtype, for L >= 2 layers.
void check_masks(const std::string& me, const Tensor& m, const Tensor& x, int64_t L, int64_t H) {
  if (!m.defined()) return;
  if (L < 2) throw ShapeError(me + ": dropout_masks " + m.describe() + " given to one layer (dropout acts between layers)");
  if (m.rank() != 4 || m.dim(0) != L - 1 || m.dim(1) != x.dim(0) || m.dim(2) != x.dim(1) || m.dim(3) != H || m.dtype != x.dtype)
    throw ShapeError(me + ": dropout_masks " + m.describe() + " must be [" + std::to_string(L - 1) + ", " + std::to_string(x.dim(0)) +
                     ", " + std::to_string(x.dim(1)) + ", " + std::to_string(H) + "] of " + dtype_name(x.dtype) + " for input " +
                     x.describe());
}

// Layer l's input through the dropout between layers l - 1 and l: the given
// masks' row l - 1, or a mask drawn now.
Tensor between_layers(Dropout& d, const Tensor& seq, const Tensor& masks, int64_t l) {
  if (!masks.defined()) return d.forward(seq);
  return d.apply(seq, reshape(slice(masks, 0, l - 1, 1), seq.shape));
}

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

// ---- Dropout

Dropout::Dropout(Tape& tape, double p, uint64_t seed) : Module(tape), p_(dropout_p(p, "nn::Dropout")), rng_(seed) {}

void Dropout::mask(std::span<float> out) {
  if (is_training() && p_ > 0) draw_mask(rng_, p_, out);
  else std::fill(out.begin(), out.end(), 1.0f);
}
void Dropout::mask(std::span<double> out) {
  if (is_training() && p_ > 0) draw_mask(rng_, p_, out);
  else std::fill(out.begin(), out.end(), 1.0);
}

Tensor Dropout::apply(const Tensor& x, const Tensor& m) const {
  if (!is_training() || p_ == 0) return x;
  if (!m.defined() || m.shape != x.shape)
    throw ShapeError("nn::Dropout(p=" + number(p_) + "): the mask " + (m.defined() ? m.describe() : std::string("(undefined)")) +
                     " must have the shape of x " + x.describe());
  return mul(x, detach(m));  // a mask is data: no gradient
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0) return x;
  if (!x.defined() || x.dtype == DType::I64)
    throw ShapeError("nn::Dropout(p=" + number(p_) + "): expects a floating-point input, got " +
                     (x.defined() ? x.describe() : std::string("an undefined tensor")));
  const size_t n = size_t(x.numel());
  if (x.dtype == DType::F64) {
    if (host64_.size() < n) host64_.resize(n);
    const std::span<double> v(host64_.data(), n);
    mask(v);
    return mul(x, x.tape->from(std::span<const double>(v), x.shape));
  }
  if (host32_.size() < n) host32_.resize(n);
  const std::span<float> v(host32_.data(), n);
  mask(v);
  return mul(x, x.tape->from(std::span<const float>(v), x.shape));
}

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

GRU::GRU(Tape& tape, Rng& rng, int64_t input, int64_t hidden, int64_t layers, bool bias, DType dtype, double p, uint64_t seed)
    : Module(tape, dtype),
      input_size(positive(input, "nn::GRU", "input_size")),
      hidden_size(positive(hidden, "nn::GRU", "hidden_size")),
      num_layers(positive(layers, "nn::GRU", "num_layers")),
      dropout(dropout_p(p, "nn::GRU")),
      between_(tape, p, seed) {
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

GRU::Output GRU::forward(const Tensor& x, const Tensor& h0, const Tensor& keep, const Tensor& dropout_masks) {
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
  if (dropout_masks.defined()) check_masks(me(), dropout_masks, x, num_layers, H);
  const bool dropping = is_training() && dropout > 0;
  // Each layer is one gru_sequence over the whole sequence (cuDNN's GRU on
  // CUDA, fused cells on the CPU); layer l's outputs, through the dropout
  // between layers, are layer l+1's input.
  Tensor seq = x, zeros = h0.defined() ? Tensor{} : x.tape->zeros({B, H}, dtype());
  for (int64_t l = 0; l < num_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    if (l > 0 && dropping) seq = between_layers(between_, seq, dropout_masks, l);
    const Tensor h = h0.defined() ? reshape(slice(h0, 0, l, 1), {B, H}) : zeros;
    seq = gru_sequence(seq, h, L.weight_ih, L.weight_hh, L.bias_ih, L.bias_hh, keep);  // [T, B, H]
    last_[size_t(l)] = reshape(slice(seq, 0, T - 1, 1), {B, H});
  }
  return {seq, reshape(concat(std::span<const Tensor>(last_.data(), size_t(num_layers)), 0), {num_layers, B, H})};
}

void GRU::dropout_masks(std::span<float> out) {
  if (is_training()) between_.mask(out);
  else std::fill(out.begin(), out.end(), 1.0f);
}
void GRU::dropout_masks(std::span<double> out) {
  if (is_training()) between_.mask(out);
  else std::fill(out.begin(), out.end(), 1.0);
}

// ---- LSTMCell

LSTMCell::LSTMCell(Tape& tape, Rng& rng, int64_t input, int64_t hidden, bool bias, DType dtype)
    : Module(tape, dtype),
      input_size(positive(input, "nn::LSTMCell", "input_size")),
      hidden_size(positive(hidden, "nn::LSTMCell", "hidden_size")),
      weight_ih(register_parameter("weight_ih", {4 * hidden, input})),
      weight_hh(register_parameter("weight_hh", {4 * hidden, hidden})),
      bias_ih(bias ? register_parameter("bias_ih", {4 * hidden}) : tape.persistent({4 * hidden}, dtype)),
      bias_hh(bias ? register_parameter("bias_hh", {4 * hidden}) : tape.persistent({4 * hidden}, dtype)) {
  const double bound = 1.0 / std::sqrt(double(hidden));
  for (const auto& [name, p] : own_parameters()) fill_uniform(p, rng, bound);
}

namespace {
void check_cell_input(const Tensor& x, int64_t I, int64_t H) {
  if (x.rank() != 2 || x.dim(1) != I)
    throw ShapeError("nn::LSTMCell" + dims(I, H) + ": input " + x.describe() + " must be [B, " + std::to_string(I) + "]");
}
}  // namespace

Tensor LSTMCell::forward(const Tensor& x, const Tensor& state) const {
  check_cell_input(x, input_size, hidden_size);
  if (state.defined()) return lstm_cell(x, state, weight_ih, weight_hh, bias_ih, bias_hh);
  return lstm_cell(x, x.tape->zeros({2, x.dim(0), hidden_size}, dtype()), weight_ih, weight_hh, bias_ih, bias_hh);
}

LstmPair LSTMCell::forward(const Tensor& x, const Tensor& h, const Tensor& c) const {
  check_cell_input(x, input_size, hidden_size);
  return lstm_cell(x, h, c, weight_ih, weight_hh, bias_ih, bias_hh);
}

// ---- LSTM

LSTM::LSTM(Tape& tape, Rng& rng, int64_t input, int64_t hidden, int64_t layers, bool bias, DType dtype, double p, uint64_t seed)
    : Module(tape, dtype),
      input_size(positive(input, "nn::LSTM", "input_size")),
      hidden_size(positive(hidden, "nn::LSTM", "hidden_size")),
      num_layers(positive(layers, "nn::LSTM", "num_layers")),
      dropout(dropout_p(p, "nn::LSTM")),
      between_(tape, p, seed) {
  // PyTorch's order: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, weight_ih_l1, ...
  for (int64_t l = 0; l < layers; ++l) {
    const std::string s = "_l" + std::to_string(l);
    Layer L;
    L.weight_ih = register_parameter("weight_ih" + s, {4 * hidden, l == 0 ? input : hidden});
    L.weight_hh = register_parameter("weight_hh" + s, {4 * hidden, hidden});
    L.bias_ih = bias ? register_parameter("bias_ih" + s, {4 * hidden}) : tape.persistent({4 * hidden}, dtype);
    L.bias_hh = bias ? register_parameter("bias_hh" + s, {4 * hidden}) : tape.persistent({4 * hidden}, dtype);
    layers_.push_back(L);
  }
  const double bound = 1.0 / std::sqrt(double(hidden));
  for (const auto& [name, p] : own_parameters()) fill_uniform(p, rng, bound);
  last_h_.resize(size_t(layers));
  last_c_.resize(size_t(layers));
}

namespace {
// Steps [s0, s0 + len) of one layer as fused cells from `state` (left at the
// last step's), their h' [1, B, H] stacked along axis 0 as concat() of the
// steps would stack them (runs of at most Node::kMaxInputs, a balanced tree),
// with no list of steps: no heap (as the GRU's gru_steps).
Tensor lstm_steps(const Tensor& x, Tensor& state, int64_t s0, int64_t len, const LSTM::Layer& L) {
  constexpr int64_t G = Node::kMaxInputs;
  const int64_t B = x.dim(1), I = x.dim(2);
  std::array<Tensor, G> parts;
  if (len == 1) {
    state = lstm_cell(reshape(slice(x, 0, s0, 1), {B, I}), state, L.weight_ih, L.weight_hh, L.bias_ih, L.bias_hh);
    return slice(state, 0, 0, 1);  // h'
  }
  if (len <= G) {
    for (int64_t s = 0; s < len; ++s) parts[size_t(s)] = lstm_steps(x, state, s0 + s, 1, L);
    return concat(std::span<const Tensor>(parts.data(), size_t(len)), 0);
  }
  for (int64_t r = 0, at = s0; r < G; ++r) {
    const int64_t n = len / G + (r < len % G ? 1 : 0);
    parts[size_t(r)] = lstm_steps(x, state, at, n, L);
    at += n;
  }
  return concat(std::span<const Tensor>(parts.data(), size_t(G)), 0);
}
}  // namespace

LSTM::Output LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& dropout_masks) {
  // Built only on the error path: a forward allocates nothing.
  auto me = [&] {
    return "nn::LSTM(" + std::to_string(input_size) + ", " + std::to_string(hidden_size) + ", " + std::to_string(num_layers) + ")";
  };
  if (x.rank() != 3 || x.dim(2) != input_size || x.dim(0) < 1)
    throw ShapeError(me() + ": input " + x.describe() + " must be [T, B, " + std::to_string(input_size) + "] with T >= 1");
  const int64_t T = x.dim(0), B = x.dim(1), H = hidden_size;
  if (h0.defined() != c0.defined())
    throw ShapeError(me() + ": h0 and c0 are given together or not at all (zeros), got " +
                     (h0.defined() ? "h0 " + h0.describe() + " alone" : "c0 " + c0.describe() + " alone"));
  for (const Tensor* s : {&h0, &c0})
    if (s->defined() && (s->rank() != 3 || s->dim(0) != num_layers || s->dim(1) != B || s->dim(2) != H))
      throw ShapeError(me() + ": " + (s == &h0 ? "h0 " : "c0 ") + s->describe() + " must be [" + std::to_string(num_layers) + ", " +
                       std::to_string(B) + ", " + std::to_string(H) + "] for input " + x.describe());
  if (dropout_masks.defined()) check_masks(me(), dropout_masks, x, num_layers, H);
  const bool dropping = is_training() && dropout > 0;
  // Layer l runs its T steps as fused cells on the state [2, B, H]; its h' at
  // every step, through the dropout between layers, is layer l+1's input.
  Tensor seq = x, zeros = h0.defined() ? Tensor{} : x.tape->zeros({2, B, H}, dtype());
  for (int64_t l = 0; l < num_layers; ++l) {
    if (l > 0 && dropping) seq = between_layers(between_, seq, dropout_masks, l);
    auto row = [&](const Tensor& t) { return reshape(slice(t, 0, l, 1), {B, H}); };
    Tensor state = h0.defined() ? lstm_state(row(h0), row(c0)) : zeros;
    seq = lstm_steps(seq, state, 0, T, layers_[size_t(l)]);  // [T, B, H]
    last_h_[size_t(l)] = slice(state, 0, 0, 1);
    last_c_[size_t(l)] = slice(state, 0, 1, 1);
  }
  const size_t L = size_t(num_layers);
  return {seq, concat(std::span<const Tensor>(last_h_.data(), L), 0), concat(std::span<const Tensor>(last_c_.data(), L), 0)};
}

void LSTM::dropout_masks(std::span<float> out) {
  if (is_training()) between_.mask(out);
  else std::fill(out.begin(), out.end(), 1.0f);
}
void LSTM::dropout_masks(std::span<double> out) {
  if (is_training()) between_.mask(out);
  else std::fill(out.begin(), out.end(), 1.0);
}

}  // namespace segtape::nn
