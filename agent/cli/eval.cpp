// segtape eval: a checkpoint's greedy score on fresh seeded episodes; and the
// evaluation's wording, which train's banner and summary share.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli.h"
#include "plugins.h"

namespace segtape_cli {

using segtape::Error;
using segtape::agent::TrainConfig;
using segtape::agent::Trainer;

std::string env_settings(const TrainConfig& c) {
  std::string s;
  if (c.env == "recall")
    s = "lag " + std::to_string(c.env_options.lag) + ", vocab " + std::to_string(c.env_options.vocab) +
        (c.env_options.sparse ? ", sparse" : "");
  if (c.update_bias != 0) {
    char b[48];
    std::snprintf(b, sizeof b, "update bias %g", c.update_bias);
    s += (s.empty() ? "" : ", ") + std::string(b);
  }
  return s;
}

int64_t eval_steps_for(const TrainConfig& c, int64_t steps, bool given, const char* flag) {
  if (steps < 1 || steps > TrainConfig::kMaxSteps) throw Error(fmt::format("{} {}: must be in [1, 1e9]", flag, steps));
  if (c.env != "recall") return steps;
  const int64_t lag = c.env_options.lag;
  if (!given) steps = std::max(steps, 2 * lag);
  if (steps <= lag)
    throw Error(fmt::format("{} {}: recall with --lag {} asks its first question at step {}, so {} steps would score nothing; "
                            "evaluate more than {} steps",
                            flag, steps, lag, lag, steps, lag));
  return steps;
}

std::string score_text(double score) { return std::isnan(score) ? "nothing scored" : fmt::format("{:.2f}%", 100 * score); }

void warn_non_finite(Trainer& tr, const std::string& file) {
  for (const auto& [name, p] : tr.policy().named_parameters()) {
    const std::vector<float> v = p.to_host<float>();
    const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    if (bad == v.end()) continue;
    std::fprintf(stderr, "segtape: warning: %s: parameter '%s' holds %s at element %td (the run diverged, or the file was "
                         "edited): what it scores is meaningless\n", file.c_str(), name.c_str(),
                 std::isnan(*bad) ? "NaN" : "inf", bad - v.begin());
    return;
  }
}

int eval(const EvalArgs& a, bool steps_given) {
  const std::string& checkpoint = a.checkpoint;
  int64_t steps = a.steps;
  if (steps < 1) throw Error("--steps " + std::to_string(steps) + ": must be >= 1 (steps of greedy evaluation)");
  TrainConfig c = Trainer::read_config(checkpoint);
  c.budget_name = "--budget";
  (void)checkpoint_plugin(checkpoint, c.env, "--checkpoint " + checkpoint);
  steps = eval_steps_for(c, steps, steps_given, "--steps");
  if (!a.device.empty()) c.device = a.device;
  Trainer tr(c);
  tr.load_rank0(checkpoint);  // a data-parallel run's too
  warn_non_finite(tr, checkpoint);
  const double s = tr.evaluate(steps, a.seed);
  const std::string measure = tr.env().spec().measure, settings = env_settings(c);
  std::printf("%s: %s %s over %ld fresh steps x %ld streams (env %s, history %s, seed %lu)\n", checkpoint.c_str(),
              measure.c_str(), score_text(s).c_str(), steps, c.batch, (c.env + (settings.empty() ? "" : ", " + settings)).c_str(),
              c.history.str().c_str(), a.seed);
  return 0;
}

}  // namespace segtape_cli
