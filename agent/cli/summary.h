// A run's end: plot.svg, metrics.json and what the run prints last (how it
// stopped and how to resume it, or its summary), and its exit status.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "logger.h"

namespace segtape::dist {
class Communicator;
}

namespace segtape_cli {

struct RunEnd {
  segtape::agent::Trainer& tr;
  const segtape::agent::TrainConfig& c;
  const Logger& log;                             // the rows, the peaks, exact's counts
  fs::path out;
  std::string plugin;                            // "" for a built-in env
  segtape::dist::Communicator* comm = nullptr;   // a data-parallel job's (nullptr: one process)
  bool resume = false;
  int64_t start_step = 0;                        // the step this process began at (a resumed run's checkpoint's)
  double wall = 0;                               // this process's seconds of training
  int64_t eval_steps = 0;
  std::optional<double> eval{};                  // the final greedy evaluation's score, when it ran to its end
  std::string stopped{};                         // why training ended before its last step ("" when it did not)
  std::string eval_stopped{};                    // the signal that stopped the final evaluation ("" when none did)
  bool finishing = false;                        // a resumed run whose training was complete: its end alone is written
  std::string log_failure{};                     // a sink's failure (Sink::failure), "" when none failed
  bool full() const { return RunKind::of(c).full; }
  bool budget_stop() const;                      // --history full stopped by its budget
  bool signal_stop() const;                      // stopped by SIGINT, SIGTERM or SIGPIPE
};

// plot.svg and metrics.json (in this order: metrics.json's "complete" marks
// the end as written, finished_metrics), then what the run prints last.
// before_write: this run's first write in its folder (MetricsCsvLog::claim).
class RunSummary : public Sink {
 public:
  explicit RunSummary(std::function<void()> before_write) : before_write_(std::move(before_write)) {}
  void end(const RunEnd& e) override;

 private:
  std::function<void()> before_write_;
};

// The exit status of a run that ended: the stop signal's (130, 143, 141),
// 2 for a budget stop or a log that failed, else 0.
int exit_status(const RunEnd& e, const std::string& log_failure);

}  // namespace segtape_cli
