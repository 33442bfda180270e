#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "../task/corpus.h"
#include "../task/series_data.h"
#include "plugins.h"
#include "run_dir.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/safetensors.h"
#include "train.h"

namespace segtape_cli {

namespace dist = segtape::dist;
using segtape::Error;
using namespace segtape::agent;

namespace {

// The job's communicator under mpirun, when it has several ranks. (It lives
// as long as the process: main's error handling uses it.)
void open_job(Plan& p, const TrainArgs& a, const Given& given) {
  static std::unique_ptr<dist::Communicator> owner;
  if (given("--dist-timeout") && !(a.dist_timeout >= 1 && std::isfinite(a.dist_timeout)))  // (1e-9 failed a healthy job)
    throw Error(fmt::format("--dist-timeout {}: must be a finite number of seconds >= 1 (healthy ranks reach a collective "
                            "that far apart: rank 0 writes the checkpoints while the others wait)", a.dist_timeout));
  if (dist::launched_by_mpirun()) {
    owner = dist::mpi({.timeout_s = a.dist_timeout});
    if (owner->size() > 1) p.comm = owner.get(), set_job_communicator(p.comm);
  }
  p.root = !p.comm || p.comm->rank() == 0;
}

// The three cadence flags as the command line names them, with what they set.
std::array<std::pair<const char*, int64_t*>, 3> cadence_flags(TrainArgs& a) {
  return {{{"--log-every", &a.log_every}, {"--checkpoint-every", &a.checkpoint_every}, {"--eval-steps", &a.eval_steps}}};
}

void check_cadence_flags(TrainArgs& a, const Given& given) {
  for (const auto& [opt, v] : cadence_flags(a))
    if (given(opt) && (*v < 1 || *v > TrainConfig::kMaxSteps)) throw Error(std::string(opt) + " " + std::to_string(*v) + ": must be in [1, 1e9]");
}

// --resume: the checkpoint's configuration, plug-in, metadata and rows
// (rank 0 reads them); a flag that would change the run is refused.
void read_resumed(Plan& p, const TrainArgs& a, const Given& given) {
  p.out = a.resume;
  const fs::path ck = p.out / "checkpoint.safetensors";
  if (p.root) {
    if (!exists_named(ck, "--resume " + p.out.string())) throw Error("--resume " + p.out.string() + ": no checkpoint.safetensors there; start a new run with --out");
    p.c = Trainer::read_config(ck);
    p.plugin = checkpoint_plugin(ck, p.c.env, "--resume " + p.out.string());
    p.ck_meta = segtape::safetensors::load(ck).metadata;
    for (const auto& [k, v] : p.ck_meta)
      if (k.rfind("run.flags.", 0) == 0) p.stored_flags[k] = v;
    p.rows = MetricsCsv::read(p.out / "metrics.csv", p.resumed_header);  // (refused here, before any collective, when damaged)
  }
  p.c.budget_name = "--budget";
  for (const char* opt : {"--env", "--task", "--data", "--valid", "--test", "--split", "--tokens", "--history", "--batch", "--hidden", "--embed", "--update-bias", "--lag", "--sparse", "--vocab", "--corridor", "--turns", "--cities", "--seed", "--lr", "--budget",
                          "--gamma", "--entropy", "--algo", "--rollout", "--epochs", "--minibatches", "--clip-range", "--gae-lambda",
                          "--lr-schedule", "--env-shards", "--clip", "--out", "--force", "--cell", "--layers", "--dropout", "--tied", "--optim", "--adam-eps", "--encoder",
                          "--critic", "--clip-schedule", "--head-hidden", "--value-clip", "--ortho-init", "--precision"})
    if (given(opt)) throw Error(std::string(opt) + " cannot change on --resume: the run continues with the configuration in its checkpoint");
  for (const char* opt : {"--target", "--features"})
    if (given(opt)) throw Error(std::string(opt) + " cannot change on --resume: the run continues with the configuration in its checkpoint");
}

// Flags of another algorithm or of another built-in env would be recorded
// as the run's settings and do nothing: refused, as --sparse is on tmaze.
void refuse_other_flags(const TrainConfig& c, const Given& given) {
  if (given("--epochs") && c.algo == segtape::agent::Algo::Lm && given("--steps"))
    throw Error("--epochs and --steps both say how long --task lm trains: give one of them");
  if (!RunKind::of(c).ppo)
    for (const char* opt : {"--rollout", c.algo == segtape::agent::Algo::Lm ? "--rollout" : "--epochs", "--minibatches", "--clip-range", "--gae-lambda", "--lr-schedule",
                            "--clip-schedule", "--value-clip"})
      if (given(opt)) throw Error(std::string(opt) + " is --algo ppo's; this run is --algo " + algo_name(c.algo));
  const std::map<std::string, std::vector<const char*>> env_flags = {
      {"recall", {"--lag", "--vocab", "--sparse"}}, {"tmaze", {"--corridor"}}, {"dialogue", {"--turns", "--cities"}},
      {"lm", {"--data", "--valid", "--test", "--split", "--tokens"}},
      {"series", {"--data", "--valid", "--test", "--split", "--target", "--features"}}};
  if (!env_flags.count(c.env)) return;
  const std::vector<const char*>& own = env_flags.at(c.env);  // (lm and series share --data, --valid, --test, --split)
  const auto owned = [&](const char* opt) {
    return std::any_of(own.begin(), own.end(), [&](const char* o) { return std::string_view(o) == opt; });
  };
  for (const auto& [env, flags] : env_flags)
    if (env != c.env)
      for (const char* opt : flags)
        if (given(opt) && !owned(opt)) throw Error(std::string(opt) + " is --env " + env + "'s; this run is --env " + c.env);
}

// --task series: --env series --algo series, and the settings that learn a
// small series (a few hundred rows) in seconds: a GRU of 64 over encodings
// of 16, chunks of 16, Adam 3e-3, the gradient's norm clipped at 1, and
// kSeriesEpochs epochs of the training part (flags given win). The series is
// read here, before the run's folder is made: a bad file writes nothing.
void plan_series(Plan& p, const Given& given) {
  constexpr int64_t kSeriesEpochs = 100;
  if (given("--env")) throw Error("--task series is --env series: give one of them");
  p.c.env = "series";
  if (!given("--algo")) p.c.algo = segtape::agent::Algo::Series;
  if (!given("--hidden")) p.c.hidden = 64;
  if (!given("--embed")) p.c.embed = 16;
  if (!given("--batch")) p.c.batch = 4;
  if (!given("--lr")) p.c.lr = 3e-3;
  if (!given("--clip")) p.c.clip = 1;
  const auto& o = p.c.env_options;
  if (o.data.empty() || o.target.empty() || given("--steps")) return;  // (validate names what is missing)
  const auto series = segtape::agent::load_series(o.data, o.valid, o.test, o.target, o.features, o.split);
  p.c.steps = kSeriesEpochs * std::max<int64_t>(1, series->train_end / p.c.batch - 1);
}

// A new run: its history, budget and folder from the command line.
void plan_new(Plan& p, const TrainArgs& a, const Given& given) {
  if (given("--task") && a.task == "series") plan_series(p, given);
  else if (given("--task")) {  // --task lm: --env lm --algo lm
    if (a.task != "lm")
      throw Error("--task '" + a.task + "': choose lm (a language model of a text: --task lm --data FILE) or series (next-value "
                  "regression: --task series --data FILE.csv --target COLUMN)");
    if (given("--env")) throw Error("--task lm is --env lm: give one of them");
    p.c.env = "lm";
    if (!given("--algo")) p.c.algo = segtape::agent::Algo::Lm;
    // The settings that learn a character model of a text in minutes: two
    // GRU layers of 256 over embeddings of 128, chunks of 64, Adam 2e-3, the
    // gradient's norm clipped at 0.25, one epoch (flags given win).
    if (!given("--layers")) p.c.layers = 2;
    if (!given("--hidden")) p.c.hidden = 256;
    if (!given("--embed")) p.c.embed = 128;
    if (!given("--lr")) p.c.lr = 2e-3;
    if (!given("--clip")) p.c.clip = 0.25;
  }
  if (auto it = plugin_envs().find(p.c.env); it != plugin_envs().end()) p.plugin = it->second;
  p.c.history = History::parse(given("--history") || p.c.env != "lm" ? a.history : "tbptt:64");
  if (p.c.env == "series" && !given("--history")) p.c.history = History::parse("tbptt:16");
  if (p.c.env == "lm" && p.c.algo == segtape::agent::Algo::Lm && !given("--steps") && !p.c.env_options.data.empty()) {
    // one epoch: the training part's tokens per stream, less one (the corpus is read once, here and by the trainer)
    const auto& o = p.c.env_options;
    const auto corpus = segtape::agent::load_corpus(o.data, o.valid, o.test, segtape::agent::parse_tokens(o.tokens), o.split);
    const int64_t epochs = given("--epochs") ? p.c.epochs : 1;
    if (epochs < 1 || epochs > 100000) throw Error("--epochs must be in [1, 100000]");
    const int64_t streams = p.c.batch * (p.comm ? p.comm->size() : 1);  // (data parallel: the ranks' streams share the text)
    p.c.steps = std::min(TrainConfig::kMaxSteps, epochs * std::max<int64_t>(1, int64_t(corpus->train.size()) / streams - 1));
  }
  if (!a.budget.empty()) p.c.budget = parse_bytes(a.budget);
  p.out = a.out.empty() ? default_out(p.c.env) : fs::path(a.out);
  if (p.root && !a.force) p.header_only = refuse_a_run_in(p.out);
  refuse_other_flags(p.c, given);
}

// The checks before training, which only rank 0 makes where they read
// files: an error on any rank is every rank's (dist::raise_if_any); then
// the checkpoint's configuration (read by rank 0) to every rank.
void share_setup(Plan& p, const TrainArgs& a, const std::string& setup_error) {
  dist::Communicator& comm = *p.comm;
  dist::raise_if_any(comm, setup_error);
  // (before the broadcast below, which only resumed runs make)
  dist::check_same(comm, {{"--resume", p.resume ? "given" : "not given"}}, "the command line (--resume or --out)");
  // Rank 0 alone writes the TensorBoard log: a --log-dir the ranks do not
  // share (given to rank 1 only, or another folder) would be ignored.
  dist::check_same(comm, {{"--log-dir", a.log_dir.empty() ? "not given" : a.log_dir}}, "the command line (--log-dir: rank 0 writes it)");
  if (!p.resume) return;
  std::string meta;
  if (p.root) meta = nlohmann::json(p.c.to_metadata()).dump() + '\n' + nlohmann::json(p.stored_flags).dump() + '\n' + p.plugin;
  meta = comm.allgather(meta, "the broadcast of the checkpoint's configuration")[0];
  if (p.root) return;
  const size_t nl = meta.find('\n'), nl2 = meta.find('\n', nl + 1);
  p.stored_flags = nlohmann::json::parse(meta.substr(nl + 1, nl2 - nl - 1)).get<std::map<std::string, std::string>>();
  p.plugin = meta.substr(nl2 + 1);
  if (!p.plugin.empty() && !env_registered(nlohmann::json::parse(meta.substr(0, nl)).value("env", ""))) load_plugin(p.plugin);
  p.c = TrainConfig::from_metadata(nlohmann::json::parse(meta.substr(0, nl)).get<std::map<std::string, std::string>>());
  p.c.budget_name = "--budget";
}

// The run's own --log-every / --checkpoint-every / --eval-steps (stored_flags) where not given again.
void apply_stored_flags(Plan& p, TrainArgs& a, const Given& given) {
  for (const auto& [opt, v] : cadence_flags(a)) {
    const std::string key = std::string("run.flags.") + (opt + 2);
    const auto it = p.stored_flags.find(key);
    if (given(opt) || it == p.stored_flags.end()) continue;
    const std::string& text = it->second;
    int64_t n = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), n);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || n < 1 || n > TrainConfig::kMaxSteps)  // (as the flags)
      throw Error(fmt::format("--resume {}: checkpoint metadata {} is malformed ('{}')", p.out.string(), key, text));
    *v = n;
    if (v == &a.eval_steps) p.eval_given = true;
  }
}

void check_config(Plan& p, TrainArgs& a, const Given& given) {
  apply_stored_flags(p, a, given);
  p.c.validate();
  a.eval_steps = eval_steps_for(p.c, a.eval_steps, p.eval_given, "--eval-steps");
}

// The checks before training, which only rank 0 makes where they read
// files: under mpirun an error on any rank is every rank's.
void plan_setup(Plan& p, TrainArgs& a, const Given& given) {
  std::string setup_error;
  try {
    check_cadence_flags(a, given);
    if (p.comm && p.c.env_shards != 1) throw Error("--env-shards " + std::to_string(p.c.env_shards) + ": under mpirun each rank is one shard (leave --env-shards at 1)");
    if (p.resume) read_resumed(p, a, given);
    else plan_new(p, a, given);
  } catch (const std::exception& e) {
    if (!p.comm) throw;
    setup_error = e.what();
  }
  if (p.comm) share_setup(p, a, setup_error);
}

// The configuration checked: under mpirun an invalid one is every rank's error alike.
void check_config_on_every_rank(Plan& p, TrainArgs& a, const Given& given) {
  if (p.comm) {
    std::string invalid;
    try {
      check_config(p, a, given);
    } catch (const std::exception& e) {
      invalid = e.what();
    }
    dist::raise_if_any(*p.comm, invalid);
  }
  check_config(p, a, given);
}

// PPO on a supervised env: the reward (1 for the target class) depends on
// the step's action alone, so future rewards are noise in its return.
void default_gamma(Plan& p, const Given& given) {
  if (p.resume || given("--gamma") || !RunKind::of(p.c).ppo) return;
  if (make_env(p.c.env, p.c.batch, p.c.seed, p.c.env_options)->spec().supervised) p.c.gamma = 0;
}

}  // namespace

Plan plan_run(TrainArgs& a, const Given& given) {
  Plan p;
  p.c = a.c;
  p.c.budget_name = "--budget";
  if (given("--resume") && a.resume.empty()) throw Error("--resume needs the folder of a run (it was empty)");
  if (given("--out") && a.out.empty()) throw Error("--out needs a folder (it was empty; without --out a run goes to runs/ENV-TIME)");
  p.resume = !a.resume.empty();
  open_job(p, a, given);
  plan_setup(p, a, given);
  if (p.resume && given("--steps")) p.c.steps = a.c.steps;
  if (p.resume && given("--device")) p.c.device = a.c.device;  // a run may move between the CPU and a GPU
  p.eval_given = given("--eval-steps");
  check_config_on_every_rank(p, a, given);
  default_gamma(p, given);
  p.c.graph_replay = a.graphs == "auto";  // (also on --resume: how the run executes, not what it computes)
  p.c.device_loop = a.device_loop == "on";  // (likewise)
  return p;
}

std::map<std::string, std::string> run_metadata(const Plan& p, const TrainArgs& a) {
  std::map<std::string, std::string> m;
  if (!p.plugin.empty()) m[kPluginKey] = p.plugin;
  if (a.log_every > 0) m["run.flags.log-every"] = std::to_string(a.log_every);
  if (a.checkpoint_every > 0) m["run.flags.checkpoint-every"] = std::to_string(a.checkpoint_every);
  if (p.eval_given) m["run.flags.eval-steps"] = std::to_string(a.eval_steps);
  return m;
}

}  // namespace segtape_cli
