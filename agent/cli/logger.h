// A training run's reporting, outside its loop: the loop hands each update's
// result to one Logger (update), closes a log interval when a row is due
// (row), and ends the run (end); the Logger keeps the open interval's sums
// and hands what they show to its sinks: the progress bar or the console's
// lines, metrics.csv, TensorBoard, and the run's summary (summary.h).
//
//   Logger log(tr, kind, rows);
//   log.add(std::make_unique<MetricsCsvLog>(...));
//   while (!tr.done()) {
//     log.update(tr.run_segment());
//     if (rows.due(tr)) log.row();
//   }
//   log.end(run_end);
#pragma once
#include <array>
#include <map>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "metrics_csv.h"
#include "tensorboard.h"

namespace segtape_cli {

using Clock = std::chrono::steady_clock;

// The open log interval: what the next metrics row averages. Its sums
// travel in the checkpoint (checkpoints.h), so a resumed run's next row is
// the row the run would have written had it never stopped.
struct Interval {
  double loss_sum = 0, return_sum = 0;
  int64_t loss_steps = 0, episodes = 0, steps = 0;
  double last_loss = 0;  // the mean loss of the last interval that had one (a row keeps it: the progress bar shows it)
  size_t peak = 0;       // the largest segment high-water since the last row (a row's segment_peak_bytes)
};

// Every `every` steps: due once the run reaches the next multiple, and at its
// last step; a due cadence moves on to the multiple after.
class Cadence {
 public:
  Cadence(int64_t every, int64_t step) : every_(every), next_((step / every + 1) * every) {}
  bool due(const segtape::agent::Trainer& tr);

 private:
  int64_t every_, next_;
};

// After each update, for the progress bar.
struct Update {
  int64_t step = 0;
  double loss = 0, score = 0;
  size_t peak = 0;  // the last segment's high-water
  double steps_per_s = 0;
};

// The algorithm's own figures of its last update that had a loss (PPO's KL
// estimate and clip fraction; UpdateResult::metrics) and Adam's learning
// rate at a row, under the algorithm's name: for an algorithm that reports any.
struct AlgoFigures {
  const char* algo = "";
  std::array<segtape::agent::Metric, 8> metrics{};
  size_t n = 0;
  double lr = 0;
};

struct RunEnd;  // summary.h

// One reporting sink; each event has a default that ignores it.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void update(const Update&) {}
  virtual void row(const Row&, const std::optional<AlgoFigures>&) {}
  // Whether the sink wants a greedy evaluation at every checkpoint, and its score then (NaN: nothing scored).
  virtual bool wants_eval() const { return false; }
  virtual void eval(int64_t /*step*/, double /*score*/) {}
  virtual void training_end() {}  // the loop has ended
  virtual void end(const RunEnd&) {}
  // Why the sink stopped writing ("" when it did not): a log that cannot be
  // written ends the log, not the run.
  virtual std::string failure() const { return ""; }
};

class Logger {
 public:
  // rows: a resumed run's rows up to its checkpoint.
  Logger(segtape::agent::Trainer& tr, RunKind kind, std::vector<Row> rows);
  void add(std::unique_ptr<Sink> sink) { sinks_.push_back(std::move(sink)); }
  // The open interval's clock starts (the loop begins).
  void start();
  // An update's result into the open interval, and the progress bar: the
  // one place the command line reads an UpdateResult.
  void update(const segtape::agent::UpdateResult& r);
  // A --history full run stopped by its budget: its one segment's high-water,
  // and the open interval's row.
  void budget_reached();
  // Closes the open interval at the last update: its row to every sink.
  void row() { row_at(last_update_); }
  // The same now, when the open interval has steps (a run that stopped).
  void row_if_open();
  bool wants_eval() const;
  void eval(double score);
  void training_end();
  // Each sink's end, given the failures of the sinks before it.
  void end(RunEnd e);
  std::string failure() const;

  Interval& open() { return open_; }
  const Interval& open() const { return open_; }
  const std::vector<Row>& rows() const { return rows_; }
  // The run's largest segment high-water: its rows' and the open interval's
  // (a run whose steps are no multiple of K ends with a shorter, smaller segment).
  size_t run_peak() const;
  // Each figure of the algorithm's own (UpdateResult::metrics) as it last
  // reported it: a language model's validation and test loss, PPO's KL.
  const std::map<std::string, double>& algo_figures() const { return algo_last_; }
  // Every report of each of them this process saw: (step, value), in order
  // (a language model's validation loss at each epoch's end).
  const std::map<std::string, std::vector<std::pair<int64_t, double>>>& algo_series() const { return algo_series_; }
  size_t node_peak() const { return node_peak_; }
  // exact: step evaluations (forward pass and replays), the steps they
  // covered, and the most bytes of boundary states kept.
  int64_t steps_run() const { return steps_run_; }
  int64_t steps_done() const { return steps_done_; }
  size_t stored_bytes() const { return stored_bytes_; }

 private:
  void row_at(Clock::time_point now);
  double rate(Clock::time_point now) const;  // steps per second since the interval began

  segtape::agent::Trainer& tr_;
  RunKind kind_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<Row> rows_;
  Interval open_;
  int64_t timed_steps_ = 0;  // the open interval's steps this process ran (its steps per second)
  Clock::time_point interval_start_{}, last_update_{};
  size_t node_peak_ = 0, stored_bytes_ = 0;
  int64_t steps_run_ = 0, steps_done_ = 0;
  std::optional<AlgoFigures> figures_;
  std::map<std::string, double> algo_last_;
  std::map<std::string, std::vector<std::pair<int64_t, double>>> algo_series_;
};

// The progress bar on a terminal's stderr, redrawn at most every 100 ms.
class ProgressBar : public Sink {
 public:
  // tokens: the tokens a step reads (a language model's batch), 0: none shown
  ProgressBar(int64_t total, std::string measure, int64_t tokens = 0) : total_(total), measure_(std::move(measure)), tokens_(tokens) {}
  void update(const Update& u) override;
  void training_end() override;

 private:
  int64_t total_;
  std::string measure_;
  int64_t tokens_;
  Clock::time_point last_{};
};

// A line on stdout per row, where no progress bar is drawn.
class ConsoleRows : public Sink {
 public:
  ConsoleRows(int64_t total, std::string measure, int64_t tokens = 0) : total_(total), measure_(std::move(measure)), tokens_(tokens) {}
  void row(const Row& r, const std::optional<AlgoFigures>&) override;

 private:
  int64_t total_;
  std::string measure_;
  int64_t tokens_;  // as ProgressBar's
};

// metrics.csv, from the run's first write on. --force takes the folder when
// this run first writes there (a metrics row, a checkpoint or its end): the
// old run's files stay whole until this run has trained a step to replace
// them with, so a run that fails at its first segment (a budget too small,
// an env plug-in's error) or is killed before it writes leaves the old run as
// it was. Then nothing of the old run may be mistaken for the new one's: its
// four files go.
class MetricsCsvLog : public Sink {
 public:
  // earlier: the rows metrics.csv starts with (a resumed run's up to its checkpoint).
  MetricsCsvLog(const fs::path& out, const std::string& measure, bool rl, bool take_over, std::vector<Row> earlier)
      : out_(out), csv_(out / "metrics.csv", measure, rl), take_over_(take_over), earlier_(std::move(earlier)) {}
  // This run's first write in the folder (later calls do nothing).
  void claim();
  void row(const Row& r, const std::optional<AlgoFigures>&) override;

 private:
  fs::path out_;
  MetricsCsv csv_;
  bool take_over_, claimed_ = false;
  std::vector<Row> earlier_;
};

// --log-dir: TensorBoard scalars with every metrics row, a greedy eval at
// every checkpoint and at the end. A log that cannot be written (a full disk
// under --log-dir) ends the log, not the run: a warning, training goes on and
// writes its checkpoints, and the run exits 2 at its end with the error.
class TensorBoardLog : public Sink {
 public:
  TensorBoardLog(const std::string& dir, std::string measure) : measure_(std::move(measure)) { writer_.emplace(dir, "--log-dir"); }
  void row(const Row& r, const std::optional<AlgoFigures>& figures) override;
  bool wants_eval() const override { return writer_.has_value(); }
  void eval(int64_t step, double score) override { scalar("eval/" + measure_, step, score); }
  void end(const RunEnd& e) override;
  std::string failure() const override { return failure_; }

 private:
  void scalar(const std::string& tag, int64_t step, double v);
  std::string measure_, failure_;
  std::optional<segtape::agent::tensorboard::EventWriter> writer_;
};

}  // namespace segtape_cli
