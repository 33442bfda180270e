#include "segtape/agent/config.h"

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

#include "algo/algorithm.h"
#include "history/history.h"
#include "task/corpus.h"
#include "task/series_data.h"
#include "segtape/emulation.h"

namespace segtape::agent {

// ---------------------------------------------------------------- --history

History History::parse(const std::string& s) {
  const std::string head = s.substr(0, s.find(':'));
#define SEGTAPE_TRY(K, N)                                                               \
  if (const HistoryDef& d = history_def(Kind::K); head == d.name || (d.alias && head == d.alias)) \
    return d.parse(s);
  SEGTAPE_HISTORIES(SEGTAPE_TRY)
#undef SEGTAPE_TRY
  throw Error("unknown --history '" + s + "' (choose " + choices() + ")");
}

std::string History::str() const { return history_def(kind).str(*this); }

bool History::grows() const { return history_def(kind).grows; }

std::string History::choices() {
  return history_choices([](const HistoryDef&) { return true; });
}

std::string history_choices(bool (*which)(const HistoryDef&)) {
  std::string all;
#define SEGTAPE_SYNTAX(K, N) \
  if (const HistoryDef& d = history_def(History::Kind::K); which(d)) all += std::string(all.empty() ? "" : ", ") + d.syntax;
  SEGTAPE_HISTORIES(SEGTAPE_SYNTAX)
#undef SEGTAPE_SYNTAX
  return all;
}

std::string History::help() {
  std::string all;
#define SEGTAPE_HELP(K, N) all += std::string(all.empty() ? "" : ", ") + history_def(Kind::K).help;
  SEGTAPE_HISTORIES(SEGTAPE_HELP)
#undef SEGTAPE_HELP
  return all;
}

int64_t history_number(const std::string& v, const std::string& text, const char* what) {
  int64_t n = 0;  // digits only: no sign, no spaces ("tbptt: 32" was read as 32)
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || v[0] == '-' || r.ec != std::errc() || r.ptr != v.data() + v.size() || n < 1 || n > 1'000'000)
    throw Error("--history " + text + ": " + what + " must be an integer in [1, 1000000]");
  return n;
}

// ---------------------------------------------------------------- --algo

Algo parse_algo(const std::string& s) {
  std::vector<const char*> names;
#define SEGTAPE_TRY(K, N)                                   \
  if (const AlgorithmDef& d = algorithm_def(Algo::K); d.flag) { \
    if (s == d.name) return Algo::K;                        \
    names.push_back(d.name);                                \
  }
  SEGTAPE_ALGORITHMS(SEGTAPE_TRY)
#undef SEGTAPE_TRY
  std::string choices;
  for (size_t i = 0; i < names.size(); ++i) choices += std::string(i == 0 ? "" : i + 1 < names.size() ? ", " : " or ") + names[i];
  throw Error("--algo '" + s + "': choose " + choices);
}

const char* algo_name(Algo a) { return algorithm_def(a).name; }

std::string algo_help() {
  std::string all;
#define SEGTAPE_HELP(K, N) \
  if (const AlgorithmDef& d = algorithm_def(Algo::K); d.flag) all += std::string(all.empty() ? "" : " or ") + d.help;
  SEGTAPE_ALGORITHMS(SEGTAPE_HELP)
#undef SEGTAPE_HELP
  return all;
}

Algo TrainConfig::learner(const EnvSpec& spec) const { return algo == Algo::A2c && spec.supervised ? Algo::Supervised : algo; }

// ---------------------------------------------------------------- the configuration

namespace {
// A language-model corpus's settings (--task lm): keys of its runs only.
void lm_metadata(const TrainConfig& c, std::map<std::string, std::string>& m) {
  if (c.env != "lm") return;
  const EnvOptions& o = c.env_options;
  char split[40];
  m["data"] = o.data, m["valid"] = o.valid, m["test"] = o.test, m["tokens"] = o.tokens;
  m["split"] = std::string(split, std::to_chars(split, split + sizeof split, o.split).ptr);
  m["cell"] = c.cell, m["layers"] = std::to_string(c.layers), m["tied"] = c.tied ? "1" : "0", m["optim"] = c.optim;
  m["dropout"] = std::string(split, std::to_chars(split, split + sizeof split, c.dropout).ptr);
}
// A time series' settings (--task series): keys of its runs only.
void series_metadata(const TrainConfig& c, std::map<std::string, std::string>& m) {
  if (c.env != "series") return;
  const EnvOptions& o = c.env_options;
  char split[40];
  m["data"] = o.data, m["valid"] = o.valid, m["test"] = o.test, m["target"] = o.target, m["features"] = o.features;
  m["split"] = std::string(split, std::to_chars(split, split + sizeof split, o.split).ptr);
}
}  // namespace

std::map<std::string, std::string> TrainConfig::to_metadata() const {
  auto d = [](double v) {  // the shortest text that reads back to v, in no locale
    char b[40];
    return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
  };
  std::map<std::string, std::string> m = {{"env", env},
          {"history", history.str()},
          {"steps", std::to_string(steps)},
          {"batch", std::to_string(batch)},
          {"hidden", std::to_string(hidden)},
          {"embed", std::to_string(embed)},
          {"update_bias", d(update_bias)},
          {"lr", d(lr)},
          {"clip", d(clip)},
          {"seed", std::to_string(seed)},
          {"device", device},
          {"budget", std::to_string(budget)},
          {"lag", std::to_string(env_options.lag)},
          {"sparse", env_options.sparse ? "1" : "0"},
          {"vocab", std::to_string(env_options.vocab)},
          {"corridor", std::to_string(env_options.corridor)},
          {"turns", std::to_string(env_options.turns)},
          {"cities", std::to_string(env_options.cities)},
          {"embed_dim", std::to_string(env_options.embed_dim)},
          {"gamma", d(gamma)},
          {"entropy", d(entropy)},
          {"value_coef", d(value_coef)},
          {"algo", algo_name(algo)},
          {"rollout", std::to_string(rollout)},
          {"epochs", std::to_string(epochs)},
          {"minibatches", std::to_string(minibatches)},
          {"clip_range", d(clip_range)},
          {"gae_lambda", d(gae_lambda)},
          {"lr_schedule", lr_schedule},
          {"env_shards", std::to_string(env_shards)}};
  if (critic != "shared") m["critic"] = critic;  // (a run with the shared core writes what runs before --critic wrote)
  if (clip_schedule != "constant") m["clip_schedule"] = clip_schedule;  // (likewise)
  if (value_clip != 0) m["value_clip"] = d(value_clip);                  // (likewise)
  if (precision != "f32") m["precision"] = precision;                    // (likewise)
  if (head_hidden > 0) m["head_hidden"] = std::to_string(head_hidden);  // (likewise)
  if (ortho_init) m["ortho_init"] = "1";                                   // (likewise)
  if (encoder != "linear") m["encoder"] = encoder;                         // (likewise)
  if (adam_eps != 1e-8) m["adam_eps"] = d(adam_eps);                      // (likewise)
  lm_metadata(*this, m);
  if (cell != "gru") m["cell"] = cell;  // (an RL run's LSTM; a GRU run's checkpoint is written as before --cell)
  series_metadata(*this, m);
  return m;
}

TrainConfig TrainConfig::from_metadata(const std::map<std::string, std::string>& m) {
  // Key k's value; `before`: what a checkpoint written before k existed means (none: k is required).
  auto get = [&](const char* k, std::optional<std::string> before = std::nullopt) {
    auto it = m.find(k);
    if (it != m.end()) return it->second;
    if (before) return *before;
    throw CheckpointError(std::string("checkpoint metadata lacks '") + k + "': not a segtape training checkpoint");
  };
  // A number, all of the value, named by its key: std::from_chars reads no
  // sign on unsigned values (std::stoull took "-1" as 2^64 - 1), no spaces,
  // and no locale (std::stod read "3,5" as 3, and a decimal comma under some
  // locales).
  auto whole = [](const char* k, const std::string& v, auto x) {
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size())
      throw CheckpointError(std::string("checkpoint metadata '") + k + "' is '" + v + "', not a number");
    return x;
  };
  auto i64 = [&](const char* k, const char* before = nullptr) {
    return whole(k, before ? get(k, std::string(before)) : get(k), int64_t{});
  };
  auto u64 = [&](const char* k) { return whole(k, get(k), uint64_t{}); };
  auto f64 = [&](const char* k, const char* before = nullptr) {
    return whole(k, before ? get(k, std::string(before)) : get(k), double{});
  };
  TrainConfig c;
  c.env = get("env");
  c.history = History::parse(get("history"));
  c.steps = i64("steps");
  c.batch = i64("batch");
  c.hidden = i64("hidden");
  c.embed = i64("embed");
  c.lr = f64("lr");
  c.clip = f64("clip");
  c.seed = u64("seed");
  c.device = get("device");
  c.precision = get("precision", "f32");
  if (!parse_precision(c.precision)) throw CheckpointError("checkpoint metadata 'precision' is '" + c.precision + "', not f32 or bf16");
  c.budget = u64("budget");
  c.env_options.lag = i64("lag");
  c.env_options.vocab = i64("vocab");
  c.env_options.corridor = i64("corridor");
  c.env_options.turns = i64("turns");
  c.env_options.cities = i64("cities");
  c.env_options.embed_dim = i64("embed_dim");
  c.gamma = f64("gamma");
  c.entropy = f64("entropy");
  c.value_coef = f64("value_coef");
  // PPO's keys (checkpoints written before PPO existed are A2C's)
  try {
    c.algo = parse_algo(get("algo", "a2c"));
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(std::string("checkpoint metadata 'algo': ") + e.what());
  }
  c.rollout = i64("rollout", std::to_string(c.rollout).c_str());
  c.epochs = i64("epochs", std::to_string(c.epochs).c_str());
  c.minibatches = i64("minibatches", std::to_string(c.minibatches).c_str());
  c.clip_range = f64("clip_range", "0.2");
  c.gae_lambda = f64("gae_lambda", "0.95");
  c.lr_schedule = get("lr_schedule", "constant");
  c.env_shards = i64("env_shards", "1");
  c.critic = get("critic", "shared");
  c.clip_schedule = get("clip_schedule", "constant");
  c.value_clip = f64("value_clip", "0");
  if (!(c.value_clip >= 0 && c.value_clip < 1e30))
    throw CheckpointError("checkpoint metadata 'value_clip' is '" + get("value_clip") + "', not a number in [0, 1e30)");
  c.head_hidden = i64("head_hidden", "0");
  if (const std::string o = get("ortho_init", "0"); o == "0" || o == "1") c.ortho_init = o == "1";
  else throw CheckpointError("checkpoint metadata 'ortho_init' is '" + o + "', not 0 or 1");
  c.adam_eps = f64("adam_eps", "1e-8");
  c.encoder = get("encoder", "linear");
  if (c.encoder != "linear" && c.encoder != "none")
    throw CheckpointError("checkpoint metadata 'encoder' is '" + c.encoder + "', not linear or none");
  if (!(c.adam_eps > 0 && c.adam_eps <= 1))
    throw CheckpointError("checkpoint metadata 'adam_eps' is '" + get("adam_eps") + "', not a number in (0, 1]");
  if (c.head_hidden < 0 || c.head_hidden > 16384)
    throw CheckpointError("checkpoint metadata 'head_hidden' is '" + get("head_hidden") + "', not a number in [0, 16384]");
  if (c.clip_schedule != "constant" && c.clip_schedule != "linear")
    throw CheckpointError("checkpoint metadata 'clip_schedule' is '" + c.clip_schedule + "', not linear or constant");
  if (c.critic != "shared" && c.critic != "separate")
    throw CheckpointError("checkpoint metadata 'critic' is '" + c.critic + "', not shared or separate");
  // (before these existed: PyTorch's init, dense recall)
  c.update_bias = f64("update_bias", "0");
  if (!(std::abs(c.update_bias) <= 20))
    throw CheckpointError("checkpoint metadata 'update_bias' is '" + get("update_bias") + "', not a number in [-20, 20]");
  if (c.env_options.embed_dim < 1 || c.env_options.embed_dim > 16384)  // (no flag sets it: validate's message would name none)
    throw CheckpointError("checkpoint metadata 'embed_dim' is '" + get("embed_dim") + "', not a number in [1, 16384]");
  const std::string sparse = get("sparse", "0");
  if (sparse != "0" && sparse != "1") throw CheckpointError("checkpoint metadata 'sparse' is '" + sparse + "', not 0 or 1");
  c.env_options.sparse = sparse == "1";
  c.cell = get("cell", "gru");
  if (c.cell != "gru" && c.cell != "lstm") throw CheckpointError("checkpoint metadata 'cell' is '" + c.cell + "', not gru or lstm");
  if (c.env == "lm") {
    c.env_options.data = get("data"), c.env_options.valid = get("valid"), c.env_options.test = get("test");
    c.env_options.tokens = get("tokens");
    c.env_options.split = f64("split");
    c.layers = i64("layers", "1"), c.dropout = f64("dropout", "0"), c.optim = get("optim", "adam");
    const std::string tied = get("tied", "0");
    if (tied != "0" && tied != "1") throw CheckpointError("checkpoint metadata 'tied' is '" + tied + "', not 0 or 1");
    c.tied = tied == "1";
  }
  if (c.env == "series") {
    c.env_options.data = get("data"), c.env_options.valid = get("valid"), c.env_options.test = get("test");
    c.env_options.target = get("target"), c.env_options.features = get("features");
    c.env_options.split = f64("split");
  }
  return c;
}

void TrainConfig::validate() const {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw Error(m);
  };
  if (!env_registered(env)) {
    std::string names;
    for (const std::string& n : env_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("unknown --env '" + env + "' (registered: " + names + ")");
  }
  need(steps >= 1 && steps <= kMaxSteps, "--steps must be in [1, 1e9]");
  need(batch >= 1 && batch <= 65536, "--batch must be in [1, 65536]");
  need(hidden >= 1 && hidden <= 16384, "--hidden must be in [1, 16384]");
  need(embed >= 1 && embed <= 16384, "--embed must be in [1, 16384]");
  need(std::isfinite(update_bias) && std::abs(update_bias) <= 20, "--update-bias must be a number in [-20, 20]");
  const HistoryDef& hd = history_def(history.kind);
  need(update_bias == 0 || hd.recurrent, std::string("--update-bias sets the GRU's update gate; --history ") + hd.syntax + " has no GRU");
  need(env_shards >= 1 && env_shards <= batch && batch % env_shards == 0,
       "--env-shards " + std::to_string(env_shards) + ": must be >= 1 and divide --batch " + std::to_string(batch));
  need(std::isfinite(lr) && lr > 0 && lr < (optim == "sgd" ? 1000 : 10), optim == "sgd" ? "--lr must be a positive number below 1000 (--optim sgd)" : "--lr must be a positive number below 10");
  need(std::isfinite(clip) && clip >= 0, "--clip must be >= 0 (0 turns clipping off)");
  need(device != "cuda" || !hd.grows,
       "--history " + history.str() + " keeps its run in one growing arena (the teaching policy), which is CPU-only: use "
       "--device cpu or a bounded history (" + history_choices([](const HistoryDef& d) { return !d.grows; }) + ")");
  check_device_flag(device);
  need(parse_precision(precision).has_value(), "--precision '" + precision + "': choose f32 or bf16");
  need(env_options.lag >= 1 && env_options.lag <= 100000, "--lag must be in [1, 100000]");
  need(!device_loop || algo == Algo::Ppo, "--device-loop on runs PPO's rollouts on the device: --algo ppo (not " +
                                               std::string(algo_name(algo)) + ")");
  need(!env_options.sparse || (env != "tmaze" && env != "dialogue" && env != "device-tmaze" && env != "device-dialogue"),
       "--sparse is recall's (a token every lag steps); --env " + env + " has no sparse form");
  need(env_options.vocab >= 2 && env_options.vocab <= 1'000'000, "--vocab must be in [2, 1e6]");
  need(env_options.corridor >= 1 && env_options.corridor <= 100000, "--corridor must be in [1, 100000]");
  need(env_options.turns >= 2 && env_options.turns <= 100000, "--turns must be in [2, 100000]");
  need(env_options.cities >= 1 && env_options.cities <= 10000, "--cities must be in [1, 10000]");
  need(env_options.embed_dim >= 1 && env_options.embed_dim <= 16384, "dialogue's message embedding size must be in [1, 16384]");
  need(gamma >= 0 && gamma <= 1, "--gamma must be in [0, 1]");
  need(std::isfinite(entropy) && entropy >= 0, "--entropy must be a finite number >= 0");
  need(std::isfinite(value_coef) && value_coef >= 0, "value_coef must be a finite number >= 0");
  if (env == "lm") {
    (void)parse_tokens(env_options.tokens);
    need(env_options.data.empty() == false, "--task lm needs a text to learn: --data FILE");
    need(!env_options.valid.empty() || (env_options.split > 0 && env_options.split < 1),
         "--split must be in (0, 1): the fraction of --data's tokens kept for validation (or give --valid FILE)");
  }
  if (env == "series") {
    need(!env_options.data.empty(), "--task series needs a CSV file to learn: --data FILE.csv");
    need(!env_options.target.empty(), "--task series needs the column to predict: --target COLUMN");
    (void)parse_features(env_options.features);
    need(!env_options.valid.empty() || (env_options.split > 0 && env_options.split < 1),
         "--split must be in (0, 1): the fraction of --data's rows kept for validation (or give --valid FILE)");
  }
  need(cell == "gru" || cell == "lstm", "--cell '" + cell + "': choose gru or lstm");
  need(layers >= 1 && layers <= 16, "--layers must be in [1, 16]");
  need(std::isfinite(dropout) && dropout >= 0 && dropout < 1, "--dropout must be in [0, 1)");
  need(optim == "adam" || optim == "adamw" || optim == "sgd", "--optim '" + optim + "': choose adam, adamw or sgd");
  need(adam_eps > 0 && adam_eps <= 1, "--adam-eps must be in (0, 1]");
  need(nonfinite == "stop" || nonfinite == "skip", "--nonfinite '" + nonfinite + "': choose stop or skip");
  need(encoder == "linear" || encoder == "none", "--encoder '" + encoder + "': choose linear or none");
  need(encoder == "linear" || ((algo == Algo::A2c || algo == Algo::Ppo) && history_def(history.kind).recurrent),
       "--encoder none feeds the observations to the agent's recurrent cell: --algo a2c or ppo with a recurrent --history (not " +
           std::string(algo_name(algo)) + " with --history " + history.str() + ")");
  need(max_skips >= 1 && max_skips <= kMaxSteps, "--max-skips must be in [1, " + std::to_string(kMaxSteps) + "]");
  need(adam_eps == 1e-8 || optim != "sgd", "--adam-eps is Adam's and AdamW's; this run's --optim is sgd");
  need(!tied || hidden == embed, "--tied shares the embeddings with the output layer: --hidden " + std::to_string(hidden) +
                                     " must equal --embed " + std::to_string(embed) + " (as word_language_model requires)");
  const bool rl = algo == Algo::A2c || algo == Algo::Ppo;
  need(algo == Algo::Lm || ((cell == "gru" || rl) && layers == 1 && dropout == 0 && !tied && optim == "adam"),
       std::string("--layers, --dropout, --tied and --optim are --task lm's, and --cell lstm is --task lm's or RL's (--algo "
                   "a2c or ppo); --algo ") + algo_name(algo) + " trains the agent's one-layer " + (rl ? "GRU or LSTM" : "GRU") +
           " with Adam");
  need(cell == "gru" || algo == Algo::Lm || history_def(history.kind).recurrent,
       "--cell lstm recurs; --history " + history.str() + " has no recurrent core");
  need(update_bias == 0 || (cell == "gru" && layers == 1), "--update-bias sets the one-layer GRU's update gate (not --cell lstm or --layers > 1)");
  need(critic == "shared" || critic == "separate", "--critic '" + critic + "': choose shared or separate");
  need(head_hidden >= 0 && head_hidden <= 16384, "--head-hidden must be in [0, 16384]");
  need(head_hidden == 0 || !tied, "--head-hidden puts a layer before the output layer, which --tied makes the embeddings'");
  need(!ortho_init || algo != Algo::Lm, "--ortho-init is the agents' (SB3's ortho_init); --task lm initialises as word_language_model");
  need(critic == "shared" || ((algo == Algo::A2c || algo == Algo::Ppo) && history_def(history.kind).recurrent),
       "--critic separate gives the value head a cell of its own: --algo a2c or ppo with a recurrent --history (not " +
           std::string(algo_name(algo)) + " with --history " + history.str() + ")");
  if (hd.validate) hd.validate(*this);
  const AlgorithmDef& ad = algorithm_def(algo);
  need(ad.flag, "--algo '" + std::string(ad.name) + "': not an algorithm --algo takes");
  if (ad.validate) ad.validate(*this);
}

void check_device_flag(const std::string& device) {
  if (device != "cpu" && device != "cuda") throw Error("--device " + device + ": must be cpu or cuda");
  if (device == "cuda" && !Device::cuda_built() && !emulation::emulating_cuda_on_host())
    throw DeviceError("--device cuda: this build of segtape has no CUDA backend (nvcc was not found when it was configured); "
                "use --device cpu, or rebuild where the CUDA toolkit is installed (docs/cuda.md)");
}

size_t parse_bytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  double mul = unit.empty() || unit == "B" ? 1
               : unit == "KiB" || unit == "K" ? 1024.0
               : unit == "MiB" || unit == "M" ? 1048576.0
               : unit == "GiB" || unit == "G" ? 1073741824.0
                                              : -1;
  if (used == 0 || mul < 0 || !(v >= 0))
    throw Error(std::string(flag) + " '" + s + "': expected a size such as 64MiB, 512KiB, 2GiB or a byte count (units B, "
                "KiB, MiB, GiB; K, M, G alike)");
  if (v * mul > 1e13) throw Error(std::string(flag) + " '" + s + "': at most 1e13 bytes (9.09 TiB)");
  if (v * mul < 1) throw Error(std::string(flag) + " '" + s + "': must be a positive size, such as 64MiB");
  return size_t(v * mul);
}

}  // namespace segtape::agent
