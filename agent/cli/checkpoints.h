// The run's checkpoint: when it is written (every --checkpoint-every steps
// and at the run's end) and what the command line keeps in it beside the
// Trainer's state: the env's plug-in, the run's own cadence flags
// (run.flags.*), and the open log interval's sums (run.interval,
// run.interval_peak), so that a resumed run continues its rows as if it had
// never stopped.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "logger.h"

namespace segtape_cli {

using Metadata = std::map<std::string, std::string>;

class Checkpoints {
 public:
  // before_save: this run's first write in its folder (MetricsCsvLog::claim).
  Checkpoints(segtape::agent::Trainer& tr, const fs::path& file, int64_t every, Metadata run_meta, std::function<void()> before_save)
      : tr_(tr), file_(file), cadence_(every, tr.step()), run_meta_(std::move(run_meta)), before_save_(std::move(before_save)) {}
  // A checkpoint is due (every `every` steps, and at the run's last step).
  bool due() { return cadence_.due(tr_); }
  // Writes it, with the open interval's sums (none: --history full's one checkpoint, at its end).
  void save(const Interval* open);

 private:
  segtape::agent::Trainer& tr_;
  fs::path file_;
  Cadence cadence_;
  Metadata run_meta_;
  std::function<void()> before_save_;
};

// A resumed run's open interval from its checkpoint's metadata (absent
// entries: a checkpoint written before them; nothing is changed). A
// malformed entry is an Error naming the run's folder `out`.
void restore_interval(const Metadata& ck_meta, Interval& open, const fs::path& out);

}  // namespace segtape_cli
