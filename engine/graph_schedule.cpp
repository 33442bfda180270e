// engine/graph_schedule.h: CUDA-graph replay's schedule and signatures.
#include "graph_schedule.h"

#include <cstring>

#include "segtape/error.h"
#include "segtape/fnv.h"

namespace segtape::detail {
namespace {
void fnv_mix_tensor(uint64_t& h, const Tensor& t) {
  fnv::mix(h, ptr_bits(t.ptr));
  fnv::mix(h, uint64_t(t.dtype) << 8 | uint64_t(t.shape.rank));
  for (int i = 0; i < t.shape.rank; ++i) fnv::mix(h, uint64_t(t.shape.dims[size_t(i)]));
}
}  // namespace

uint64_t mix4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = fnv::kOffset;
  for (uint64_t v : {a, b, c, d}) fnv::mix(h, v);
  return h;
}

uint64_t bits_of(double v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

uint64_t op_signature(const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>* dst) {
  uint64_t h = fnv::kOffset;
  fnv::mix(h, uint64_t(n.op) | uint64_t(n.n_in) << 8 | uint64_t(dst ? 1 : 0) << 16);
  fnv_mix_tensor(h, n.out);
  for (int i = 0; i < n.n_in; ++i) fnv_mix_tensor(h, n.in[size_t(i)]);
  for (int64_t v : n.ia) fnv::mix(h, uint64_t(v));
  uint64_t fa = 0;
  std::memcpy(&fa, &n.fa, sizeof fa);
  fnv::mix(h, fa);
  fnv::mix(h, ptr_bits(n.saved));
  fnv::mix(h, ptr_bits(gout));
  if (dst)
    for (void* p : *dst) fnv::mix(h, ptr_bits(p));
  return h;
}

namespace call {
uint64_t host_to_device(const void* dst, size_t staged_at, size_t bytes) { return mix4(1, ptr_bits(dst), staged_at, bytes); }
uint64_t device_copy(const void* dst, const void* src, size_t bytes) { return mix4(2, ptr_bits(dst), ptr_bits(src), bytes); }
uint64_t zero(const void* dst, size_t bytes) { return mix4(3, ptr_bits(dst), bytes, 0); }
uint64_t fill(const void* dst, int64_t n, DType d, double value) {
  return mix4(4, ptr_bits(dst), uint64_t(n) << 8 | uint64_t(d), bits_of(value));
}
uint64_t sgd(const void* p, const void* g, const void* buf, int64_t n, DType d, const SgdOptions& s, bool first) {
  return mix4(mix4(5, ptr_bits(p), ptr_bits(g), ptr_bits(buf)), uint64_t(n) << 8 | uint64_t(d),
              mix4(bits_of(s.lr), bits_of(s.momentum), bits_of(s.dampening), bits_of(s.weight_decay)),
              uint64_t(s.nesterov) << 1 | uint64_t(first));
}
uint64_t adam(const void* p, const void* g, const void* m, const void* v, int64_t n, DType d, const AdamOptions& s,
              bool decoupled, int64_t step, const double* step_at) {
  return mix4(mix4(6, ptr_bits(p), ptr_bits(g), mix4(ptr_bits(m), ptr_bits(v), uint64_t(n) << 8 | uint64_t(d), uint64_t(decoupled))),
              mix4(bits_of(s.lr), bits_of(s.beta1), bits_of(s.beta2), bits_of(s.eps)), bits_of(s.weight_decay),
              step_at ? ptr_bits(step_at) : uint64_t(step));
}
uint64_t scale(const void* x, int64_t n, DType d, double factor) {
  return mix4(7, ptr_bits(x), uint64_t(n) << 8 | uint64_t(d), bits_of(factor));
}
uint64_t add_scalar(const void* x, int64_t n, DType d, double value) {
  return mix4(8, ptr_bits(x), uint64_t(n) << 8 | uint64_t(d), bits_of(value));
}
uint64_t add_sum_squares(const void* x, int64_t n, DType d, const double* acc, bool first) {
  return mix4(9, ptr_bits(x), uint64_t(n) << 8 | uint64_t(d), ptr_bits(acc) ^ uint64_t(first));
}
uint64_t clip_scale(const void* x, int64_t n, DType d, const double* sum_sq, double max_norm) {
  return mix4(10, ptr_bits(x), uint64_t(n) << 8 | uint64_t(d), mix4(ptr_bits(sum_sq), bits_of(max_norm), 0, 0));
}
uint64_t device_function(const DeviceFunction& fn, const CallArgs& a) {
  uint64_t h = mix4(11, ptr_bits(fn.name), 0, 0);
  for (size_t k = 0; k < a.ptr.size(); ++k) h = mix4(h, ptr_bits(a.ptr[k]), uint64_t(a.numel[k]), k);
  for (size_t k = 0; k < a.i.size(); ++k) h = mix4(h, uint64_t(a.i[k]), k, 1);
  for (size_t k = 0; k < a.f.size(); ++k) h = mix4(h, bits_of(a.f[k]), k, 2);
  return h;
}
}  // namespace call

void check_graph_options(const Device& device, const TapeOptions& options) {
  if (options.graph_replay && options.anomaly)
    throw Error("Tape(" + device.str() + "): anomaly mode reads every op's output on the host, which a CUDA-graph "
                "segment cannot do: turn off TapeOptions::anomaly or graph_replay");
}

GraphSchedule::Mode GraphSchedule::begin(uint32_t index, bool graph, unsigned slot) {
  segment_ = index;
  mode_ = Mode::Eager;
  staging_used_ = 0;
  eager_asked_ = !graph;
  if (!on_ || !graph) return mode_;
  Graph& g = graphs_[2 * size_t(slot % kSlots) + index % 2];
  if (g.ready) {
    graph_ = &g;
    mode_ = Mode::Replaying;
    replay_pos_ = 0;
    replay_failed_ = false;
  } else if (warm_) {
    g.signatures.clear();
    graph_ = &g;
    mode_ = Mode::Capturing;
  }
  return mode_;
}

bool GraphSchedule::issue(uint64_t sig, const char* what) {
  switch (mode_) {
    case Mode::Eager: return true;
    case Mode::Capturing: graph_->signatures.push_back(sig); return true;
    case Mode::Replaying: break;
  }
  const std::vector<uint64_t>& captured = graph_->signatures;
  if (replay_pos_ >= captured.size() || captured[replay_pos_] != sig) {
    replay_failed_ = true;
    throw TapeError("CUDA graph replay: segment " + std::to_string(segment_) + " issued '" + what + "' as device call #" +
                    std::to_string(replay_pos_ + 1) + ", which differs from the captured segment " +
                    std::to_string(graph_->captured) + " (" + std::to_string(captured.size()) +
                    " calls): a replayed segment must repeat the captured one's ops, shapes, scalar attributes and "
                    "addresses. Call tape.discard_graph() after a change of shape, or turn TapeOptions::graph_replay off");
  }
  ++replay_pos_;
  return false;
}

GraphSchedule::End GraphSchedule::end(bool abandoned, std::string& pending) {
  const Mode m = mode_;
  mode_ = Mode::Eager;
  switch (m) {
    case Mode::Eager:
      if (on_ && !abandoned && !eager_asked_) warm_ = true;
      return End::Nothing;
    case Mode::Capturing:
      if (abandoned) {
        graph_->signatures.clear();
        return End::DropCapture;
      }
      graph_->captured = segment_;
      return End::Instantiate;
    case Mode::Replaying:
      if (abandoned || replay_failed_) return End::Nothing;  // the error went to the caller; nothing to run
      if (replay_pos_ != graph_->signatures.size()) {
        pending = "CUDA graph replay: segment " + std::to_string(segment_) + " issued " + std::to_string(replay_pos_) +
                  " device calls where the captured segment " + std::to_string(graph_->captured) + " issued " +
                  std::to_string(graph_->signatures.size()) +
                  "; its graph was not run (its values are undefined). Call tape.discard_graph() after a change of "
                  "shape, or turn TapeOptions::graph_replay off";
        return End::Nothing;
      }
      ++replays_;
      return End::Launch;
  }
  return End::Nothing;
}

void GraphSchedule::cancel_capture() {
  if (mode_ == Mode::Capturing) graph_->signatures.clear();
  mode_ = Mode::Eager;
}

size_t GraphSchedule::stage(size_t bytes) {
  const size_t at = staging_used_;
  if (at + align_up(bytes) > staging_cap_)
    throw BudgetError("tape.from() in a CUDA-graph segment: the segment's host inputs exceed TapeOptions::graph_staging (" +
                      format_bytes(staging_cap_) + "): raise it");
  staging_used_ += align_up(bytes);
  return at;
}

void GraphSchedule::check_host_read() const {
  if (in_graph_segment())
    throw TapeError("reading a value on the host (item(), to_host()) inside a CUDA-graph segment: its values exist "
                    "only once the segment has ended and its graph has run. Read it after the segment (copy_into a "
                    "persistent tensor inside it), or turn TapeOptions::graph_replay off");
}

void GraphSchedule::check_synchronize() const {
  if (in_graph_segment()) throw TapeError("tape.synchronize() inside a CUDA-graph segment: its work runs when the segment ends");
}

void GraphSchedule::check_norm() const {
  if (in_graph_segment())
    throw TapeError("grad_squared_norm (clip_grad_norm) inside a CUDA-graph segment: it returns a value to the host, "
                    "which exists only once the segment has ended; clip after the segment");
}

void GraphSchedule::captured() {
  if (!graph_) return;
  graph_->ready = true;
  ++captures_;
}

void GraphSchedule::forget() {
  for (Graph& g : graphs_) g = Graph{};
  graph_ = nullptr;
}

void GraphSchedule::discard() {
  if (in_graph_segment()) throw TapeError("tape.discard_graph() inside a CUDA-graph segment: call it between segments");
  forget();
  warm_ = false;
}

}  // namespace segtape::detail
