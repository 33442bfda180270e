// segtape train: a run planned (cli/train_plan.cpp), its folder opened, then
// the training loop, with its reporting behind one Logger (cli/logger.h) and
// its checkpoint cadence in one object (cli/checkpoints.h), and its end
// (cli/summary.h).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "checkpoints.h"
#include "run_dir.h"
#include "segtape/nn/dist.h"
#include "signals.h"
#include "summary.h"
#include "train.h"

namespace segtape_cli {

namespace dist = segtape::dist;
using segtape::BudgetError;
using segtape::Error;
using namespace segtape::agent;

namespace {

// The greedy evaluation's length and seed, at checkpoints (with --log-dir) and at the end.
struct Eval {
  int64_t steps = 0;
  uint64_t seed = 0;
};

// The training loop and what it drives: the trainer, the logger every
// update goes to, the rows' and the checkpoints' cadences.
struct Loop {
  Trainer& tr;
  Logger& log;
  Cadence rows;
  Checkpoints& checkpoints;
  Eval eval;
  RunKind kind;
  dist::Communicator* comm;  // a data-parallel job's (nullptr: one process)

  // A segment, its report, a checkpoint when one is due, until the run is
  // done or stopped. Returns why it stopped before its last step ("" when it did not).
  std::string run() {
    log.start();
    while (!tr.done()) {
      if (stop_requested() && !comm) return stop_signal_name();
      // Data parallel: the request travels with this segment's update, and
      // every rank stops after it (the same step on every rank).
      if (stop_requested() && comm) tr.request_stop(stop_signal_reason());
      try {
        log.update(tr.run_segment());
      } catch (const BudgetError& e) {
        if (!kind.full) throw;
        // The teaching run reached its limit: that climb is the lesson, so
        // its metrics and plot are written up to here.
        std::string why = e.what();
        log.budget_reached();
        return why;
      }
      if (rows.due(tr)) log.row();
      if (!kind.full) checkpoint_if_due();
      if (comm && tr.stop_agreed() && !tr.done()) return stop_reason_name(tr.stop_reason());
    }
    return "";
  }

  // A checkpoint when one is due, then a greedy evaluation for the sinks
  // that want one (evaluate puts the training state back: the run continues
  // as without it).
  void checkpoint_if_due() {
    if (!checkpoints.due()) return;
    checkpoints.save(&log.open());
    if (!log.wants_eval() || tr.done()) return;
    const double score = tr.evaluate(eval.steps, eval.seed);
    if (!stop_requested()) log.eval(score);  // (a stopped evaluation is not a score)
  }

  // After the loop: a run stopped by a signal keeps the segment boundary it
  // stopped at; --history full logs its last interval when it stopped, and
  // writes its one checkpoint when it did not.
  void finish(const RunEnd& e) {
    if (!kind.full && e.signal_stop()) {
      checkpoints.save(&log.open());
      log.update(tr.stopped_figures());  // (a language model's validation loss where the run stopped)
    }
    if (kind.full && !e.stopped.empty()) log.row_if_open();
    if (kind.full && e.stopped.empty() && !e.finishing) checkpoints.save(nullptr);
  }
};

// a2c on a supervised env is cross-entropy on its targets: no return, no
// policy entropy. The flags would be recorded and do nothing.
void refuse_rl_flags(const Plan& p, const EnvSpec& spec, const Given& given) {
  if (p.resume || !spec.supervised || RunKind::of(p.c).ppo) return;
  for (const char* opt : {"--gamma", "--entropy"})
    if (given(opt))
      throw Error(std::string(opt) + " is for RL: --env " + p.c.env + " is supervised, and --algo a2c trains it with "
                  "cross-entropy on its targets (no return, no entropy bonus); --algo ppo uses it");
}

// A resumed run's folder, once its checkpoint is loaded.
enum class Resumed { Train, Finish, Complete };

// A resumed run's folder (rank 0), before it trains again: its metrics.csv's
// header checked, the folder locked, TensorBoard's new event file, and the
// temporary files of a killed write removed. A run killed while writing
// leaves its temporary files (".<file>.tmp",
// ".checkpoint.safetensors.tmp.<pid>.<n>"); the files themselves are intact.
// (Locked first: they may be a running process's. Not before here: a
// complete run's --resume writes nothing, in a read-only folder too.)
void reopen_run_dir(const Plan& p, const TrainArgs& a, const EnvSpec& spec, std::unique_ptr<TensorBoardLog>& tb) {
  MetricsCsv::check_header(p.out / "metrics.csv", p.resumed_header, spec.measure, !spec.supervised);
  lock_run_dir(p.out, "--resume");
  if (!a.log_dir.empty()) tb = std::make_unique<TensorBoardLog>(a.log_dir, spec.measure);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p.out, ec))
    if (is_run_temp_file(e.path().filename().string())) fs::remove(e.path(), ec);
}

// --resume: the checkpoint loaded into `tr`; a run whose training is
// complete either has its end still to write (Finish: killed during the
// final evaluation, or a full disk at metrics.json) or nothing to do
// (Complete: every file stays as it is). Then its folder reopened (rank 0),
// and the rows up to the checkpoint kept.
Resumed open_resumed(Trainer& tr, Plan& p, const TrainArgs& a, const Given& given, std::unique_ptr<TensorBoardLog>& tb) {
  const fs::path ck = p.out / "checkpoint.safetensors";
  const EnvSpec& spec = tr.env().spec();
  tr.load(ck);
  if (p.root) warn_non_finite(tr, ck.string());
  // (fewer steps than done: the run was taken for complete, its interrupted mark dropped)
  if (given("--steps") && p.c.steps < tr.step())
    throw Error(fmt::format("--steps {}: the checkpoint in {} is at step {}; pass --steps N with N > {} to train further, "
                            "or leave --steps out to finish the run as it was given", p.c.steps, p.out.string(), tr.step(), tr.step()));
  const bool finishing = tr.done() && p.root && !finished_metrics(p.out, tr.step());
  if (tr.done() && !finishing) {
    if (p.root) std::printf("%s: already complete (step %ld of %ld); nothing to do. To train further, pass --steps N with N > %ld.\n",
                            p.out.c_str(), tr.step(), p.c.steps, tr.step());
    return Resumed::Complete;
  }
  if (p.root) reopen_run_dir(p, a, spec, tb);
  while (!p.rows.empty() && p.rows.back().step > tr.step()) p.rows.pop_back();
  return finishing ? Resumed::Finish : Resumed::Train;
}

// A new run's folder: made, locked, and checked again under the lock (a run
// may have written its rows or checkpoint while this one set up; the first
// check spared that set-up).
void open_new(const Plan& p, const TrainArgs& a) {
  prepare_dir(p.out);
  lock_run_dir(p.out, "--out", p.header_only);
  if (!a.force) (void)refuse_a_run_in(p.out);
}

void print_banner(const Plan& p, Trainer& tr, bool finishing) {
  const TrainConfig& c = p.c;
  const EnvSpec& spec = tr.env().spec();
  const RunKind kind = RunKind::of(c);
  const std::string settings = env_settings(c);
  if (p.root)
    std::printf("segtape %s: training %s (%s, %s) with history %s for %ld steps, batch %ld, hidden %ld, budget %s%s%s%s -> %s\n",
                SEGTAPE_VERSION, c.env.c_str(), kind.ppo ? "recurrent PPO" : spec.supervised ? "supervised" : "actor-critic",
                spec.measure.c_str(), c.history.str().c_str(), c.steps, c.batch, c.hidden, segtape::format_bytes(tr.budget()).c_str(),
                kind.full ? (c.budget ? " (growth limit)" : " (growth limit, the default for full; set it with --budget)") : "",
                settings.empty() ? "" : "; ", settings.c_str(), p.out.c_str());
  if (p.root && !p.plugin.empty()) std::printf("env %s from the plug-in %s\n", c.env.c_str(), p.plugin.c_str());
  if (finishing)
    std::printf("training was complete at step %ld, but its end was not written (%s/metrics.json is missing or not final, or plot.svg is missing): "
                "running the final evaluation and writing metrics.json and plot.svg\n", tr.step(), p.out.c_str());
  if (p.comm && p.root)
    std::printf("data parallel: %d ranks (%s) x %ld streams, gradients averaged every update; rank 0 writes the files\n",
                p.comm->size(), p.comm->backend().c_str(), c.batch);
  std::fflush(stdout);
}

// The final greedy evaluation of a run that trained to its end; a signal
// during it leaves no score.
void evaluate_at_end(Trainer& tr, RunEnd& e, const Eval& eval) {
  if (!e.stopped.empty()) return;
  e.eval = tr.evaluate(eval.steps, eval.seed);
  if (stop_requested()) e.eval.reset(), e.eval_stopped = stop_signal_name();
}

// Steps between rows (a hundredth of the run) or checkpoints (a tenth), in
// whole segments, unless the flag gave them.
int64_t every(int64_t given, const TrainConfig& c, int64_t per_run) {
  const int64_t K = c.history.k;
  return given > 0 ? given : std::max<int64_t>(K, (c.steps / per_run + K - 1) / K * K);
}

// Rank 0's sinks: metrics.csv, TensorBoard, the progress bar on a terminal
// (else a line per row), the summary. Returns the run's first write in its
// folder (done now unless --force waits for it: MetricsCsvLog).
std::function<void()> add_sinks(Logger& log, const Plan& p, const TrainArgs& a, const EnvSpec& spec, std::unique_ptr<TensorBoardLog> tb) {
  auto csv = std::make_unique<MetricsCsvLog>(p.out, spec.measure, !spec.supervised, a.force && !p.resume, p.rows);
  std::function<void()> claim = [csv = csv.get()] { csv->claim(); };
  log.add(std::move(csv));
  if (tb) log.add(std::move(tb));
  const int64_t tokens = p.c.algo == segtape::agent::Algo::Lm ? p.c.batch : 0;  // (a language model's step reads B tokens)
  if (isatty(STDERR_FILENO)) log.add(std::make_unique<ProgressBar>(p.c.steps, spec.measure, tokens));
  else log.add(std::make_unique<ConsoleRows>(p.c.steps, spec.measure, tokens));
  log.add(std::make_unique<RunSummary>(claim));
  if (!a.force || p.resume) claim();
  return claim;
}

}  // namespace

int train(TrainArgs& a, const Given& given) {
  catch_sigpipe();
  Plan p = plan_run(a, given);
  const TrainConfig& c = p.c;
  Trainer tr(c, p.comm);  // before the directory: a device that cannot be used, or a model too large, leaves nothing behind
  tr.set_interrupt([] { return stop_requested(); });  // an evaluation stops at its next segment on SIGINT / SIGTERM
  const EnvSpec& spec = tr.env().spec();
  refuse_rl_flags(p, spec, given);
  // --log-dir: made before --out's folder (a --log-dir that cannot be made
  // leaves no run behind); a resumed run's once it will train, a new event file.
  std::unique_ptr<TensorBoardLog> tb;
  if (p.root && !a.log_dir.empty() && !p.resume) tb = std::make_unique<TensorBoardLog>(a.log_dir, spec.measure);
  const int64_t log_every = every(a.log_every, c, 100), ck_every = every(a.checkpoint_every, c, 10);
  // Checkpoints are collective: every rank must write them at the same steps
  // (compared before --out is touched).
  if (p.comm) dist::check_same(*p.comm, {{"checkpoint_every", std::to_string(ck_every)}}, "the command line (--checkpoint-every)");
  const Resumed resumed = p.resume ? open_resumed(tr, p, a, given, tb) : Resumed::Train;
  if (resumed == Resumed::Complete) return 0;
  if (!p.resume && p.root) open_new(p, a);

  Logger log(tr, RunKind::of(c), p.rows);
  const std::function<void()> claim = p.root ? add_sinks(log, p, a, spec, std::move(tb)) : nullptr;
  Checkpoints checkpoints(tr, p.out / "checkpoint.safetensors", ck_every, run_metadata(p, a), claim);
  print_banner(p, tr, resumed == Resumed::Finish);
  catch_stop_signals();
  const auto t0 = Clock::now();
  const int64_t start_step = tr.step();  // (after --resume: the checkpoint's step)
  if (!p.resume) tr.env().reset_score();  // a resumed env's score counts continue from its checkpoint
  restore_interval(p.ck_meta, log.open(), p.out);

  Loop loop{tr, log, Cadence(log_every, tr.step()), checkpoints, {a.eval_steps, c.seed + 7919}, RunKind::of(c), p.comm};
  RunEnd e{.tr = tr, .c = c, .log = log, .out = p.out, .plugin = p.plugin, .comm = p.comm, .resume = p.resume, .start_step = start_step};
  e.stopped = loop.run();
  log.training_end();
  e.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  e.eval_steps = a.eval_steps;
  e.finishing = resumed == Resumed::Finish;
  loop.finish(e);
  if (!p.root) return exit_status(e, "");  // rank 0 writes the rest
  evaluate_at_end(tr, e, loop.eval);
  log.end(e);
  return exit_status(e, log.failure());
}

}  // namespace segtape_cli
