// The segtape command: train, evaluate and resume recurrent agents whose
// memory per segment is fixed. `segtape --help` lists everything.
#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <csignal>
#include <optional>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "segtape/agent/plot.h"
#include "segtape/agent/retention.h"
#include "segtape/agent/trainer.h"
#include "segtape/blas.h"
#include "segtape/explain.h"
#include "cli/cli.h"
#include "cli/plugins.h"
#include "cli/run_dir.h"
#include "cli/signals.h"
#include "cli/startup.h"
#include "segtape/nn/safetensors.h"
#include "tensorboard.h"

namespace fs = std::filesystem;
using namespace segtape;
using namespace segtape::agent;
using namespace segtape_cli;

namespace {

// One metrics row: a log interval's means.
struct Row {
  int64_t step = 0;
  double loss = 0, score = 0;  // loss: NaN with has_loss false when the interval had none; with it true, a diverged run's
  bool has_loss = true;
  double episode_return = std::nan("");  // RL: mean return of the episodes that ended in the interval
  size_t segment_peak = 0, rss = 0;
  double steps_per_s = 0;
};

// A row's loss as text: `none` when the interval had none, `nan` for a
// diverged run's (fmt writes x86's default NaN as -nan), else in `format`.
std::string loss_text(const Row& r, const char* none, const char* format) {
  if (!r.has_loss) return none;
  return std::isnan(r.loss) ? "nan" : fmt::format(fmt::runtime(format), r.loss);
}

// metrics.csv: one row per log interval, each on disk as soon as it is
// logged (appended and flushed), so a run that stops loses no row.
// Text quoted in an error line, its control characters written out: a CRLF
// file's header read as the expected one with an invisible \r, and a binary
// file's bytes went to the terminal.
std::string printable(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '\r') out += "\\r";
    else if (ch == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += ch;
  }
  return out;
}

class MetricsCsv {
 public:
  MetricsCsv(const fs::path& path, const std::string& measure, bool rl) : path_(path), measure_(measure), rl_(rl) {}
  ~MetricsCsv() {
    if (f_) std::fclose(f_);
  }
  // Starts the file with these rows (a resumed run's rows up to its checkpoint).
  void start(const std::vector<Row>& rows) {
    std::string text = header();
    for (const Row& r : rows) text += line(r);
    write_text(path_, text);
    f_ = std::fopen(path_.c_str(), "ab");
    if (!f_) throw Error("cannot append to " + path_.string() + ": " + std::strerror(errno));
  }
  void append(const Row& r) {
    const std::string l = line(r);
    if (std::fwrite(l.data(), 1, l.size(), f_) != l.size() || std::fflush(f_) != 0)
      throw Error("cannot append to " + path_.string() + ": " + std::strerror(errno));
  }
  // The rows of an existing file of this run (columns found by name).
  // A cell that is not what this program writes (a hand-edited or damaged
  // file) is refused, naming the file, the line and the column.
  // `header`: line 1 as found ("" without a file), for check_header once the
  // env's measure is known.
  static std::vector<Row> read(const fs::path& p, std::string& header) {
    std::vector<Row> rows;
    header.clear();
    (void)text_target(p, "--resume");  // (a FIFO there: the open below waited forever)
    std::error_code ec;
    if (!fs::exists(p, ec) && !ec) return rows;  // (no file: the checkpoint does not need it)
    std::ifstream in(p);
    if (!in)  // (an unreadable file was taken for none, and the run's rows were written over)
      throw Error(fmt::format("--resume: cannot read {} ({}); make it readable, or delete it (the checkpoint does not need it)",
                              p.string(), std::strerror(errno)));
    std::string line;
    if (!std::getline(in, line)) return rows;
    header = line;
    std::vector<std::string> cols;
    std::stringstream hs(line);
    for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
    // A header of the form this program writes, and no other: a renamed or
    // missing column read as zeros, a deleted header took the first row's place.
    const bool rl = cols.size() == 7;
    const std::vector<std::string> tail = {"segment_peak_bytes", "rss_bytes", "steps_per_s"};
    if ((cols.size() != 6 && !rl) || cols[0] != "step" || cols[1] != "loss" || cols[2].empty() ||
        (rl && cols[3] != "episode_return") || !std::equal(tail.begin(), tail.end(), cols.end() - 3))
      throw Error(fmt::format("{} line 1: the header is '{}', not step,loss,<measure>[,episode_return],segment_peak_bytes,"
                              "rss_bytes,steps_per_s as this program writes it; fix the line or delete the file (the "
                              "checkpoint does not need it)", p.string(), printable(line)));
    for (int64_t n = 2; std::getline(in, line); ++n) {
      if (in.eof()) break;  // a last line with no newline: cut short by a kill or a full disk, dropped unread
      std::stringstream ls(line);
      Row r;
      size_t i = 0;
      std::vector<std::string> cells;
      for (std::string v; std::getline(ls, v, ',');) cells.push_back(v);
      if (!line.empty() && line.back() == ',') cells.emplace_back();  // (getline drops a last empty cell)
      if (cells.size() != cols.size())
        throw Error(fmt::format("{} line {}: {} cells where the header has {}; fix the line or delete the file (the "
                                "checkpoint does not need it)", p.string(), n, cells.size(), cols.size()));
      for (; i < cols.size(); ++i) {
        const std::string& c = cols[i];
        const std::string& v = cells[i];
        auto bad = [&](const char* what) {
          return Error(fmt::format("{} line {}: {} '{}' is {}; fix the line or delete the file (the checkpoint does not need it)",
                                   p.string(), n, printable(c), printable(v), what));
        };
        if (c == "step" || c == "segment_peak_bytes" || c == "rss_bytes") {  // whole numbers >= 0
          int64_t x = 0;
          const auto res = std::from_chars(v.data(), v.data() + v.size(), x);
          if (res.ec != std::errc() || res.ptr != v.data() + v.size() || x < 0) throw bad("not a whole number >= 0");
          if (c == "step") r.step = x;
          else if (c == "segment_peak_bytes") r.segment_peak = size_t(x);
          else r.rss = size_t(x);
          continue;
        }
        char* end = nullptr;
        const double d = v.empty() ? std::nan("") : std::strtod(v.c_str(), &end);  // empty: nothing measured
        if (!v.empty() && end != v.c_str() + v.size()) throw bad("not a number");  // (inf and nan are: a run that diverged)
        if (c == "loss") r.loss = d, r.has_loss = !v.empty();
        else if (c == "episode_return") r.episode_return = d;
        else if (c == "steps_per_s") r.steps_per_s = d;
        else if (i == 2) r.score = d;  // the env's measure (accuracy, success)
      }
      rows.push_back(r);
    }
    if (in.bad()) throw Error(fmt::format("--resume: cannot read {} ({})", p.string(), std::strerror(errno)));
    return rows;
  }
  // A header read by read() that is this run's (its env's measure, and
  // episode_return for RL), or none: another one was taken for this run's
  // and written over.
  static void check_header(const fs::path& p, const std::string& found, const std::string& measure, bool rl) {
    const std::string want = header_of(measure, rl);
    if (!found.empty() && found + '\n' != want)
      throw Error(fmt::format("{} line 1: the header is '{}', not '{}' as this run writes it; fix the line or delete the file "
                              "(the checkpoint does not need it)", p.string(), printable(found), want.substr(0, want.size() - 1)));
  }

 private:
  static std::string header_of(const std::string& measure, bool rl) {
    return "step,loss," + measure + (rl ? ",episode_return" : "") + ",segment_peak_bytes,rss_bytes,steps_per_s\n";
  }
  std::string header() const { return header_of(measure_, rl_); }
  // An interval with no loss (no target asked yet) or nothing scored (no
  // target, no finished episode) leaves that cell empty, as episode_return.
  static std::string cell(double v) { return std::isnan(v) ? std::string() : fmt::format("{:.6g}", v); }
  std::string line(const Row& r) const {
    return fmt::format("{},{},{}{},{},{},{:.6g}\n", r.step, loss_text(r, "", "{:.6g}"), cell(r.score),
                       rl_ ? "," + cell(r.episode_return) : "",
                       r.segment_peak, r.rss, r.steps_per_s);
  }
  fs::path path_;
  std::string measure_;
  bool rl_;
  FILE* f_ = nullptr;
};

// The training plot: loss; the env's measure on a fixed 0-100 % axis with the
// chance level and the final greedy evaluation; RL: the episode return;
// memory. Nothing is drawn for a measure no interval has a value of.
std::string plot(const std::vector<Row>& rows, const TrainConfig& c, const EnvSpec& spec, std::optional<double> eval) {
  const std::string& measure = spec.measure;
  Series loss{"loss per step", {}, {}}, score{measure + " (training)", {}, {}},
      ret{"mean episode return", {}, {}}, peak{"segment peak (arena)", {}, {}}, rss{"process RSS", {}, {}};
  for (const Row& r : rows) {
    const double x = double(r.step);
    loss.x.push_back(x), loss.y.push_back(r.loss);
    score.x.push_back(x), score.y.push_back(100.0 * r.score);
    if (!std::isnan(r.episode_return)) ret.x.push_back(x), ret.y.push_back(r.episode_return);
    peak.x.push_back(x), peak.y.push_back(double(r.segment_peak));
    rss.x.push_back(x), rss.y.push_back(double(r.rss));
  }
  const std::string what = c.env + ", history " + c.history.str() + ", B=" + std::to_string(c.batch) + ", H=" + std::to_string(c.hidden);
  const double chance = 100.0 / double(spec.num_actions);
  Panel score_panel{measure + " (%)", "step", measure + " %", {score}, false, false};
  score_panel.y_min = 0, score_panel.y_max = 100;
  score_panel.hlines.push_back({chance, fmt::format("chance {:.1f}% (uniform over {} actions)", chance, spec.num_actions), "#888888", "4 3"});
  if (eval && !rows.empty())
    score_panel.series[0].marks.push_back({double(rows.back().step), 100.0 * *eval, fmt::format("eval {:.1f}% (greedy)", 100.0 * *eval)});
  std::vector<Panel> panels = {{"Training loss (" + what + ")", "step", "loss", {loss}, false, false}, score_panel};
  if (!spec.supervised) {
    Panel rp{"Episode return", "step", "return", {ret}, false, false};
    if (ret.x.empty()) rp.note = "no episode ended in a logged interval";
    panels.push_back(rp);
  }
  panels.push_back({"Memory: segment high-water vs process RSS", "step", "bytes", {peak, rss}, false, true});
  return render_svg(panels);
}

// Numbers as numbers: the checkpoint's string metadata, typed for JSON.
nlohmann::json config_json(const TrainConfig& c, size_t budget_applied) {
  nlohmann::json j = nlohmann::json::object();
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

class Progress {
 public:
  Progress(int64_t total, bool shown) : total_(total), tty_(shown && isatty(STDERR_FILENO)) {}
  bool tty() const { return tty_; }
  void update(int64_t step, double loss, double score, size_t peak, double rate, const std::string& measure) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (step < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 28;
    const int filled = int(double(width) * double(step) / double(total_));
    std::string bar(size_t(filled), '#');
    bar += std::string(size_t(width - filled), '-');
    std::fprintf(stderr, "\r[%s] %ld/%ld %3.0f%% | %.0f steps/s | loss %.4f | %s %.1f%% | segment %s   ", bar.c_str(), step,
                 total_, 100.0 * double(step) / double(total_), rate, loss, measure.c_str(), 100 * score,
                 format_bytes(peak).c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  int64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
};

// A flag given twice is refused, as an option given twice is (CLI11 counts flags).
constexpr CLI::MultiOptionPolicy kOnce = CLI::MultiOptionPolicy::Throw;
// A path option given as '' is refused (it was ignored, or fell back to its default).
const CLI::Validator kNonEmpty(
    [](std::string& v) { return v.empty() ? std::string("needs a path (it was empty)") : std::string(); }, "PATH");

int train(TrainArgs& a, CLI::App& cmd) {
  catch_sigpipe();
  fs::path out;
  bool header_only = false;  // a new run in a folder whose metrics.csv holds a header alone (lock_run_dir)
  TrainConfig c = a.c;
  std::string plugin;  // the file of the --env-plugin that defines c.env ("" for a built-in env)
  c.budget_name = "--budget";
  if (cmd.count("--resume") && a.resume.empty()) throw Error("--resume needs the folder of a run (it was empty)");
  if (cmd.count("--out") && a.out.empty()) throw Error("--out needs a folder (it was empty; without --out a run goes to runs/ENV-TIME)");
  const bool resume = !a.resume.empty();
  // --log-every, --checkpoint-every and --eval-steps as the run was given them
  // (checkpoint metadata run.flags.*): a resumed run keeps its cadence unless
  // the flag is given again.
  std::map<std::string, std::string> stored_flags;
  std::map<std::string, std::string> ck_meta;  // rank 0: the resumed checkpoint's metadata
  std::vector<Row> resumed_rows;  // rank 0: metrics.csv of a resumed run
  std::string resumed_header;     // and its line 1
  // Started by mpirun: one rank of a data-parallel run (docs/distributed.md).
  // Rank 0 alone reads and writes files and prints; every rank trains.
  // (The communicator lives as long as the process: main's error handling uses it.)
  static std::unique_ptr<dist::Communicator> owner;
  dist::Communicator* comm = nullptr;
  if (cmd.count("--dist-timeout") && !(a.dist_timeout >= 1 && std::isfinite(a.dist_timeout)))  // (1e-9 failed a healthy job)
    throw Error(fmt::format("--dist-timeout {}: must be a finite number of seconds >= 1 (healthy ranks reach a collective "
                            "that far apart: rank 0 writes the checkpoints while the others wait)", a.dist_timeout));
  if (dist::launched_by_mpirun()) {
    owner = dist::mpi({.timeout_s = a.dist_timeout});
    if (owner->size() > 1) comm = owner.get(), set_job_communicator(comm);
  }
  const bool root = !comm || comm->rank() == 0;
  // The checks before training, which only rank 0 makes where they read
  // files: an error on any rank is every rank's (dist::raise_if_any).
  std::string setup_error;
  try {
  for (const auto& [opt, v] : {std::pair{"--log-every", a.log_every}, std::pair{"--checkpoint-every", a.checkpoint_every},
                                std::pair{"--eval-steps", a.eval_steps}})
    if (cmd.count(opt) && (v < 1 || v > TrainConfig::kMaxSteps)) throw Error(std::string(opt) + " " + std::to_string(v) + ": must be in [1, 1e9]");
  if (comm && c.env_shards != 1) throw Error("--env-shards " + std::to_string(c.env_shards) + ": under mpirun each rank is one shard (leave --env-shards at 1)");
  if (resume) {
    out = a.resume;
    const fs::path ck = out / "checkpoint.safetensors";
    if (root) {
      if (!exists_named(ck, "--resume " + out.string())) throw Error("--resume " + out.string() + ": no checkpoint.safetensors there; start a new run with --out");
      c = Trainer::read_config(ck);
      plugin = checkpoint_plugin(ck, c.env, "--resume " + out.string());
      ck_meta = safetensors::load(ck).metadata;
      for (const auto& [k, v] : ck_meta)
        if (k.rfind("run.flags.", 0) == 0) stored_flags[k] = v;
      resumed_rows = MetricsCsv::read(out / "metrics.csv", resumed_header);  // (refused here, before any collective, when damaged)
    }
    c.budget_name = "--budget";
    for (const char* opt : {"--env", "--history", "--batch", "--hidden", "--embed", "--update-bias", "--lag", "--sparse", "--vocab", "--corridor", "--turns", "--cities", "--seed", "--lr", "--budget",
                            "--gamma", "--entropy", "--algo", "--rollout", "--epochs", "--minibatches", "--clip-range", "--gae-lambda",
                            "--lr-schedule", "--env-shards", "--clip", "--out", "--force"})
      if (cmd.count(opt)) throw Error(std::string(opt) + " cannot change on --resume: the run continues with the configuration in its checkpoint");
  } else {
    if (auto it = plugin_envs().find(c.env); it != plugin_envs().end()) plugin = it->second;
    c.history = History::parse(a.history);
    if (!a.budget.empty()) c.budget = parse_bytes(a.budget);
    if (a.out.empty()) {
      char stamp[32];
      const std::time_t now = std::time(nullptr);
      std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
      out = fs::path("runs") / (c.env + "-" + stamp);
    } else {
      out = a.out;
    }
    if (root && !a.force) header_only = refuse_a_run_in(out);
    // Flags of another algorithm or of another built-in env would be recorded
    // as the run's settings and do nothing: refused, as --sparse is on tmaze.
    if (c.algo != "ppo")
      for (const char* opt : {"--rollout", "--epochs", "--minibatches", "--clip-range", "--gae-lambda", "--lr-schedule"})
        if (cmd.count(opt)) throw Error(std::string(opt) + " is --algo ppo's; this run is --algo " + c.algo);
    const std::map<std::string, std::vector<const char*>> env_flags = {
        {"recall", {"--lag", "--vocab", "--sparse"}}, {"tmaze", {"--corridor"}}, {"dialogue", {"--turns", "--cities"}}};
    if (env_flags.count(c.env))
      for (const auto& [env, flags] : env_flags)
        if (env != c.env)
          for (const char* opt : flags)
            if (cmd.count(opt)) throw Error(std::string(opt) + " is --env " + env + "'s; this run is --env " + c.env);
  }
  } catch (const std::exception& e) {
    if (!comm) throw;
    setup_error = e.what();
  }
  if (comm) {
    dist::raise_if_any(*comm, setup_error);
    // (before the broadcast below, which only resumed runs make)
    dist::check_same(*comm, {{"--resume", resume ? "given" : "not given"}}, "the command line (--resume or --out)");
    if (resume) {  // the checkpoint's configuration (read by rank 0) to every rank
      std::string meta;
      if (root) meta = nlohmann::json(c.to_metadata()).dump() + '\n' + nlohmann::json(stored_flags).dump() + '\n' + plugin;
      meta = comm->allgather(meta, "the broadcast of the checkpoint's configuration")[0];
      if (!root) {
        const size_t nl = meta.find('\n'), nl2 = meta.find('\n', nl + 1);
        stored_flags = nlohmann::json::parse(meta.substr(nl + 1, nl2 - nl - 1)).get<std::map<std::string, std::string>>();
        plugin = meta.substr(nl2 + 1);
        if (!plugin.empty() && !env_registered(nlohmann::json::parse(meta.substr(0, nl)).value("env", ""))) load_plugin(plugin);
        c = TrainConfig::from_metadata(nlohmann::json::parse(meta.substr(0, nl)).get<std::map<std::string, std::string>>());
        c.budget_name = "--budget";
      }
    }
  }
  if (resume) {
    if (cmd.count("--steps")) c.steps = a.c.steps;
    if (cmd.count("--device")) c.device = a.c.device;  // a run may move between the CPU and a GPU
  }
  bool eval_given = cmd.count("--eval-steps") > 0;
  // The run's own --log-every / --checkpoint-every / --eval-steps (stored_flags) where not given again.
  const auto apply_stored_flags = [&] {
    for (auto [opt, v] : {std::pair{"--log-every", &a.log_every}, std::pair{"--checkpoint-every", &a.checkpoint_every},
                          std::pair{"--eval-steps", &a.eval_steps}}) {
      const std::string key = std::string("run.flags.") + (opt + 2);
      const auto it = stored_flags.find(key);
      if (cmd.count(opt) || it == stored_flags.end()) continue;
      const std::string& text = it->second;
      int64_t n = 0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), n);
      if (r.ec != std::errc() || r.ptr != text.data() + text.size() || n < 1 || n > TrainConfig::kMaxSteps)  // (as the flags)
        throw Error(fmt::format("--resume {}: checkpoint metadata {} is malformed ('{}')", out.string(), key, text));
      *v = n;
      if (v == &a.eval_steps) eval_given = true;
    }
  };
  const auto check = [&] {
    apply_stored_flags();
    c.validate();
    a.eval_steps = eval_steps_for(c, a.eval_steps, eval_given, "--eval-steps");
  };
  if (comm) {
    // An invalid configuration is every rank's error alike.
    std::string invalid;
    try {
      check();
    } catch (const std::exception& e) {
      invalid = e.what();
    }
    dist::raise_if_any(*comm, invalid);
  }
  check();
  // PPO on a supervised env: the reward (1 for the target class) depends on
  // the step's action alone, so future rewards are noise in its return.
  if (!resume && !cmd.count("--gamma") && c.algo == "ppo" && make_env(c.env, c.batch, c.seed, c.env_options)->spec().supervised)
    c.gamma = 0;
  c.graph_replay = a.graphs == "auto";  // (also on --resume: how the run executes, not what it computes)
  Trainer tr(c, comm);  // before the directory: a device that cannot be used, or a model too large, leaves nothing behind
  tr.set_interrupt([] { return stop_requested(); });  // an evaluation stops at its next segment on SIGINT / SIGTERM
  const EnvSpec& spec = tr.env().spec();
  // a2c on a supervised env is cross-entropy on its targets: no return, no
  // policy entropy. The flags would be recorded and do nothing.
  if (!resume && spec.supervised && c.algo != "ppo")
    for (const char* opt : {"--gamma", "--entropy"})
      if (cmd.count(opt))
        throw Error(std::string(opt) + " is for RL: --env " + c.env + " is supervised, and --algo a2c trains it with "
                    "cross-entropy on its targets (no return, no entropy bonus); --algo ppo uses it");
  const std::string measure = spec.measure;
  // --log-dir: TensorBoard scalars with every metrics row, a greedy eval at
  // every checkpoint and at the end. A resumed run adds a new event file.
  // (Made before --out's folder: a --log-dir that cannot be made leaves no run behind.)
  std::optional<agent::tensorboard::EventWriter> tb;
  if (root && !a.log_dir.empty() && !resume) tb.emplace(a.log_dir, "--log-dir");  // (a resumed run's: once it will train)
  // A log that cannot be written (a full disk under --log-dir) ends the log,
  // not the run: a warning, training goes on and writes its checkpoints, and
  // the run exits 2 at its end with the error.
  std::string tb_error;
  const auto tb_scalar = [&](const std::string& tag, int64_t step, double v) {
    if (!tb) return;
    try {
      tb->scalar(tag, step, v);
    } catch (const std::exception& e) {
      tb_error = fmt::format("{} (the TensorBoard log under --log-dir stops at step {})", e.what(), step);
      std::fprintf(stderr, "segtape: warning: %s; training goes on\n", tb_error.c_str());
      tb.reset();
    }
  };

  const int64_t K = c.history.k;
  const int64_t log_every = a.log_every > 0 ? a.log_every : std::max<int64_t>(K, (c.steps / 100 + K - 1) / K * K);
  const int64_t ck_every = a.checkpoint_every > 0 ? a.checkpoint_every : std::max<int64_t>(K, (c.steps / 10 + K - 1) / K * K);
  const bool full = c.history.kind == History::Kind::Full;
  // Checkpoints are collective: every rank must write them at the same steps
  // (compared before --out is touched).
  if (comm) dist::check_same(*comm, {{"checkpoint_every", std::to_string(ck_every)}}, "the command line (--checkpoint-every)");
  std::vector<Row> rows;
  // A resumed run whose training was complete but whose end was not written
  // (killed during the final evaluation, or a full disk at metrics.json):
  // only the final evaluation, metrics.json and plot.svg are done.
  bool finishing = false;
  if (resume) {
    tr.load(out / "checkpoint.safetensors");
    if (root) warn_non_finite(tr, (out / "checkpoint.safetensors").string());
    // (fewer steps than done: the run was taken for complete, its interrupted mark dropped)
    if (cmd.count("--steps") && c.steps < tr.step())
      throw Error(fmt::format("--steps {}: the checkpoint in {} is at step {}; pass --steps N with N > {} to train further, "
                              "or leave --steps out to finish the run as it was given", c.steps, out.string(), tr.step(), tr.step()));
    if (tr.done()) {
      finishing = root && !finished_metrics(out, tr.step());
      if (!finishing) {  // nothing to do: every file stays as it is
        if (root) std::printf("%s: already complete (step %ld of %ld); nothing to do. To train further, pass --steps N with N > %ld.\n",
                    out.c_str(), tr.step(), c.steps, tr.step());
        return 0;
      }
    }
    if (root) MetricsCsv::check_header(out / "metrics.csv", resumed_header, measure, !spec.supervised);
    // A run killed while writing leaves its temporary files (".<file>.tmp",
    // ".checkpoint.safetensors.tmp.<pid>.<n>"); the files themselves are intact.
    // (Locked first: they may be a running process's. Not before here: a
    // complete run's --resume writes nothing, in a read-only folder too.)
    std::error_code ec;
    if (root) lock_run_dir(out, "--resume");
    if (root && !a.log_dir.empty()) tb.emplace(a.log_dir, "--log-dir");
    if (root) {
      for (const auto& e : fs::directory_iterator(out, ec)) {
        const std::string name = e.path().filename().string();
        if (is_run_temp_file(name)) fs::remove(e.path(), ec);
      }
      rows = std::move(resumed_rows);
    }
    while (!rows.empty() && rows.back().step > tr.step()) rows.pop_back();
  } else if (root) {
    prepare_dir(out);
    lock_run_dir(out, "--out", header_only);
    // (again, under the lock: a run may have written its rows or checkpoint
    // while this one set up; the first check spared that set-up)
    if (!a.force) (void)refuse_a_run_in(out);
  }
  // --force takes the folder when this run first writes there (a metrics row
  // or a checkpoint): the old run's files stay whole until this run has
  // trained a step to replace them with, so a run that fails at its first
  // segment (a budget too small, an env plug-in's error) or is killed before
  // it writes leaves the old run as it was. Then nothing of the old run may
  // be mistaken for the new one's: its four files go.
  std::optional<MetricsCsv> csv;
  if (root) csv.emplace(out / "metrics.csv", measure, !spec.supervised);
  const bool take_over = a.force && !resume;
  bool claimed = false;
  const auto claim = [&] {
    if (!root || claimed) return;
    claimed = true;
    if (take_over) {
      std::error_code ec;
      for (const char* f : {"checkpoint.safetensors", "metrics.csv", "metrics.json", "plot.svg"}) fs::remove(out / f, ec);
    }
    csv->start(rows);
  };
  if (!take_over) claim();
  const auto save_checkpoint = [&](const std::map<std::string, std::string>& meta) {
    claim();
    tr.save(out / "checkpoint.safetensors", meta);
  };

  const std::string settings = env_settings(c);
  if (root) std::printf("segtape %s: training %s (%s, %s) with history %s for %ld steps, batch %ld, hidden %ld, budget %s%s%s%s -> %s\n",
              SEGTAPE_VERSION, c.env.c_str(), c.algo == "ppo" ? "recurrent PPO" : spec.supervised ? "supervised" : "actor-critic", measure.c_str(),
              c.history.str().c_str(), c.steps, c.batch, c.hidden, format_bytes(tr.budget()).c_str(),
              full ? (c.budget ? " (growth limit)" : " (growth limit, the default for full; set it with --budget)") : "",
              settings.empty() ? "" : "; ", settings.c_str(), out.c_str());
  if (root && !plugin.empty()) std::printf("env %s from the plug-in %s\n", c.env.c_str(), plugin.c_str());
  if (finishing)
    std::printf("training was complete at step %ld, but its end was not written (%s/metrics.json is missing or not final, or plot.svg is missing): "
                "running the final evaluation and writing metrics.json and plot.svg\n", tr.step(), out.c_str());
  if (comm && root)
    std::printf("data parallel: %d ranks (%s) x %ld streams, gradients averaged every update; rank 0 writes the files\n",
                comm->size(), comm->backend().c_str(), c.batch);
  std::fflush(stdout);

  catch_stop_signals();
  Progress bar(c.steps, root);
  const auto t0 = std::chrono::steady_clock::now();
  auto interval_start = t0;
  const int64_t start_step = tr.step();  // (after --resume: the checkpoint's step)
  // interval_steps: the log interval's steps (restored on --resume); timed_steps:
  // those this process ran, since interval_start (the interval's steps per second)
  int64_t interval_steps = 0, timed_steps = 0, next_log = (tr.step() / log_every + 1) * log_every, next_ck = (tr.step() / ck_every + 1) * ck_every;
  double loss_sum = 0, last_loss = 0, return_sum = 0;
  int64_t loss_n = 0, episodes = 0;
  // peak: the last segment's high-water (the progress bar); interval_peak:
  // the largest since the last row (a row's segment_peak_bytes). The run's
  // largest (metrics.json) is the rows' and the open interval's: a run whose
  // steps are no multiple of K ends with a shorter, smaller segment.
  size_t peak = 0, interval_peak = 0, node_peak = 0, stored_bytes = 0;
  int64_t steps_run = 0, steps_done = 0;  // exact: step evaluations, and the steps they covered
  std::string stopped;  // why the run ended before its last step ("" when it did not)
  if (!resume) tr.env().reset_score();  // a resumed env's score counts continue from its checkpoint
  // The open log interval's sums travel in the checkpoint, so a resumed run's
  // next row is the row the run would have written had it never stopped.
  std::map<std::string, std::string> run_meta;  // checkpoint metadata besides the Trainer's own
  if (!plugin.empty()) run_meta[kPluginKey] = plugin;
  constexpr const char* kIntervalPeakKey = "run.interval_peak";
  if (a.log_every > 0) run_meta["run.flags.log-every"] = std::to_string(a.log_every);
  if (a.checkpoint_every > 0) run_meta["run.flags.checkpoint-every"] = std::to_string(a.checkpoint_every);
  if (eval_given) run_meta["run.flags.eval-steps"] = std::to_string(a.eval_steps);
  auto interval_meta = [&]() -> std::map<std::string, std::string> {
    std::map<std::string, std::string> m = run_meta;
    m["run.interval"] = fmt::format("{:.17g},{},{:.17g},{},{},{:.17g}", loss_sum, loss_n, return_sum, episodes, interval_steps,
                                    last_loss);
    m[kIntervalPeakKey] = std::to_string(interval_peak);
    return m;
  };
  if (resume && root) {
    if (auto it = ck_meta.find("run.interval"); it != ck_meta.end()) {
      // six numbers, each read in full, counts >= 0 (the sums may be non-finite: a diverged run stays resumable)
      const std::string& v = it->second;
      const char *p = v.data(), *end = v.data() + v.size();
      bool ok = true;
      auto next = [&](auto& x, bool last) {
        const auto r = std::from_chars(p, end, x);
        ok = ok && r.ec == std::errc() && (last ? r.ptr == end : r.ptr < end && *r.ptr == ',');
        p = ok ? r.ptr + (last ? 0 : 1) : end;
      };
      next(loss_sum, false), next(loss_n, false), next(return_sum, false), next(episodes, false), next(interval_steps, false),
          next(last_loss, true);
      constexpr int64_t most = int64_t(1) << 53;  // (counts a run could reach; more would overflow the sums they go on into)
      if (!ok || loss_n < 0 || episodes < 0 || interval_steps < 0 || loss_n > most || episodes > most || interval_steps > most)
        throw Error("--resume " + out.string() + ": checkpoint metadata run.interval is malformed ('" + v + "')");
    }
    if (auto it = ck_meta.find(kIntervalPeakKey); it != ck_meta.end()) {  // (absent from checkpoints before it: 0)
      const std::string& v = it->second;
      const auto r = std::from_chars(v.data(), v.data() + v.size(), interval_peak);
      if (r.ec != std::errc() || r.ptr != v.data() + v.size())
        throw Error("--resume " + out.string() + ": checkpoint metadata " + kIntervalPeakKey + " is malformed ('" + v + "')");
    }
  }
  double ppo_kl = 0, ppo_clip = 0;  // the last PPO iteration's diagnostics
  bool ppo_ran = false;
  auto log_row = [&](std::chrono::steady_clock::time_point now) {
    const double secs = std::chrono::duration<double>(now - interval_start).count();
    const double nothing = std::numeric_limits<double>::quiet_NaN();
    Row row{tr.step(), loss_n ? last_loss : nothing, tr.env().score_counts().second > 0 ? tr.env().score() : nothing,
            loss_n > 0, episodes ? return_sum / double(episodes) : nothing, interval_peak,
            resident_bytes(), secs > 0 ? double(timed_steps) / secs : 0};
    claim();  // (before the row joins `rows`: a claim writes the rows so far)
    rows.push_back(row);
    if (csv) csv->append(row);
    if (tb) {
      if (!std::isnan(row.loss)) tb_scalar("train/loss", row.step, row.loss);
      if (!std::isnan(row.score)) tb_scalar("train/" + measure, row.step, row.score);
      if (!std::isnan(row.episode_return)) tb_scalar("train/episode_return", row.step, row.episode_return);
      tb_scalar("memory/segment_peak_bytes", row.step, double(row.segment_peak));
      tb_scalar("memory/rss_bytes", row.step, double(row.rss));
      tb_scalar("speed/steps_per_s", row.step, row.steps_per_s);
      if (ppo_ran) {
        tb_scalar("ppo/approx_kl", row.step, ppo_kl);
        tb_scalar("ppo/clip_fraction", row.step, ppo_clip);
        tb_scalar("ppo/lr", row.step, tr.lr());
      }
    }
    if (root && !bar.tty())
      std::printf("step %ld/%ld  loss %s  %s %s  segment peak %s  rss %s  %.0f steps/s\n", tr.step(), c.steps,
                  loss_text(row, "none", "{:.4f}").c_str(), measure.c_str(),
                  score_text(row.score).c_str(), format_bytes(interval_peak).c_str(), format_bytes(row.rss).c_str(), row.steps_per_s);
    std::fflush(stdout);
    tr.env().reset_score();
    loss_sum = 0, loss_n = 0, interval_steps = 0, timed_steps = 0, return_sum = 0, episodes = 0, interval_peak = 0;
    interval_start = now;
  };
  while (!tr.done()) {
    if (stop_requested() && !comm) {
      stopped = stop_signal_name();
      break;
    }
    // Data parallel: the request travels with this segment's update, and
    // every rank stops after it (the same step on every rank).
    if (stop_requested() && comm) tr.request_stop();
    SegmentResult r;
    try {
      r = tr.run_segment();
    } catch (const BudgetError& e) {
      if (!full) throw;
      // The teaching run reached its limit: that climb is the lesson, so
      // its metrics and plot are written up to here.
      stopped = e.what();
      peak = tr.tape().stats().peak_bytes;
      interval_peak = std::max(interval_peak, peak);
      if (interval_steps) log_row(std::chrono::steady_clock::now());
      break;
    }
    interval_steps += r.steps, timed_steps += r.steps;
    loss_sum += r.loss_sum;
    loss_n += r.loss_steps;
    return_sum += r.return_sum;
    episodes += r.episodes;
    if (r.loss_steps && c.algo == "ppo") ppo_kl = r.approx_kl, ppo_clip = r.clip_fraction, ppo_ran = true;
    peak = full ? tr.tape().stats().peak_bytes : tr.tape().stats().last_segment_peak;
    if (r.segment_peak) peak = r.segment_peak;  // exact, ppo: the largest segment of the window or iteration
    interval_peak = std::max(interval_peak, peak);
    steps_run += r.steps_run, steps_done += r.steps_run ? r.steps : 0, stored_bytes = std::max(stored_bytes, r.stored_bytes);
    node_peak = std::max(node_peak, tr.tape().stats().node_peak_bytes);
    const auto now = std::chrono::steady_clock::now();
    if (loss_n) last_loss = loss_sum / double(loss_n);
    const double secs = std::chrono::duration<double>(now - interval_start).count();
    bar.update(tr.step(), last_loss, tr.env().score(), peak, secs > 0 ? double(timed_steps) / secs : 0, measure);
    if (tr.step() >= next_log || tr.done()) {
      log_row(now);
      next_log += log_every;
    }
    if (!full && (tr.step() >= next_ck || tr.done())) {
      save_checkpoint(interval_meta());
      next_ck += ck_every;
      // (evaluate puts the training state back: the run continues as without it)
      if (tb && !tr.done()) {
        const double e = tr.evaluate(a.eval_steps, c.seed + 7919);
        if (!stop_requested()) tb_scalar("eval/" + measure, tr.step(), e);  // (a stopped evaluation is not a score)
      }
    }
    if (comm && tr.stop_agreed() && !tr.done()) {
      stopped = stop_signal_name();
      break;
    }
  }
  bar.finish();
  const bool budget_stop = full && !stopped.empty() && !is_stop_signal(stopped);
  const bool signal_stop = !stopped.empty() && !budget_stop;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!full && signal_stop) save_checkpoint(interval_meta());  // the segment boundary it stopped at
  if (full && !stopped.empty() && interval_steps) log_row(std::chrono::steady_clock::now());
  if (full && stopped.empty() && !finishing) save_checkpoint(run_meta);
  if (!root) return signal_stop ? stop_exit_code(stopped) : budget_stop ? 2 : 0;  // rank 0 writes the rest
  size_t run_peak = interval_peak;  // (segments since the last row, before a stop or on a resume's checkpoint)
  for (const Row& r : rows) run_peak = std::max(run_peak, r.segment_peak);  // (a resumed run's earlier rows too)
  std::optional<double> eval;
  std::string eval_stopped;  // a signal during the final evaluation: training complete, no score
  if (stopped.empty()) {
    eval = tr.evaluate(a.eval_steps, c.seed + 7919);
    if (stop_requested()) eval.reset(), eval_stopped = stop_signal_name();
  }
  if (tb && eval) tb_scalar("eval/" + measure, tr.step(), *eval);
  const TapeStats st = tr.tape().stats();
  nlohmann::json j;
  j["config"] = config_json(c, tr.budget());
  if (!plugin.empty()) j["config"]["env_plugin"] = plugin;
  j["steps"] = tr.step();
  // (null: the last log interval had no loss / scored nothing, or no row was logged)
  const auto number_or_null = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  j["final_loss"] = number_or_null(rows.empty() ? std::nan("") : rows.back().loss);
  j["final_" + measure] = number_or_null(rows.empty() ? std::nan("") : rows.back().score);
  if (!spec.supervised && !rows.empty() && !std::isnan(rows.back().episode_return))
    j["final_episode_return"] = rows.back().episode_return;
  if (eval) j["eval_" + measure] = std::isnan(*eval) ? nlohmann::json(nullptr) : nlohmann::json(*eval), j["eval_steps"] = a.eval_steps;
  j["segment_peak_bytes"] = run_peak;
  j["node_peak_bytes"] = finishing ? nlohmann::json(nullptr) : nlohmann::json(node_peak);  // (not in metrics.csv: unknown here)
  if (steps_done) {  // exact:K/T: the cost of replaying, next to the segment peak
    j["recompute_factor"] = double(steps_run) / double(steps_done);
    j["stored_state_bytes"] = stored_bytes;
  }  // tape nodes of the largest segment (counted in the budget too)
  j["persistent_bytes"] = st.persistent_bytes;
  if (c.device == "cuda")  // (this process's segments)
    j["cuda_graphs"] = {{"on", tr.graph_segments()}, {"captured", st.graph_captures}, {"replayed", st.graph_replays},
                        {"segments", st.segment_index}};
  j["parameters"] = tr.policy().parameter_count();
  j["rss_bytes"] = resident_bytes();
  j["wall_seconds"] = wall;
  j["blas_kernels"] = segtape::blas_kernels();
  j["resumed"] = resume;
  if (resume) j["resumed_at_step"] = start_step;  // wall_seconds: this process's, from that step
  if (const dist::AverageStats* ds = tr.dist_stats(); ds && ds->calls) {
    j["dist"] = {{"ranks", tr.ranks()},
                 {"backend", comm->backend()},
                 {"transport", tr.dist_transport()},
                 {"allreduce_seconds_per_update", ds->seconds / double(ds->calls)},
                 {"allreduce_bytes_per_update", ds->bytes / double(ds->calls)},
                 {"allreduce_calls_per_update", double(ds->collectives) / double(ds->calls)}};
  }
  j["complete"] = stopped.empty();
  if (signal_stop) j["interrupted"] = stopped;
  if (!eval_stopped.empty()) j["interrupted"] = eval_stopped + " during the final evaluation";
  if (budget_stop) j["stopped_by_budget"] = stopped;
  claim();
  // plot.svg first: metrics.json's "complete" marks the end as written (finished_metrics)
  write_text(out / "plot.svg", plot(rows, c, spec, eval));
  write_text(out / "metrics.json", j.dump(2) + "\n");
  if (!tb_error.empty() && (signal_stop || !eval_stopped.empty() || budget_stop))  // (the stop's own status is the exit status)
    std::fprintf(stderr, "segtape: error: %s\n", tb_error.c_str());
  if (signal_stop) {
    std::printf("\nstopped by %s at step %ld of %ld; wrote %s/{%smetrics.csv, metrics.json, plot.svg}\n", stopped.c_str(),
                tr.step(), c.steps, out.c_str(), full ? "" : "checkpoint.safetensors, ");
    if (!full && comm) std::printf("resume with: mpirun -np %d segtape train --resume %s\n", comm->size(), out.c_str());
    else if (!full) std::printf("resume with: segtape train --resume %s\n", out.c_str());
    else std::printf("(--history full keeps its run in one segment and cannot be resumed)\n");
    return stop_exit_code(stopped);
  }
  if (!eval_stopped.empty()) {
    std::printf("\nstopped by %s during the final evaluation: training is complete (%ld steps); metrics.json has no eval score\n",
                eval_stopped.c_str(), tr.step());
    if (!full)
      std::printf("evaluate it with: segtape eval --checkpoint %s/checkpoint.safetensors, or write its final evaluation with: "
                  "segtape train --resume %s\n", out.c_str(), out.c_str());
    return stop_exit_code(eval_stopped);
  }
  if (budget_stop) {
    std::fprintf(stderr, "segtape: error: %s\n", stopped.c_str());
    std::printf("\nthe run stopped at its budget at step %ld; metrics and plot up to the stop: %s/{metrics.csv, metrics.json, plot.svg}\n",
                tr.step(), out.c_str());
    return 2;
  }
  std::printf("\nsummary\n");
  std::printf("  env / history        %s%s%s%s / %s\n", c.env.c_str(), settings.empty() ? "" : " (", settings.c_str(),
              settings.empty() ? "" : ")", c.history.str().c_str());
  if (resume)
    std::printf("  steps                %ld (batch %ld); %ld of them in %.1f s after resuming at step %ld\n", tr.step(), c.batch,
                tr.step() - start_step, wall, start_step);
  else
    std::printf("  steps                %ld (batch %ld) in %.1f s\n", tr.step(), c.batch, wall);
  if (rows.empty() || !rows.back().has_loss) std::printf("  final loss           none (no loss in the last log interval)\n");
  else if (!std::isfinite(rows.back().loss)) std::printf("  final loss           %s (the run diverged)\n", loss_text(rows.back(), "", "{}").c_str());
  else std::printf("  final loss           %.4f\n", rows.back().loss);
  std::printf("  train %-14s %s (last log interval)\n", measure.c_str(), score_text(rows.empty() ? std::nan("") : rows.back().score).c_str());
  if (j.contains("final_episode_return"))
    std::printf("  episode return       %.3f (mean, last log interval)\n", j["final_episode_return"].get<double>());
  std::printf("  eval %-15s %s (%ld fresh steps x %ld streams, greedy)\n", measure.c_str(), score_text(*eval).c_str(), a.eval_steps,
              c.batch);
  std::printf("  segment peak         %s%s\n", format_bytes(run_peak).c_str(), full ? " (one growing segment)" : " (fixed per segment)");
  std::printf("  persistent memory    %s (%ld parameters)\n", format_bytes(st.persistent_bytes).c_str(), tr.policy().parameter_count());
  if (c.device == "cuda")
    std::printf("  cuda graphs          %s\n", tr.graph_segments() ? (std::to_string(st.graph_replays) + " of " + std::to_string(st.segment_index) +
                                                                        " segments replayed a graph (" + std::to_string(st.graph_captures) +
                                                                        " captured; evaluation segments included)").c_str()
                                                                   : "off (--cuda-graphs off, or the run does not allow them: docs/agent.md)");
  if (j.contains("dist"))
    std::printf("  data parallel        %d ranks; all-reduce %.3f ms and %s per update (rank 0)\n", tr.ranks(),
                1e3 * j["dist"]["allreduce_seconds_per_update"].get<double>(),
                format_bytes(size_t(j["dist"]["allreduce_bytes_per_update"].get<double>())).c_str());
  std::printf("  files                %s/{metrics.csv, metrics.json, checkpoint.safetensors, plot.svg}\n", out.c_str());
  if (!tb_error.empty()) {
    std::fprintf(stderr, "segtape: error: %s\n", tb_error.c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  // Env plug-ins first: --env then knows the names they register.
  for (const std::string& file : plugin_args(argc, argv)) {
    try {
      load_plugin(file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: --env-plugin %s\n", error_head().c_str(), e.what());
      return 2;
    }
  }
  std::string env_help = "Environment: recall (delayed recall), tmaze (T-maze, RL), dialogue (tool use)";
  for (const auto& [name, file] : plugin_envs()) env_help += ", " + name + " (from " + fs::path(file).filename().string() + ")";

  // A seed is a uint64 written in decimal: CLI11 alone took -1 as 2^64 - 1 and
  // clamped 99999999999999999999 to it.
  const CLI::Validator seed_check(
      [](const std::string& v) {
        uint64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        return !v.empty() && ec == std::errc() && end == v.data() + v.size()
                   ? std::string()
                   : "'" + v + "' is not a whole number in [0, 18446744073709551615]";
      },
      "UINT64");
  CLI::App app{"segtape: recurrent agents with fixed memory per segment (truncated BPTT as the structure of the engine)", "segtape"};
  app.set_version_flag("--version", std::string("segtape ") + SEGTAPE_VERSION);
  app.require_subcommand(1);

  TrainArgs ta;
  CLI::App* tr = app.add_subcommand("train", "Train a recurrent agent; writes metrics.csv, metrics.json, checkpoint.safetensors, plot.svg");
  tr->add_option("--env", ta.c.env, env_help)
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& name) {
            return env_registered(name) ? std::string()
                                        : "unknown env '" + name + "' (registered: " + registered_envs() +
                                              "; an env of your own: --env-plugin FILE)";
          },
          "{" + [] {
            std::string s;
            for (const std::string& n : env_names()) s += (s.empty() ? "" : ",") + n;
            return s;
          }() + "}"));
  tr->add_option("--env-plugin", ta.env_plugins,
                 "Load envs from this shared library (defines segtape_register_envs(); docs/agent.md, \"Your own environment\"); "
                 "recorded in the checkpoint, so --resume and eval load it again");
  tr->add_option("--history", ta.history,
                 "How history reaches the gradient: tbptt:K (segments of K steps), detach (K=1), full (one growing segment; "
                 "teaching), window:N (last N embeddings, no recurrence), nograd-history (1-step gradient, K-step updates), "
                 "exact:K/T (the gradient of T-step windows in the memory of K-step segments, by replay; T defaults to 8K)")
      ->capture_default_str();
  tr->add_option("--steps", ta.c.steps, "Environment steps to train (each over the whole batch)")->capture_default_str();
  tr->add_option("--batch", ta.c.batch, "Parallel episode streams B")->capture_default_str();
  tr->add_option("--hidden", ta.c.hidden, "GRU hidden size H")->capture_default_str();
  tr->add_option("--embed", ta.c.embed, "Observation embedding size")->capture_default_str();
  tr->add_option("--update-bias", ta.c.update_bias,
                 "Added to the GRU's update-gate bias at init: the cell keeps about sigmoid(b) of its state per step "
                 "from the start (3: 95 %), which long lags need; 0 = PyTorch's init; |b| <= 20")->capture_default_str();
  tr->add_option("--lr", ta.c.lr, "Adam learning rate")->capture_default_str();
  tr->add_option("--clip", ta.c.clip, "Gradient norm clip (0 = off)")->capture_default_str();
  tr->add_option("--seed", ta.c.seed, "Seed for the model, the env and sampling")->capture_default_str()->check(seed_check);
  tr->add_option("--device", ta.c.device, "cpu, or cuda (a build with the CUDA backend and a GPU; docs/cuda.md)")
      ->capture_default_str();
  tr->add_option("--cuda-graphs", ta.graphs,
                 "cuda: auto runs each training segment as a CUDA graph where the run allows it (a supervised open-loop env, "
                 "tbptt or detach, a2c, one process; docs/agent.md), off runs every segment eagerly")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "off"}));
  tr->add_option("--out", ta.out, "Output directory (default runs/<env>-<time>)");
  tr->add_option("--resume", ta.resume, "Continue the run in this directory from its checkpoint");
  tr->add_flag("--force", ta.force, "Overwrite a run already in --out")->multi_option_policy(kOnce);
  tr->add_option("--budget", ta.budget, "Segment budget: arena and tape nodes, e.g. 64MiB (default 64MiB; for --history full the growth limit, default 1GiB)");
  tr->add_option("--lag", ta.c.env_options.lag, "recall: lag L")->capture_default_str();
  tr->add_flag("--sparse", ta.c.env_options.sparse,
               "recall: a token only every L steps (a blank between), a target only there: one token to hold, not L")
      ->multi_option_policy(kOnce);
  tr->add_option("--vocab", ta.c.env_options.vocab, "recall: vocabulary size")->capture_default_str();
  tr->add_option("--corridor", ta.c.env_options.corridor, "tmaze: corridor length N")->capture_default_str();
  tr->add_option("--turns", ta.c.env_options.turns, "dialogue: turns per conversation")->capture_default_str();
  tr->add_option("--cities", ta.c.env_options.cities, "dialogue: cities a user can name")->capture_default_str();
  tr->add_option("--gamma", ta.c.gamma, "RL (tmaze, --algo ppo): discount (default 0.9; 0 for --algo ppo on a supervised env)");
  tr->add_option("--entropy", ta.c.entropy, "RL: entropy bonus")->capture_default_str();
  tr->add_option("--algo", ta.c.algo,
                 "RL algorithm: a2c (an update per segment) or ppo (recurrent PPO: rollouts, GAE, clipped surrogate, "
                 "minibatches of whole streams replayed from their stored states; on a supervised env the reward is 1 "
                 "for the target class)")->capture_default_str();
  tr->add_option("--rollout", ta.c.rollout, "ppo: steps per stream per rollout")->capture_default_str();
  tr->add_option("--epochs", ta.c.epochs, "ppo: passes over each rollout")->capture_default_str();
  tr->add_option("--minibatches", ta.c.minibatches, "ppo: minibatches of whole streams per pass (divides --batch)")->capture_default_str();
  tr->add_option("--clip-range", ta.c.clip_range, "ppo: the surrogate's clip epsilon")->capture_default_str();
  tr->add_option("--gae-lambda", ta.c.gae_lambda, "ppo: GAE lambda")->capture_default_str();
  tr->add_option("--lr-schedule", ta.c.lr_schedule, "ppo: linear (Adam's lr from --lr to 0 over --steps) or constant")->capture_default_str();
  tr->add_option("--log-every", ta.log_every,
                 "Steps between metric rows (default: steps/100); a row is written where the first segment that reaches "
                 "each multiple ends, at most one per segment, and at the last step");
  tr->add_option("--checkpoint-every", ta.checkpoint_every, "Steps between checkpoints (default: steps/10)");
  tr->add_option("--eval-steps", ta.eval_steps, "Steps of greedy evaluation at the end (and at each checkpoint with --log-dir); recall: more than --lag (default: at least 2 x --lag)")->capture_default_str();
  tr->add_option("--env-shards", ta.c.env_shards,
                 "Make the --batch streams as N envs seeded like the N ranks of mpirun -np N (one process reproduces "
                 "a data-parallel run's streams; docs/distributed.md)")->capture_default_str();
  tr->add_option("--dist-timeout", ta.dist_timeout,
                 "Under mpirun: seconds a rank waits in a collective before ending the job (a rank died or hangs)")->capture_default_str();
  tr->add_option("--log-dir", ta.log_dir,
                 "Also write TensorBoard event files here: train/loss, train/<measure>, train/episode_return, "
                 "memory/segment_peak_bytes, memory/rss_bytes, speed/steps_per_s with every metrics row (and "
                 "ppo/approx_kl, ppo/clip_fraction, ppo/lr under --algo ppo), eval/<measure> at every checkpoint")->check(kNonEmpty);

  EvalArgs ea;
  CLI::App* ev = app.add_subcommand("eval", "Evaluate a checkpoint on fresh seeded episodes");
  ev->add_option("--checkpoint", ea.checkpoint, "checkpoint.safetensors written by train")->required()->check(kNonEmpty);
  ev->add_option("--steps", ea.steps, "Steps to evaluate (recall: more than its --lag; default: at least 2 x --lag)")->capture_default_str();
  ev->add_option("--seed", ea.seed, "Seed of the fresh episodes")->capture_default_str()->check(seed_check);
  ev->add_option("--device", ea.device, "cpu or cuda (default: the device the checkpoint was trained on)");
  ev->add_option("--env-plugin", ea.env_plugins,
                 "Load envs from this shared library (default: the plug-in recorded in the checkpoint, if any)");

  RetentionArgs ra;
  CLI::App* rl = app.add_subcommand(
      "retention", "The retention lab: every graph-retention pitfall beside its fix, measured on segtape and LibTorch (docs/retention.md)");
  rl->add_option("--steps", ra.c.steps, "Steps per case (pitfalls 1, 5-7 take time, pitfall 4 memory, quadratic in it)")
      ->capture_default_str();
  rl->add_option("--batch", ra.c.batch, "Parallel streams B")->capture_default_str();
  rl->add_option("--hidden", ra.c.hidden, "GRU hidden size H")->capture_default_str();
  rl->add_option("--budget", ra.budget, "Strict-policy segment budget (pitfall reruns, fixes) and the line the table reports crossing")
      ->capture_default_str();
  rl->add_option("--seed", ra.c.seed, "Seed of the model and the data")->capture_default_str()->check(seed_check);
  rl->add_option("--device", ra.c.device, "segtape's side on cpu or cuda (LibTorch's side runs on its CPU)")
      ->capture_default_str();
  rl->add_option("--out", ra.out, "Output directory (default runs/retention-<time>)")->check(kNonEmpty);
  rl->add_option("--cases", ra.cases, "Comma-separated cases to run (default: all), by name, number or as the table prints them: " +
                                          retention::case_names(ra.c));
  rl->add_flag("--explain", ra.explain, "Print the explainer's report (who holds the memory) for each pitfall at its last step")
      ->multi_option_policy(kOnce);
  rl->add_option("--dot", ra.dot, "Write the Graphviz DOT of a small segment's tape (pitfall 1, 3 steps) to this file, and tbptt's second segment (the state carried in) beside it as <name>-tbptt.dot")->check(kNonEmpty);
  rl->add_flag("--no-libtorch", ra.no_libtorch, "Run segtape only")->multi_option_policy(kOnce);
  rl->add_flag("--force", ra.force, "Overwrite a lab run already in --out")->multi_option_policy(kOnce);
  rl->add_flag("--anomaly-cost", ra.anomaly_only, "Only measure anomaly mode's cost per step on the agent loop (also part of every lab run)")
      ->multi_option_policy(kOnce);

  // Commands in the program's own terms: `segtape`, `segtape help [cmd]`, `segtape foo`.
  const std::vector<std::string> commands = {"train", "eval", "retention"};
  if (argc < 2) {
    std::printf("%s", app.help().c_str());
    std::fprintf(stderr, "%s: a command is required: train, eval or retention (segtape help <command> for its options)\n", error_head().c_str());
    return 2;
  }
  const std::string first = argv[1];
  if (first == "help") {
    if (argc == 2) return std::printf("%s", app.help().c_str()), 0;
    const std::string which = argv[2];
    if (std::find(commands.begin(), commands.end(), which) != commands.end())
      return std::printf("%s", app.get_subcommand(which)->help("segtape").c_str()), 0;  // (Usage: segtape train, as --help)
    std::fprintf(stderr, "%s: no command '%s' (commands: train, eval, retention)\n", error_head().c_str(), which.c_str());
    return 2;
  }
  if (first.rfind('-', 0) == 0 && first != "-h" && first != "--help" && first != "--version") {  // (CLI11 said "A subcommand is required")
    std::fprintf(stderr, "%s: '%s' before a command: the options follow the command (segtape train|eval|retention "
                 "[options]; see segtape help)\n", error_head().c_str(), first.c_str());
    return 2;
  }
  if (first.rfind('-', 0) != 0 && std::find(commands.begin(), commands.end(), first) == commands.end()) {
    std::fprintf(stderr, "%s: unknown command '%s' (commands: train, eval, retention; see segtape help)\n", error_head().c_str(), first.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error: what was wrong and where to look.
    const bool sub = std::find(commands.begin(), commands.end(), first) != commands.end();
    std::fprintf(stderr, "%s: %s (see segtape %s--help)\n", error_head().c_str(), e.what(), sub ? (first + " ").c_str() : "");
    return 2;  // a usage error, as every other bad argument (CLI11's own codes were 105-114)
  }
  try {
    if (*tr) return train(ta, *tr);
    if (*ev) return eval(ea, ev->count("--steps") > 0);
    if (*rl) return retention_lab(ra);
  } catch (const std::bad_alloc&) {  // (what() is "std::bad_alloc", which names nothing)
    const Error e("out of memory in segtape " + first + " (std::bad_alloc): the run needs more memory than this process may "
                  "take (the machine's, or ulimit -v); make it smaller (--hidden, --batch, --steps) or allow more");
    if (job_communicator()) return rank_error(e);
    std::fprintf(stderr, "%s: %s\n", error_head().c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    if (job_communicator()) return rank_error(e);
    std::fprintf(stderr, "%s: %s\n", error_head().c_str(), one_line(e.what()).c_str());
    return 2;
  } catch (...) {  // thrown by code of the user's (a plug-in) that bypassed the env's checks: never terminate()
    const Error e("an exception that is not a std::exception (from an env plug-in's code?)");
    if (job_communicator()) return rank_error(e);
    std::fprintf(stderr, "%s: %s\n", error_head().c_str(), e.what());
    return 2;
  }
  return 0;
}

int main(int argc, char** argv) {
  segtape_cli::keep_standard_descriptors();
  segtape_cli::restart_with_recognised_blas_kernels(argv);
  try {  // setting up the parser could throw too (out of memory): never terminate()
    return run_cli(argc, argv);
  } catch (const std::exception& e) {
    if (job_communicator()) return rank_error(e);
    std::fprintf(stderr, "segtape: error: %s\n", e.what());
    return 2;
  } catch (...) {
    std::fprintf(stderr, "segtape: error: an exception that is not a std::exception\n");
    return 2;
  }
}
