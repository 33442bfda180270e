#include "summary.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "run_dir.h"
#include "segtape/agent/plot.h"
#include "segtape/blas.h"
#include "segtape/nn/dist.h"
#include "signals.h"

namespace segtape_cli {

using nlohmann::json;
using segtape::format_bytes;
using segtape::TapeStats;
using namespace segtape::agent;

bool RunEnd::budget_stop() const { return full() && !stopped.empty() && !is_stop_signal(stopped); }
bool RunEnd::signal_stop() const { return !stopped.empty() && !budget_stop(); }

int exit_status(const RunEnd& e, const std::string& log_failure) {
  if (e.signal_stop()) return stop_exit_code(e.stopped);
  if (!e.eval_stopped.empty()) return stop_exit_code(e.eval_stopped);
  if (e.budget_stop() || !log_failure.empty()) return 2;
  return 0;
}

namespace {

// ---- plot.svg

// The score panel: the env's measure on a fixed 0-100 % axis with the chance
// level and the final greedy evaluation.
Panel score_panel(const std::vector<Row>& rows, const EnvSpec& spec, const std::optional<double>& eval) {
  const std::string& measure = spec.measure;
  Series score{measure + " (training)", {}, {}};
  for (const Row& r : rows) score.x.push_back(double(r.step)), score.y.push_back(100.0 * r.score);
  const double chance = 100.0 / double(spec.num_actions);
  Panel p{measure + " (%)", "step", measure + " %", {score}, false, false};
  p.y_min = 0, p.y_max = 100;
  p.hlines.push_back({chance, fmt::format("chance {:.1f}% (uniform over {} actions)", chance, spec.num_actions), "#888888", "4 3"});
  if (eval && !rows.empty())
    p.series[0].marks.push_back({double(rows.back().step), 100.0 * *eval, fmt::format("eval {:.1f}% (greedy)", 100.0 * *eval)});
  return p;
}

// The training plot: loss; the env's measure; RL: the episode return;
// memory. Nothing is drawn for a measure no interval has a value of.
std::string plot_svg(const std::vector<Row>& rows, const TrainConfig& c, const EnvSpec& spec, const std::optional<double>& eval) {
  Series loss{"loss per step", {}, {}}, ret{"mean episode return", {}, {}}, peak{"segment peak (arena)", {}, {}},
      rss{"process RSS", {}, {}};
  for (const Row& r : rows) {
    const double x = double(r.step);
    loss.x.push_back(x), loss.y.push_back(r.loss);
    if (!std::isnan(r.episode_return)) ret.x.push_back(x), ret.y.push_back(r.episode_return);
    peak.x.push_back(x), peak.y.push_back(double(r.segment_peak));
    rss.x.push_back(x), rss.y.push_back(double(r.rss));
  }
  const std::string what = c.env + ", history " + c.history.str() + ", B=" + std::to_string(c.batch) + ", H=" + std::to_string(c.hidden);
  std::vector<Panel> panels = {{"Training loss (" + what + ")", "step", "loss", {loss}, false, false}, score_panel(rows, spec, eval)};
  if (!spec.supervised) {
    Panel rp{"Episode return", "step", "return", {ret}, false, false};
    if (ret.x.empty()) rp.note = "no episode ended in a logged interval";
    panels.push_back(rp);
  }
  panels.push_back({"Memory: segment high-water vs process RSS", "step", "bytes", {peak, rss}, false, true});
  return render_svg(panels);
}

// ---- metrics.json

// Numbers as numbers: the checkpoint's string metadata, typed for JSON.
json config_json(const TrainConfig& c, size_t budget_applied) {
  json j = json::object();
  for (const auto& [k, v] : c.to_metadata()) {
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0' && errno == 0) {
      j[k] = i;
      continue;
    }
    const double d = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0' && std::isfinite(d)) j[k] = d;
    else j[k] = v;
  }
  j["seed"] = c.seed;  // a uint64: above 2^63 - 1 strtoll fails above and it would go out as a rounded double
  j["budget"] = budget_applied;
  return j;
}

json number_or_null(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

// The last row's figures and the final evaluation's.
// (null: the last log interval had no loss / scored nothing, or no row was logged)
void add_finals(json& j, const RunEnd& e) {
  const std::vector<Row>& rows = e.log.rows();
  const EnvSpec& spec = e.tr.env().spec();
  j["final_loss"] = number_or_null(rows.empty() ? std::nan("") : rows.back().loss);
  j["final_" + spec.measure] = number_or_null(rows.empty() ? std::nan("") : rows.back().score);
  if (!spec.supervised && !rows.empty() && !std::isnan(rows.back().episode_return))
    j["final_episode_return"] = rows.back().episode_return;
  if (e.eval) j["eval_" + spec.measure] = number_or_null(*e.eval), j["eval_steps"] = e.eval_steps;
}

void add_memory(json& j, const RunEnd& e) {
  const TapeStats st = e.tr.tape().stats();
  j["segment_peak_bytes"] = e.log.run_peak();
  j["node_peak_bytes"] = e.finishing ? json(nullptr) : json(e.log.node_peak());  // (not in metrics.csv: unknown here)
  if (e.log.steps_done()) {  // exact:K/T: the cost of replaying, next to the segment peak
    j["recompute_factor"] = double(e.log.steps_run()) / double(e.log.steps_done());
    j["stored_state_bytes"] = e.log.stored_bytes();
  }  // tape nodes of the largest segment (counted in the budget too)
  j["persistent_bytes"] = st.persistent_bytes;
  if (e.c.device == "cuda") {  // (this process's segments)
    j["cuda_graphs"] = {{"on", e.tr.graph_segments()}, {"captured", st.graph_captures}, {"replayed", st.graph_replays},
                        {"segments", st.segment_index}};
    j["recurrence"] = e.tr.recurrence();
  }
}

void add_process(json& j, const RunEnd& e) {
  j["parameters"] = e.tr.policy().parameter_count();
  j["rss_bytes"] = resident_bytes();
  j["peak_rss_bytes"] = peak_resident_bytes();  // (this process's: a resumed run's from its resume)
  const SizeEstimate& s = e.tr.size_estimate();  // what the size check counted, before anything was allocated
  j["memory_estimate"] = {{"resident_bytes", s.resident_total}, {"address_bytes", s.address_total},
                          {"process_bytes", s.process_bytes},   {"parameter_bytes", s.parameter_bytes},
                          {"arena_bytes", s.arena_bytes},       {"segment_bytes", s.segment_bytes},
                          {"packed_bytes", s.packed_bytes},
                          {"rollout_bytes", s.rollout_bytes},   {"checkpoint_bytes", s.checkpoint_bytes},
                          {"other_bytes", s.other_bytes},       {"dist_bytes", s.dist_bytes}};
  j["wall_seconds"] = e.wall;
  j["blas_kernels"] = segtape::blas_kernels();
  j["resumed"] = e.resume;
  if (e.resume) j["resumed_at_step"] = e.start_step;  // wall_seconds: this process's, from that step
  if (const segtape::dist::AverageStats* ds = e.tr.dist_stats(); ds && ds->calls) {
    j["dist"] = {{"ranks", e.tr.ranks()},
                 {"backend", e.comm->backend()},
                 {"transport", e.tr.dist_transport()},
                 {"allreduce_seconds_per_update", ds->seconds / double(ds->calls)},
                 {"allreduce_bytes_per_update", ds->bytes / double(ds->calls)},
                 {"allreduce_calls_per_update", double(ds->collectives) / double(ds->calls)}};
  }
}

json metrics_json(const RunEnd& e) {
  json j;
  j["config"] = config_json(e.c, e.tr.budget());
  if (!e.plugin.empty()) j["config"]["env_plugin"] = e.plugin;
  j["steps"] = e.tr.step();
  j["skipped_updates"] = e.tr.skipped_updates();  // (--nonfinite skip)
  add_finals(j, e);
  add_memory(j, e);
  add_process(j, e);
  if (!e.log.algo_figures().empty()) {
    const std::string algo = segtape::agent::algo_name(e.c.algo);
    j[algo] = e.log.algo_figures();  // the algorithm's own, as last reported
    for (const auto& [name, points] : e.log.algo_series())  // and every report of them (this process's)
      for (const auto& [step, value] : points) j[algo + "_series"][name].push_back({step, value});
  }
  j["complete"] = e.stopped.empty();
  if (e.signal_stop()) j["interrupted"] = e.stopped;
  if (!e.eval_stopped.empty()) j["interrupted"] = e.eval_stopped + " during the final evaluation";
  if (e.budget_stop()) j["stopped_by_budget"] = e.stopped;
  return j;
}

// ---- what the run prints last

// A run that stopped early says how and what to do next; false when it did not stop.
bool print_stop(const RunEnd& e) {
  const char* out = e.out.c_str();
  const int64_t step = e.tr.step();
  if (e.signal_stop()) {
    std::printf("\nstopped by %s at step %ld of %ld; wrote %s/{%smetrics.csv, metrics.json, plot.svg}\n", e.stopped.c_str(),
                step, e.c.steps, out, e.full() ? "" : "checkpoint.safetensors, ");
    if (!e.full() && e.comm) std::printf("resume with: mpirun -np %d segtape train --resume %s\n", e.comm->size(), out);
    else if (!e.full()) std::printf("resume with: segtape train --resume %s\n", out);
    else std::printf("(--history full keeps its run in one segment and cannot be resumed)\n");
    return true;
  }
  if (!e.eval_stopped.empty()) {
    std::printf("\nstopped by %s during the final evaluation: training is complete (%ld steps); metrics.json has no eval score\n",
                e.eval_stopped.c_str(), step);
    if (!e.full())
      std::printf("evaluate it with: segtape eval --checkpoint %s/checkpoint.safetensors, or write its final evaluation with: "
                  "segtape train --resume %s\n", out, out);
    return true;
  }
  if (e.budget_stop()) {
    std::fprintf(stderr, "segtape: error: %s\n", e.stopped.c_str());
    std::printf("\nthe run stopped at its budget at step %ld; metrics and plot up to the stop: %s/{metrics.csv, metrics.json, plot.svg}\n",
                step, out);
    return true;
  }
  return false;
}

void print_training(const RunEnd& e, const json& j) {
  const TrainConfig& c = e.c;
  const std::vector<Row>& rows = e.log.rows();
  const std::string settings = env_settings(c), measure = e.tr.env().spec().measure;
  std::printf("  env / history        %s%s%s%s / %s\n", c.env.c_str(), settings.empty() ? "" : " (", settings.c_str(),
              settings.empty() ? "" : ")", c.history.str().c_str());
  if (e.resume)
    std::printf("  steps                %ld (batch %ld); %ld of them in %.1f s after resuming at step %ld\n", e.tr.step(), c.batch,
                e.tr.step() - e.start_step, e.wall, e.start_step);
  else
    std::printf("  steps                %ld (batch %ld) in %.1f s\n", e.tr.step(), c.batch, e.wall);
  if (rows.empty() || !rows.back().has_loss) std::printf("  final loss           none (no loss in the last log interval)\n");
  else if (!std::isfinite(rows.back().loss)) std::printf("  final loss           %s (the run diverged)\n", loss_text(rows.back(), "", "{}").c_str());
  else std::printf("  final loss           %.4f\n", rows.back().loss);
  std::printf("  train %-14s %s (last log interval)\n", measure.c_str(), score_text(rows.empty() ? std::nan("") : rows.back().score).c_str());
  if (j.contains("final_episode_return"))
    std::printf("  episode return       %.3f (mean, last log interval)\n", j["final_episode_return"].get<double>());
  std::printf("  eval %-15s %s (%ld fresh steps x %ld streams, greedy)\n", measure.c_str(), score_text(*e.eval).c_str(), e.eval_steps,
              c.batch);
  for (const auto& [name, value] : e.log.algo_figures()) std::printf("  %-20s %.4f\n", name.c_str(), value);  // (the algorithm's own)
  if (e.tr.skipped_updates() > 0)
    std::printf("  skipped updates      %ld (their gradient was not finite; --nonfinite skip)\n", e.tr.skipped_updates());
}

void print_resources(const RunEnd& e, const json& j) {
  const TapeStats st = e.tr.tape().stats();
  std::printf("  segment peak         %s%s\n", format_bytes(e.log.run_peak()).c_str(), e.full() ? " (one growing segment)" : " (fixed per segment)");
  std::printf("  persistent memory    %s (%ld parameters)\n", format_bytes(st.persistent_bytes).c_str(), e.tr.policy().parameter_count());
  if (e.c.precision != "f32")
    std::printf("  precision            %s matrix products (the rest float32; docs/precision.md)\n", e.c.precision.c_str());
  if (e.c.device == "cuda")
    std::printf("  cuda graphs          %s\n", e.tr.graph_segments() ? (std::to_string(st.graph_replays) + " of " + std::to_string(st.segment_index) +
                                                                          " segments replayed a graph (" + std::to_string(st.graph_captures) +
                                                                          " captured; evaluation segments included)").c_str()
                                                                     : "off (--cuda-graphs off, or the run does not allow them: docs/agent.md)");
  if (e.c.device == "cuda") std::printf("  recurrence           %s\n", e.tr.recurrence().c_str());
  if (j.contains("dist"))
    std::printf("  data parallel        %d ranks; all-reduce %.3f ms and %s per update (rank 0)\n", e.tr.ranks(),
                1e3 * j["dist"]["allreduce_seconds_per_update"].get<double>(),
                format_bytes(size_t(j["dist"]["allreduce_bytes_per_update"].get<double>())).c_str());
  std::printf("  files                %s/{metrics.csv, metrics.json, checkpoint.safetensors, plot.svg}\n", e.out.c_str());
}

}  // namespace

void RunSummary::end(const RunEnd& e) {
  const json j = metrics_json(e);
  if (before_write_) before_write_();
  write_text(e.out / "plot.svg", plot_svg(e.log.rows(), e.c, e.tr.env().spec(), e.eval));
  write_text(e.out / "metrics.json", j.dump(2) + "\n");
  if (!e.log_failure.empty() && (e.signal_stop() || !e.eval_stopped.empty() || e.budget_stop()))  // (the stop's own status is the exit status)
    std::fprintf(stderr, "segtape: error: %s\n", e.log_failure.c_str());
  if (print_stop(e)) return;
  std::printf("\nsummary\n");
  print_training(e, j);
  print_resources(e, j);
  if (!e.log_failure.empty()) std::fprintf(stderr, "segtape: error: %s\n", e.log_failure.c_str());
}

}  // namespace segtape_cli
