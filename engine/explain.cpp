#include "segtape/explain.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace segtape {

size_t node_arena_bytes(const Node& n) {
  // Node::bytes is output + saved before alignment; the arena rounded each
  // allocation separately. A view (reshape) allocated nothing.
  const size_t out = std::min(n.bytes, n.out.nbytes());
  const size_t saved = n.bytes - out;
  return (out ? align_up(out) : 0) + (saved ? align_up(saved) : 0);
}

namespace {

size_t saved_arena_bytes(const Node& n) {
  const size_t saved = n.bytes - std::min(n.bytes, n.out.nbytes());
  return saved ? align_up(saved) : 0;
}

std::string pct(size_t part, size_t whole) {
  char b[16];
  std::snprintf(b, sizeof b, "%5.1f%%", whole ? 100.0 * double(part) / double(whole) : 0.0);
  return b;
}

// A string inside a DOT "..." label.
std::string dot_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

Explanation explain(const Tape& tape, size_t top) {
  Explanation e;
  const TapeStats st = tape.stats();
  e.segment = tape.segment_index();
  e.open = tape.segment_open();
  if (!e.open) return e;
  e.arena_bytes = st.live_bytes;
  e.arena_by_op = st.bytes_by_op;
  e.grad_bytes = st.grad_bytes;
  const std::vector<Node>& nodes = tape.nodes();
  e.node_count = nodes.size();
  // The largest nodes: a min-heap of at most `top` entries (O(n log top)).
  auto smaller = [](const NodeBytes& a, const NodeBytes& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.index < b.index; };
  e.largest.reserve(std::min(top, nodes.size()) + 1);  // (a top above the node count: every node)
  bool sorted_steps = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const size_t b = node_arena_bytes(n);
    e.node_bytes += b;
    e.node_bytes_by_op[size_t(n.op)] += b;
    ++e.nodes_by_op[size_t(n.op)];
    // Steps only grow while a segment is open, so nodes arrive grouped by step.
    if (!e.by_step.empty() && e.by_step.back().step == n.step) {
      e.by_step.back().bytes += b;
      ++e.by_step.back().nodes;
    } else {
      if (!e.by_step.empty() && n.step < e.by_step.back().step) sorted_steps = false;
      e.by_step.push_back({n.step, b, 1});
    }
    if (top == 0 || b == 0) continue;
    NodeBytes nb{uint32_t(i), n.op, n.step, b, saved_arena_bytes(n), n.out.shape, n.out.dtype};
    if (e.largest.size() < top) {
      e.largest.push_back(nb);
      std::push_heap(e.largest.begin(), e.largest.end(), smaller);
    } else if (smaller(nb, e.largest.front())) {
      std::pop_heap(e.largest.begin(), e.largest.end(), smaller);
      e.largest.back() = nb;
      std::push_heap(e.largest.begin(), e.largest.end(), smaller);
    }
  }
  std::sort_heap(e.largest.begin(), e.largest.end(), smaller);
  if (!sorted_steps) {  // defensive: merge runs of equal steps after sorting
    std::sort(e.by_step.begin(), e.by_step.end(), [](const StepBytes& a, const StepBytes& b) { return a.step < b.step; });
    std::vector<StepBytes> merged;
    for (const StepBytes& s : e.by_step) {
      if (!merged.empty() && merged.back().step == s.step) merged.back().bytes += s.bytes, merged.back().nodes += s.nodes;
      else merged.push_back(s);
    }
    e.by_step.swap(merged);
  }
  if (!e.by_step.empty()) e.first_step = e.by_step.front().step, e.last_step = e.by_step.back().step;
  return e;
}

double Explanation::bytes_per_step() const {
  if (by_step.size() < 2) return 0;
  return double(node_bytes) / double(last_step - first_step + 1);
}

std::string Explanation::report(size_t max_rows) const {
  if (!open) return "no segment is open: nothing is held (the last segment's arena was reset when it ended)\n";
  std::string r;
  const size_t steps = by_step.empty() ? 0 : size_t(last_step - first_step + 1);
  r += "segment " + std::to_string(segment) + ": " + format_bytes(arena_bytes) + " in the arena, " +
       std::to_string(node_count) + " tape nodes" +
       (steps ? " over steps " + std::to_string(first_step) + ".." + std::to_string(last_step) + " (" +
                    std::to_string(steps) + " steps)"
              : std::string()) +
       "\n";
  const size_t inputs = arena_by_op[size_t(OpKind::Input)], grads = grad_bytes;
  size_t untracked = 0;  // outputs of ops that recorded no node (no grad needed)
  for (size_t k = 0; k < kOpKinds; ++k)
    if (k != size_t(OpKind::Input) && arena_by_op[k] > node_bytes_by_op[k])
      untracked += arena_by_op[k] - node_bytes_by_op[k];
  r += "  held by tape nodes       " + pad(format_bytes(node_bytes), 11) + pct(node_bytes, arena_bytes) + "\n";
  r += "  backward's buffers       " + pad(format_bytes(grads), 11) + pct(grads, arena_bytes) + "\n";
  r += "  inputs (from / zeros)    " + pad(format_bytes(inputs), 11) + pct(inputs, arena_bytes) + "\n";
  r += "  outputs without history  " + pad(format_bytes(untracked), 11) + pct(untracked, arena_bytes) + "\n";

  std::vector<size_t> kinds;
  for (size_t k = 0; k < kOpKinds; ++k)
    if (nodes_by_op[k]) kinds.push_back(k);
  std::sort(kinds.begin(), kinds.end(), [&](size_t a, size_t b) { return node_bytes_by_op[a] > node_bytes_by_op[b]; });
  r += "by op kind (bytes held by the nodes, share of the arena, nodes):\n";
  for (size_t k : kinds) {
    r += "  " + pad(op_name(OpKind(k)), 13) + pad(format_bytes(node_bytes_by_op[k]), 11) + pct(node_bytes_by_op[k], arena_bytes) +
         "  " + std::to_string(nodes_by_op[k]) + " nodes\n";
  }
  if (!by_step.empty()) {
    r += "by step: " + format_bytes(size_t(bytes_per_step())) + " per step on average; first step " +
         std::to_string(by_step.front().step) + " holds " + format_bytes(by_step.front().bytes) + ", last step " +
         std::to_string(by_step.back().step) + " holds " + format_bytes(by_step.back().bytes) + "\n";
    std::vector<StepBytes> big(by_step);
    const size_t n = std::min(max_rows, big.size());
    std::partial_sort(big.begin(), big.begin() + ptrdiff_t(n), big.end(),
                      [](const StepBytes& a, const StepBytes& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.step < b.step; });
    r += "  largest steps:";
    for (size_t i = 0; i < n; ++i) r += " " + std::to_string(big[i].step) + " (" + format_bytes(big[i].bytes) + ")";
    r += "\n";
  }
  if (!largest.empty()) {
    r += "largest tensors held (node, op, step, output, bytes):\n";
    for (size_t i = 0; i < largest.size() && i < max_rows; ++i) {
      const NodeBytes& b = largest[i];
      r += "  #" + pad(std::to_string(b.index), 7) + pad(op_name(b.op), 13) + "step " + pad(std::to_string(b.step), 6) +
           pad(std::string(dtype_name(b.dtype)) + b.shape.str(), 16) + format_bytes(b.bytes) +
           (b.saved_bytes ? " (" + format_bytes(b.saved_bytes) + " saved for backward)" : std::string()) + "\n";
    }
  }
  // What the shape of it says.
  if (steps > 1) {
    r += "diagnosis: this segment keeps the tape of " + std::to_string(steps) + " steps (" +
         format_bytes(size_t(bytes_per_step())) +
         " per step): history is retained across steps. End the segment every K steps and carry the state "
         "(h = seg.carry(h)), keep values rather than graphs (detach, copy_into), or record under NoGradGuard what "
         "needs no gradient.";
    if (grads > node_bytes / 4)
      r += " Backward's buffers hold " + format_bytes(grads) +
           ": each backward's gradient buffers and pointer table stay in the arena until the segment ends, so "
           "a backward per step inside one segment adds its own every step.";
    r += "\n";
  } else {
    r += "diagnosis: the tape covers at most one step: no history is retained across steps.\n";
  }
  return r;
}

std::string to_dot(const Tape& tape, const DotOptions& o) {
  if (!tape.segment_open()) throw TapeError("to_dot: no segment is open; export the tape before its segment ends");
  const std::vector<Node>& nodes = tape.nodes();
  auto drawn = [&](const Node& n) { return n.step >= o.first_step && n.step <= o.last_step; };
  size_t count = 0;
  for (const Node& n : nodes) count += drawn(n);
  if (count > o.max_nodes)
    throw TapeError("to_dot: " + std::to_string(count) + " nodes in steps [" + std::to_string(o.first_step) + ", " +
                    (o.last_step == UINT32_MAX ? std::string("end") : std::to_string(o.last_step)) + "] exceed max_nodes = " +
                    std::to_string(o.max_nodes) + "; narrow the step range (DotOptions::first_step / last_step)");
  std::string s = "digraph segment_" + std::to_string(tape.segment_index()) +
                  " {\n  rankdir=LR;\n  node [fontname=\"sans-serif\", fontsize=10];\n  edge [fontname=\"sans-serif\", fontsize=10];\n";
  char buf[512];
  std::unordered_map<const void*, size_t> leaves;  // leaf tensor memory -> id
  bool stub = false;
  std::string edges;
  uint32_t cur_step = 0;
  bool in_cluster = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (!drawn(n)) continue;
    if (!in_cluster || n.step != cur_step) {
      if (in_cluster) s += "  }\n";
      cur_step = n.step, in_cluster = true;
      s += "  subgraph cluster_step_" + std::to_string(n.step) + " {\n    label=\"step " + std::to_string(n.step) +
           "\"; style=dashed;\n";
    }
    const size_t saved = saved_arena_bytes(n);
    std::snprintf(buf, sizeof buf, "    n%zu [shape=box, label=\"#%zu %s\\n%s%s\\nout %s%s%s\"];\n", i, i, op_name(n.op),
                  dtype_name(n.out.dtype), n.out.shape.str().c_str(), format_bytes(node_arena_bytes(n) - saved).c_str(),
                  saved ? "\\nsaved " : "", saved ? format_bytes(saved).c_str() : "");
    s += buf;
    for (int j = 0; j < n.n_in; ++j) {
      const Tensor& in = n.in[j];
      if (in.node >= 0 && size_t(in.node) < nodes.size() && drawn(nodes[size_t(in.node)])) {
        edges += "  n" + std::to_string(in.node) + " -> n" + std::to_string(i) + ";\n";
      } else if (in.node >= 0) {
        stub = true;
        edges += "  earlier -> n" + std::to_string(i) + ";\n";
      } else {
        auto [it, fresh] = leaves.try_emplace(in.ptr, leaves.size());
        const bool carried = in.space == Space::Carry;
        if (fresh) {
          const std::string name = o.name_of ? o.name_of(in.ptr) : std::string();
          std::string what = carried ? "carried state" : in.requires_grad ? "parameter" : "no grad";
          if (!name.empty()) what = carried ? name + " (carried state)" : name;
          std::snprintf(buf, sizeof buf, "  l%zu [shape=ellipse, style=filled, fillcolor=\"%s\"%s, label=\"%s\\n%s%s\"];\n",
                        it->second, carried ? "#f9d6d5" : in.requires_grad ? "#dde8f7" : "#eeeeee",
                        carried ? ", color=\"#c0392b\", penwidth=2" : "", dot_escape(what).c_str(), dtype_name(in.dtype),
                        in.shape.str().c_str());
          edges += buf;
        }
        edges += "  l" + std::to_string(it->second) + " -> n" + std::to_string(i) +
                 (carried ? " [color=\"#c0392b\", penwidth=2.5, fontcolor=\"#c0392b\", label=\"carried state\"]" : "") + ";\n";
      }
    }
  }
  if (in_cluster) s += "  }\n";
  if (stub) s += "  earlier [shape=plaintext, label=\"from step < " + std::to_string(o.first_step) + "\"];\n";
  s += edges + "}\n";
  return s;
}

}  // namespace segtape
