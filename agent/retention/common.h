// What the retention lab's files share (agent/retention/): the case labels,
// the clock, what segtape's rows count, and the interrupt check.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "segtape/agent/retention.h"

namespace segtape::agent::retention {

using Clock = std::chrono::steady_clock;

// What segtape's `bytes` count (Trace::memory_source).
inline constexpr const char* kArenaSource = "segtape: segment arena bytes in use after the step (Tape::stats().live_bytes)";

// A case as the table prints it: "1 hidden-not-detached", "tbptt:8",
// "gru-state (tbptt:32)", "exact-replay (exact:8/200)" (the numbers from cfg).
std::string label(Case c, const LabConfig& cfg);

// Interrupted when an interrupt check is set and says stop.
void stop_if_asked(const std::function<bool()>& interrupted);

}  // namespace segtape::agent::retention
