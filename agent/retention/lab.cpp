// The retention lab put together: the summaries of a trace (the fit, the
// step over the budget), anomaly mode's cost, exact-replay's gradient check,
// the lab's memory check, and run_lab.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.h"
#include "segtape/agent/trainer.h"

namespace segtape::agent::retention {

Fit fit_line(const Trace& t) {
  // Every row but the last: pitfalls 2 and 4 run their one backward there.
  const size_t n = t.step.size() > 3 ? t.step.size() - 1 : t.step.size();
  if (n < 2) return {0, n ? t.bytes[0] : 0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = double(t.step[i]), y = t.bytes[i];
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double d = double(n) * sxx - sx * sx;
  if (d == 0) return {0, sy / double(n)};
  const double slope = (double(n) * sxy - sx * sy) / d;
  return {slope, (sy - slope * sx) / double(n)};
}

Summary summarise(const Trace& t, size_t budget) {
  Summary s;
  const size_t n = t.step.size();
  if (n == 0) return s;
  const Fit f = fit_line(t);
  s.bytes_per_step = f.slope;
  s.bytes_last = t.bytes.back();
  s.bytes_peak = *std::max_element(t.bytes.begin(), t.bytes.end());
  const size_t tail = std::max<size_t>(2, n / 10);
  const size_t a = n > tail ? n - tail : 0;
  if (n >= 2 && t.step[n - 1] > t.step[a]) s.growth_end = (t.bytes[n - 1] - t.bytes[a]) / double(t.step[n - 1] - t.step[a]);
  // Time per step over the first and the last 10% of rows.
  auto mean_ms = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += t.seconds[i];
    return to > from ? 1e3 * sum / double(to - from) : 0.0;
  };
  const size_t w = std::max<size_t>(1, n / 10);
  s.ms_start = mean_ms(0, std::min(n, w));
  s.ms_end = mean_ms(n - std::min(n, w), n);
  for (size_t i = 0; i < n; ++i)
    if (t.bytes[i] > double(budget)) {
      s.budget_step = double(t.step[i]);
      return s;
    }
  // Extrapolate only what really grows: a fix's sawtooth has a small slope
  // too, but the same high-water in its last quarter as in its third (the
  // first holds the steps before the first target).
  auto max_of = [&](size_t from, size_t to) { return *std::max_element(t.bytes.begin() + ptrdiff_t(from), t.bytes.begin() + ptrdiff_t(to)); };
  const size_t q = n / 4;
  const bool grows = q >= 1 && max_of(n - q, n) > 1.01 * max_of(n - 2 * q, n - q);
  if (grows && f.slope > 0) {
    s.budget_step = std::max((double(budget) - f.intercept) / f.slope, double(t.step.back() + 1));
    s.budget_extrapolated = true;
  }
  return s;
}

AnomalyCost anomaly_cost(const LabConfig& cfg, int64_t steps, const std::function<bool()>& interrupted) {
  TrainConfig tc;
  tc.env = "recall";
  tc.history = History::parse("tbptt:" + std::to_string(cfg.trainer_k));
  tc.steps = steps, tc.batch = cfg.batch, tc.hidden = cfg.hidden, tc.embed = cfg.embed, tc.seed = cfg.seed;
  tc.device = cfg.device;
  tc.env_options.lag = cfg.lag, tc.env_options.vocab = cfg.vocab;
  tc.graph_replay = false;  // anomaly mode reads every op's output on the host: eager segments, both alike
  // Two identical trainers, one with anomaly mode, run segment by segment in
  // turn: whatever else the machine does hits both alike, and the median
  // segment time ignores the bursts.
  Trainer off(tc), on(tc);
  on.tape().set_anomaly(true);
  std::vector<double> t_off, t_on;
  auto timed = [](Trainer& tr) {
    const auto start = Clock::now();
    const UpdateResult r = tr.run_segment();
    return 1e6 * std::chrono::duration<double>(Clock::now() - start).count() / double(std::max<int64_t>(r.steps, 1));
  };
  while (!off.done()) {
    stop_if_asked(interrupted);
    t_off.push_back(timed(off));
    t_on.push_back(timed(on));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  return {median(t_off), median(t_on)};
}

double grad_tolerance(int64_t steps) { return std::max(kGradTolerance, double(steps) * std::ldexp(1.0, -23)); }

GradCheck compare_gradients(const Trace& got, const Trace& want, double tolerance) {
  GradCheck g;
  g.tolerance = tolerance;
  for (const Trace* t : {&got, &want})
    if (t->grads.empty()) {
      g.problem = t->engine + " " + info(t->id).name + " has no gradients" +
                  (t->error.empty() ? "" : " (it stopped: " + t->error_type + ": " + t->error + ")");
      return g;
    }
  g.run = true;
  for (const NamedValues& w : want.grads) {
    const auto it = std::find_if(got.grads.begin(), got.grads.end(), [&](const NamedValues& v) { return v.name == w.name; });
    if (it == got.grads.end() || it->shape != w.shape) {
      g.problem = "parameter " + w.name + (it == got.grads.end() ? " is missing" : " has another shape");
      return g;
    }
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < w.values.size(); ++i) {
      const double a = it->values[i], b = w.values[i];
      d += (a - b) * (a - b), na += a * a, nb += b * b;
    }
    const double den = std::sqrt(std::max(na, nb));
    const double e = den == 0 ? std::sqrt(d) : std::sqrt(d) / den;
    if (!(e <= g.max_rel_error) || g.worst.empty()) g.max_rel_error = e, g.worst = w.name;  // NaN included
    ++g.parameters;
  }
  if (got.grads.size() != want.grads.size()) g.problem = "the two models have different parameters";
  return g;
}

std::string LabReport::check_failure() const {
  for (const CaseResult& r : results) {
    if (r.id != Case::ExactReplay) continue;
    const std::pair<const GradCheck*, const char*> checks[] = {
        {&r.grad_check, "segtape"}, {&r.libtorch_grad_check, "LibTorch"}, {&r.cross_engine_check, "segtape against LibTorch"}};
    for (const auto& [g, which] : checks) {
      if (g != &r.grad_check && !g->run) continue;  // (LibTorch's: where it ran)
      const std::string check = std::string("exact-replay's gradient check (") + which + ")";
      if (!g->run) return check + " could not be made: " + g->problem;
      if (!g->problem.empty()) return check + ": " + g->problem;
      if (!g->passed()) {
        char b[160];
        std::snprintf(b, sizeof b, "%.3g relative in %s, more than %.3g", g->max_rel_error, g->worst.c_str(), g->tolerance);
        return "exact-replay's gradients differ from pitfall 1's beyond the tolerance (" + std::string(which) + ": " + b + ")";
      }
    }
  }
  return "";
}

bool LabReport::checks_passed() const { return check_failure().empty(); }

// Refuses a lab whose least memory is more than the process may take, before
// anything is allocated (a bare std::bad_alloc named nothing): every case's
// episode (tokens and targets, int64 a step and stream), and where a pitfall
// runs on the CPU (exact-replay's check runs pitfall 1) its one segment,
// whose arena holds every step's observation, embedding, GRU output and
// logits at least (the gates too, but for pitfall 7's recomputation).
void check_lab_memory(const LabConfig& cfg, const std::vector<Case>& which) {
  const bool pitfall = std::any_of(which.begin(), which.end(), [](Case c) { return info(c).pitfall || c == Case::ExactReplay; });
  const double episode = 16.0 * double(cfg.steps) * double(cfg.batch);
  const double step = double(cfg.batch) * (8.0 + 4.0 * double(cfg.embed) + 4.0 * double(cfg.vocab) + 4.0 * double(cfg.hidden));
  const double segment = pitfall && cfg.device == "cpu" ? step * double(cfg.steps) : 0;
  std::string has;
  const size_t limit = memory_limit(&has);
  if (limit && episode + segment > double(limit))
    throw Error("retention: --steps " + std::to_string(cfg.steps) + ", --batch " + std::to_string(cfg.batch) + ", --hidden " +
                std::to_string(cfg.hidden) + " need at least " + format_bytes(size_t(episode + segment)) + " (the episode " +
                format_bytes(size_t(episode)) + (segment > 0 ? ", and a pitfall's segment, which keeps all " +
                std::to_string(cfg.steps) + " steps, " + format_bytes(size_t(segment)) : std::string()) + ") but " + has + " " +
                format_bytes(limit) + ": lower --steps, --batch or --hidden");
}

LabReport run_lab(const LabConfig& cfg, const std::vector<Case>& which, TorchRunner torch,
                  const LabHooks& hooks) {
  cfg.validate();
  check_lab_memory(cfg, which);
  LabReport rep;
  rep.config = cfg;
  rep.libtorch_built = torch != nullptr;
  auto say = [&](const std::string& s) {
    if (hooks.progress) hooks.progress(s);
  };
  for (Case c : which) {
    stop_if_asked(hooks.interrupted);
    CaseResult r;
    r.id = c;
    const std::string name = label(c, cfg);
    RunOptions o;
    o.interrupted = hooks.interrupted;
    if (hooks.inspect && info(c).pitfall) o.inspect = [&](const Tape& t) { hooks.inspect(c, t); };
    say("segtape  " + name);
    r.segtape = run_segtape(c, cfg, o);
    if (info(c).pitfall) {
      RunOptions strict;
      strict.strict = true;
      strict.interrupted = hooks.interrupted;
      r.strict = run_segtape(c, cfg, strict);
      strict.retain_graph = false;
      if (info(c).backward_every_step) r.no_retain = run_segtape(c, cfg, strict);
    }
    if (torch) {
      say("libtorch " + name);
      r.libtorch = torch(c, cfg);
      if (rep.libtorch_memory.empty()) rep.libtorch_memory = r.libtorch.memory_source;
    }
    rep.results.push_back(std::move(r));
  }
  // exact-replay's gradients against pitfall 1's, on each engine where both ran.
  const auto p1 = std::find_if(rep.results.begin(), rep.results.end(), [](const CaseResult& r) { return r.id == Case::HiddenNotDetached; });
  const double tol = grad_tolerance(cfg.steps);
  for (CaseResult& r : rep.results) {
    if (r.id != Case::ExactReplay) continue;
    if (p1 != rep.results.end()) {
      r.grad_check = compare_gradients(r.segtape, p1->segtape, tol);
      if (!p1->libtorch.engine.empty()) {
        r.cross_engine_check = compare_gradients(r.segtape, p1->libtorch, tol);
        if (!r.libtorch.engine.empty()) r.libtorch_grad_check = compare_gradients(r.libtorch, p1->libtorch, tol);
      }
    } else {
      say("segtape  " + label(Case::HiddenNotDetached, cfg) + " (the gradients exact-replay must equal)");
      RunOptions p1_run;
      p1_run.interrupted = hooks.interrupted;
      r.grad_check = compare_gradients(r.segtape, run_segtape(Case::HiddenNotDetached, cfg, p1_run), tol);
    }
  }
  if (hooks.measure_anomaly) {
    say("anomaly mode cost");
    rep.anomaly = anomaly_cost(cfg, 8192, hooks.interrupted);
  }
  return rep;
}

}  // namespace segtape::agent::retention
