// The retention lab's cases (the pitfalls and their fixes), its
// configuration's checks, and the episode both engines run.
#include <cmath>

#include "common.h"
#include "segtape/agent/env.h"

namespace segtape::agent::retention {

const std::vector<CaseInfo>& cases() {
  static const std::vector<CaseInfo> v = {
      {Case::HiddenNotDetached, "hidden-not-detached", true, true,
       "h never detached; backward every step with retain_graph", "end the segment every K steps and carry h (tbptt:K; PyTorch: h = h.detach())"},
      {Case::LossSum, "loss-sum", true, false, "loss = loss + step_loss over the episode, one backward at the end",
       "backward and cut every K steps (tbptt:K)"},
      {Case::LogitsBuffer, "logits-buffer", true, false,
       "every step's logits appended to a list with their graph; TBPTT every K steps otherwise correct",
       "keep values, not graphs: logits.detach() / .item() (segtape: read them before the segment ends)"},
      {Case::GrowingContext, "growing-context", true, false,
       "prompt-style history = cat(history, e_t), never detached; feature = tanh(Linear(mean(history)))",
       "a fixed-size history: window:N, nograd-history, or the GRU state (gru-state)"},
      {Case::DetachInputOnly, "detach-input-only", true, true, "the input embedding detached, h still carries the graph",
       "detach the state, not the input (tbptt:K, detach)"},
      {Case::ClipGrad, "clip-grad", true, true, "pitfall 1 plus clip_grad_norm after every backward",
       "clipping bounds gradients, not memory: tbptt:K"},
      {Case::Checkpoint, "checkpoint", true, true, "pitfall 1 with the GRU gates recomputed in backward (in-step checkpointing)",
       "checkpointing shrinks each step, not the number of steps kept: tbptt:K"},
      {Case::Tbptt, "tbptt", false, false, "segments of K steps, h carried across the boundary", "fixes 1, 2, 5, 6, 7"},
      {Case::Detach, "detach", false, false, "segments of one step (h carried every step)", "fixes 1, 2, 5, 6, 7 without gradient through time"},
      {Case::NogradHistory, "nograd-history", false, false, "h = gru(e, detach(h)): the current step's gradient only",
       "fixes 4 and 5 (history as a value)"},
      {Case::Window, "window", false, false, "the last N embeddings as detached values, no recurrence", "fixes 4 (bounded prompt)"},
      {Case::GruState, "gru-state", false, false, "the agent Trainer's loop (tbptt, Adam, clipping): history compressed in the fixed-size GRU state",
       "fixes 3 and 4 (what the agent program does)"},
      {Case::ExactReplay, "exact-replay", false, false,
       "pitfall 1's gradients (every step's loss through the whole history, one update): segments of K steps replayed in reverse from "
       "stored boundary states (replay::Driver)",
       "fixes 1, 5, 6, 7 without truncating the gradient: one segment's memory plus a state per K steps, each step computed twice"},
  };
  return v;
}

const CaseInfo& info(Case c) { return cases()[size_t(c)]; }

std::string label(Case c, const LabConfig& cfg) {
  const CaseInfo& i = info(c);
  if (i.pitfall) return std::to_string(int(c) + 1) + " " + i.name;
  switch (c) {
    case Case::Tbptt: return "tbptt:" + std::to_string(cfg.k);
    case Case::Window: return "window:" + std::to_string(cfg.window);
    case Case::GruState: return "gru-state (tbptt:" + std::to_string(cfg.trainer_k) + ")";
    case Case::ExactReplay: return "exact-replay (exact:" + std::to_string(cfg.k) + "/" + std::to_string(cfg.steps) + ")";
    default: return i.name;
  }
}

namespace {
std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}
}  // namespace

std::string case_names(const LabConfig& cfg) {
  std::string names;
  for (const CaseInfo& c : cases()) names += (names.empty() ? "" : ", ") + label(c.id, cfg);
  return names;
}

Case parse_case(const std::string& name, const LabConfig& cfg) {
  const std::string n = trimmed(name);
  for (const CaseInfo& c : cases()) {
    const std::string number = std::to_string(int(c.id) + 1);
    if (n == c.name || n == label(c.id, cfg) || (c.pitfall && n == number)) return c.id;
  }
  // A fix's parameter that is not the lab's: say which one runs.
  // (exact-replay's and gru-state's labels carry --k and --steps: a name
  // copied from a table of other settings is named the same way)
  for (const CaseInfo& c : cases()) {
    if (c.pitfall || (n.rfind(c.name + ":", 0) != 0 && n.rfind(c.name + " (", 0) != 0)) continue;
    throw Error("retention case '" + n + "': with these settings the lab runs " + label(c.id, cfg) + " ('" + c.name +
                "' names it whatever they are; valid names: " + case_names(cfg) + ")");
  }
  throw Error("unknown retention case '" + n + "' (valid names: " + case_names(cfg) +
              "; a pitfall also by its name or number alone, a fix without its parameter)");
}

void LabConfig::validate() const {
  auto need = [](bool ok, const char* m) {
    if (!ok) throw Error(std::string("retention: ") + m);
  };
  need(steps >= 2 && steps <= 100000, "--steps must be in [2, 100000]");
  need(batch >= 1 && batch <= 4096, "--batch must be in [1, 4096]");
  need(hidden >= 1 && hidden <= 8192, "--hidden must be in [1, 8192]");
  need(embed >= 1 && embed <= 8192 && vocab >= 2 && vocab <= 100000, "embed in [1, 8192] and vocab in [2, 100000]");
  need(lag >= 0 && lag < steps, "--steps must be greater than the recall lag (the first target arrives at step lag)");
  need(k >= 1 && trainer_k >= 1, "K must be >= 1");
  need(window >= 1 && window <= 64, "window N must be in [1, 64]");
  need(std::isfinite(lr) && lr > 0, "lr must be a finite number > 0 (the lab loops' SGD step)");
  need(std::isfinite(clip) && clip > 0, "clip must be a finite number > 0 (pitfall 6's bound on the gradient norm)");
  need(budget >= 1024, "--budget must be at least 1 KiB");
  need(device == "cpu" || device == "cuda", "--device must be cpu or cuda");
  need(device != "cuda" || device_arena >= budget, "the CUDA teaching arena (device_arena) must be at least --budget");
}

bool Episode::has_target(int64_t t) const {
  for (int64_t b = 0; b < batch; ++b)
    if (targets[size_t(t * batch + b)] != kNoTarget) return true;
  return false;
}

Episode make_episode(const LabConfig& cfg) {
  EnvOptions eo;
  eo.lag = cfg.lag;
  eo.vocab = cfg.vocab;
  auto env = make_env("recall", cfg.batch, cfg.seed * 7919u + 3u, eo);
  Episode ep{cfg.steps, cfg.batch, std::vector<int64_t>(size_t(cfg.steps * cfg.batch)), std::vector<int64_t>(size_t(cfg.steps * cfg.batch))};
  const size_t B = size_t(cfg.batch);
  std::vector<int64_t> actions(B, 0);
  std::vector<float> reward(B);
  std::vector<uint8_t> done(B);
  for (int64_t t = 0; t < cfg.steps; ++t) {
    env->observe(std::span<int64_t>(ep.tokens).subspan(size_t(t) * B, B), {});
    env->targets(std::span<int64_t>(ep.targets).subspan(size_t(t) * B, B));
    env->step(actions, reward, done);  // recall's stream does not depend on the actions
  }
  return ep;
}

}  // namespace segtape::agent::retention
