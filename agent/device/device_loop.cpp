#include "device_loop.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "bodies.h"
#include "segtape/device_call.h"
#include "segtape/ops.h"

namespace segtape::agent::device {
namespace {

// ---- the device functions: each body made from a call's arguments, run by
// a host loop or launched by nvcc's code (functions.cu).

template <class Rules> Rules rules_from(const CallArgs& a);
template <> rules::Recall rules_from(const CallArgs& a) { return {uint64_t(a.i[0]), a.i[1], a.i[2], a.i[3] != 0}; }
template <> rules::TMaze rules_from(const CallArgs& a) { return {uint64_t(a.i[0]), a.i[1]}; }
template <> rules::Dialogue rules_from(const CallArgs& a) { return {uint64_t(a.i[0]), a.i[1], a.i[2], a.i[3], a.at<const float>(2)}; }
// An env call's tensors: observe {state, cursor, table} -> {obs, buffer};
// step {actions, cursor, table} -> {state, rewards, done, keep, stats};
// its integers: the rules' five, then B and (observe) the vector's D.
constexpr size_t kB = 5;

template <class Body> Body body_from(const CallArgs& a);
template <class Body> int64_t extent(const CallArgs& a);

template <class R> struct ObserveOf {
  static Observe<R> make(const CallArgs& a) {
    return {rules_from<R>(a), a.at<const int64_t>(0), a.at<const int64_t>(1), a.ptr[3], a.ptr[4], a.i[kB], a.i[kB + 1]};
  }
};
template <class R> struct StepOf {
  static EnvStep<R> make(const CallArgs& a) {
    return {rules_from<R>(a), a.at<int64_t>(3), a.at<const int64_t>(0), a.at<const int64_t>(1), a.at<float>(4),
            a.at<float>(5), a.at<float>(6), a.at<double>(7), a.i[kB]};
  }
};
template <> Observe<rules::Recall> body_from(const CallArgs& a) { return ObserveOf<rules::Recall>::make(a); }
template <> Observe<rules::TMaze> body_from(const CallArgs& a) { return ObserveOf<rules::TMaze>::make(a); }
template <> EnvStep<rules::Recall> body_from(const CallArgs& a) { return StepOf<rules::Recall>::make(a); }
template <> EnvStep<rules::TMaze> body_from(const CallArgs& a) { return StepOf<rules::TMaze>::make(a); }
template <> Observe<rules::Dialogue> body_from(const CallArgs& a) { return ObserveOf<rules::Dialogue>::make(a); }
template <> EnvStep<rules::Dialogue> body_from(const CallArgs& a) { return StepOf<rules::Dialogue>::make(a); }
template <> Sample body_from(const CallArgs& a) {
  return {uint64_t(a.i[0]), a.at<const float>(0), a.at<const int64_t>(1), a.at<int64_t>(2), a.at<int64_t>(3),
          a.at<int64_t>(4), a.at<float>(5), a.i[1], a.i[2]};
}
template <> Store body_from(const CallArgs& a) {
  return a.i[1] ? Store{a.at<const float>(0), a.at<const int64_t>(1), a.at<float>(2), a.i[0]}
                : Store{a.at<const float>(0), nullptr, a.at<float>(1), a.i[0]};
}
template <> Reset body_from(const CallArgs& a) { return {a.at<float>(1), a.at<const float>(0), a.i[0], a.i[1]}; }
template <> Advance body_from(const CallArgs& a) { return {a.at<int64_t>(0), a.i[0]}; }
template <> StoreState body_from(const CallArgs& a) { return {a.at<const float>(0), a.at<const int64_t>(1), a.at<float>(2), a.numel[0], a.i[0]}; }
template <> Gae body_from(const CallArgs& a) {
  return {a.at<const float>(0), a.at<const float>(1), a.at<const float>(2), a.at<const float>(3), a.at<float>(4), a.at<float>(5),
          a.i[0], a.i[1], float(a.f[0]), float(a.f[1])};
}

// PPO's update (row: the window's first step, int64 [1]; off: the step's
// place in the window): gather {buffer, mb, row} -> {out}, ints {off, B,
// D}; reset factors {done, mb, row} -> {out}, ints {off, B, Bm, H, window};
// state {starts, mb, row} -> {out}, ints {W, R, B, Bm, H}; the
// minibatch's advantages {adv, mb} -> {out}, ints {B, Bm}; their stats
// {gathered} -> {norm}, ints {n, Bm}, reals {clip range}; terms {lp, v,
// mb, row, norm, adv, actions, logp, returns, values} -> {weights, target, parts},
// ints {off, B, Bm, A, rows}, reals the constants; step sums {parts, row}
// -> {stats}, ints {off, Bm, A, len}; totals {stats} -> {totals}, ints {n};
// an update's norm {sq} -> {into}, ints {at}.
template <> GatherRows<int64_t> body_from(const CallArgs& a) {
  return {a.at<const int64_t>(0), a.at<const int64_t>(1), a.at<const int64_t>(2), a.at<int64_t>(3), a.i[0], a.i[1], a.i[2]};
}
template <> GatherRows<float> body_from(const CallArgs& a) {
  return {a.at<const float>(0), a.at<const int64_t>(1), a.at<const int64_t>(2), a.at<float>(3), a.i[0], a.i[1], a.i[2]};
}
template <> ResetFactors body_from(const CallArgs& a) {
  return {a.at<const float>(0), a.at<const int64_t>(1), a.at<const int64_t>(2), a.at<float>(3), a.i[0], a.i[1], a.i[2], a.i[3], a.i[4]};
}
template <> GatherState body_from(const CallArgs& a) {
  return {a.at<const float>(0), a.at<const int64_t>(1), a.at<const int64_t>(2), a.at<float>(3), a.i[0], a.i[1], a.i[2], a.i[3], a.i[4]};
}
template <> GatherAdvantages body_from(const CallArgs& a) { return {a.at<const float>(0), a.at<const int64_t>(1), a.at<float>(2), a.i[0], a.i[1]}; }
template <> AdvantageStats body_from(const CallArgs& a) { return {a.at<const float>(0), a.at<double>(1), a.i[0], a.i[1], a.f[0]}; }
template <> PpoTerms body_from(const CallArgs& a) {
  return {{a.f[0], a.f[1], a.f[2]}, a.at<const float>(0), a.at<const float>(1), a.at<const int64_t>(2), a.at<const int64_t>(3),
          a.at<const double>(4), a.at<const float>(5), a.at<const int64_t>(6), a.at<const float>(7), a.at<const float>(8),
          a.at<const float>(9), a.at<float>(10), a.at<float>(11), a.at<double>(12), a.i[0], a.i[1], a.i[2], a.i[3]};
}
template <> PpoStepSums body_from(const CallArgs& a) { return {a.at<const double>(0), a.at<const int64_t>(1), a.at<double>(2), a.i[0], a.i[1], a.i[2]}; }
template <> PpoTotals body_from(const CallArgs& a) { return {a.at<const double>(0), a.at<double>(1), a.i[0]}; }
template <> KeepSquare body_from(const CallArgs& a) { return {a.at<const double>(0), a.at<double>(1), a.i[0]}; }

// How many elements a call runs: one per stream, the state's elements
// (Reset), or one (Advance).
template <class Body> int64_t extent(const CallArgs& a) {
  if constexpr (std::is_same_v<Body, Reset>) return a.numel[1];
  else if constexpr (std::is_same_v<Body, StoreState>) return a.numel[0];
  else if constexpr (std::is_same_v<Body, Advance> || std::is_same_v<Body, AdvantageStats> || std::is_same_v<Body, PpoTotals> ||
                     std::is_same_v<Body, KeepSquare>)
    return 1;
  else if constexpr (std::is_same_v<Body, GatherAdvantages>) return a.numel[2];
  else if constexpr (std::is_same_v<Body, GatherRows<int64_t>> || std::is_same_v<Body, GatherRows<float>> ||
                     std::is_same_v<Body, ResetFactors> || std::is_same_v<Body, GatherState>)
    return a.numel[3];  // (the output's elements: after the buffer, the streams and the row)
  else if constexpr (std::is_same_v<Body, PpoTerms>) return a.i[4];
  else if constexpr (std::is_same_v<Body, PpoStepSums>) return a.i[3];
  else if constexpr (std::is_same_v<Body, Sample> || std::is_same_v<Body, Gae>) return a.i[1];
  else if constexpr (std::is_same_v<Body, Store>) return a.i[0];
  else return a.i[kB];
}

template <class Body> void host_form(const CallArgs& a) {
  const Body body = body_from<Body>(a);
  const int64_t n = extent<Body>(a);
  for (int64_t i = 0; i < n; ++i) body(i);
}
#ifdef SEGTAPE_AGENT_CUDA
template <class Body> void cuda_form(const CallArgs& a, void* stream) { launch(body_from<Body>(a), extent<Body>(a), stream); }
#define SEGTAPE_FUNCTION(name, Body) DeviceFunction{name, host_form<Body>, cuda_form<Body>}
#else
#define SEGTAPE_FUNCTION(name, Body) DeviceFunction{name, host_form<Body>, nullptr}
#endif

const DeviceFunction kObserve[3] = {SEGTAPE_FUNCTION("device recall: observe", Observe<rules::Recall>),
                                    SEGTAPE_FUNCTION("device tmaze: observe", Observe<rules::TMaze>),
                                    SEGTAPE_FUNCTION("device dialogue: observe", Observe<rules::Dialogue>)};
const DeviceFunction kStep[3] = {SEGTAPE_FUNCTION("device recall: step", EnvStep<rules::Recall>),
                                 SEGTAPE_FUNCTION("device tmaze: step", EnvStep<rules::TMaze>),
                                 SEGTAPE_FUNCTION("device dialogue: step", EnvStep<rules::Dialogue>)};
const DeviceFunction kSample = SEGTAPE_FUNCTION("device rollout: sample actions", Sample);
const DeviceFunction kStore = SEGTAPE_FUNCTION("device rollout: store values", Store);
const DeviceFunction kReset = SEGTAPE_FUNCTION("device rollout: reset finished streams", Reset);
const DeviceFunction kAdvance = SEGTAPE_FUNCTION("device rollout: next row", Advance);
const DeviceFunction kStoreState = SEGTAPE_FUNCTION("device rollout: store the state a window starts from", StoreState);
const DeviceFunction kGae = SEGTAPE_FUNCTION("device rollout: GAE", Gae);
const DeviceFunction kGatherTokens = SEGTAPE_FUNCTION("device PPO: the minibatch's tokens", GatherRows<int64_t>);
const DeviceFunction kGatherVectors = SEGTAPE_FUNCTION("device PPO: the minibatch's observations", GatherRows<float>);
const DeviceFunction kResetFactors = SEGTAPE_FUNCTION("device PPO: the minibatch's episode resets", ResetFactors);
const DeviceFunction kGatherState = SEGTAPE_FUNCTION("device PPO: the minibatch's stored state", GatherState);
const DeviceFunction kGatherAdvantages = SEGTAPE_FUNCTION("device PPO: the minibatch's advantages", GatherAdvantages);
const DeviceFunction kAdvantageStats = SEGTAPE_FUNCTION("device PPO: the advantages' normalisation", AdvantageStats);
const DeviceFunction kPpoTerms = SEGTAPE_FUNCTION("device PPO: the loss's terms", PpoTerms);
const DeviceFunction kPpoStepSums = SEGTAPE_FUNCTION("device PPO: each step's figures", PpoStepSums);
const DeviceFunction kPpoTotals = SEGTAPE_FUNCTION("device PPO: the iteration's figures", PpoTotals);
const DeviceFunction kKeepSquare = SEGTAPE_FUNCTION("device PPO: an update's gradient norm", KeepSquare);
#undef SEGTAPE_FUNCTION

}  // namespace

bool device_env_built(const std::string& name) { return name == "recall" || name == "tmaze" || name == "dialogue"; }
bool is_twin(const std::string& env_name) {
  return env_name == "device-recall" || env_name == "device-tmaze" || env_name == "device-dialogue";
}

DeviceEnv::DeviceEnv(Tape& tape, const Env& twin, const EnvOptions& o)
    : DeviceEnv(tape, is_twin(twin.spec().name) ? twin.spec().name.substr(7) : twin.spec().name, twin.batch(),
                uint64_t(twin.save_state()[0]), o) {  // (the twin's seed: its rng's first word, its rules' seed)
  const std::vector<int64_t> saved = twin.save_state();
  load_rows(std::span<const int64_t>(saved).last(size_t(B_ * width_)));
}

void DeviceEnv::sync_to(Env& twin) const {
  const std::vector<int64_t> rows = state_.to_host<int64_t>();
  std::vector<int64_t> saved = twin.save_state();
  std::span<int64_t> old = std::span<int64_t>(saved).last(rows.size());
  for (int64_t b = 0; b < B_; ++b) {  // the score counted since: the rows' counters' growth
    const auto num = size_t((b + 1) * width_ - 2), den = num + 1;
    saved[2] += rows[num] - old[num], saved[3] += rows[den] - old[den];
  }
  std::copy(rows.begin(), rows.end(), old.begin());
  twin.load_state(saved);
}

DeviceEnv::DeviceEnv(Tape& tape, const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o) : B_(batch) {
  if (!device_env_built(name))
    throw Error("device env '" + name + "': not built for the device (the device envs: recall, tmaze, dialogue); the host loop runs every env");
  // The twin checks the options and makes the state; the device starts from its rows.
  twin_ = make_env("device-" + name, batch, seed, o);
  spec_ = twin_->spec();
  spec_.name = name;
  if (name == "recall") {
    kind_ = Kind::Recall, width_ = rules::Recall::kWidth;
    ints_ = {int64_t(seed), o.lag, o.vocab, o.sparse ? 1 : 0, 0};
  } else if (name == "tmaze") {
    kind_ = Kind::TMaze, width_ = rules::TMaze::kWidth;
    ints_ = {int64_t(seed), o.corridor, 0, 0, 0};
  } else {
    kind_ = Kind::Dialogue, width_ = rules::Dialogue::kWidth;
    ints_ = {int64_t(seed), o.turns, o.cities, o.embed_dim, 0};
  }
  // the message table of dialogue (its rows on the device), a placeholder element for the others
  const std::vector<float> table = kind_ == Kind::Dialogue ? dialogue_table(o.cities, o.embed_dim) : std::vector<float>{0.0f};
  table_ = tape.persistent({int64_t(table.size())});
  table_.from_host(std::span<const float>(table));
  const std::vector<int64_t> saved = twin_->save_state();  // (the base's: the rng's and the score's 4, then the state ints)
  state_ = tape.persistent({B_, width_}, DType::I64);
  state_.from_host(std::span<const int64_t>(saved).last(size_t(B_ * width_)));
}

void DeviceEnv::load_rows(std::span<const int64_t> rows) {
  std::vector<int64_t> saved = twin_->save_state();
  if (rows.size() != size_t(B_ * width_))
    throw Error("device env '" + spec_.name + "': " + std::to_string(rows.size()) + " state integers, expected " +
                std::to_string(B_ * width_) + " (" + std::to_string(B_) + " streams of " + std::to_string(width_) + ")");
  std::copy(rows.begin(), rows.end(), saved.end() - ptrdiff_t(rows.size()));
  twin_->load_state(saved);  // (its range checks; it throws, naming the env, before the device's state changes)
  state_.from_host(rows);
}

void DeviceEnv::observe(const Tensor& obs, const Tensor& buffer, const Tensor& cursor) const {
  const auto& f = kObserve[size_t(kind_)];
  const auto& i = ints_;
  const int64_t D = spec_.obs_dim;
  if (buffer.defined()) device_call(f, {state_, cursor, table_}, {obs, buffer}, {i[0], i[1], i[2], i[3], i[4], B_, D});
  else device_call(f, {state_, cursor, table_}, {obs}, {i[0], i[1], i[2], i[3], i[4], B_, D});
}

void DeviceEnv::step(const Tensor& actions, const Tensor& cursor, const Tensor& rewards, const Tensor& done, const Tensor& keep,
                     const Tensor& stats) const {
  const auto& i = ints_;
  device_call(kStep[size_t(kind_)], {actions, cursor, table_}, {state_, rewards, done, keep, stats}, {i[0], i[1], i[2], i[3], i[4], B_});
}

std::pair<int64_t, int64_t> DeviceEnv::score_counts() const {
  const std::vector<int64_t> rows = state_.to_host<int64_t>();
  int64_t num = 0, den = 0;
  for (int64_t b = 0; b < B_; ++b) num += rows[size_t((b + 1) * width_ - 2)], den += rows[size_t((b + 1) * width_ - 1)];
  return {num, den};
}

DeviceRollout::DeviceRollout(Tape& tape, const Policy& policy, DeviceEnv& env, int64_t T_, int64_t K_, uint64_t sample_seed, int64_t W_,
                             int64_t state_rows)
    : T(T_), K(K_), B(env.batch()), A(env.spec().num_actions), W(W_), tape_(tape), policy_(policy), env_(env), seed_(sample_seed) {
  if (T < 1 || K < 1 || W < 0) throw Error("device rollout: needs T >= 1 and K >= 1 steps, and W >= 0");
  if (W > 0) starts = tape.persistent({(T + W - 1) / W, state_rows * B, policy.shape().hidden});
  // CUDA-graph segments where every segment has the same steps (the calls of
  // a segment name no step: the row is the device's cursor)
  graphs = true;
  for (int64_t t0 = 0, first = segment_end(0); t0 < T; t0 = segment_end(t0)) graphs = graphs && segment_end(t0) - t0 == first;
  counters_host_.assign(size_t(B), 0);
  stats_host_.assign(size_t(B) * 3, 0.0);
  D = env.spec().vocab > 0 ? 0 : env.spec().obs_dim;
  if (D == 0) tokens = tape.persistent({T, B}, DType::I64);
  else vectors = tape.persistent({T, B, D});
  actions = tape.persistent({T, B}, DType::I64);
  for (Tensor* t : {&logp, &values, &rewards, &done, &advantages_, &returns}) *t = tape.persistent({T, B});
  bootstrap = tape.persistent({B});
  stats = tape.persistent({B, 3}, DType::F64);
  counters = tape.persistent({B}, DType::I64);
  cursor = tape.persistent({1}, DType::I64);
  keep_ = tape.persistent({B});
}

void DeviceRollout::run(const Tensor& h_home) {
  const int64_t H = h_home.dim(1);
  segment_peak = 0;
  for (int64_t t0 = 0, end = 0; t0 < T; t0 = end, segment_peak = std::max(segment_peak, tape_.stats().last_segment_peak)) {
    end = segment_end(t0);
    Segment seg = graphs ? tape_.graph_segment() : tape_.segment();
    NoGradGuard ng(tape_);
    if (W > 0) device_call(kStoreState, {h_home, cursor}, {starts}, {W});
    Tensor h = h_home;
    for (int64_t t = t0; t < end; ++t, tape_.next_step()) {
      const Tensor obs = D == 0 ? tape_.empty({B}, DType::I64) : tape_.empty({B, D});
      env_.observe(obs, D == 0 ? tokens : vectors, cursor);
      const Tensor state = policy_.recur(policy_.encode(obs), h);
      const Tensor f = policy_.output(state);
      const Tensor lp = log_softmax(policy_.logits(f));  // [B, A]
      device_call(kStore, {policy_.value(f), cursor}, {values}, {B, 1});
      const Tensor a = tape_.empty({B}, DType::I64);
      device_call(kSample, {lp, cursor}, {counters, a, actions, logp}, {int64_t(seed_), B, A});
      env_.step(a, cursor, rewards, done, keep_, stats);
      device_call(kReset, {keep_}, {state}, {B, H});
      device_call(kAdvance, {}, {cursor}, {T});
      h = state;
    }
    copy_into(h_home, h);
  }
  // The look-ahead: a segment of another shape, eager under graph replay.
  Segment seg = tape_.eager_segment();
  NoGradGuard ng(tape_);
  const Tensor obs = D == 0 ? tape_.empty({B}, DType::I64) : tape_.empty({B, D});
  env_.observe(obs, Tensor{}, cursor);
  device_call(kStore, {policy_.value(policy_.output(policy_.recur(policy_.encode(obs), h_home)))}, {bootstrap}, {B, 0});
}

// Segments of at most K steps, cut where a window starts too (as PPO's host rollout cuts them).
int64_t DeviceRollout::segment_end(int64_t t0) const {
  const int64_t end = std::min(T, (t0 / K + 1) * K);
  return W > 0 ? std::min(end, (t0 / W + 1) * W) : end;
}

void DeviceRollout::start_at(int64_t step, std::span<const float> returns) {
  if (returns.size() != size_t(B)) throw Error("device rollout: start_at needs " + std::to_string(B) + " returns, one a stream");
  std::fill(counters_host_.begin(), counters_host_.end(), step);
  for (size_t b = 0; b < size_t(B); ++b) stats_host_[3 * b] = returns[b], stats_host_[3 * b + 1] = 0, stats_host_[3 * b + 2] = 0;
  counters.from_host(std::span<const int64_t>(counters_host_));
  stats.from_host(std::span<const double>(stats_host_));
}

void DeviceRollout::advantages(double gamma, double lambda) {
  const Segment seg = tape_.eager_segment();
  device_call(kGae, {rewards, values, done, bootstrap}, {advantages_, returns}, {T, B}, {gamma, lambda});
}

// ---- PPO's update on the device.

namespace {
void need(bool ok, const char* what, const std::string& why) {
  if (!ok) throw ShapeError(std::string(what) + ": " + why);
}
}  // namespace

void UpdateWindow::at(int64_t t) {
  row.from_host(std::span<const int64_t>(&t, 1));
  first = t;
}

void gather_rows(const Tensor& buffer, const UpdateWindow& w, int64_t t, const Tensor& out) {
  const bool tokens = buffer.dtype == DType::I64;
  const int64_t D = tokens ? 1 : buffer.dim(2);
  need(buffer.dim(0) > t && t >= w.first && out.dtype == buffer.dtype && out.numel() == w.mb.numel() * D, "device PPO: gather rows",
       "row " + std::to_string(t) + " (window from " + std::to_string(w.first) + ") of " + buffer.describe() + " for " +
           std::to_string(w.mb.numel()) + " streams into " + out.describe());
  device_call(tokens ? kGatherTokens : kGatherVectors, {buffer, w.mb, w.row}, {out}, {t - w.first, buffer.dim(1), D});
}

void reset_factors(const Tensor& done, const UpdateWindow& w, int64_t t, const Tensor& out, bool window) {
  const int64_t Bm = w.mb.numel(), H = out.dim(1);
  need(t >= w.first && (window ? out.dim(1) == Bm && t + out.dim(0) - 1 <= done.dim(0) : out.dim(0) % Bm == 0 && t < done.dim(0)),
       "device PPO: reset factors",
       out.describe() + " from step " + std::to_string(t) + " of " + done.describe() + " for " + std::to_string(Bm) + " streams");
  device_call(kResetFactors, {done, w.mb, w.row}, {out}, {t - w.first, done.dim(1), Bm, H, window ? 1 : 0});
}

void gather_state(const Tensor& starts, const UpdateWindow& w, int64_t W, const Tensor& out) {
  const int64_t Bm = w.mb.numel(), R = out.dim(0) / Bm, H = out.dim(1);
  need(out.dim(0) == R * Bm && starts.dim(1) % R == 0 && starts.dim(2) == H && W >= 1 && w.first % W == 0 && w.first / W < starts.dim(0),
       "device PPO: stored state", "step " + std::to_string(w.first) + " (windows of " + std::to_string(W) + ") of " + starts.describe() +
                                       " into " + out.describe());
  device_call(kGatherState, {starts, w.mb, w.row}, {out}, {W, R, starts.dim(1) / R, Bm, H});
}

void advantage_stats(const Tensor& advantages, const Tensor& mb, int64_t n, double clip_range, const Tensor& gathered, const Tensor& norm) {
  need(n >= 1 && n <= advantages.dim(0) && gathered.numel() == n * mb.numel() && norm.numel() == 5 && norm.dtype == DType::F64,
       "device PPO: advantage statistics",
       std::to_string(n) + " steps of " + advantages.describe() + " through " + gathered.describe() + " into " + norm.describe());
  device_call(kGatherAdvantages, {advantages, mb}, {gathered}, {advantages.dim(1), mb.numel()});
  device_call(kAdvantageStats, {gathered}, {norm}, {n, mb.numel()}, {clip_range});
}

void ppo_terms(const DeviceRollout& r, const UpdateWindow& w, const Tensor& norm, int64_t t0, const Tensor& lp, const Tensor& v,
               const rules::PpoConstants& k, const Tensor& weights, const Tensor& target, const Tensor& parts, const Tensor& stats) {
  const int64_t Bm = w.mb.numel(), A = lp.dim(1), rows = lp.dim(0), len = rows / Bm;
  need(rows == len * Bm && t0 >= w.first && t0 + len <= r.T && v.numel() == rows && weights.numel() == rows * A && target.numel() == rows &&
           parts.numel() >= rows * (4 + A) && stats.numel() == 3 * r.T,
       "device PPO: loss terms", "log-probabilities " + lp.describe() + ", values " + v.describe() + " of steps from " + std::to_string(t0) +
                                     " of " + std::to_string(Bm) + " streams; weights " + weights.describe() + ", targets " +
                                     target.describe() + ", parts " + parts.describe());
  device_call(kPpoTerms, {detach(lp), detach(v), w.mb, w.row, norm, r.advantages_, r.actions, r.logp, r.returns, r.values},
              {weights, target, parts}, {t0 - w.first, r.B, Bm, A, rows}, {k.value_clip, k.entropy, k.value_coef});
  device_call(kPpoStepSums, {parts, w.row}, {stats}, {t0 - w.first, Bm, A, len});
}

void ppo_totals(const Tensor& stats, int64_t n, const Tensor& totals) {
  need(n >= 0 && 3 * n <= stats.numel() && totals.numel() >= 3, "device PPO: totals", std::to_string(n) + " steps of " + stats.describe() +
       " into " + totals.describe());
  device_call(kPpoTotals, {stats}, {totals}, {n});
}

void keep_square(const Tensor& sq, const Tensor& into, int64_t at) {
  need(sq.numel() == 1 && at >= 0 && at < into.numel(), "device PPO: an update's gradient norm",
       sq.describe() + " at " + std::to_string(at) + " of " + into.describe());
  device_call(kKeepSquare, {sq}, {into}, {at});
}

}  // namespace segtape::agent::device
