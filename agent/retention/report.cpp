// The retention lab's outputs: retention.csv, retention.json, retention.svg
// and the table the terminal shows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common.h"
#include "segtape/agent/plot.h"

namespace segtape::agent::retention {

namespace {

std::string num(double v, const char* f = "%.0f") {
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A fit's slope may be slightly negative (a fix's sawtooth).
std::string signed_bytes(double b) { return (b < 0 ? "-" : "") + format_bytes(size_t(std::fabs(b))); }

nlohmann::json summary_json(const Trace& t, size_t budget, const std::string& absent) {
  nlohmann::json j;
  if (t.engine.empty()) return absent;
  const Summary s = summarise(t, budget);
  j["memory"] = t.memory_source;
  j["bytes_per_step"] = s.bytes_per_step;
  j["bytes_per_step_at_end"] = s.growth_end;
  j["bytes_last_step"] = s.bytes_last;
  j["bytes_peak"] = s.bytes_peak;
  if (t.held_steps > 0) {
    j["explained_at_last_step"] = {{"tape_node_bytes", t.final_node_bytes},
                                   {"tape_node_bytes_per_step", t.final_node_bytes / t.held_steps},
                                   {"backward_gradient_bytes", t.final_grad_bytes},
                                   {"steps_held", t.held_steps}};
  }
  j["ms_per_step_start"] = s.ms_start;
  j["ms_per_step_end"] = s.ms_end;
  j["budget_bytes"] = budget;
  if (s.budget_step < 0) j["budget_exceeded_at_step"] = nullptr;
  else j["budget_exceeded_at_step"] = std::round(s.budget_step);
  j["budget_step_extrapolated"] = s.budget_extrapolated;
  j["rows"] = t.step.size();
  if (!t.segment_peaks.empty()) {
    const auto [lo, hi] = std::minmax_element(t.segment_peaks.begin() + std::min<ptrdiff_t>(1, ptrdiff_t(t.segment_peaks.size()) - 1),
                                              t.segment_peaks.end());
    j["segment_peak_min_after_first"] = *lo;
    j["segment_peak_max_after_first"] = *hi;
    j["segments"] = t.segment_peaks.size();
  }
  if (!t.error.empty()) j["error"] = {{"type", t.error_type}, {"step", t.error_step}, {"message", t.error}};
  return j;
}

nlohmann::json error_json(const Trace& t) {
  if (t.error.empty()) return "no error";
  return {{"type", t.error_type}, {"step", t.error_step}, {"message", t.error}};
}

nlohmann::json check_json(const GradCheck& g) {
  nlohmann::json j = {{"run", g.run}, {"equal", g.passed()}};
  if (g.run) j["max_relative_error"] = g.max_rel_error, j["worst_parameter"] = g.worst, j["parameters"] = g.parameters;
  if (!g.problem.empty()) j["problem"] = g.problem;
  return j;
}

// "6.1e-06 (gru.bias_ih; tolerance 2.4e-05): equal", or "FAILED: ..." saying why.
std::string check_line(const GradCheck& g) {
  if (!g.run) return "FAILED: not checked: " + g.problem;
  std::string s = num(g.max_rel_error, "%.1e") + " (" + g.worst + "; tolerance " + num(g.tolerance, "%.1e") + "): ";
  if (!g.problem.empty()) return "FAILED: " + s + g.problem;
  return g.passed() ? s + "equal" : "FAILED: " + s + "the gradients differ";
}

}  // namespace

std::string to_csv(const LabReport& r) {
  std::string s = "engine,case,step,bytes\n";
  for (const CaseResult& c : r.results)
    for (const Trace* t : {&c.segtape, &c.libtorch})
      for (size_t i = 0; i < t->step.size(); ++i)
        s += t->engine + "," + info(c.id).name + "," + std::to_string(t->step[i]) + "," + num(t->bytes[i]) + "\n";
  return s;
}

std::string to_json(const LabReport& r) {
  const LabConfig& c = r.config;
  nlohmann::json j;
  j["config"] = {{"steps", c.steps}, {"batch", c.batch}, {"vocab", c.vocab}, {"embed", c.embed}, {"hidden", c.hidden},
                 {"lag", c.lag}, {"k", c.k}, {"window", c.window}, {"trainer_k", c.trainer_k}, {"lr", c.lr},
                 {"clip", c.clip}, {"budget", c.budget}, {"seed", c.seed}, {"device", c.device}};
  j["checks_passed"] = r.checks_passed();
  j["memory"] = {{"segtape", kArenaSource},
                 {"libtorch", r.libtorch_built ? r.libtorch_memory : r.libtorch_note}};
  if (r.anomaly.us_off > 0)
    j["anomaly_mode"] = {{"loop", "agent Trainer, recall, tbptt:" + std::to_string(c.trainer_k)},
                         {"us_per_step_off", r.anomaly.us_off},
                         {"us_per_step_on", r.anomaly.us_on},
                         {"cost_percent", r.anomaly.percent()}};
  else
    j["anomaly_mode"] = "not measured";
  nlohmann::json cs = nlohmann::json::array();
  for (const CaseResult& x : r.results) {
    const CaseInfo& i = info(x.id);
    nlohmann::json e = {{"case", i.name}, {"label", label(x.id, c)}, {"pitfall", i.pitfall}, {"summary", i.summary}, {"remedy", i.remedy}};
    e["segtape"] = summary_json(x.segtape, c.budget, "not run");
    e["segtape"]["policy"] = i.pitfall ? "teaching (TapeOptions{.grow = true})" : "strict (segment_budget = budget)";
    if (i.pitfall) e["segtape_strict_policy_error"] = error_json(x.strict);
    if (i.backward_every_step) e["segtape_without_retain_graph_error"] = error_json(x.no_retain);
    e["libtorch"] = summary_json(x.libtorch, c.budget, r.libtorch_note);
    if (x.id == Case::ExactReplay) {
      const replay::Report& rp = x.segtape.replay;
      if (!x.segtape.step.empty())
        e["segtape"]["replay"] = {{"window_steps", c.steps},
                                  {"k", c.k},
                                  {"segments", rp.segments},
                                  {"steps_run", rp.steps_run},
                                  {"recompute_factor", rp.recompute_factor},
                                  {"stored_states", rp.stored_states},
                                  {"state_bytes", rp.state_bytes},
                                  {"state_bytes_in_first_row", x.segtape.state_bytes.front()},
                                  {"input_bytes", rp.input_bytes},
                                  {"segment_peak", rp.segment_peak},
                                  {"rows", "arena bytes after the step in its replayed segment (a segment's last step: its "
                                           "high-water) + the boundary states needed then (state_bytes_in_first_row + one "
                                           "state per K steps; all of state_bytes at the last step)"}};
      const std::string not_run = "not checked (pitfall 1 did not run on LibTorch)";
      e["gradient_check"] = {
          {"against", label(Case::HiddenNotDetached, c)},
          {"relative_error", "per parameter ||got - want|| / max(||got||, ||want||), the largest"},
          {"tolerance", grad_tolerance(c.steps)},
          {"segtape", check_json(x.grad_check)},
          {"libtorch", x.libtorch_grad_check.run ? check_json(x.libtorch_grad_check) : nlohmann::json(not_run)},
          {"segtape_vs_libtorch_pitfall_1", x.cross_engine_check.run ? check_json(x.cross_engine_check) : nlohmann::json(not_run)}};
    }
    cs.push_back(e);
  }
  j["cases"] = cs;
  return j.dump(2) + "\n";
}

namespace {

// Case i (0-based) is drawn with kMarkers[i % 7]; pitfall i with kDashes[i], fixes solid.
const char* const kDashes[] = {"7 4", "2 3", "10 3 2 3", "5 2", "1 2", "12 5", "6 2 2 2"};
const Marker kMarkers[] = {Marker::Circle, Marker::Square, Marker::Triangle, Marker::Diamond,
                           Marker::Cross,  Marker::TriangleDown, Marker::Plus};

// A pitfall's legend notes: "= N" when its curve is an earlier pitfall's on
// the same engine, and the step it crosses the budget at (marked on the curve).
std::string pitfall_notes(const LabReport& r, const CaseResult& x, const Trace& t, Series& s) {
  std::string notes;
  for (const CaseResult& y : r.results) {
    if (&y == &x) break;
    const Trace& u = &t == &x.segtape ? y.segtape : y.libtorch;
    if (info(y.id).pitfall && u.step == t.step && u.bytes == t.bytes) {
      notes += "= " + std::to_string(int(y.id) + 1);
      break;
    }
  }
  const Summary m = summarise(t, r.config.budget);
  if (m.budget_step >= 0) {
    notes += (notes.empty() ? "" : "; ") + std::string("over at ") + (m.budget_extrapolated ? "~" : "") + num(m.budget_step);
    for (size_t i = 0; i < t.step.size() && !m.budget_extrapolated; ++i)
      if (double(t.step[i]) == m.budget_step) s.marks.push_back({s.x[i], s.y[i], ""});
  }
  return notes;
}

// Case x's curve from its trace t on one engine, in KiB; lo and hi take in
// its positive values (one scale for both engines).
Series case_series(const LabReport& r, const CaseResult& x, const Trace& t, double& lo, double& hi) {
  const size_t k = size_t(x.id);
  Series s{label(x.id, r.config), {}, {}};
  for (size_t i = 0; i < t.step.size(); ++i) {
    s.x.push_back(double(t.step[i])), s.y.push_back(t.bytes[i] / 1024);
    if (s.y.back() > 0) lo = std::min(lo, s.y.back()), hi = std::max(hi, s.y.back());
  }
  s.color = series_color(k);
  // Markers every eighth of the run, each case at its own offset, so that
  // curves drawn on top of each other still show every case.
  s.marker = kMarkers[k % std::size(kMarkers)];
  s.marker_every = std::max<size_t>(1, t.step.size() / 8);
  s.marker_offset = k * s.marker_every / cases().size();
  if (!info(x.id).pitfall) return s;
  s.dash = kDashes[k % std::size(kDashes)];
  const std::string notes = pitfall_notes(r, x, t, s);
  if (!notes.empty()) s.label += " (" + notes + ")";
  return s;
}

}  // namespace

std::string to_svg(const LabReport& r) {
  const LabConfig& c = r.config;
  // KiB on a plain log axis: decade ticks (100, 1000, 10000 KiB) read better
  // here than the byte axis's powers of 1024 over four decades.
  Panel st{"segtape: segment arena after each step (pitfalls: teaching policy; fixes: strict)", "step", "KiB", {}, true, false};
  Panel lt{"LibTorch: live CPU tensor bytes after each step (counting allocator), same model and data", "step", "KiB", {}, true, false};
  if (r.libtorch_built && r.libtorch_memory.rfind("RSS", 0) == 0) lt.title = "LibTorch: process RSS after each step (allocator not installed)";
  const std::string budget = format_bytes(c.budget);
  st.note = "dashed with markers: pitfalls; solid: fixes; horizontal line: the " + budget +
            " budget; open marker: a pitfall's first step over it (legend: that step, ~ extrapolated).\n"
            "A curve identical to an earlier one lies under it and says so in its legend (\"= 1\": the same as pitfall 1); its markers sit at other steps.";
  lt.note = "Same conventions; the budget applies to segtape only and is drawn for comparison.";
  double lo = double(c.budget) / 1024, hi = lo;
  for (const CaseResult& x : r.results)
    for (auto [t, p] : {std::pair{&x.segtape, &st}, std::pair{&x.libtorch, &lt}})
      if (!t->engine.empty()) p->series.push_back(case_series(r, x, *t, lo, hi));
  for (Panel* p : {&st, &lt}) {
    p->hlines.push_back({double(c.budget) / 1024, "budget " + budget + " (strict policy)"});
    p->y_min = lo / 1.3, p->y_max = hi * 1.3;  // one scale for both engines
  }
  if (!r.libtorch_built) {
    st.note += "\n" + r.libtorch_note + ": only segtape's panel is drawn.";
    return render_svg({st}, 1100, 470);
  }
  return render_svg({st, lt}, 1100, 470);
}

namespace {

// A trace's columns: bytes per step, peak, time per step at the start and the end.
std::string summary_cell(const Trace& t, size_t budget) {
  if (t.engine.empty()) return "not run";
  const Summary m = summarise(t, budget);
  char x[96];
  std::snprintf(x, sizeof x, "%9s %9s %4.2f>%-5.2f", signed_bytes(m.bytes_per_step).c_str(), format_bytes(size_t(m.bytes_peak)).c_str(),
                m.ms_start, m.ms_end);
  return x;
}

// The step a trace crosses the budget at.
std::string over_cell(const Trace& t, size_t budget) {
  if (t.engine.empty()) return "-";
  const Summary m = summarise(t, budget);
  if (m.budget_step < 0) return "never";
  return (m.budget_extrapolated ? "~" : "") + num(m.budget_step);
}

// The last column: a pitfall's error under the strict policy, or a fix's segment peak.
std::string strict_cell(const CaseResult& x) {
  if (info(x.id).pitfall)
    return x.strict.error.empty() ? "no error (fits the budget)" : x.strict.error_type + " at step " + std::to_string(x.strict.error_step);
  if (!x.segtape.error.empty()) return "FAILED: " + x.segtape.error_type;
  return "fits (peak " + format_bytes(size_t(*std::max_element(x.segtape.segment_peaks.begin(), x.segtape.segment_peaks.end()))) + ")";
}

// exact-replay's lines under the table: its replay, and its gradients against pitfall 1's.
std::string exact_lines(const LabConfig& c, const CaseResult& x) {
  std::string s;
  char b[512];
  const replay::Report& rp = x.segtape.replay;
  if (!x.segtape.step.empty()) {
    std::snprintf(b, sizeof b,
                  "%s: one window of %ld steps in %ld segments of %ld, %ld step evaluations (recompute factor %.2f); "
                  "%ld boundary states + dL/dh + the final state stored (%s), rows count those still needed (%s at the first step)\n",
                  label(x.id, c).c_str(), c.steps, rp.segments, c.k, rp.steps_run, rp.recompute_factor, rp.stored_states,
                  format_bytes(rp.state_bytes).c_str(), format_bytes(size_t(x.segtape.state_bytes.front())).c_str());
    s += b;
  }
  s += label(x.id, c) + ": parameter gradients vs " + label(Case::HiddenNotDetached, c) + "'s, max relative error: segtape " +
       check_line(x.grad_check);
  if (x.libtorch_grad_check.run) s += "; libtorch " + check_line(x.libtorch_grad_check);
  if (x.cross_engine_check.run) s += "; segtape's vs LibTorch's pitfall 1 " + check_line(x.cross_engine_check);
  return s + "\n";
}

}  // namespace

std::string table(const LabReport& r) {
  const LabConfig& c = r.config;
  std::string s;
  char b[512];
  std::snprintf(b, sizeof b, "retention lab: B=%ld vocab=%ld embed=%ld H=%ld, %ld steps, lag %ld, K=%ld, budget %s, segtape on %s\n",
                c.batch, c.vocab, c.embed, c.hidden, c.steps, c.lag, c.k, format_bytes(c.budget).c_str(), c.device.c_str());
  s += b;
  s += "memory: segtape = segment arena bytes in use; libtorch = " +
       (r.libtorch_built ? r.libtorch_memory : r.libtorch_note) + "\n\n";
  std::snprintf(b, sizeof b, "%-26s | %-31s | %-31s | %-15s | %s\n", "case", "segtape: B/step  peak   ms/step", "libtorch: B/step  peak  ms/step",
                "over budget at", "strict policy (segtape)");
  s += b;
  s += std::string(26, '-') + "-+-" + std::string(31, '-') + "-+-" + std::string(31, '-') + "-+-" + std::string(15, '-') + "-+-" +
       std::string(30, '-') + "\n";
  for (const CaseResult& x : r.results) {
    std::snprintf(b, sizeof b, "%-26s | %-31s | %-31s | %6s / %-6s | %s\n", label(x.id, c).c_str(), summary_cell(x.segtape, c.budget).c_str(),
                  summary_cell(x.libtorch, c.budget).c_str(), over_cell(x.segtape, c.budget).c_str(), over_cell(x.libtorch, c.budget).c_str(),
                  strict_cell(x).c_str());
    s += b;
  }
  s += "\nB/step: least-squares slope of bytes vs step; ms/step: first 10% > last 10% of steps; over budget at: step at which\n"
       "the budget is exceeded (segtape / libtorch; ~ extrapolated from the fit).\n";
  for (const CaseResult& x : r.results)
    if (x.id == Case::ExactReplay) s += exact_lines(c, x);
  if (r.anomaly.us_off > 0) {
    std::snprintf(b, sizeof b, "anomaly mode on the agent loop (Trainer, tbptt:%ld): %.1f us/step off, %.1f us/step on (%+.1f%%)\n",
                  c.trainer_k, r.anomaly.us_off, r.anomaly.us_on, r.anomaly.percent());
    s += b;
  }
  return s;
}

}  // namespace segtape::agent::retention
