// The tape's long messages: the budget report (what filled a segment, and
// the advice that fits) and the expired-tensor message (which segment and
// step made it, and what to do). Tests assert their text.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "segtape/tape.h"

namespace segtape {

std::string format_bytes(size_t b) {
  char buf[48];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%zu B", b);
  else if (b < (size_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else if (b < (size_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / (1 << 30));
  return buf;
}

std::string Tape::expired_message(const Tensor& t, const char* what) const {
  std::string m = std::string(what) + ": tensor " + std::string(dtype_name(t.dtype)) + t.shape.str();
  if (t.space == Space::Carry) {
    m += " was carried out of segment " + std::to_string(t.gen) + " and has expired (the tape is now at segment " +
         std::to_string(seg_index_) +
         "). A carried value lives through the next segment only: carry it again in each segment "
         "(h = seg.carry(h)), or copy_into() a persistent tensor to keep it longer.";
  } else {
    m += " made in segment " + std::to_string(t.gen) + " at step " + std::to_string(t.step) +
         " has expired: segment " + std::to_string(t.gen) + " ended and its arena was reset" +
         (open_ ? " (the open segment is " + std::to_string(seg_index_) + ")" : std::string(" (no segment is open)")) +
         ". Tensors made inside a segment live only while it is open: carry it across the boundary with "
         "seg.carry(x) (or detach and copy_into() a persistent tensor) before the segment ends.";
  }
  return m;
}

const char* Tape::budget_name() const {
  if (options_.budget_name) return options_.budget_name;
  return arena_.grows() ? "TapeOptions::grow_limit" : "TapeOptions::segment_budget";
}

// The report leads with what holds the most memory (not with the request
// that happened to cross the line), then gives the advice that fits: one
// step larger than the budget, outputs kept with no graph, or history
// retained across steps.
std::string Tape::budget_report(size_t request, const char* kind, const char* op) const {
  const size_t budget_bytes = arena_.budget();
  const size_t node_bytes = nodes_.size() * sizeof(Node);
  const size_t held = arena_.used() + node_bytes;
  const double whole = double(std::max<size_t>(held, 1));
  auto pct = [&](size_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * double(b) / whole);
    return std::string(buf);
  };
  // Contributors, largest first: the arena bytes of each op kind, and the nodes.
  std::vector<std::pair<size_t, std::string>> parts;
  for (size_t k = 0; k < kOpKinds; ++k)
    if (bytes_by_op_[k]) parts.push_back({bytes_by_op_[k], op_name(OpKind(k))});
  if (grad_bytes_) parts.push_back({grad_bytes_, "Grad"});
  if (node_bytes) parts.push_back({node_bytes, "tape nodes"});
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });

  std::string m = "segment budget exceeded (" + std::string(budget_name()) + " = " + format_bytes(budget_bytes) + ", segment " +
                  std::to_string(seg_index_) + ", step " + std::to_string(step_) + "): ";
  if (!parts.empty())
    m += "the largest share is " + parts[0].second + " with " + format_bytes(parts[0].first) + " (" + pct(parts[0].first) +
         " of the " + format_bytes(held) + " held); ";
  m += "then " + std::string(op) + " (op '" + kind + "') asked for " + format_bytes(align_up(request)) + " more.\n";

  m += "What holds the segment's memory, largest first:";
  for (auto& [b, name] : parts) m += " " + name + " " + format_bytes(b) + " (" + pct(b) + ");";
  m += "\nTape nodes: " + std::to_string(nodes_.size()) + " x " + std::to_string(sizeof(Node)) + " B = " +
       format_bytes(node_bytes) + " (counted in the budget).";
  // By step, largest first (recorded nodes only).
  std::map<uint32_t, size_t> by_step;
  for (const Node& n : nodes_) by_step[n.step] += align_up(n.bytes) + sizeof(Node);
  std::vector<std::pair<size_t, uint32_t>> steps;
  steps.reserve(by_step.size());
  for (auto& [st, b] : by_step) steps.push_back({b, st});
  std::sort(steps.rbegin(), steps.rend());
  m += "\nBy step (recorded nodes, largest first, " + std::to_string(steps.size()) + " steps on the tape):";
  for (size_t i = 0; i < steps.size() && i < 8; ++i)
    m += " step " + std::to_string(steps[i].second) + " " + format_bytes(steps[i].first) + ";";
  if (steps.size() > 8) m += " ...";

  // One step, or many? The recorded nodes' steps say it when there are
  // nodes; otherwise the step counter since the segment opened. Neither is
  // known on a tape whose steps are not counted (next_step() never called).
  const uint64_t seg_steps = step_ - seg_first_step_ + 1;  // steps this segment has begun
  const bool counted = step_ > 0;
  const bool one_step = nodes_.empty() ? seg_steps == 1 : steps.size() == 1;
  const std::string budget = budget_name();
  if (!counted) {
    m += "\nThis tape's steps are not counted (tape.next_step() was never called), so this report cannot tell one "
         "step too large for the budget from history retained over many steps. If one step alone needs more than " +
         format_bytes(budget_bytes) + ", make it smaller (batch, hidden size) or raise " + budget +
         "; if the segment spans many steps, end it every K steps and carry the state across the boundary "
         "(h = seg.carry(h)). Call tape.next_step() after each step for a report by step.";
  } else if (one_step) {
    m += "\nOne step needs more than the budget: step " + std::to_string(step_) + " alone holds " + format_bytes(held) +
         " and asks for " + format_bytes(align_up(request)) + " more, over the " + format_bytes(budget_bytes) +
         " budget. This is not retained history, and a shorter segment cannot help (a segment holds at least one "
         "step): make the step smaller (batch, hidden size, sequence length) or raise " + budget + ".";
  } else if (nodes_.empty()) {
    m += "\nNo graph is recorded in this segment (0 tape nodes: grad is off, or no input requires grad), yet the arena "
         "keeps every tensor made in the segment until it ends: the outputs of " + std::to_string(seg_steps) +
         " steps fill it. This is not retained history: end the segment more often (a segment per chunk of the "
         "rollout), or copy what must outlive it into persistent tensors (copy_into), or raise " + budget + ".";
  } else {
    m += "\nA segment whose memory grows with every step is retaining history: end the segment every K steps "
         "(TBPTT) and carry the state across the boundary (h = seg.carry(h)), detach what needs no gradient, or "
         "raise " + budget + ".";
  }
  return m;
}

}  // namespace segtape
