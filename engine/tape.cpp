#include "segtape/tape.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "backend.h"
#include "segtape/emulation.h"
#include "tape_internals.h"

namespace segtape {

const char* op_name(OpKind k) {
  static constexpr const char* names[] = {
#define SEGTAPE_NAME(name) #name,
      SEGTAPE_OPS(SEGTAPE_NAME)
#undef SEGTAPE_NAME
  };
  return size_t(k) < kOpKinds ? names[size_t(k)] : "?";
}

namespace detail {
// Backward's free list of dead gradient buffers, by exact aligned size. The
// links are kept on the host (device memory cannot hold them for us). The
// slots are given to sizes anew in each backward, in the order they come;
// every stack holds kDepth links from the start and keeps what it grew to,
// so a backward allocates nothing unless more than kDepth dead buffers of
// one size wait at once (a shorter segment, whose sizes land on other
// slots, included: a language model's last chunk of an epoch).
struct FreeList {
  static constexpr size_t kDepth = 64;
  FreeList() {
    for (auto& s : stack) s.reserve(kDepth);
  }
  std::array<size_t, 32> size{};
  std::array<std::vector<void*>, 32> stack;
  int n = 0;
  void clear() {
    for (int k = 0; k < n; ++k) stack[size_t(k)].clear();
    n = 0;
  }
  void put(void* p, size_t bytes) {
    for (int k = 0; k < n; ++k)
      if (size[size_t(k)] == bytes) return stack[size_t(k)].push_back(p);
    if (n == int(size.size())) return;  // more distinct sizes than slots: let the arena keep it
    size[size_t(n)] = bytes;
    stack[size_t(n++)].push_back(p);
  }
  void* take(size_t bytes) {
    for (int k = 0; k < n; ++k)
      if (size[size_t(k)] == bytes && !stack[size_t(k)].empty()) {
        void* p = stack[size_t(k)].back();
        stack[size_t(k)].pop_back();
        return p;
      }
    return nullptr;
  }
};
}  // namespace detail

namespace {
// A CUDA tape's backend checks for a GPU first.
std::unique_ptr<detail::Backend> make_backend(const Device& d, const TapeOptions& o) {
  if (d.kind == Device::Kind::CPU) return detail::make_cpu_backend(d, o);
  if (emulation::emulating_cuda_on_host()) return detail::make_host_emulated_backend(d, o);
  return detail::make_cuda_backend(d, o);
}
ChunkAllocator pool_memory(detail::Backend* be, const char* what) { return be->allocator(what); }
}  // namespace

// On a device every pool is one fixed allocation (no growth: a segment runs
// at the same addresses every time); on the CPU they grow in chunks.
Tape::Tape(Device device, TapeOptions options)
    : device_(device),
      options_(options),
      backend_(make_backend(device, options)),
      arena_(options.segment_budget, options.grow, options.grow_limit,
             pool_memory(backend_.get(), kSegmentArenaPool)),
      pool_(device_pools() ? options.device_persistent : options.persistent_chunk, !device_pools(), 0,
            pool_memory(backend_.get(), device_pools() ? "persistent pool (TapeOptions::device_persistent)" : "persistent pool")),
      carry_{Arena(device_pools() ? options.device_carry : options.carry_chunk, !device_pools(), 0,
                   pool_memory(backend_.get(), device_pools() ? "carry buffer (TapeOptions::device_carry)" : "carry buffer")),
             Arena(device_pools() ? options.device_carry : options.carry_chunk, !device_pools(), 0,
                   pool_memory(backend_.get(), device_pools() ? "carry buffer (TapeOptions::device_carry)" : "carry buffer"))},
      scratch_(device_pools() ? options.device_workspace : size_t(64) << 10, !device_pools(), 0,
               pool_memory(backend_.get(), device_pools() ? "op workspace (TapeOptions::device_workspace)" : "op workspace")),
      free_(std::make_unique<detail::FreeList>()) {
  // Nodes count against the budget: never reserve more than it can hold.
  // (SIZE_MAX reached vector::reserve's length_error, naming nothing; the array grows past the reserve when it must)
  constexpr size_t kMaxNodes = size_t(1) << 24;
  if (options.node_capacity > kMaxNodes)
    throw Error("TapeOptions::node_capacity " + std::to_string(options.node_capacity) + ": reserve at most 2^24 nodes "
                "(the node array grows past it when a segment needs more)");
  const size_t budget = arena_.budget();
  nodes_.reserve(budget ? std::min(options.node_capacity, budget / sizeof(Node)) : options.node_capacity);
  params_.reserve(256);
  leaf_grads_.reserve(16);
  writes_.reserve(64);
  if (device_pools()) grad_table_.reserve(options.node_capacity);
}

Tape::~Tape() = default;

Segment Tape::segment() { return open_segment(!options_.graph_explicit); }
Segment Tape::eager_segment() { return open_segment(false); }
Segment Tape::graph_segment(unsigned slot) {
  if (slot > 1) throw Error("tape.graph_segment(" + std::to_string(slot) + "): the slots are 0 and 1");
  return open_segment(true, slot);
}

Segment Tape::open_segment(bool graph, unsigned slot) {
  if (open_)
    throw TapeError("tape.segment(): segment " + std::to_string(seg_index_) +
                    " is still open; end it (let its Segment go out of scope, or call end()) before opening the next");
  backend_->segment_begin(seg_index_ + 1, graph, slot);  // may raise what the last segment left behind
  ++seg_index_;
  open_ = true;
  arena_.reset();
  arena_.reset_peak();
  carry_[seg_index_ % 2].reset();  // frees what was carried two segments ago
  nodes_.clear();
  leaf_grads_.clear();
  arena_.set_outside(0);
  node_peak_ = 0;
  seg_first_step_ = step_;
  bytes_by_op_.fill(0);
  grad_bytes_ = 0;
  released_any_ = false;
  writes_.clear();
  return Segment(this);
}

void Tape::end_segment(bool abandoned) {
  if (!open_) return;
  last_segment_peak_ = arena_.peak();
  open_ = false;
  nodes_.clear();
  leaf_grads_.clear();
  arena_.set_outside(0);
  arena_.reset();
  released_any_ = false;
  writes_.clear();
  backend_->segment_end(abandoned);  // launches a captured / replayed CUDA graph
}

void* Tape::native_stream() const { return backend_->native_stream(); }

void Tape::synchronize() { backend_->synchronize(); }

void Tape::discard_graph() { backend_->discard_graph(); }

void Tape::set_anomaly(bool on) {
  if (on && options_.graph_replay)
    throw TapeError("set_anomaly(true): anomaly mode reads every op's output on the host, which a CUDA graph "
                    "segment cannot do; turn TapeOptions::graph_replay off to use it");
  options_.anomaly = on;
}

void Tape::fill_zero(void* p, size_t bytes) {
  if (!bytes) return;
  backend_->zero(p, bytes);
}

bool Tape::device_pools() const { return backend_->device_memory(); }

bool Tape::is_live(const Tensor& t) const {
  switch (t.space) {
    case Space::None: return false;
    case Space::Persistent: return true;
    case Space::Segment: return open_ && t.gen == seg_index_;
    case Space::Carry: return t.gen == seg_index_ || t.gen + 1 == seg_index_;
  }
  return false;
}

void* Tape::alloc(size_t bytes, OpKind kind, const char* op) {
  return segment_alloc(bytes, op_name(kind), op, bytes_by_op_[size_t(kind)]);
}

void* Tape::alloc(size_t bytes, GradBuffers, const char* op) { return segment_alloc(bytes, "Grad", op, grad_bytes_); }

void* Tape::segment_alloc(size_t bytes, const char* kind, const char* op, size_t& counted) {
  if (!open_)
    throw TapeError(std::string(op) + ": no segment is open; open one with tape.segment() (tensors made outside a segment would have nowhere to live)");
  void* p = arena_.try_alloc(bytes);
  if (!p) throw BudgetError(budget_report(bytes, kind, op));
  counted += align_up(bytes);
  return p;
}

Tensor Tape::make(const Shape& s, DType d, OpKind kind, const char* op) {
  Tensor t;
  t.ptr = alloc(size_t(s.numel()) * dtype_size(d), kind, op);
  t.tape = this;
  t.shape = s;
  t.gen = seg_index_;
  t.step = uint32_t(step_);
  t.dtype = d;
  t.space = Space::Segment;
  return t;
}

Tensor Tape::persistent_alloc(const Shape& s, DType d) {
  s.check("tape.parameter() / persistent()");
  Tensor t;
  const size_t n = size_t(s.numel()) * dtype_size(d);
  t.ptr = pool_.try_alloc(n);
  if (!t.ptr && device_pools())  // a device pool is fixed
    throw BudgetError("tape.parameter() / persistent(): the persistent pool on " + device_.str() + " is full (" +
                      format_bytes(pool_.used()) + " of " + format_bytes(pool_.reserved()) + " in use, asked for " +
                      format_bytes(align_up(n)) + " for " + std::string(dtype_name(d)) + s.str() +
                      "): raise TapeOptions::device_persistent");
  if (!t.ptr)  // the host pool grows: only a request beyond any memory gets here
    throw OutOfMemoryError("tape.parameter() / persistent(): out of memory for " + std::string(dtype_name(d)) + s.str() + " (" +
                               std::to_string(n) + " bytes)",
                           pool_.what());
  fill_zero(t.ptr, n);
  t.tape = this;
  t.shape = s;
  t.dtype = d;
  t.space = Space::Persistent;
  return t;
}

Tensor Tape::parameter(const Shape& s, DType d) {
  if (d == DType::I64) throw ShapeError("tape.parameter(): parameters are floating point, got i64");
  Tensor t = persistent_alloc(s, d);
  t.grad = persistent_alloc(s, d).ptr;
  t.requires_grad = true;
  params_.push_back(t);
  return t;
}

Tensor Tape::persistent(const Shape& s, DType d) { return persistent_alloc(s, d); }

Tensor Tape::empty(const Shape& s, DType d) {
  s.check("tape.empty()");
  return make(s, d, OpKind::Input, "tape.empty()");
}

Tensor Tape::zeros(const Shape& s, DType d) {
  s.check("tape.zeros()");
  Tensor t = make(s, d, OpKind::Input, "tape.zeros()");
  fill_zero(t.ptr, t.nbytes());
  return t;
}

namespace {
template <class T>
Tensor from_impl(Tape& tape, std::span<const T> v, const Shape& s) {
  s.check("tape.from()");
  if (int64_t(v.size()) != s.numel())
    throw ShapeError("tape.from(): " + std::to_string(v.size()) + " values for shape " + s.str() + " (" +
                     std::to_string(s.numel()) + " elements)");
  Tensor t = detail::TapeInternals::make(tape, s, dtype_of<T>(), OpKind::Input, "tape.from()");
  if (v.empty()) return t;
  detail::TapeInternals::backend(tape)->copy(t.ptr, v.data(), v.size_bytes(), detail::Backend::Copy::HostToDevice);
  return t;
}
}  // namespace

Tensor Tape::from(std::span<const float> v, const Shape& s) { return from_impl(*this, v, s); }
Tensor Tape::from(std::span<const double> v, const Shape& s) { return from_impl(*this, v, s); }
Tensor Tape::from(std::span<const int64_t> v, const Shape& s) { return from_impl(*this, v, s); }

void Tape::zero_grad() {
  for (const Tensor& p : params_) fill_zero(p.grad, p.nbytes());
}

void* Tape::scratch(size_t bytes) {
  void* p = scratch_.try_alloc(bytes);
  if (!p && device_pools())
    throw BudgetError("segtape: the op workspace on " + device_.str() + " (" + format_bytes(scratch_.budget()) + ") cannot hold " +
                      format_bytes(align_up(bytes)) + " more: raise TapeOptions::device_workspace");
  if (!p) throw OutOfMemoryError("segtape: out of memory in the op workspace (" + std::to_string(bytes) + " bytes)", scratch_.what());
  return p;
}

bool Tape::wants_grad(std::span<const Tensor> inputs) const {
  if (!grad_enabled_) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad) return true;
  return false;
}

Node& Tape::record(const Node& src) {
  // A node is segment memory: it counts against the budget with the arena.
  const size_t budget = arena_.budget();
  const size_t node_bytes = (nodes_.size() + 1) * sizeof(Node);
  if (budget && arena_.used() + node_bytes > budget)
    throw BudgetError(budget_report(sizeof(Node), op_name(src.op), (std::string("recording a tape node for ") + op_name(src.op)).c_str()));
  if (nodes_.size() == nodes_.capacity()) {  // grow within what the budget can hold
    size_t cap = std::max<size_t>(64, 2 * nodes_.capacity());
    if (budget) cap = std::min(cap, std::max(budget / sizeof(Node), nodes_.size() + 1));
    nodes_.reserve(cap);
  }
  Node& n = nodes_.emplace_back(src);
  arena_.set_outside(node_bytes);
  node_peak_ = std::max(node_peak_, node_bytes);
  n.step = uint32_t(step_);
  Tensor& out = n.out;
  out.node = int32_t(nodes_.size() - 1);
  out.requires_grad = true;
  // A node index means "this segment's tape": whatever space the bytes live
  // in (a view of a parameter or of a carried value), the handle now
  // belongs to the open segment and expires with it.
  out.space = Space::Segment;
  out.gen = seg_index_;
  out.step = uint32_t(step_);
  return n;
}

void Tape::check_output(const Tensor& out, OpKind k) {
  if (!options_.anomaly || out.dtype == DType::I64) return;
  const auto [bad, v] = backend_->first_nonfinite(out);
  if (bad >= 0) {
    throw AnomalyError("anomaly mode: op '" + std::string(op_name(k)) + "' at step " + std::to_string(step_) +
                       " (segment " + std::to_string(seg_index_) + ") produced " + (std::isnan(v) ? "NaN" : "Inf") +
                       " at element " + std::to_string(bad) + " of its output " + std::string(dtype_name(out.dtype)) +
                       out.shape.str() + ": the first non-finite value of this segment starts here");
  }
}

TapeStats Tape::stats() const {
  TapeStats s;
  s.live_bytes = open_ ? arena_.used() : 0;
  s.peak_bytes = arena_.peak();
  s.last_segment_peak = last_segment_peak_;
  s.host_reads = host_reads_;
  s.node_count = nodes_.size();
  s.node_bytes = nodes_.size() * sizeof(Node);
  s.node_peak_bytes = node_peak_;
  s.persistent_bytes = pool_.used();
  s.carry_bytes = carry_[0].used() + carry_[1].used();
  s.workspace_bytes = scratch_.reserved() + backend_->workspace_bytes();
  s.system_allocations = memory::system_allocations();
  s.segment_index = seg_index_;
  s.step = step_;
  s.bytes_by_op = bytes_by_op_;
  s.grad_bytes = grad_bytes_;
  if (device_pools())
    s.device_bytes = arena_.reserved() + pool_.reserved() + carry_[0].reserved() + carry_[1].reserved() +
                     scratch_.reserved() + backend_->internal_device_bytes();
  s.device_allocations = memory::device_allocations();
  std::tie(s.graph_captures, s.graph_replays) = backend_->graph_counts();
  return s;
}

// ---- backward ----

namespace {
// One term of the objective: a tensor of the segment with the gradient it
// starts with (nullptr: a one-element loss, whose gradient is 1).
struct Root {
  const Tensor* t;
  const Tensor* seed;
};
}  // namespace

void Tape::note_write(const void* p, size_t bytes, const char* by) {
  if (!open_ || nodes_.empty() || !bytes) return;  // nothing recorded yet reads anything
  const Write w{p, bytes, nodes_.size(), by ? by : "a write"};
  // The same bytes written again: the later write stales every node the
  // earlier one did and more, so it replaces it. The log holds one entry per
  // range written in the segment (a few tensors), not one per write.
  for (Write& e : writes_)
    if (e.p == w.p && e.bytes == w.bytes) {
      e = w;
      return;
    }
  writes_.push_back(w);  // (capacity kept across segments)
}

// Before a backward that follows a non-retained backward or a write (only
// then: one backward per segment pays nothing): walks what the roots (marked
// in reach_) reach, without computing anything, and refuses before any
// gradient is added if that is a released node, or a node whose backward
// reads bytes written after it was recorded (PyTorch's "modified by an
// inplace operation"). A refusal found mid-walk would have left the
// parameters' gradients partly accumulated.
void Tape::check_reached(size_t count, bool check_writes) {
  if (check_writes) {  // by address, each with the highest end so far: refuse_overwritten looks up only the writes near an operand
    std::sort(writes_.begin(), writes_.end(), [](const Write& a, const Write& b) { return a.p < b.p; });
    uintptr_t reach = 0;
    for (Write& w : writes_) w.reach = reach = std::max(reach, reinterpret_cast<uintptr_t>(w.p) + w.bytes);
  }
  for (size_t i = count; i-- > 0;) {
    if (!reach_[i] || nodes_[i].op == OpKind::Input) continue;
    const Node& n = nodes_[i];
    if (n.released)
      throw TapeError("backward: trying to backward through the segment's tape a second time (node " +
                      std::to_string(i) + ", op '" + op_name(n.op) + "' at step " + std::to_string(n.step) +
                      ", was released by an earlier backward; no gradient was changed). Pass {.retain_graph = true} "
                      "to the earlier backward, or detach / carry the state so the new loss does not reach back into "
                      "released history");
    if (check_writes) refuse_overwritten(i, n);
    for (int j = 0; j < n.n_in; ++j)
      if (n.in[j].requires_grad && n.in[j].node >= 0) reach_[size_t(n.in[j].node)] = 1;
  }
}

// Refuses node i if an operand its backward reads (Node::reads: in[j], or
// out at bit kMaxInputs) overlaps a write logged after it was recorded.
// writes_ is sorted by address (check_reached): the writes that may overlap
// an operand [a, a + n) start below a + n, and are found walking down from
// there until no earlier write reaches past a.
void Tape::refuse_overwritten(size_t i, const Node& n) const {
  for (int j = 0; j <= Node::kMaxInputs; ++j) {
    if (!(n.reads & (1 << j)) || (j < Node::kMaxInputs && j >= n.n_in)) continue;
    const Tensor& t = j < Node::kMaxInputs ? n.in[size_t(j)] : n.out;
    const auto a = reinterpret_cast<uintptr_t>(t.ptr), end = a + t.nbytes();
    auto k = std::lower_bound(writes_.begin(), writes_.end(), end,
                              [](const Write& w, uintptr_t e) { return reinterpret_cast<uintptr_t>(w.p) < e; });
    while (k != writes_.begin()) {
      const Write& w = *--k;
      if (w.reach <= a) break;  // (neither this write nor any below it reaches the operand)
      if (w.nodes <= i) continue;  // written before the node was recorded
      if (!detail::bytes_overlap(t.ptr, t.nbytes(), w.p, w.bytes)) continue;
      const std::string what = j < Node::kMaxInputs ? "its input " + std::to_string(j) : std::string("its output");
      throw TapeError("backward: op '" + std::string(op_name(n.op)) + "' (node " + std::to_string(i) + ", step " +
                      std::to_string(n.step) + ") reads " + what + ", " + t.describe() + ", as it was when the op " +
                      "was recorded, but " + w.by + " wrote into it after that, so its gradient would be wrong " +
                      "(PyTorch: \"modified by an inplace operation\"); no gradient was changed. Write it after "
                      "this backward, or record the op after the write");
    }
  }
}

void Tape::backward(const Tensor* loss, std::span<const Seed> seeds, bool retain, bool allow_overwritten) {
  std::array<Root, 16> roots_buf;
  if (seeds.size() + 1 > roots_buf.size())
    throw TapeError("backward: " + std::to_string(seeds.size()) + " seeds; at most " + std::to_string(roots_buf.size() - 1) + " per call");
  size_t n_roots = 0;
  if (loss) roots_buf[n_roots++] = {loss, nullptr};
  for (const Seed& s : seeds) roots_buf[n_roots++] = {&s.out, &s.grad};
  const std::span<const Root> roots(roots_buf.data(), n_roots);
  if (roots.empty()) throw TapeError("backward: nothing to differentiate (no loss and no seeds)");
  int32_t last = -1;
  for (const Root& r : roots) {
    const Tensor& root = *r.t;
    const char* what = r.seed ? "backward (seeded tensor)" : "backward";
    root.check_live(what);
    if (root.tape != this) throw TapeError(std::string(what) + ": the tensor belongs to another tape");
    if (!root.requires_grad || root.node < 0)
      throw TapeError(std::string(what) + ": " + root.describe() +
                      " has no history (it was made under NoGradGuard, detached, carried, or from inputs that need no gradient)");
    if (nodes_[size_t(root.node)].op == OpKind::Input)
      throw TapeError(std::string(what) + ": " + root.describe() +
                      " is an input() leaf: its gradient would be its own seed; seed a tensor computed from it");
    if (nodes_[size_t(root.node)].released)
      throw TapeError("backward: trying to backward through the segment's tape a second time: " + root.describe() +
                      " (node " + std::to_string(root.node) + ", op '" + op_name(nodes_[size_t(root.node)].op) +
                      "') was released by an earlier backward. Pass {.retain_graph = true} to the first backward if you "
                      "really need a second one (or, for an agent loop, end the segment and carry the state instead of "
                      "keeping the graph)");
    if (r.seed) {
      r.seed->check_live("backward (seed gradient)");
      if (!(r.seed->shape == root.shape) || r.seed->dtype != root.dtype)
        throw ShapeError("backward: seed gradient " + r.seed->describe() + " does not match its tensor " + root.describe());
      if (r.seed->tape != this) throw TapeError("backward: a seed gradient belongs to another tape");
    } else if (root.numel() != 1) {
      throw ShapeError("backward: " + root.describe() + " has " + std::to_string(root.numel()) +
                       " elements; backward(loss) needs a single-element loss (or pass the output gradient)");
    }
    for (const Root& o : roots)
      if (&o != &r && o.t->node == root.node)
        throw TapeError("backward: " + root.describe() + " is given twice (as the loss or a seed); pass each tensor once");
    last = std::max(last, root.node);
  }
  const size_t count = size_t(last) + 1;
  const bool check_writes = !writes_.empty() && !allow_overwritten;
  if (released_any_ || check_writes) {
    reach_.assign(count, 0);
    for (const Root& r : roots) reach_[size_t(r.t->node)] = 1;
    check_reached(count, check_writes);
  }
  void** grads;
  if (device_pools()) {  // host data: kept off the device arena
    grad_table_.assign(count, nullptr);
    grads = grad_table_.data();
  } else {
    grads = static_cast<void**>(alloc(count * sizeof(void*), GradBuffers{}, "backward"));
    std::memset(grads, 0, count * sizeof(void*));
  }
  // A node's gradient is dead once the node has been processed (its consumers
  // all come later on the tape): its buffer goes to the free list by size and
  // is reused, so backward's working set stays a few buffers, not one per node.
  free_->clear();
  auto grad_buffer = [&](int32_t node) -> void* {
    if (!grads[node]) {
      const size_t bytes = align_up(nodes_[node].out.nbytes());
      void* p = free_->take(bytes);
      grads[node] = p ? p : alloc(bytes, GradBuffers{}, "backward");
      fill_zero(grads[node], bytes);
    }
    return grads[node];
  };
  // input() leaves keep their gradient across backward calls: it accumulates.
  for (const auto& [node, buf] : leaf_grads_)
    if (buf && size_t(node) < count) grads[node] = buf;
  for (const Root& r : roots) {
    const Tensor& root = *r.t;
    void* g0 = grad_buffer(root.node);  // a fresh zeroed buffer: no root is an input() leaf or given twice
    if (r.seed) backend_->copy(g0, r.seed->ptr, root.nbytes(), detail::Backend::Copy::DeviceToDevice);
    else backend_->fill(g0, 1, root.dtype, 1.0);
  }

  backend_->backward_begin(*this, last);
  for (int64_t i = last; i >= 0; --i) {
    if (!grads[i]) continue;
    if (nodes_[i].op == OpKind::Input) {  // an input() leaf: its gradient is kept for grad(), not freed
      for (auto& lg : leaf_grads_)
        if (lg.first == i) lg.second = grads[i];
      continue;
    }
    const Node& n = nodes_[i];
    std::array<void*, Node::kMaxInputs> dst{};
    for (int j = 0; j < n.n_in; ++j) {
      const Tensor& in = n.in[j];
      if (!in.requires_grad) continue;
      if (in.node >= 0) dst[j] = grad_buffer(in.node);
      else dst[j] = in.grad;
    }
    scratch_.reset();
    if (!retain) nodes_[size_t(i)].released = released_any_ = true;  // (before: a failure midway has spent it too)
    backend_->backward(*this, n, grads[i], dst);
    free_->put(grads[i], align_up(n.out.nbytes()));
    grads[i] = nullptr;
  }
  backend_->backward_end(*this);
}

Tensor Tape::input(const Tensor& x) {
  x.check_live("seg.input");
  if (!open_) throw TapeError("seg.input: no segment is open");
  if (x.tape != this) throw TapeError("seg.input: " + x.describe() + " belongs to another tape");
  if (x.dtype == DType::I64) throw ShapeError("seg.input: gradients need a floating tensor, got " + x.describe());
  if (!grad_enabled_)
    throw TapeError("seg.input: under NoGradGuard nothing is recorded, so no gradient could be reported for " + x.describe());
  Node n;
  n.op = OpKind::Input;
  n.out = x;
  n.out.node = -1;
  n.out.grad = nullptr;
  n.out.requires_grad = false;
  const Tensor out = record(n).out;
  leaf_grads_.push_back({out.node, nullptr});
  return out;
}

Tensor Tape::input_grad(const Tensor& leaf) {
  leaf.check_live("seg.grad");
  if (leaf.tape != this) throw TapeError("seg.grad: " + leaf.describe() + " belongs to another tape");
  for (auto& [node, buf] : leaf_grads_) {
    if (node != leaf.node) continue;
    if (!buf) {  // nothing reached it (yet): its gradient is zero
      buf = alloc(align_up(leaf.nbytes()), GradBuffers{}, "seg.grad");
      fill_zero(buf, align_up(leaf.nbytes()));
    }
    Tensor g = leaf;
    g.ptr = buf;
    g.node = -1;
    g.grad = nullptr;
    g.requires_grad = false;
    return g;
  }
  throw TapeError("seg.grad: " + leaf.describe() + " is not an input() leaf of this segment; make it with x = seg.input(value)");
}

namespace {
Tape& open_tape(Tape* t, const char* what) {
  if (!t)
    throw TapeError(std::string(what) + ": this Segment has ended (or was moved from); open a new one with tape.segment()");
  return *t;
}
}  // namespace
void Segment::backward(const Tensor& loss, BackwardOptions o) { open_tape(tape_, "backward").backward(&loss, {}, o.retain_graph, o.allow_overwritten); }
void Segment::backward(const Tensor& out, const Tensor& g, BackwardOptions o) {
  const Seed seed{out, g};
  open_tape(tape_, "backward").backward(nullptr, std::span<const Seed>(&seed, 1), o.retain_graph, o.allow_overwritten);
}
void Segment::backward(const Tensor& loss, std::initializer_list<Seed> seeds, BackwardOptions o) {
  open_tape(tape_, "backward").backward(&loss, std::span<const Seed>(seeds.begin(), seeds.size()), o.retain_graph, o.allow_overwritten);
}
void Segment::backward(std::initializer_list<Seed> seeds, BackwardOptions o) {
  open_tape(tape_, "backward").backward(nullptr, std::span<const Seed>(seeds.begin(), seeds.size()), o.retain_graph, o.allow_overwritten);
}
void Segment::backward(const Tensor* loss, std::span<const Seed> seeds, BackwardOptions o) {
  open_tape(tape_, "backward").backward(loss, seeds, o.retain_graph, o.allow_overwritten);
}
Tensor Segment::input(const Tensor& x) { return open_tape(tape_, "seg.input").input(x); }
Tensor Segment::grad(const Tensor& leaf) { return open_tape(tape_, "seg.grad").input_grad(leaf); }
Tensor Segment::carry(const Tensor& x) { return open_tape(tape_, "carry").carry(x); }
Tape& Segment::tape() { return open_tape(tape_, "Segment::tape"); }
void Segment::end() {
  if (tape_) tape_->end_segment();
  tape_ = nullptr;
}

Tensor Tape::carry(const Tensor& x) {
  x.check_live("carry");
  if (!open_) throw TapeError("carry: no segment is open");
  if (x.tape != this) throw TapeError("carry: " + x.describe() + " belongs to another tape");
  Tensor c = x;
  c.ptr = carry_[seg_index_ % 2].try_alloc(x.nbytes());
  if (!c.ptr && device_pools())
    throw BudgetError("carry: the carry buffer on " + device_.str() + " (" + format_bytes(carry_[0].budget()) + ") cannot hold " +
                      x.describe() + " more: raise TapeOptions::device_carry");
  if (!c.ptr)
    throw OutOfMemoryError("carry: out of memory for " + x.describe() + " (" + std::to_string(x.nbytes()) + " bytes)",
                           carry_[0].what());
  backend_->copy(c.ptr, x.ptr, x.nbytes(), detail::Backend::Copy::DeviceToDevice);
  c.space = Space::Carry;
  c.gen = seg_index_;
  c.node = -1;
  c.grad = nullptr;
  c.requires_grad = false;
  return c;
}

}  // namespace segtape
