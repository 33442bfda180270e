// The retention lab: every graph-retention pitfall of recurrent agent loops
// beside its fix, run on segtape and (when built with it) on LibTorch with the
// same model, sizes and data, measuring memory after every step.
// `segtape retention` runs it, and its tests call the same functions;
// docs/retention.md explains the results.
//
// The model: tokens of the delayed-recall env -> Embedding(vocab, embed) ->
// GRUCell(embed, hidden) -> Linear(hidden, vocab), cross-entropy on the token
// shown `lag` steps earlier (no loss before the first target). The pitfalls are
// deliberately wrong loops; each fix is a loop whose memory per segment is flat.
// exact-replay computes pitfall 1's gradients (full BPTT over the episode) in
// segments of K steps replayed in reverse (segtape/replay.h); the lab checks
// that they are equal.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "segtape/nn/module.h"
#include "segtape/replay.h"
#include "segtape/tape.h"

namespace segtape::agent::retention {

struct LabConfig {
  int64_t steps = 200;   // env steps per case (one episode)
  int64_t batch = 8;     // B streams
  int64_t vocab = 16;    // recall tokens = classes
  int64_t embed = 32;    // E
  int64_t hidden = 128;  // H
  int64_t lag = 8;       // recall lag: steps [0, lag) have no target
  int64_t k = 8;         // steps per segment of tbptt:K / nograd-history / window / exact-replay, and pitfall 3's update interval
  int64_t window = 8;    // window:N
  int64_t trainer_k = 32;  // gru-state: the agent Trainer with tbptt:trainer_k
  double lr = 0.05;      // SGD (the lab's loops); the Trainer uses its Adam
  double clip = 1.0;     // pitfall 6's clip_grad_norm
  size_t budget = size_t(1) << 20;  // strict-policy segment budget (pitfall reruns and fixes)
  const char* budget_name = "LabConfig::budget";  // how budget errors name it (the segtape command: "--budget")
  uint64_t seed = 1;
  // segtape's side: "cpu" or "cuda". On CUDA a pitfall's teaching run cannot
  // grow its arena (device pools are one allocation each): it runs in one
  // fixed arena of device_arena bytes instead. LibTorch's side runs on its CPU.
  std::string device = "cpu";
  size_t device_arena = size_t(1) << 30;
  // Throws Error naming the first impossible value.
  void validate() const;
};

enum class Case {
  // pitfalls
  HiddenNotDetached,  // 1: h never detached, backward every step (retain_graph)
  LossSum,            // 2: loss = loss + step_loss over the episode, one backward at the end
  LogitsBuffer,       // 3: logits kept in a buffer with their graph; TBPTT otherwise correct
  GrowingContext,     // 4: prompt-style history: concat of every past embedding, not detached
  DetachInputOnly,    // 5: the input embedding detached, h still carries the graph
  ClipGrad,           // 6: pitfall 1 plus gradient clipping
  Checkpoint,         // 7: pitfall 1 with in-step recomputation of the GRU gates
  // fixes
  Tbptt,              // tbptt:K: segments of K steps, h carried
  Detach,             // detach: K = 1
  NogradHistory,      // nograd-history: gradient of the current step only, h arrives as a value
  Window,             // window:N: the last N embeddings as values, no recurrence
  GruState,           // the agent's Trainer (tbptt:trainer_k): the compressed, fixed-size GRU state
  ExactReplay,        // exact-replay: pitfall 1's gradients (one window over the episode) by replaying K-step segments
};

struct CaseInfo {
  Case id;
  std::string name;     // command-line name, e.g. "hidden-not-detached"
  bool pitfall = false;
  bool backward_every_step = false;  // needs retain_graph (pitfalls 1, 5, 6, 7)
  std::string summary;  // one line: what the loop does
  std::string remedy;   // one line: the fix (pitfalls) or what it fixes (fixes)
};
const std::vector<CaseInfo>& cases();
const CaseInfo& info(Case c);
// The valid case names as the table prints them, one string:
// "1 hidden-not-detached, ..., 7 checkpoint, tbptt:8, detach, nograd-history,
// window:8, gru-state (tbptt:32), exact-replay (exact:8/200)" (the numbers from cfg).
std::string case_names(const LabConfig& cfg = {});
// A case by any of: its name ("hidden-not-detached", "tbptt"), its label in
// the table ("1 hidden-not-detached", "tbptt:8", "gru-state (tbptt:32)",
// "exact-replay (exact:8/200)"), or a pitfall's number ("1"); surrounding
// blanks ignored. A fix's parameter must be cfg's (tbptt:16 is refused when
// cfg.k is 8). Throws Error listing case_names(cfg) when unknown.
Case parse_case(const std::string& name, const LabConfig& cfg = {});

// A parameter's values (or gradient) by PyTorch's name, e.g. "gru.weight_hh".
struct NamedValues {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// One run of one case on one engine.
struct Trace {
  std::string engine;  // "segtape" or "libtorch"
  Case id{};
  std::vector<int64_t> step;    // the step each row was measured after
  std::vector<double> bytes;    // memory after that step (see memory_source)
  std::vector<double> seconds;  // wall time of that step (per step for rows covering several)
  std::vector<double> grad_bytes;  // segtape: of `bytes`, backward's gradient buffers (TapeStats::grad_bytes)
  std::vector<double> segment_peaks;  // fixes: high-water of every segment (segtape: to the byte)
  std::string memory_source;    // what `bytes` counts
  // segtape pitfalls, from the explainer at the last step: bytes held by tape
  // nodes, by backward's gradient buffers, and the steps the tape spans.
  double final_node_bytes = 0, final_grad_bytes = 0, held_steps = 0;
  // When the run stopped on an error (the strict policy's refusal).
  std::string error_type, error;
  int64_t error_step = -1;
  // Pitfall 1 and exact-replay: every parameter's gradient just before the
  // episode's one update (the gradient of every step's loss through the whole
  // history), for the check that the two are equal.
  std::vector<NamedValues> grads;
  // exact-replay on segtape: of each row of `bytes`, the boundary states it
  // counts (see run_segtape), and the replay driver's report of the window.
  std::vector<double> state_bytes;
  replay::Report replay{};
};

// What to do with the segtape tape at the last step, before its segment ends
// (the explainer, the DOT export). Called once: at a pitfall's last step (its
// one segment) or at a fix's last step (its last segment).
using Inspect = std::function<void(const Tape&)>;
// The same, also given the model's parameters by name ("gru.weight_hh", ...).
using InspectNamed = std::function<void(const Tape&, const std::vector<nn::NamedTensor>& params)>;

struct RunOptions {
  // false: pitfalls run under the teaching policy (the arena grows); true:
  // under the strict policy with budget `LabConfig::budget` (they raise).
  // Fixes always run under the strict policy.
  bool strict = false;
  // Pitfalls 1, 5, 6, 7: backward every step with retain_graph (false shows
  // the double-backward TapeError a user gets first).
  bool retain_graph = true;
  bool anomaly = false;  // TapeOptions::anomaly
  Inspect inspect;
  InspectNamed inspect_named;
  // Asked between steps (every 64th, outside the timed work) and between the
  // driver's segments: true stops the run with Interrupted. Empty: never.
  std::function<bool()> interrupted;
};
// Thrown when RunOptions::interrupted or LabHooks::interrupted says stop (not
// a segtape::Error: the runs record those into their trace as the result).
struct Interrupted : std::exception {
  const char* what() const noexcept override { return "the retention lab was interrupted"; }
};

// Runs one case on segtape. Errors from the strict policy are caught into the
// trace; any other exception propagates.
//
// exact-replay runs one replay::Driver window over the whole episode (T =
// steps, uniform schedule, segments of K = cfg.k steps), then one update: the
// loop of pitfall 1, which backpropagates every step's loss through the
// history since step 0 and updates once at the end, so that its gradients are
// pitfall 1's. Row t of its trace is the memory while step t is replayed:
// the arena after step t in its replayed segment (at a segment's last step,
// the segment's high-water, its backward included) plus the boundary states
// needed then: the start of each segment up to t's (one state per K steps),
// dL/dh and the final state. Row t's time is step t's forward pass plus its
// replay (a segment's backward in its last step's row).
Trace run_segtape(Case c, const LabConfig& cfg, const RunOptions& o = {});

// The same case on LibTorch (agent/retention_torch.cpp: the module
// libsegtape_torch_lab.so, built only when LibTorch was found, which the
// segtape program loads for a lab run that includes LibTorch).
Trace run_libtorch(Case c, const LabConfig& cfg);
using TorchRunner = Trace (*)(Case, const LabConfig&);

// The env's data for one episode, shared by both engines: tokens and targets [steps, batch].
struct Episode {
  int64_t steps = 0, batch = 0;
  std::vector<int64_t> tokens, targets;
  bool has_target(int64_t t) const;  // any stream has a target at step t
};
Episode make_episode(const LabConfig& cfg);

// The lab model's initial weights under PyTorch's names ("encoder.weight",
// "gru.weight_ih", ..., "head.bias", "ctx.weight", ...; window mode: "compress.*"
// instead of "gru.*"), so that LibTorch starts from exactly segtape's model.
std::vector<NamedValues> initial_weights(const LabConfig& cfg, bool window_mode);

// Least-squares line through (step, bytes), every row but the last (where
// pitfalls 2 and 4 run their one backward).
struct Fit {
  double slope = 0, intercept = 0;
};
Fit fit_line(const Trace& t);

struct Summary {
  double bytes_per_step = 0;      // slope of the fit
  double bytes_last = 0;          // at the last row
  double bytes_peak = 0;          // the largest row
  double growth_end = 0;          // mean bytes per step over the last 10% of rows (shows curvature)
  double ms_start = 0, ms_end = 0;  // mean time per step over the first / last 10% of rows
  double budget_step = -1;        // first step above the budget, or extrapolated from the fit; -1: never
  bool budget_extrapolated = false;
};
Summary summarise(const Trace& t, size_t budget);

// Anomaly mode's cost on the agent loop (the Trainer, recall, tbptt:trainer_k):
// the median time per step of a segment with and without it, over `steps`
// steps of two trainers run in turn.
struct AnomalyCost {
  double us_off = 0, us_on = 0;
  double percent() const { return us_off > 0 ? 100.0 * (us_on - us_off) / us_off : 0; }
};
// interrupted: asked between segments (Interrupted when true).
AnomalyCost anomaly_cost(const LabConfig& cfg, int64_t steps = 8192, const std::function<bool()>& interrupted = {});

// Graphviz DOT (segtape/explain.h) of a small run's tape with the parameters
// named ("gru.weight_hh", ...): a pitfall's one segment after 3 steps, or a
// fix's second segment of 2 steps (detach: of 1), where the state arrives
// carried (its edge highlighted). Sizes and seed from cfg.
std::string tape_dot(Case c, const LabConfig& cfg);

// exact-replay's gradients against pitfall 1's, parameter by parameter:
// ||got - want|| / max(||got||, ||want||) (0 when both are zero), the largest.
// Both are float32 sums of the same terms in other orders. Pitfall 1 adds
// each step's backward into the gradient buffers, about T^2 / 2 terms per
// element over an episode of T steps, and its rounding grows with T (on
// segtape, at the lab's sizes: 2.8e-6 at T = 64, 6.1e-6 at 200, 1.2e-5 at
// 400, while exact-replay stays within 1e-6 of LibTorch's pitfall 1), so the
// lab allows T float32 epsilons (2^-23 each), and never less than 1e-5.
constexpr double kGradTolerance = 1e-5;
double grad_tolerance(int64_t steps);  // max(kGradTolerance, steps * 2^-23)
struct GradCheck {
  bool run = false;          // both traces had gradients
  double max_rel_error = 0;  // the largest over the parameters
  std::string worst;         // the parameter it was found in
  size_t parameters = 0;
  double tolerance = kGradTolerance;
  std::string problem;       // why it could not be run, or what differed (a missing parameter, a shape)
  bool passed() const { return run && problem.empty() && max_rel_error <= tolerance; }
};
GradCheck compare_gradients(const Trace& got, const Trace& want, double tolerance = kGradTolerance);

// Throws Error when the lab's least memory (its episode; a pitfall's
// one segment of every step, on the CPU) is more than the process may take
// (memory_limit), naming --steps, --batch and --hidden. run_lab calls it.
void check_lab_memory(const LabConfig& cfg, const std::vector<Case>& which);

// The whole lab.
struct CaseResult {
  Case id{};
  Trace segtape, strict;        // teaching (pitfalls) / strict (fixes) run; strict rerun of a pitfall
  Trace no_retain;              // pitfalls 1, 5, 6, 7 without retain_graph (the double-backward error)
  Trace libtorch;               // empty engine string when LibTorch was not built
  // exact-replay: its gradients against pitfall 1's on the same engine
  // (LibTorch: when pitfall 1 ran there too), and segtape's against LibTorch's
  // pitfall 1 (which of the two float32 sums differs more).
  GradCheck grad_check, libtorch_grad_check, cross_engine_check;
};
struct LabReport {
  LabConfig config;
  std::vector<CaseResult> results;
  AnomalyCost anomaly;
  bool libtorch_built = false;
  std::string libtorch_memory;  // what LibTorch's bytes count (allocator statistics or RSS)
  // Said wherever LibTorch's results would be when it did not run.
  std::string libtorch_note = "LibTorch not built (configure with libtorch-dev installed to run it)";
  // false when exact-replay's gradient check failed or could not run (the table and the JSON say FAILED)
  bool checks_passed() const;
  // Why not ("" when they did): the check, and the run that stopped (a
  // BudgetError), the parameter or the error that failed it.
  std::string check_failure() const;
};
struct LabHooks {
  std::function<void(const std::string&)> progress;  // a line before each run
  // Each pitfall's teaching-policy tape at its last step (the explainer, DOT).
  std::function<void(Case, const Tape&)> inspect;
  // Measure anomaly mode's cost (anomaly_cost: 8192 steps of two trainers,
  // seconds on a small machine). false: LabReport::anomaly stays zero and the
  // table and JSON say "not measured" (Python's quick runs).
  bool measure_anomaly = true;
  // Passed to every run (RunOptions::interrupted) and to anomaly_cost: the
  // lab stops with Interrupted once it returns true (Python: Ctrl-C).
  std::function<bool()> interrupted;
};
// torch: nullptr when LibTorch was not built (its panel then says so).
// exact-replay's gradients are checked against pitfall 1's, on each engine
// where both ran; when pitfall 1 is not among `which`, it is run on segtape
// for the check alone.
LabReport run_lab(const LabConfig& cfg, const std::vector<Case>& which, TorchRunner torch, const LabHooks& hooks = {});

std::string to_csv(const LabReport& r);   // engine,case,step,bytes
std::string to_json(const LabReport& r);  // per case and engine: the Summary, the strict error
// Memory vs step, one panel per engine (one panel and a note without
// LibTorch) on one log scale: pitfalls dashed with markers, fixes solid, the
// budget as a horizontal line with each pitfall's first step over it marked;
// a curve identical to an earlier one says so in its legend ("= 1").
std::string to_svg(const LabReport& r);
std::string table(const LabReport& r);    // the terminal summary

}  // namespace segtape::agent::retention
