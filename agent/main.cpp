// The segtape command: train, evaluate and resume recurrent agents whose
// memory per segment is fixed. `segtape --help` lists everything.
//
// This file defines the command line (CLI11) and wires each command to its
// file: cli/train.cpp, cli/eval.cpp, cli/retention.cpp.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <new>

#include "cli/cli.h"
#include "cli/plugins.h"
#include "cli/startup.h"
#include "segtape/agent/env.h"
#include "segtape/kernels.h"

namespace segtape_cli {
namespace {

using segtape::agent::env_names;
using segtape::agent::env_registered;

// A flag given twice is refused, as an option given twice is (CLI11 counts flags).
constexpr CLI::MultiOptionPolicy kOnce = CLI::MultiOptionPolicy::Throw;
// A path option given as '' is refused (it was ignored, or fell back to its default).
const CLI::Validator kNonEmpty(
    [](std::string& v) { return v.empty() ? std::string("needs a path (it was empty)") : std::string(); }, "PATH");

// A seed is a uint64 written in decimal: CLI11 alone took -1 as 2^64 - 1 and
// clamped 99999999999999999999 to it.
const CLI::Validator kSeed(
    [](const std::string& v) {
      uint64_t x = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      return !v.empty() && ec == std::errc() && end == v.data() + v.size()
                 ? std::string()
                 : "'" + v + "' is not a whole number in [0, 18446744073709551615]";
    },
    "UINT64");

// --env: a registered env (a built-in one, or one an --env-plugin registered).
CLI::Validator env_check() {
  std::string names;
  for (const std::string& n : env_names()) names += (names.empty() ? "" : ",") + n;
  return CLI::Validator(
      [](const std::string& name) {
        return env_registered(name) ? std::string()
                                    : "unknown env '" + name + "' (registered: " + registered_envs() +
                                          "; an env of your own: --env-plugin FILE)";
      },
      "{" + names + "}");
}

std::string env_help() {
  std::string help = "Environment: recall (delayed recall), tmaze (T-maze, RL), dialogue (tool use), lm (a text corpus: --task lm), "
                     "series (a CSV time series: --task series), device-recall, device-tmaze and device-dialogue (recall, tmaze and "
                     "dialogue by the device loop's rules: docs/device-loop.md)";
  for (const auto& [name, file] : plugin_envs()) help += ", " + name + " (from " + std::filesystem::path(file).filename().string() + ")";
  return help;
}

// The run's shape, its history and its folder.
void add_run_options(CLI::App* tr, TrainArgs& ta) {
  tr->add_option("--env", ta.c.env, env_help())->capture_default_str()->check(env_check());
  tr->add_option("--env-plugin", ta.env_plugins,
                 "Load envs from this shared library (defines segtape_register_envs(); docs/agent.md, \"Your own environment\"); "
                 "recorded in the checkpoint, so --resume and eval load it again");
  tr->add_option("--history", ta.history, "How history reaches the gradient: " + segtape::agent::History::help())
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
  tr->add_option("--nonfinite", ta.c.nonfinite,
                 "An update whose gradient is not finite (inf or NaN): stop (an error naming it; the last checkpoint kept) or "
                 "skip (the update left out and counted, as PyTorch's GradScaler; stops after --max-skips in a row)")
      ->capture_default_str();
  tr->add_option("--max-skips", ta.c.max_skips, "--nonfinite skip: stop after this many updates skipped in a row")->capture_default_str();
  tr->add_option("--size-check", ta.c.size_check,
                 "on: refuse, before anything is allocated, a run whose estimated memory does not fit what this machine has "
                 "free (or its cgroup, or ulimit -v / -d; ranks on one machine counted together); off: run without that check. "
                 "Default: on");
  tr->add_option("--seed", ta.c.seed, "Seed for the model, the env and sampling")->capture_default_str()->check(kSeed);
  tr->add_option("--device", ta.c.device, "cpu, or cuda (a build with the CUDA backend and a GPU; docs/cuda.md)")
      ->capture_default_str();
  tr->add_option("--precision", ta.c.precision,
                 "f32, or bf16: every matrix product on bfloat16 operands, accumulated in float32 and rounded to bfloat16, "
                 "the rest (recurrent state, losses, gradient sums, master weights) float32; on --device cuda, cuBLAS's bfloat16 GEMM "
                 "(docs/precision.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  tr->add_option("--cuda-graphs", ta.graphs,
                 "cuda: auto runs each training segment as a CUDA graph where the run allows it (a supervised open-loop env, "
                 "tbptt or detach, a2c, one process; docs/agent.md), off runs every segment eagerly")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "off"}));
  tr->add_option("--device-loop", ta.device_loop,
                 "ppo on device-recall, device-tmaze or device-dialogue: on runs each rollout (the env's streams, sampling, resets, GAE) on the "
                 "--device with nothing read back per step, the same run as off (docs/device-loop.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  // (how the run executes, not what it computes: not in the checkpoint)
  tr->add_option_function<std::vector<std::string>>(
        "--kernel",
        [](const std::vector<std::string>& all) {
          for (const std::string& v : all) {
            const size_t eq = v.find('=');
            if (eq == std::string::npos) throw segtape::Error("--kernel " + v + ": give NAME=VALUE (e.g. fused_gru=off)");
            segtape::kernels::set_option(std::string_view(v).substr(0, eq), std::string_view(v).substr(eq + 1));
          }
        },
        "a kernel switch, NAME=VALUE: gemv=auto|on|off, packed=best|avx2|off, fused_gru=on|off, "
        "fused_gru_grid=on|off (segtape/kernels.h; every choice computes the same training, to rounding); repeatable")
      ->type_name("NAME=VALUE");
  tr->add_option("--out", ta.out, "Output directory (default runs/<env>-<time>)");
  tr->add_option("--resume", ta.resume, "Continue the run in this directory from its checkpoint");
  tr->add_flag("--force", ta.force, "Overwrite a run already in --out")->multi_option_policy(kOnce);
  tr->add_option("--budget", ta.budget, "Segment budget: arena and tape nodes, e.g. 64MiB (default 64MiB, 256MiB for --task lm; for --history full the growth limit, default 1GiB)");
}

// The built-in envs' settings and the RL algorithms'.
void add_env_and_algo_options(CLI::App* tr, TrainArgs& ta) {
  tr->add_option("--task", ta.task, "lm: a language model of a text (--env lm --algo lm; --data FILE); series: next-value regression "
                                    "on a CSV time series (--env series --algo series; --data FILE.csv --target COLUMN)");
  tr->add_option("--data", ta.c.env_options.data,
                 "lm: the text to learn (read through a memory map); series: the CSV file (a header row, one row per time step)")
      ->check(kNonEmpty);
  tr->add_option("--valid", ta.c.env_options.valid, "lm: the validation text (default: the last --split of --data's tokens); series: the rows after --data's")
      ->check(kNonEmpty);
  tr->add_option("--test", ta.c.env_options.test, "lm: a test text, evaluated at the run's end; series: the rows after the validation part's")
      ->check(kNonEmpty);
  tr->add_option("--split", ta.c.env_options.split, "lm, series: the fraction of --data's tokens (rows) kept for validation without --valid")
      ->capture_default_str();
  tr->add_option("--tokens", ta.c.env_options.tokens, "lm: bytes, chars (UTF-8 code points) or words (split at whitespace, <eos> at each line's end)")
      ->capture_default_str();
  tr->add_option("--cell", ta.c.cell, "lm, a2c, ppo: the recurrent cell, gru or lstm")->capture_default_str();
  tr->add_option("--layers", ta.c.layers, "lm: recurrent layers (default 2 for --task lm)");
  tr->add_option("--dropout", ta.c.dropout, "lm: dropout on the embeddings, between the layers and on the output (word_language_model's)")
      ->capture_default_str();
  tr->add_flag("--tied", ta.c.tied, "lm: the output layer's weights are the embeddings' (--hidden = --embed)")->multi_option_policy(kOnce);
  tr->add_option("--optim", ta.c.optim, "lm: adam, adamw or sgd (sgd: the learning rate / 4 after an epoch whose validation loss did not improve)")
      ->capture_default_str();
  tr->add_option("--adam-eps", ta.c.adam_eps, "Adam's and AdamW's eps (PyTorch's 1e-8; SB3's and CleanRL's PPO use 1e-5)")
      ->capture_default_str();
  tr->add_option("--target", ta.c.env_options.target, "series: the column whose next value is predicted");
  tr->add_option("--features", ta.c.env_options.features, "series: the columns observed, a,b,c (default: the target alone)");
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
  tr->add_option_function<std::string>("--algo", [&ta](const std::string& v) { ta.c.algo = segtape::agent::parse_algo(v); },
                 "What learns from the steps: " + segtape::agent::algo_help())->default_str("a2c");
  tr->add_option("--rollout", ta.c.rollout, "ppo: steps per stream per rollout")->capture_default_str();
  tr->add_option("--epochs", ta.c.epochs, "ppo: passes over each rollout; lm: passes over the text (instead of --steps; default 1)")->capture_default_str();
  tr->add_option("--minibatches", ta.c.minibatches, "ppo: minibatches of whole streams per pass (divides --batch)")->capture_default_str();
  tr->add_option("--clip-range", ta.c.clip_range, "ppo: the surrogate's clip epsilon")->capture_default_str();
  tr->add_option("--gae-lambda", ta.c.gae_lambda, "ppo: GAE lambda")->capture_default_str();
  tr->add_option("--critic", ta.c.critic,
                 "a2c/ppo: the value head reads the policy's GRU or LSTM (shared) or a cell of its own of the same kind over the same "
                 "embeddings (separate)")
      ->capture_default_str();
  tr->add_option("--encoder", ta.c.encoder,
                 "vector observations into the recurrent cell through linear (Linear(obs, --embed) + tanh) or none (as they are, "
                 "as SB3's recurrent policies read them)")
      ->capture_default_str();
  tr->add_flag("--ortho-init", ta.c.ortho_init,
               "SB3's ortho_init: the linear layers outside the recurrent core orthogonal (encoder and hidden layers gain "
               "sqrt(2), action head 0.01, value head 1), biases 0; the recurrent cells as PyTorch's");
  tr->add_option("--head-hidden", ta.c.head_hidden,
                 "a hidden layer of N units with ReLU before the action head and one before the value head (SB3's "
                 "net_arch pi=[N], vf=[N]); 0: the heads read the recurrent state")
      ->capture_default_str();
  tr->add_option("--lr-schedule", ta.c.lr_schedule, "ppo: linear (Adam's lr from --lr to 0 over --steps) or constant")->capture_default_str();
  tr->add_option("--clip-schedule", ta.c.clip_schedule,
                 "ppo: constant, or linear (the clip range from --clip-range to 0 over --steps, as SB3's lin_)")
      ->capture_default_str();
  tr->add_option("--value-clip", ta.c.value_clip,
                 "ppo: > 0 clips the value's move from its rollout value by this much, as PPO2 and CleanRL (the larger of "
                 "the clipped and unclipped value losses); 0: off, as SB3's default")
      ->capture_default_str();
}

// Reporting, evaluation and data parallelism.
void add_report_options(CLI::App* tr, TrainArgs& ta) {
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
}

CLI::App* add_train(CLI::App& app, TrainArgs& ta) {
  CLI::App* tr = app.add_subcommand("train", "Train a recurrent agent; writes metrics.csv, metrics.json, checkpoint.safetensors, plot.svg");
  add_run_options(tr, ta);
  add_env_and_algo_options(tr, ta);
  add_report_options(tr, ta);
  return tr;
}

CLI::App* add_eval(CLI::App& app, EvalArgs& ea) {
  CLI::App* ev = app.add_subcommand("eval", "Evaluate a checkpoint on fresh seeded episodes");
  ev->add_option("--checkpoint", ea.checkpoint, "checkpoint.safetensors written by train")->required()->check(kNonEmpty);
  ev->add_option("--steps", ea.steps, "Steps to evaluate (recall: more than its --lag; default: at least 2 x --lag)")->capture_default_str();
  ev->add_option("--seed", ea.seed, "Seed of the fresh episodes")->capture_default_str()->check(kSeed);
  ev->add_option("--device", ea.device, "cpu or cuda (default: the device the checkpoint was trained on)");
  ev->add_option("--env-plugin", ea.env_plugins,
                 "Load envs from this shared library (default: the plug-in recorded in the checkpoint, if any)");
  return ev;
}

CLI::App* add_retention(CLI::App& app, RetentionArgs& ra) {
  CLI::App* rl = app.add_subcommand(
      "retention", "The retention lab: every graph-retention pitfall beside its fix, measured on segtape and LibTorch (docs/retention.md)");
  rl->add_option("--steps", ra.c.steps, "Steps per case (pitfalls 1, 5-7 take time, pitfall 4 memory, quadratic in it)")
      ->capture_default_str();
  rl->add_option("--batch", ra.c.batch, "Parallel streams B")->capture_default_str();
  rl->add_option("--hidden", ra.c.hidden, "GRU hidden size H")->capture_default_str();
  rl->add_option("--budget", ra.budget, "Strict-policy segment budget (pitfall reruns, fixes) and the line the table reports crossing")
      ->capture_default_str();
  rl->add_option("--seed", ra.c.seed, "Seed of the model and the data")->capture_default_str()->check(kSeed);
  rl->add_option("--device", ra.c.device, "segtape's side on cpu or cuda (LibTorch's side runs on its CPU)")
      ->capture_default_str();
  rl->add_option("--out", ra.out, "Output directory (default runs/retention-<time>)")->check(kNonEmpty);
  rl->add_option("--cases", ra.cases, "Comma-separated cases to run (default: all), by name, number or as the table prints them: " +
                                          segtape::agent::retention::case_names(ra.c));
  rl->add_flag("--explain", ra.explain, "Print the explainer's report (who holds the memory) for each pitfall at its last step")
      ->multi_option_policy(kOnce);
  rl->add_option("--dot", ra.dot, "Write the Graphviz DOT of a small segment's tape (pitfall 1, 3 steps) to this file, and tbptt's second segment (the state carried in) beside it as <name>-tbptt.dot")->check(kNonEmpty);
  rl->add_flag("--no-libtorch", ra.no_libtorch, "Run segtape only")->multi_option_policy(kOnce);
  rl->add_flag("--force", ra.force, "Overwrite a lab run already in --out")->multi_option_policy(kOnce);
  rl->add_flag("--anomaly-cost", ra.anomaly_only, "Only measure anomaly mode's cost per step on the agent loop (also part of every lab run)")
      ->multi_option_policy(kOnce);
  return rl;
}

CLI::App* add_sample(CLI::App& app, SampleArgs& sa) {
  CLI::App* sm = app.add_subcommand("sample", "The text a language model (train --task lm) writes after a prompt, on standard output");
  sm->add_option("--checkpoint", sa.checkpoint, "checkpoint.safetensors written by train --task lm")->required()->check(kNonEmpty);
  sm->add_option("--prompt", sa.o.prompt, "Text to start from (default: a first token at random)");
  sm->add_option("--length", sa.o.length, "Tokens to generate")->capture_default_str();
  sm->add_option("--temperature", sa.o.temperature, "The logits divided by it before the softmax (lower: likelier tokens)")
      ->capture_default_str();
  sm->add_option("--seed", sa.o.seed, "Seed of the draws (the same seed, the same text)")->capture_default_str()->check(kSeed);
  return sm;
}

const std::vector<std::string> kCommands = {"train", "eval", "sample", "retention"};
bool is_command(const std::string& s) { return std::find(kCommands.begin(), kCommands.end(), s) != kCommands.end(); }

// Commands in the program's own terms: `segtape`, `segtape help [cmd]`,
// `segtape foo`, an option before the command. Returns the exit status
// where that settles it, else -1 (CLI11 parses the rest).
int before_parsing(CLI::App& app, int argc, char** argv) {
  if (argc < 2) {
    std::printf("%s", app.help().c_str());
    std::fprintf(stderr, "%s: a command is required: train, eval, sample or retention (segtape help <command> for its options)\n", error_head().c_str());
    return 2;
  }
  const std::string first = argv[1];
  if (first == "help") {
    if (argc == 2) return std::printf("%s", app.help().c_str()), 0;
    const std::string which = argv[2];
    if (is_command(which)) return std::printf("%s", app.get_subcommand(which)->help("segtape").c_str()), 0;  // (Usage: segtape train, as --help)
    std::fprintf(stderr, "%s: no command '%s' (commands: train, eval, sample, retention)\n", error_head().c_str(), which.c_str());
    return 2;
  }
  if (first.rfind('-', 0) == 0 && first != "-h" && first != "--help" && first != "--version") {  // (CLI11 said "A subcommand is required")
    std::fprintf(stderr, "%s: '%s' before a command: the options follow the command (segtape train|eval|sample|retention "
                 "[options]; see segtape help)\n", error_head().c_str(), first.c_str());
    return 2;
  }
  if (first.rfind('-', 0) != 0 && !is_command(first)) {
    std::fprintf(stderr, "%s: unknown command '%s' (commands: train, eval, sample, retention; see segtape help)\n", error_head().c_str(), first.c_str());
    return 2;
  }
  return -1;
}

// CLI11's parse; its usage errors as one line, like every other error: what
// was wrong and where to look. Returns the exit status where that settles it, else -1.
int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string first = argv[1];
    std::fprintf(stderr, "%s: %s (see segtape %s--help)\n", error_head().c_str(), e.what(), is_command(first) ? (first + " ").c_str() : "");
    return 2;  // a usage error, as every other bad argument (CLI11's own codes were 105-114)
  }
  return -1;
}

// Env plug-ins first: --env then knows the names they register. false when one does not load.
bool load_plugins(int argc, char** argv) {
  for (const std::string& file : plugin_args(argc, argv)) {
    try {
      load_plugin(file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: --env-plugin %s\n", error_head().c_str(), e.what());
      return false;
    }
  }
  return true;
}

// A command run, its errors reported as one line (or by rank_error under mpirun).
int run_command(const std::string& command, const std::function<int()>& run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {  // (what() is "std::bad_alloc", which names nothing)
    return report_error(segtape::Error("out of memory in segtape " + command + " (std::bad_alloc): the run needs more memory than this process may "
                                       "take (the machine's, or ulimit -v); make it smaller (--hidden, --batch, --steps) or allow more"));
  } catch (const std::exception& e) {
    return report_error(e);
  } catch (...) {  // thrown by code of the user's (a plug-in) that bypassed the env's checks: never terminate()
    return report_error(segtape::Error("an exception that is not a std::exception (from an env plug-in's code?)"));
  }
}

int run_cli(int argc, char** argv) {
  if (!load_plugins(argc, argv)) return 2;
  CLI::App app{"segtape: recurrent agents with fixed memory per segment (truncated BPTT as the structure of the engine)", "segtape"};
  app.set_version_flag("--version", std::string("segtape ") + SEGTAPE_VERSION);
  app.require_subcommand(1);
  TrainArgs ta;
  EvalArgs ea;
  RetentionArgs ra;
  SampleArgs sa;
  CLI::App* tr = add_train(app, ta);
  CLI::App* ev = add_eval(app, ea);
  CLI::App* sm = add_sample(app, sa);
  CLI::App* rl = add_retention(app, ra);
  if (const int status = before_parsing(app, argc, argv); status >= 0) return status;
  if (const int status = parse(app, argc, argv); status >= 0) return status;
  const std::string command = argv[1];
  if (*tr) return run_command(command, [&] { return train(ta, [tr](const std::string& o) { return tr->count(o) > 0; }); });
  if (*ev) return run_command(command, [&] { return eval(ea, ev->count("--steps") > 0); });
  if (*sm) return run_command(command, [&] { return sample(sa); });
  if (*rl) return run_command(command, [&] { return retention_lab(ra); });
  return 0;
}

}  // namespace
}  // namespace segtape_cli

int main(int argc, char** argv) {
  segtape_cli::keep_standard_descriptors();
  segtape_cli::restart_with_recognised_blas_kernels(argv);
  try {  // setting up the parser could throw too (out of memory): never terminate()
    return segtape_cli::run_cli(argc, argv);
  } catch (const std::exception& e) {
    if (segtape_cli::job_communicator()) return segtape_cli::rank_error(e);
    std::fprintf(stderr, "segtape: error: %s\n", e.what());
    return 2;
  } catch (...) {
    std::fprintf(stderr, "segtape: error: an exception that is not a std::exception\n");
    return 2;
  }
}
