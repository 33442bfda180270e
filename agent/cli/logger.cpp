#include "logger.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "summary.h"

namespace segtape_cli {

using segtape::agent::UpdateResult;
using segtape::agent::Trainer;

bool Cadence::due(const Trainer& tr) {
  if (tr.step() < next_ && !tr.done()) return false;
  next_ += every_;
  return true;
}

Logger::Logger(Trainer& tr, RunKind kind, std::vector<Row> rows) : tr_(tr), kind_(kind), rows_(std::move(rows)) {}

void Logger::start() { interval_start_ = Clock::now(); }

double Logger::rate(Clock::time_point now) const {
  const double secs = std::chrono::duration<double>(now - interval_start_).count();
  return secs > 0 ? double(timed_steps_) / secs : 0;
}

void Logger::update(const UpdateResult& r) {
  open_.steps += r.steps, timed_steps_ += r.steps;
  open_.loss_sum += r.loss_sum;
  open_.loss_steps += r.loss_steps;
  open_.return_sum += r.return_sum;
  open_.episodes += r.episodes;
  for (const segtape::agent::Metric& m : r.metrics) algo_last_[m.name] = m.value, algo_series_[m.name].emplace_back(tr_.step(), m.value);
  if (r.loss_steps && !r.metrics.empty()) {
    AlgoFigures f{.algo = kind_.algo};
    for (const segtape::agent::Metric& m : r.metrics)
      if (f.n < f.metrics.size()) f.metrics[f.n++] = m;
    figures_ = f;
  }
  const segtape::TapeStats& st = tr_.tape().stats();
  size_t peak = kind_.full ? st.peak_bytes : st.last_segment_peak;
  if (r.segment_peak) peak = r.segment_peak;  // exact, ppo: the largest segment of the window or iteration
  open_.peak = std::max(open_.peak, peak);
  steps_run_ += r.steps_run, steps_done_ += r.steps_run ? r.steps : 0, stored_bytes_ = std::max(stored_bytes_, r.stored_bytes);
  node_peak_ = std::max(node_peak_, st.node_peak_bytes);
  last_update_ = Clock::now();
  if (open_.loss_steps) open_.last_loss = open_.loss_sum / double(open_.loss_steps);
  const Update u{tr_.step(), open_.last_loss, tr_.env().score(), peak, rate(last_update_)};
  for (auto& s : sinks_) s->update(u);
}

void Logger::budget_reached() {
  open_.peak = std::max(open_.peak, tr_.tape().stats().peak_bytes);
  row_if_open();
}

void Logger::row_if_open() {
  if (open_.steps) row_at(Clock::now());
}

void Logger::row_at(Clock::time_point now) {
  const double nothing = std::numeric_limits<double>::quiet_NaN();
  const Row row{tr_.step(), open_.loss_steps ? open_.last_loss : nothing,
                tr_.env().score_counts().second > 0 ? tr_.env().score() : nothing, open_.loss_steps > 0,
                open_.episodes ? open_.return_sum / double(open_.episodes) : nothing, open_.peak,
                segtape::agent::resident_bytes(), rate(now)};
  std::optional<AlgoFigures> figures = figures_;
  if (figures) figures->lr = tr_.lr();
  for (auto& s : sinks_) s->row(row, figures);
  rows_.push_back(row);
  std::fflush(stdout);
  tr_.env().reset_score();
  open_ = Interval{.last_loss = open_.last_loss};
  timed_steps_ = 0;
  interval_start_ = now;
}

bool Logger::wants_eval() const {
  return std::any_of(sinks_.begin(), sinks_.end(), [](const auto& s) { return s->wants_eval(); });
}

void Logger::eval(double score) {
  for (auto& s : sinks_) s->eval(tr_.step(), score);
}

void Logger::training_end() {
  for (auto& s : sinks_) s->training_end();
}

void Logger::end(RunEnd e) {
  for (auto& s : sinks_) {
    e.log_failure = failure();
    s->end(e);
  }
}

std::string Logger::failure() const {
  for (const auto& s : sinks_)
    if (std::string f = s->failure(); !f.empty()) return f;
  return "";
}

size_t Logger::run_peak() const {
  size_t peak = open_.peak;  // (segments since the last row, before a stop or on a resume's checkpoint)
  for (const Row& r : rows_) peak = std::max(peak, r.segment_peak);  // (a resumed run's earlier rows too)
  return peak;
}

void ProgressBar::update(const Update& u) {
  const auto now = Clock::now();
  if (u.step < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int width = 28;
  const int filled = int(double(width) * double(u.step) / double(total_));
  std::string bar(size_t(filled), '#');
  bar += std::string(size_t(width - filled), '-');
  char tokens[48] = "";
  if (tokens_) std::snprintf(tokens, sizeof tokens, " (%.0f tokens/s)", u.steps_per_s * double(tokens_));
  std::fprintf(stderr, "\r[%s] %ld/%ld %3.0f%% | %.0f steps/s%s | loss %.4f | %s %.1f%% | segment %s   ", bar.c_str(), u.step,
               total_, 100.0 * double(u.step) / double(total_), u.steps_per_s, tokens, u.loss, measure_.c_str(), 100 * u.score,
               segtape::format_bytes(u.peak).c_str());
  std::fflush(stderr);
}

void ProgressBar::training_end() { std::fputc('\n', stderr); }

void ConsoleRows::row(const Row& r, const std::optional<AlgoFigures>&) {
  char tokens[48] = "";
  if (tokens_) std::snprintf(tokens, sizeof tokens, " (%.0f tokens/s)", r.steps_per_s * double(tokens_));
  std::printf("step %ld/%ld  loss %s  %s %s  segment peak %s  rss %s  %.0f steps/s%s\n", r.step, total_,
              loss_text(r, "none", "{:.4f}").c_str(), measure_.c_str(), score_text(r.score).c_str(),
              segtape::format_bytes(r.segment_peak).c_str(), segtape::format_bytes(r.rss).c_str(), r.steps_per_s, tokens);
}

void MetricsCsvLog::claim() {
  if (claimed_) return;
  claimed_ = true;
  if (take_over_) {
    std::error_code ec;
    for (const char* f : {"checkpoint.safetensors", "metrics.csv", "metrics.json", "plot.svg"}) fs::remove(out_ / f, ec);
  }
  csv_.start(earlier_);
}

void MetricsCsvLog::row(const Row& r, const std::optional<AlgoFigures>&) {
  claim();
  csv_.append(r);
}

void TensorBoardLog::scalar(const std::string& tag, int64_t step, double v) {
  if (!writer_) return;
  try {
    writer_->scalar(tag, step, v);
  } catch (const std::exception& e) {
    failure_ = fmt::format("{} (the TensorBoard log under --log-dir stops at step {})", e.what(), step);
    std::fprintf(stderr, "segtape: warning: %s; training goes on\n", failure_.c_str());
    writer_.reset();
  }
}

void TensorBoardLog::row(const Row& r, const std::optional<AlgoFigures>& figures) {
  if (!std::isnan(r.loss)) scalar("train/loss", r.step, r.loss);
  if (!std::isnan(r.score)) scalar("train/" + measure_, r.step, r.score);
  if (!std::isnan(r.episode_return)) scalar("train/episode_return", r.step, r.episode_return);
  scalar("memory/segment_peak_bytes", r.step, double(r.segment_peak));
  scalar("memory/rss_bytes", r.step, double(r.rss));
  scalar("speed/steps_per_s", r.step, r.steps_per_s);
  if (figures) {
    const std::string prefix = std::string(figures->algo) + "/";
    for (size_t i = 0; i < figures->n; ++i) scalar(prefix + figures->metrics[i].name, r.step, figures->metrics[i].value);
    scalar(prefix + "lr", r.step, figures->lr);
  }
}

void TensorBoardLog::end(const RunEnd& e) {
  if (e.eval) scalar("eval/" + measure_, e.tr.step(), *e.eval);
}

}  // namespace segtape_cli
