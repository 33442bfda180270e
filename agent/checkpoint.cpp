// A trainer's checkpoints: everything to continue bit-identically, in one
// safetensors file (metadata format "segtape-train-1"), written by rank 0
// for every rank of a data-parallel run.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>

#include "algo/algorithm.h"
#include "context.h"
#include "history/history.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/safetensors.h"

namespace segtape::agent {

namespace {
// The checkpoint (metadata format "segtape-train-1"): the trainer's tensors
// by name, and its host values in these buffers. One list of entries for
// save and load (nn::save_entries / nn::load_entries).
struct Checkpoint {
  int64_t counters[3];                // step, optimizer steps, window position
  int64_t rngs[4];                    // init_rng_'s and act_rng_'s (seed, counter), u64 stored bit for bit in I64
  std::vector<int64_t> env_state;     // Env::save_state()
  std::vector<float> episode_return;  // RL: each stream's return so far in its episode
  std::vector<nn::Entry> entries;
};

// The buffers hold the trainer's values (what save() writes); `state` is the GRU state's entry.
void checkpoint_entries(const Context& t, const HistoryRunner& history, Checkpoint& c, const Tensor& state) {
  c.counters[0] = t.step, c.counters[1] = t.optim->step_count(), c.counters[2] = history.position();
  const nn::Rng::State ir = t.init_rng.state(), ar = t.act_rng.state();
  const uint64_t rngs[4] = {ir.seed, ir.counter, ar.seed, ar.counter};
  std::memcpy(c.rngs, rngs, sizeof rngs);
  c.env_state = t.env->save_state();
  c.episode_return = t.episode_return;
  const auto n = [](const auto& v) { return std::vector<int64_t>{int64_t(std::size(v))}; };
  for (const auto& [name, p] : t.policy->named_parameters()) c.entries.push_back(nn::entry("policy." + name, p));
  for (const auto& [name, s] : t.optim->state()) c.entries.push_back(nn::entry("optim." + name, s));
  c.entries.push_back(nn::entry("train.counters", std::span<int64_t>(c.counters), n(c.counters)));
  c.entries.push_back(nn::entry("train.rngs", std::span<int64_t>(c.rngs), n(c.rngs)));
  c.entries.push_back(nn::entry("env.state", std::span<int64_t>(c.env_state), n(c.env_state)));
  c.entries.push_back(nn::entry("state.h", state));
  c.entries.push_back(nn::entry("train.episode_return", std::span<float>(c.episode_return), n(c.episode_return)));
  c.entries.back().optional = true;
  // --dropout: the masks' generator (save reads it, load writes it: one list of entries for both)
  if (t.dropout) c.entries.push_back(nn::entry("train.dropout_rng", const_cast<nn::Rng&>(t.dropout->rng())));
  const std::span<const Tensor> carried = history.carried();
  for (size_t i = 0; i < carried.size(); ++i) c.entries.push_back(nn::entry("state.window." + std::to_string(i), carried[i]));
}

// A rank's streams: its integers (env state, sampling rng) and floats
// (carried state, episode returns, window ring), as bytes: [n][ints][m][floats].
std::string encode_streams(const std::vector<int64_t>& ints, const std::vector<float>& floats) {
  std::string b;
  auto put = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  const uint64_t n = ints.size(), m = floats.size();
  put(&n, 8), put(ints.data(), n * 8), put(&m, 8), put(floats.data(), m * 4);
  return b;
}
void decode_streams(const std::string& b, std::vector<int64_t>& ints, std::vector<float>& floats, const std::string& whose) {
  uint64_t n = 0, m = 0;
  const auto bad = [&] { return Error("dist: " + whose + ": malformed stream state (" + std::to_string(b.size()) + " bytes)"); };
  if (b.size() < 16) throw bad();
  std::memcpy(&n, b.data(), 8);
  if (n > (b.size() - 16) / 8) throw bad();
  std::memcpy(&m, b.data() + 8 + n * 8, 8);
  if (b.size() != 16 + n * 8 + m * 4) throw bad();
  ints.resize(n), floats.resize(m);
  std::memcpy(ints.data(), b.data() + 8, n * 8);
  std::memcpy(floats.data(), b.data() + 16 + n * 8, m * 4);
}
}  // namespace

std::string Trainer::stream_state() const {
  const Context& c = *c_;
  std::vector<int64_t> ints = c.env->save_state();
  const nn::Rng::State ar = c.act_rng.state();
  ints.push_back(int64_t(ar.seed)), ints.push_back(int64_t(ar.counter));
  if (c.dropout) {  // (--dropout: each rank draws its own masks)
    const nn::Rng::State dr = c.dropout->rng().state();
    ints.push_back(int64_t(dr.seed)), ints.push_back(int64_t(dr.counter));
  }
  std::vector<float> floats = c.h.to_host<float>();
  floats.insert(floats.end(), c.episode_return.begin(), c.episode_return.end());
  for (const Tensor& w : history_->carried()) {
    const std::vector<float> v = w.to_host<float>();
    floats.insert(floats.end(), v.begin(), v.end());
  }
  return encode_streams(ints, floats);
}

void Trainer::set_stream_state(const std::string& bytes) {
  std::vector<int64_t> ints;
  std::vector<float> floats;
  const std::string whose = "rank " + std::to_string(rank()) + "'s streams in the checkpoint";
  decode_streams(bytes, ints, floats, whose);
  std::vector<int64_t> want_ints;
  std::vector<float> want_floats;
  decode_streams(stream_state(), want_ints, want_floats, whose);
  if (ints.size() != want_ints.size() || floats.size() != want_floats.size())
    throw CheckpointError("dist: " + whose + " have " + std::to_string(ints.size()) + " integers and " + std::to_string(floats.size()) +
                          " floats; this configuration needs " + std::to_string(want_ints.size()) + " and " +
                          std::to_string(want_floats.size()));
  Context& c = *c_;
  const size_t ni = ints.size() - (c.dropout ? 4 : 2);
  c.env->load_state(std::span<const int64_t>(ints).first(ni));
  c.act_rng.set_state({uint64_t(ints[ni]), uint64_t(ints[ni + 1])});
  if (c.dropout) c.dropout->rng().set_state({uint64_t(ints[ni + 2]), uint64_t(ints[ni + 3])});
  std::span<const float> f(floats);
  const size_t BH = size_t(c.h_home.numel()), B = c.episode_return.size();
  c.h_home.from_host(f.subspan(0, BH));
  c.h = c.h_home;
  std::copy_n(f.begin() + BH, B, c.episode_return.begin());
  size_t at = BH + B;
  for (const Tensor& w : history_->carried()) w.from_host(f.subspan(at, size_t(w.numel()))), at += size_t(w.numel());
}

void Trainer::save(const std::filesystem::path& file, const std::map<std::string, std::string>& extra) const {
  const Context& t = *c_;
  if (grows() && t.tape->segment_open())
    throw Error("save: history '" + t.config.history.str() + "' keeps its whole run in one open segment; it checkpoints only at the end");
  refuse_inside_a_segment(busy_ > 0 || t.tape->segment_open(), "save");
  refuse_after_non_finite("save");
  // Data parallel: every rank's streams to rank 0, which writes the one file.
  std::vector<std::string> streams;
  if (t.comm) streams = t.comm->gather(stream_state(), 0, "the gather of the ranks' streams for a checkpoint");
  if (rank() != 0) return;
  Checkpoint c;
  checkpoint_entries(t, *history_, c, t.h);
  algo_->entries(c.entries);
  auto meta = t.config.to_metadata();
  meta["format"] = "segtape-train-1";
  algo_->save_metadata(meta);
  if (t.skipped > 0) meta["skipped_updates"] = std::to_string(t.skipped);  // (--nonfinite skip; none: as before it)
  if (t.skipped_in_a_row > 0) meta["skipped_in_a_row"] = std::to_string(t.skipped_in_a_row);  // (a streak goes on after --resume)
  for (const auto& [k, v] : extra) meta[k] = v;
  std::vector<std::vector<int64_t>> ints(streams.size());
  std::vector<std::vector<float>> floats(streams.size());
  if (t.comm) {
    meta["dist.ranks"] = std::to_string(ranks());
    for (size_t r = 1; r < streams.size(); ++r) {
      decode_streams(streams[r], ints[r], floats[r], "rank " + std::to_string(r) + "'s streams");
      const std::string p = "dist.rank" + std::to_string(r);
      c.entries.push_back(nn::entry(p + ".ints", std::span<int64_t>(ints[r]), {int64_t(ints[r].size())}));
      c.entries.push_back(nn::entry(p + ".floats", std::span<float>(floats[r]), {int64_t(floats[r].size())}));
    }
  }
  nn::save_entries(file, c.entries, meta);
}

TrainConfig Trainer::read_config(const std::filesystem::path& file) {
  const safetensors::File f = safetensors::load(file);
  auto it = f.metadata.find("format");
  if (it == f.metadata.end() || it->second != "segtape-train-1")
    throw CheckpointError(file.string() + ": not a segtape training checkpoint (no format 'segtape-train-1' in its metadata)");
  return TrainConfig::from_metadata(f.metadata);
}

void Trainer::load(const std::filesystem::path& file) {
  // (history full's segment stays open between segments: load_file refuses that run)
  refuse_inside_a_segment(busy_ > 0 || (!grows() && c_->tape->segment_open()), "load");
  if (c_->comm) return load_dist(file);
  load_file(file, {}, true);
}

void Trainer::load_rank0(const std::filesystem::path& file) {
  if (c_->comm) throw Error("load_rank0: for one process (segtape eval), not for a rank of a data-parallel run");
  int64_t n = 1;
  const safetensors::File f = safetensors::load(file);
  if (auto it = f.metadata.find("dist.ranks"); it != f.metadata.end()) {
    try {
      n = std::stoll(it->second);
    } catch (const std::logic_error&) {
      n = 0;
    }
    const bool has_last = n >= 1 && n <= 1'000'000 &&
                          (n == 1 || std::any_of(f.tensors.begin(), f.tensors.end(), [&](const safetensors::TensorInfo& t) {
                            return t.name == "dist.rank" + std::to_string(n - 1) + ".ints";
                          }));
    if (!has_last)
      throw CheckpointError(file.string() + ": metadata dist.ranks is '" + it->second + "', which the file's entries do not match (a damaged checkpoint?)");
  }
  load_as_rank0_of(file, n, false);  // the other ranks' streams are read and dropped
}

std::vector<std::string> Trainer::load_as_rank0_of(
    const std::filesystem::path& file, int64_t n, bool check_ranks,
    const std::function<void(const std::vector<std::string>&, std::vector<std::string>&)>& check) {
  std::vector<int64_t> my_ints;
  std::vector<float> my_floats;
  decode_streams(stream_state(), my_ints, my_floats, "rank 0's streams");
  std::vector<std::vector<int64_t>> ints(size_t(n), my_ints);
  std::vector<std::vector<float>> floats(size_t(n), my_floats);
  std::vector<nn::Entry> extra;
  for (int64_t r = 1; r < n; ++r) {
    const std::string p = "dist.rank" + std::to_string(r);
    extra.push_back(nn::entry(p + ".ints", std::span<int64_t>(ints[size_t(r)]), {int64_t(my_ints.size())}));
    extra.push_back(nn::entry(p + ".floats", std::span<float>(floats[size_t(r)]), {int64_t(my_floats.size())}));
  }
  std::vector<std::string> parts(static_cast<size_t>(n));
  const auto encode = [&] {
    for (int64_t r = 1; r < n; ++r) parts[size_t(r)] = encode_streams(ints[size_t(r)], floats[size_t(r)]);
  };
  std::function<void(std::vector<std::string>&)> others;
  if (check) others = [&](std::vector<std::string>& problems) { encode(), check(parts, problems); };
  load_file(file, std::move(extra), check_ranks, others);
  if (!check) encode();  // (with a check, a load that succeeded encoded them for it)
  return parts;
}

// Data parallel: rank 0 reads the file (its own streams, and every other
// rank's), then sends the parameters, the optimizer state, the counters and
// each rank's streams to the ranks; the other ranks read nothing, so the file
// need only be on rank 0's machine. A file rank 0 refuses is refused on
// every rank alike (CollectiveError).
void Trainer::load_dist(const std::filesystem::path& file) {
  const int n = ranks();
  // Every rank's streams are checked by its own env before any rank takes
  // anything: rank 0, inside its load (the file read and checked, nothing
  // taken yet), sends them out; each rank takes its own and puts back what it
  // had; a refusal fails rank 0's load (nothing loaded), whose outcome every
  // rank then gets. (Checked after the broadcast, a refusal left rank 0 with
  // the file, the others with its parameters and half their counters.)
  bool exchanged = false;
  const auto exchange = [&](const std::vector<std::string>& parts) {  // collective
    exchanged = true;
    const std::string pending = c_->comm->scatter(parts, 0, "the scatter of the ranks' streams for their check");
    std::string refused;
    if (rank() != 0 && !pending.empty()) {
      const std::string own = stream_state();
      try {
        set_stream_state(pending);
      } catch (const std::exception& e) {
        refused = e.what();
      }
      set_stream_state(own);
    }
    return c_->comm->allgather(refused, "the ranks' check of their streams");
  };
  std::vector<std::string> parts(static_cast<size_t>(n));
  std::string error;
  if (rank() == 0) {
    try {
      parts = load_as_rank0_of(file, n, true, [&](const std::vector<std::string>& p, std::vector<std::string>& problems) {
        const std::vector<std::string> refused = exchange(p);
        for (size_t r = 1; r < refused.size(); ++r)
          if (!refused[r].empty()) problems.push_back("rank " + std::to_string(r) + "'s streams: " + refused[r]);
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!exchanged) exchange(std::vector<std::string>(static_cast<size_t>(n)));  // (refused before the check: the ranks still meet)
  } else {
    exchange({});
  }
  Context& c = *c_;
  const std::vector<std::string> errors = c.comm->allgather(error, "the outcome of rank 0's checkpoint load");
  if (!errors[0].empty()) throw dist::CollectiveError(errors[0]);
  std::vector<Tensor> state = c.policy->parameters();
  for (const auto& [name, t] : c.optim->state()) state.push_back(t);
  c.avg->broadcast(state, "the broadcast of the checkpoint's parameters and optimizer state");
  int64_t counters[5] = {c.step, c.optim->step_count(), history_->position(), c.skipped, c.skipped_in_a_row};
  c.comm->broadcast(counters, sizeof counters, 0, "the broadcast of the checkpoint's counters");
  const std::string mine = c.comm->scatter(parts, 0, "the scatter of the ranks' streams from the checkpoint");
  if (rank() != 0) {  // (checked above)
    c.step = counters[0];
    c.optim->set_step_count(counters[1]);
    history_->set_position(counters[2]);
    c.skipped = counters[3], c.skipped_in_a_row = counters[4];
    c.stopped_at_non_finite.clear();
    set_stream_state(mine);
  }
}

void Trainer::load_file(const std::filesystem::path& file, std::vector<nn::Entry> extra, bool check_ranks,
                        const std::function<void(std::vector<std::string>&)>& check_others) {
  Context& t = *c_;
  const TrainConfig& config_ = t.config;
  if (grows())
    throw CheckpointError(file.string() + ": a --history " + config_.history.str() + " run's checkpoint cannot be resumed or evaluated: its history lives "
                          "in one segment, which no checkpoint holds");
  Checkpoint c;
  checkpoint_entries(t, *history_, c, t.h_home);
  algo_->entries(c.entries);
  for (nn::Entry& e : extra) c.entries.push_back(std::move(e));
  std::fill(c.episode_return.begin(), c.episode_return.end(), 0.0f);  // what a checkpoint without them means
  int64_t skipped = 0, in_a_row = 0;  // (--nonfinite skip's counts; a checkpoint without them skipped none)
  // Is it a checkpoint of this configuration?
  const auto about_file = [&](const nn::Metadata& metadata, std::vector<std::string>& problems) {
    TrainConfig saved;
    try {
      saved = TrainConfig::from_metadata(metadata);
    } catch (const CheckpointError& e) {
      problems.push_back(e.what());
      return;
    }
    auto same = [&](bool ok, const char* what) {
      if (!ok) problems.push_back(std::string("checkpoint was written with another ") + what + " than this run's");
    };
    same(saved.env == config_.env, "--env");
    same(saved.history.str() == config_.history.str(), "--history");
    same(saved.algo == config_.algo && saved.rollout == config_.rollout && saved.epochs == config_.epochs &&
             saved.minibatches == config_.minibatches && saved.lr_schedule == config_.lr_schedule &&
             saved.clip_schedule == config_.clip_schedule,
         "--algo/--rollout/--epochs/--minibatches/--lr-schedule/--clip-schedule");
    same(saved.batch == config_.batch && saved.hidden == config_.hidden && saved.embed == config_.embed &&
             saved.head_hidden == config_.head_hidden && saved.encoder == config_.encoder,
         "--batch/--hidden/--embed/--head-hidden/--encoder");
    same(saved.env_shards == config_.env_shards, "--env-shards");
    same(saved.precision == config_.precision, "--precision");
    same(saved.cell == config_.cell && saved.layers == config_.layers && saved.dropout == config_.dropout && saved.tied == config_.tied &&
             saved.optim == config_.optim && saved.adam_eps == config_.adam_eps,
         "--cell/--layers/--dropout/--tied/--optim/--adam-eps");
    const EnvOptions &so = saved.env_options, &o = config_.env_options;
    same(so.lag == o.lag && so.vocab == o.vocab && so.sparse == o.sparse && so.corridor == o.corridor && so.turns == o.turns &&
             so.cities == o.cities,
         "--lag/--vocab/--sparse/--corridor/--turns/--cities");
    // What the algorithm made from the run's data (a language model's
    // vocabulary, a series' normalisation) must be what the checkpoint was
    // trained with: data files changed since would be read otherwise.
    std::map<std::string, std::string> made;
    algo_->save_metadata(made);
    for (const auto& [key, value] : made)
      if (auto m = metadata.find(key); m == metadata.end() || m->second != value)
        problems.push_back("checkpoint's " + key + " differs from the one this run made from its data (--data, --valid, --test, " +
                           "--tokens, --split, --target, --features): the data changed since it was written?");
    for (auto [key, count] : {std::pair{"skipped_updates", &skipped}, std::pair{"skipped_in_a_row", &in_a_row}})
      if (auto s = metadata.find(key); s != metadata.end()) {
        const auto [end, ec] = std::from_chars(s->second.data(), s->second.data() + s->second.size(), *count);
        if (s->second.empty() || ec != std::errc() || end != s->second.data() + s->second.size() || *count < 0)
          problems.push_back("checkpoint metadata '" + std::string(key) + "' is '" + s->second + "', not a count");
      }
    auto it = metadata.find("dist.ranks");
    const std::string written = it == metadata.end() ? "1" : it->second;
    if (check_ranks && written != std::to_string(ranks()))
      problems.push_back("checkpoint was written by a run of " + written + " rank(s) (mpirun -np " + written + "); this run has " +
                         std::to_string(ranks()) + ": resume it with the same number of ranks");
  };
  // The counters and the env's state are in range (a damaged checkpoint must
  // not become an out-of-range index); the env takes its state last, when
  // nothing else can be refused.
  const auto about_values = [&](const nn::Metadata&, std::vector<std::string>& problems) {
    const int64_t ring = std::max<int64_t>(int64_t(history_->carried().size()), 1);
    const int64_t* n = c.counters;
    // (steps: --steps' bound; optimizer steps: where Adam's bias correction,
    // a power of the step count in double, still sees every step)
    if (n[0] < 0 || n[0] > TrainConfig::kMaxSteps || n[1] < 0 || n[1] > nn::Optimizer::kMaxSteps || n[2] < 0 || n[2] >= ring) {
      problems.push_back("train.counters out of range (step " + std::to_string(n[0]) + ", optimizer steps " +
                         std::to_string(n[1]) + ", window position " + std::to_string(n[2]) + " of " +
                         std::to_string(ring) + "): a damaged checkpoint?");
      return;
    }
    if (check_others) {  // (data parallel: the other ranks' streams, each checked by its rank's env)
      check_others(problems);
      if (!problems.empty()) return;
    }
    try {
      t.env->load_state(c.env_state);
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  };
  nn::load_entries(file, c.entries, "the training checkpoint", about_file, about_values);
  t.episode_return = c.episode_return;
  t.h = t.h_home;
  t.step = c.counters[0];
  t.skipped = skipped, t.skipped_in_a_row = in_a_row;
  t.stopped_at_non_finite.clear();
  t.optim->set_step_count(c.counters[1]);
  history_->set_position(c.counters[2]);
  history_->loaded();
  algo_->loaded();
  t.init_rng.set_state({uint64_t(c.rngs[0]), uint64_t(c.rngs[1])});
  t.act_rng.set_state({uint64_t(c.rngs[2]), uint64_t(c.rngs[3])});
}

}  // namespace segtape::agent
